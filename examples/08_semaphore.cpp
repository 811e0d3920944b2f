// 08 — rlock::semaphore: at most N workers at once on a backend.
//
//     08_semaphore <redis uri> [workers] [rounds]
//
// Sets the semaphore "demo-backend" to 2 permits (try_set_permits does nothing once a count is
// set, so start several of these at once and they share it), then runs `workers` threads (4 by
// default), each with its own client as separate services would have. Each round takes a permit,
// works 100 ms and returns it. Read the output: never more than 2 workers are inside at once,
// and a waiter gets a permit as soon as one is returned (the release message wakes it).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <rlock/rlock.hpp>

int main(int argc, char** argv) {
    if (argc < 2 || argc > 4) {
        std::fprintf(stderr, "usage: %s <redis uri> [workers] [rounds]\n", argv[0]);
        return 2;
    }
    const std::string uri = argv[1];
    const int workers = argc > 2 ? std::atoi(argv[2]) : 4;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
    std::atomic<int> inside{0}, most{0}, failed{0};
    try {
        rlock::client setup(uri);
        rlock::semaphore backend(setup, "demo-backend");
        if (backend.try_set_permits(2)) std::printf("set the semaphore to 2 permits\n");
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
        threads.emplace_back([&, w] {
            try {
                rlock::client redis(uri);
                rlock::semaphore backend(redis, "demo-backend");
                for (int i = 0; i < rounds; ++i) {
                    backend.acquire();
                    const int now = ++inside;
                    int seen = most.load();
                    while (now > seen && !most.compare_exchange_weak(seen, now)) {
                    }
                    std::printf("worker %d in  (%d inside)\n", w, now);
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                    --inside;
                    backend.release();
                }
            } catch (const rlock::error& e) {
                std::fprintf(stderr, "worker %d: %s\n", w, e.what());
                ++failed;
            }
        });
    }
    for (auto& t : threads) t.join();
    std::printf("at most %d inside at once\n", most.load());
    return failed == 0 && most <= 2 ? 0 : 1;
}
