// 02 — rlock::reentrant_lock: nested locking, a lease, and bounded waits.
//
//     02_reentrant_lock <redis uri>
//
// An "inventory" service moves stock between two bins under one lock. move() takes the lock and
// calls count() which takes it again on the same thread — the reentry count goes to 2, no wait.
// Then a lock with a 10 s lease (expires by itself, never renewed), and a second thread that
// tries the lock with try_lock_for: refused within its 200 ms while the main thread holds it,
// granted within milliseconds of the unlock (it waits for the unlock message, not a poll).
// The key in Redis is Redisson's RLock layout, so a Java service using Redisson's
// getLock("example:inventory") would be excluded too.
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include <rlock/rlock.hpp>

namespace {

using namespace std::chrono_literals;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

class inventory {
public:
    explicit inventory(rlock::client& redis) : lock_(redis, "example:inventory") {}

    int count() {
        std::lock_guard<rlock::reentrant_lock> guard(lock_);  // re-entered when called by move()
        return a_ + b_;
    }

    bool move(int n) {
        std::lock_guard<rlock::reentrant_lock> guard(lock_);
        const int before = count();  // the same thread locks again: count 2, no waiting
        a_ -= n;
        b_ += n;
        return count() == before;
    }

    rlock::reentrant_lock& lock() { return lock_; }

private:
    rlock::reentrant_lock lock_;
    int a_ = 10, b_ = 0;  // stands in for data kept elsewhere
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        rlock::client redis(argv[1]);
        inventory stock(redis);
        rlock::reentrant_lock& lock = stock.lock();
        bool ok = true;

        std::printf("nested locking on one thread\n");
        ok &= expect(stock.move(3), "move() locked twice and kept the total");
        ok &= expect(!lock.is_locked(), "after the outer unlock the key is gone");

        std::printf("a leased hold: expires by itself, never renewed\n");
        lock.lock(10s);
        const milliseconds left = lock.remaining_lease();
        std::printf("       remaining lease %lld ms\n", static_cast<long long>(left.count()));
        ok &= expect(left > 8s && left <= 10s, "the key's TTL is the lease");
        ok &= expect(lock.is_held_by_current_thread(), "held by this thread");

        // Another thread, same client: a different holder id ("<clientId>:<threadId>").
        auto refused = std::async(std::launch::async, [&] {
            const auto t0 = steady_clock::now();
            const bool got = lock.try_lock_for(200ms);
            if (got) lock.unlock();
            return std::make_pair(got, duration_cast<milliseconds>(steady_clock::now() - t0));
        }).get();
        std::printf("       try_lock_for(200ms) from another thread gave up after %lld ms\n",
                    static_cast<long long>(refused.second.count()));
        ok &= expect(!refused.first && refused.second >= 200ms, "refused, after the full wait");

        // The waiter is already waiting when the holder unlocks; it is woken by the unlock
        // message. try_lock_for(wait, lease): the waiter's own hold is leased too.
        std::promise<void> waiting;
        auto granted = std::async(std::launch::async, [&] {
            waiting.set_value();
            const bool got = lock.try_lock_for(10s, 5s);
            const auto at = steady_clock::now();
            if (got) lock.unlock();
            return std::make_pair(got, at);
        });
        waiting.get_future().wait();
        std::this_thread::sleep_for(300ms);  // let it subscribe and find the lock taken
        const auto released = steady_clock::now();
        lock.unlock();
        const auto result = granted.get();
        const auto delay = duration_cast<milliseconds>(result.second - released);
        std::printf("       the waiter got the lock %lld ms after the unlock\n",
                    static_cast<long long>(delay.count()));
        ok &= expect(result.first, "try_lock_for(10s, 5s) succeeded once the holder unlocked");
        ok &= expect(delay < 1s, "woken by the unlock, not by the end of the holder's lease");
        ok &= expect(!lock.is_locked(), "everything released");
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
