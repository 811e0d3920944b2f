// 04 — rlock::fair_lock: first come, first served.
//
//     04_fair_lock <redis uri>
//
// A "payments" job runner lets one worker at a time at a ledger, in the order they asked. The
// main thread holds the lock while four worker threads ask for it one after the other, 200 ms
// apart, so their order is known: 0, 1, 2, 3. Each refused worker joins the queue
// `redisson_lock_queue:{example:payments}` and waits on its own channel; every unlock wakes
// exactly the queue head. Worker 2 is impatient: try_lock_for(300ms) gives up while the main
// thread still holds the lock, and leaves the queue at once. Then the main thread unlocks, and the
// others get the lock in the order they queued — 0, 1, 3 — and nobody overtakes anybody.
//
// The workers are threads on one client here; each thread is its own holder
// ("<client id>:<thread number>"), exactly as separate processes or a Redisson RFairLock on
// the same name would be.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <rlock/rlock.hpp>
#include <string>
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

constexpr int workers = 4;
constexpr int impatient = 2;

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        rlock::client redis(argv[1]);
        rlock::fair_lock lock(redis, "example:payments");
        bool ok = true;

        std::mutex mu;  // guards the two below
        std::condition_variable changed;
        std::vector<int> order;  // who got the lock, in the order they got it
        bool gave_up = false;    // the impatient worker's try_lock_for returned false
        const auto t0 = steady_clock::now();
        auto ms = [&] {
            return static_cast<long long>(
                duration_cast<milliseconds>(steady_clock::now() - t0).count());
        };

        lock.lock();
        std::printf("main holds the lock (t=%lld ms)\n", ms());
        std::vector<std::thread> threads;
        for (int i = 0; i < workers; ++i) {
            threads.emplace_back([&, i] {
                try {
                    std::printf("       t=%4lld ms  worker %d asks%s\n", ms(), i,
                                i == impatient ? " (try_lock_for 300 ms)" : "");
                    if (i == impatient) {
                        if (!lock.try_lock_for(300ms)) {
                            std::lock_guard<std::mutex> g(mu);
                            gave_up = true;
                            changed.notify_all();
                            std::printf(
                                "       t=%4lld ms  worker %d gives up and leaves the queue\n",
                                ms(), i);
                            return;
                        }
                    } else {
                        lock.lock();
                    }
                    {
                        std::lock_guard<std::mutex> g(mu);
                        order.push_back(i);
                        std::printf("       t=%4lld ms  worker %d has the lock\n", ms(), i);
                    }
                    std::this_thread::sleep_for(50ms);  // its turn at the ledger
                    lock.unlock();                      // wakes the next in the queue
                } catch (const rlock::error& e) {
                    std::fprintf(stderr, "worker %d: %s\n", i, e.what());
                }
            });
            // Its first attempt (one round trip) has queued it long before the next one asks.
            std::this_thread::sleep_for(200ms);
        }
        {
            std::unique_lock<std::mutex> g(mu);
            changed.wait_for(g, 5s, [&] { return gave_up; });
        }
        std::printf("main unlocks (t=%lld ms)\n", ms());
        lock.unlock();
        for (std::thread& t : threads) t.join();

        std::string got;
        for (int i : order) got += (got.empty() ? "" : ", ") + std::to_string(i);
        std::printf("order of acquisition: %s\n", got.c_str());
        ok &= expect(order == std::vector<int>{0, 1, 3},
                     "the workers got the lock in the order they asked");
        ok &= expect(gave_up, "the impatient worker gave up while the lock was held");
        ok &= expect(!lock.is_locked(), "everything released");
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
