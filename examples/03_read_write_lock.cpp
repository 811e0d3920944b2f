// 03 — rlock::read_write_lock: many readers at once, or one writer.
//
//     03_read_write_lock <redis uri>
//
// A "catalog" is read often and written rarely. Readers take the read side through
// std::shared_lock, the writer the write side through std::unique_lock — the standard guards,
// because read_write_lock has lock_shared()/unlock_shared() and lock()/unlock().
//
//   1. three reader threads hold the read side at the same time; while they do, a writer's
//      try_lock_for(200ms) is refused;
//   2. the writer holds the write side; readers that ask meanwhile wait (a try_lock_shared_for
//      of 200 ms is refused), and they all get in only after the writer's unlock, woken by its
//      unlock message rather than by a poll.
//
// The key in Redis is Redisson's RReadWriteLock layout, so a Java service using Redisson's
// getReadWriteLock("example:catalog") takes part in the same exclusion.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <rlock/rlock.hpp>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

/// Lets threads wait until `n` of them have arrived (C++17 has no std::latch).
class gate {
public:
    explicit gate(int n) : left_(n) {}
    void arrive() {
        std::lock_guard<std::mutex> g(mu_);
        if (--left_ <= 0) cv_.notify_all();
    }
    bool wait_for(milliseconds limit) {
        std::unique_lock<std::mutex> g(mu_);
        return cv_.wait_for(g, limit, [&] { return left_ <= 0; });
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    int left_;
};

constexpr int readers = 3;

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        rlock::client redis(argv[1]);
        rlock::read_write_lock rw(redis, "example:catalog");
        bool ok = true;

        std::printf("1. %d readers hold the read side at once\n", readers);
        {
            std::atomic<int> inside{0}, most{0};
            gate all_in(readers), done(1);
            std::vector<std::thread> threads;
            for (int i = 0; i < readers; ++i) {
                threads.emplace_back([&, i] {
                    try {
                        std::shared_lock<rlock::read_write_lock> read(rw);
                        const int now = ++inside;
                        int seen = most.load();
                        while (seen < now && !most.compare_exchange_weak(seen, now)) {
                        }
                        std::printf("       reader %d in (%d inside)\n", i, now);
                        all_in.arrive();
                        done.wait_for(5s);  // stay until the writer has been refused
                        --inside;
                    } catch (const rlock::error& e) {
                        std::fprintf(stderr, "reader %d: %s\n", i, e.what());
                        all_in.arrive();
                    }
                });
            }
            ok &= expect(all_in.wait_for(5s) && most == readers,
                         "all three were inside together: nobody waited for another reader");
            const auto t0 = steady_clock::now();
            const bool wrote = rw.try_lock_for(200ms);
            const auto waited = duration_cast<milliseconds>(steady_clock::now() - t0);
            if (wrote) rw.unlock();
            std::printf("       writer: try_lock_for(200ms) -> %s after %lld ms\n",
                        wrote ? "granted" : "refused", static_cast<long long>(waited.count()));
            ok &= expect(!wrote, "a writer is refused while readers hold the lock");
            done.arrive();
            for (std::thread& t : threads) t.join();
        }
        ok &= expect(!rw.is_locked(), "the last reader out deleted the lock");

        std::printf("2. a writer excludes readers\n");
        {
            std::atomic<bool> writing{false};
            std::atomic<int> overlaps{0};
            std::vector<std::thread> threads;
            std::vector<steady_clock::time_point> entered(readers);
            gate asking(readers);
            steady_clock::time_point released;
            {
                std::unique_lock<rlock::read_write_lock> write(rw);
                writing = true;
                std::printf("       writer in\n");
                std::atomic<bool> other_refused{false};
                std::thread probe([&] {
                    try {
                        const bool got = rw.try_lock_shared_for(200ms);
                        if (got) rw.unlock_shared();
                        other_refused = !got;
                    } catch (const rlock::error& e) {
                        std::fprintf(stderr, "probe: %s\n", e.what());
                    }
                });
                probe.join();
                ok &=
                    expect(other_refused, "another thread's try_lock_shared_for(200ms) is refused");
                for (int i = 0; i < readers; ++i) {
                    threads.emplace_back([&, i] {
                        try {
                            asking.arrive();
                            std::shared_lock<rlock::read_write_lock> read(rw);
                            entered[static_cast<std::size_t>(i)] = steady_clock::now();
                            if (writing) ++overlaps;
                        } catch (const rlock::error& e) {
                            std::fprintf(stderr, "reader %d: %s\n", i, e.what());
                            ++overlaps;
                        }
                    });
                }
                asking.wait_for(5s);
                std::this_thread::sleep_for(300ms);  // the readers are waiting now
                std::printf("       writer out, %d readers waiting\n", readers);
                writing = false;
                released = steady_clock::now();
            }  // unlock(): publishes `1` on redisson_rwlock:{example:catalog}
            for (std::thread& t : threads) t.join();
            long long slowest = 0;
            for (int i = 0; i < readers; ++i) {
                const steady_clock::time_point in = entered[static_cast<std::size_t>(i)];
                const long long ms = duration_cast<milliseconds>(in - released).count();
                std::printf("       reader %d in %lld ms after the writer's unlock\n", i, ms);
                slowest = std::max(slowest, ms);
                if (in < released) ++overlaps;
            }
            ok &= expect(overlaps == 0, "no reader got in while the writer held the lock");
            ok &= expect(slowest < 1000, "all readers got in at once after the unlock (< 1 s)");
        }
        ok &= expect(!rw.is_locked(), "everything released");
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
