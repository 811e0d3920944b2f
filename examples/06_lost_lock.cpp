// 06 — a lost lock, and why a protected resource checks fencing tokens.
//
//     06_lost_lock <redis uri>
//
// A lock can be lost while its holder still thinks it holds it: the key is deleted by an
// operator, or expires while the holder is paused or cut off from Redis. rlock tells the holder
// (on_lock_lost, lost()), but a holder may already be in the middle of a write when that
// happens. Only the resource itself can refuse a stale writer, and fencing tokens let it: each
// acquisition gets a strictly larger token, and the resource rejects a token smaller than one it
// has already seen.
//
// Here two services (two clients) share a ledger guarded by the lock "example:ledger":
//   1. service A locks it (watched: the watchdog renews its 1.5 s lease every 0.5 s) and
//      writes with its token; 2 s later it still holds it — the watchdog kept it alive;
//   2. service B, deciding A is stuck, force_unlock()s the lock, takes it itself with a larger
//      token, and writes;
//   3. A's watchdog finds its hold gone and calls on_lock_lost; lost() turns true;
//   4. A, late, tries to write with its old token: the ledger refuses it;
//   5. A's unlock does not throw (its hold is gone; it was told already) and B finishes.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rlock/rlock.hpp>

namespace {

using namespace std::chrono_literals;

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

/// The protected resource (think: a database row with a "last token" column). It accepts a
/// write only with a token at least as large as every token it has accepted before.
class ledger {
public:
    bool write(std::uint64_t token, const std::string& entry) {
        std::lock_guard<std::mutex> g(mu_);
        if (token < highest_) {
            std::printf("       ledger: REJECTED \"%s\" (token %llu < %llu)\n", entry.c_str(),
                        static_cast<unsigned long long>(token),
                        static_cast<unsigned long long>(highest_));
            return false;
        }
        highest_ = token;
        entries_.push_back(entry);
        std::printf("       ledger: accepted \"%s\" (token %llu)\n", entry.c_str(),
                    static_cast<unsigned long long>(token));
        return true;
    }

private:
    std::mutex mu_;
    std::uint64_t highest_ = 0;
    std::vector<std::string> entries_;
};

/// What on_lock_lost reported.
struct loss_log {
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;
    rlock::errc code{};
    std::string what;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        loss_log losses;
        rlock::client_options options = rlock::client_options::from_uri(argv[1]);
        options.lock_watchdog_timeout = 1500ms;  // short, so the example is quick
        // Runs on the watchdog thread: record and return, never throw.
        options.on_lock_lost = [&losses](std::string_view lock, const rlock::error& reason) {
            std::lock_guard<std::mutex> g(losses.mu);
            ++losses.calls;
            losses.code = reason.value();
            losses.what = reason.what();
            std::printf("       on_lock_lost(\"%.*s\"): %s\n", static_cast<int>(lock.size()),
                        lock.data(), reason.what());
            losses.cv.notify_all();
        };
        rlock::client service_a(options);
        rlock::client service_b(argv[1]);
        const rlock::lock_options fenced{/*fencing=*/true};
        ledger book;
        bool ok = true;

        std::printf("1. service A locks and writes\n");
        rlock::mutex lock_a(service_a, "example:ledger", fenced);
        lock_a.lock();
        const std::uint64_t token_a = lock_a.fencing_token();
        ok &= expect(book.write(token_a, "A: debit 10"), "A's write is accepted");
        std::this_thread::sleep_for(2s);
        ok &= expect(!lock_a.lost() && lock_a.is_held_by_current_thread(),
                     "2 s later (lease 1.5 s) A still holds it: the watchdog renewed it");

        std::printf("2. service B breaks the lock and takes it\n");
        std::promise<bool> b_wrote;
        std::promise<void> a_done;
        std::thread b([&] {
            bool signalled = false;
            try {
                rlock::mutex lock_b(service_b, "example:ledger", fenced);
                const bool was_held = lock_b.force_unlock();
                lock_b.lock();
                const std::uint64_t token_b = lock_b.fencing_token();
                std::printf("       B: force_unlock() -> %s, new token %llu\n",
                            was_held ? "was held" : "was free",
                            static_cast<unsigned long long>(token_b));
                const bool wrote = book.write(token_b, "B: credit 5");
                signalled = true;
                b_wrote.set_value(expect(was_held && token_b > token_a && wrote,
                                         "B broke A's lock, got a larger token and wrote"));
                a_done.get_future().wait();  // hold it until A has tried its late write
                lock_b.unlock();
            } catch (const rlock::error& e) {
                std::fprintf(stderr, "service B: %s\n", e.what());
                if (!signalled) b_wrote.set_value(false);
            }
        });
        ok &= b_wrote.get_future().get();

        std::printf("3. A's watchdog finds the hold gone\n");
        {
            std::unique_lock<std::mutex> g(losses.mu);
            losses.cv.wait_for(g, 5s, [&] { return losses.calls > 0; });
            ok &= expect(losses.calls == 1 && losses.code == rlock::errc::lock_lost,
                         "on_lock_lost was called once, with errc::lock_lost");
        }
        ok &= expect(lock_a.lost(), "lock_a.lost() is true");

        std::printf("4. A, unaware, writes with its old token\n");
        ok &= expect(!book.write(token_a, "A: debit 10 again"), "the ledger refuses A's token");

        std::printf("5. A unlocks, B finishes\n");
        lock_a.unlock();  // no throw: the loss was reported through on_lock_lost already
        a_done.set_value();
        b.join();
        {
            std::lock_guard<std::mutex> g(losses.mu);
            ok &= expect(losses.calls == 1, "the loss was reported once, not again at unlock");
        }
        ok &= expect(!lock_a.is_locked(), "the lock is free");
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
