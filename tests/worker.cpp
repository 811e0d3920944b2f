// A separate OS process for the multi-process tests.
//
//   rlock_test_worker <port> <mutex|reentrant|fair|rw> <lock> <threads> <iterations> <counter>
//       Each thread loops: lock, GET the counter, SET it to value + 1 (not atomic on purpose),
//       unlock. (rw: the write side.) Exits 0 when every iteration ran, 1 on any error.
//   rlock_test_worker <port> red <lock> <threads> <iterations> <counter> <port,port,...>
//       As above with a red_lock over the first port and the listed ones (counter on the first).
//   rlock_test_worker <port> multi <lock A> <threads> <iterations> <counter> <lock B>
//       As above with a multi_lock of two mutexes, A then B, each on its own client (so the
//       part-by-part path runs); the test starts others with B then A.
//   rlock_test_worker <port> fair-order <lock> <id> <wait timeout ms>
//       Waits for the fair lock, RPUSHes <id> to "<lock>:order", holds 50 ms, unlocks.
//   rlock_test_worker <port> rw-read-hang <lock> <watchdog ms>
//       Takes the read side (watched), SETs "<lock>:ready", then sleeps until killed.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"

namespace {

rlock::detail::context_ptr raw(int port) {
    rlock::detail::context_ptr c(redisConnect("127.0.0.1", port));
    if (!c || c->err) throw std::runtime_error("worker: no raw connection");
    return c;
}

template <class Lock>
void count(rlock::client& c, int port, const std::string& name, int iterations,
           const std::string& counter) {
    Lock lock(c, name);
    auto redis = raw(port);
    for (int i = 0; i < iterations; ++i) {
        std::lock_guard<Lock> guard(lock);
        auto got = rlock::detail::command(redis.get(), {"GET", counter});
        const long long value = got->type == REDIS_REPLY_STRING ? std::atoll(got->str) : 0;
        std::this_thread::yield();  // widen the window a lost update would need
        const std::string next = std::to_string(value + 1);
        rlock::detail::command(redis.get(), {"SET", counter, next});
    }
}

int counting(int port, const std::string& kind, const std::string& name, int threads,
             int iterations, const std::string& counter) {
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
                    count<rlock::mutex>(c, port, name, iterations, counter);
                } else if (kind == "reentrant") {
                    count<rlock::reentrant_lock>(c, port, name, iterations, counter);
                } else if (kind == "fair") {
                    count<rlock::fair_lock>(c, port, name, iterations, counter);
                } else {
                    count<rlock::read_write_lock>(c, port, name, iterations, counter);
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
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: see the comment at the top of worker.cpp\n");
        return 2;
    }
    const int port = std::atoi(argv[1]);
    const std::string mode = argv[2], name = argv[3];
    try {
        if (mode == "fair-order" && argc == 6) {
            rlock::client_options o;
            o.port = port;
            rlock::client c(o);
            rlock::lock_options lo;
            lo.fair_lock_wait_timeout = std::chrono::milliseconds(std::atoi(argv[5]));
            rlock::fair_lock lock(c, name, lo);
            lock.lock();
            rlock::detail::command(raw(port).get(), {"RPUSH", name + ":order", argv[4]});
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            lock.unlock();
            return 0;
        }
        if (mode == "rw-read-hang" && argc == 5) {
            rlock::client_options o;
            o.port = port;
            o.lock_watchdog_timeout = std::chrono::milliseconds(std::atoi(argv[4]));
            rlock::client c(o);
            rlock::read_write_lock lock(c, name);
            lock.lock_shared();
            rlock::detail::command(raw(port).get(), {"SET", name + ":ready", "1"});
            std::this_thread::sleep_for(std::chrono::seconds(60));
            return 3;  // should have been killed
        }
        if (mode == "multi" && argc == 8) {
            rlock::client_options o;
            o.port = port;
            rlock::client c1(o), c2(o);
            rlock::mutex a(c1, name), b(c2, argv[7]);
            rlock::multi_lock both{a, b};
            auto redis = raw(port);
            for (int i = 0; i < std::atoi(argv[5]); ++i) {
                std::lock_guard<rlock::multi_lock> guard(both);
                auto got = rlock::detail::command(redis.get(), {"GET", argv[6]});
                const long long v = got->type == REDIS_REPLY_STRING ? std::atoll(got->str) : 0;
                std::this_thread::yield();
                rlock::detail::command(redis.get(), {"SET", argv[6], std::to_string(v + 1)});
            }
            return 0;
        }
        if (mode == "red" && argc == 8) {
            std::vector<std::unique_ptr<rlock::client>> clients;
            std::vector<rlock::client*> nodes;
            std::string ports = std::to_string(port) + "," + argv[7];
            for (std::size_t at = 0; at < ports.size();) {
                const std::size_t comma = std::min(ports.find(',', at), ports.size());
                rlock::client_options o;
                o.port = std::atoi(ports.substr(at, comma - at).c_str());
                clients.push_back(std::make_unique<rlock::client>(o));
                nodes.push_back(clients.back().get());
                at = comma + 1;
            }
            rlock::red_lock lock(nodes, name);
            auto redis = raw(port);
            const int threads = std::atoi(argv[4]), iterations = std::atoi(argv[5]);
            std::vector<std::thread> pool;
            std::atomic<int> failures{0};
            for (int t = 0; t < threads; ++t) {
                pool.emplace_back([&] {
                    try {
                        auto mine = raw(port);
                        for (int i = 0; i < iterations; ++i) {
                            std::lock_guard<rlock::red_lock> guard(lock);
                            auto got = rlock::detail::command(mine.get(), {"GET", argv[6]});
                            const long long v = got->type == REDIS_REPLY_STRING ? std::atoll(got->str) : 0;
                            std::this_thread::yield();
                            rlock::detail::command(mine.get(), {"SET", argv[6], std::to_string(v + 1)});
                        }
                    } catch (const std::exception& e) {
                        std::fprintf(stderr, "red worker thread failed: %s\n", e.what());
                        ++failures;
                    }
                });
            }
            for (auto& t : pool) t.join();
            return failures == 0 ? 0 : 1;
        }
        if (argc == 7) {
            return counting(port, mode, name, std::atoi(argv[4]), std::atoi(argv[5]), argv[6]);
        }
        std::fprintf(stderr, "worker: bad arguments\n");
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "worker failed: %s\n", e.what());
        return 1;
    }
}
