// A separate OS process for the mutual-exclusion tests:
//   rlock_test_worker <port> <mutex|reentrant> <lock name> <threads> <iterations> <counter key>
// Each thread loops: lock, GET the counter, SET it to value + 1 (not atomic on purpose), unlock.
// Exits 0 when every iteration ran, 1 on any error (printed).
#include <hiredis/hiredis.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"

namespace {

template <class Lock>
void work(rlock::client& c, int port, const std::string& name, int iterations,
          const std::string& counter) {
    Lock lock(c, name);
    rlock::detail::context_ptr raw(redisConnect("127.0.0.1", port));
    if (!raw || raw->err) throw std::runtime_error("worker: no raw connection");
    for (int i = 0; i < iterations; ++i) {
        std::lock_guard<Lock> guard(lock);
        auto got = rlock::detail::command(raw.get(), {"GET", counter});
        const long long value = got->type == REDIS_REPLY_STRING ? std::atoll(got->str) : 0;
        std::this_thread::yield();  // widen the window a lost update would need
        const std::string next = std::to_string(value + 1);
        rlock::detail::command(raw.get(), {"SET", counter, next});
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 7) {
        std::fprintf(stderr, "usage: %s port kind name threads iterations counter\n", argv[0]);
        return 2;
    }
    const int port = std::atoi(argv[1]);
    const std::string kind = argv[2], name = argv[3], counter = argv[6];
    const int threads = std::atoi(argv[4]), iterations = std::atoi(argv[5]);
    try {
        rlock::client_options o;
        o.port = port;
        rlock::client c(o);
        std::vector<std::thread> pool;
        int failures = 0;
        std::mutex failures_mu;
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&] {
                try {
                    if (kind == "mutex") {
                        work<rlock::mutex>(c, port, name, iterations, counter);
                    } else {
                        work<rlock::reentrant_lock>(c, port, name, iterations, counter);
                    }
                } catch (const std::exception& e) {
                    std::lock_guard<std::mutex> g(failures_mu);
                    std::fprintf(stderr, "worker thread failed: %s\n", e.what());
                    ++failures;
                }
            });
        }
        for (auto& t : pool) t.join();
        return failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "worker failed: %s\n", e.what());
        return 1;
    }
}
