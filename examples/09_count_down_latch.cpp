// 09 — rlock::count_down_latch: start when every worker is ready.
//
//     09_count_down_latch <redis uri> [workers]
//
// A coordinator sets the latch "demo-ready" to `workers` (3 by default). Each worker thread,
// with its own client as a separate service would have, prepares for a moment, counts down and
// waits; the coordinator waits too. Read the output: nobody passes the latch before the last
// worker has counted down, and everyone passes at once when it has (the zero message wakes them).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <rlock/rlock.hpp>

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        std::fprintf(stderr, "usage: %s <redis uri> [workers]\n", argv[0]);
        return 2;
    }
    const std::string uri = argv[1];
    const int workers = argc > 2 ? std::atoi(argv[2]) : 3;
    std::atomic<int> counted{0}, early{0}, failed{0};
    try {
        rlock::client redis(uri);
        rlock::count_down_latch ready(redis, "demo-ready");
        if (!ready.try_set_count(workers)) {
            std::fprintf(stderr, "demo-ready is in use (count %lld)\n", ready.count());
            return 1;
        }
        std::vector<std::thread> threads;
        for (int w = 0; w < workers; ++w) {
            threads.emplace_back([&, w] {
                try {
                    rlock::client mine(uri);
                    rlock::count_down_latch latch(mine, "demo-ready");
                    std::this_thread::sleep_for(std::chrono::milliseconds(100 * (w + 1)));
                    ++counted;
                    std::printf("worker %d ready (%lld to go)\n", w, latch.count_down());
                    latch.wait();
                    if (counted < workers) ++early;
                    std::printf("worker %d started\n", w);
                } catch (const rlock::error& e) {
                    std::fprintf(stderr, "worker %d: %s\n", w, e.what());
                    ++failed;
                }
            });
        }
        ready.wait();
        std::printf("coordinator: all %d ready\n", workers);
        for (auto& t : threads) t.join();
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return failed == 0 && early == 0 ? 0 : 1;
}
