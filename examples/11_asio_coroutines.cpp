// 11 — rlock with Asio C++20 coroutines: a lock per key, awaited, without a thread per waiter.
//
//     11_asio_coroutines <redis uri> [requests]
//
// A small timer-driven service on one io_context thread: `requests` coroutines (default 200)
// each take the lock of one of 4 stock keys with `co_await m.async_lock(asio::use_awaitable)`,
// read the key's stock, sleep 2 ms on an Asio timer (the work of the request: the thread serves
// other coroutines meanwhile), write the stock back one lower, and release the lock by letting
// the hold go. Every waiter waits for its key's unlock message; none holds a thread. At the end
// the stock of each key must be exactly its initial 1000 minus the requests that chose it:
// with a lost update it would be higher. Exits 0 when it is.
//
// Built when Asio is found (Debian: libasio-dev) and the compiler has C++20 coroutines.
#include <rlock/asio.hpp>
#include <rlock/rlock.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <hiredis/hiredis.h>

namespace {

using namespace std::chrono_literals;

constexpr int keys = 4;
constexpr long long initial_stock = 1000;

// The stock lives in Redis too (a plain key, read and written without a script): only the lock
// keeps two requests from reading the same value.
long long command_integer(redisContext* c, const char* fmt, const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c, fmt, key.c_str()));
    if (!r) throw std::runtime_error("redis command failed");
    long long v = 0;
    if (r->type == REDIS_REPLY_STRING) v = std::stoll(std::string(r->str, r->len));
    if (r->type == REDIS_REPLY_INTEGER) v = r->integer;
    freeReplyObject(r);
    return v;
}

asio::awaitable<void> request(rlock::mutex& lock, redisContext* redis, const std::string& key,
                              std::array<int, keys>& served, int which) {
    rlock::hold h = co_await lock.async_lock(asio::use_awaitable);
    const long long stock = command_integer(redis, "GET %s", key);
    asio::steady_timer work(co_await asio::this_coro::executor, 2ms);
    co_await work.async_wait(asio::use_awaitable);
    const std::string next = std::to_string(stock - 1);
    freeReplyObject(redisCommand(redis, "SET %s %s", key.c_str(), next.c_str()));
    ++served[static_cast<std::size_t>(which)];
}  // h released here: the next waiter for this key is woken by the unlock message

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <redis uri> [requests]\n", argv[0]);
        return 2;
    }
    const int requests = argc > 2 ? std::atoi(argv[2]) : 200;
    try {
        rlock::client redis(argv[1]);
        const rlock::client_options& o = redis.options();
        redisContext* raw = o.unix_socket.empty() ? redisConnect(o.host.c_str(), o.port)
                                                  : redisConnectUnix(o.unix_socket.c_str());
        if (!raw || raw->err) throw std::runtime_error("cannot connect for the stock keys");

        std::array<std::string, keys> names;
        std::array<std::unique_ptr<rlock::mutex>, keys> locks;
        for (int k = 0; k < keys; ++k) {
            names[k] = "example11:stock:" + std::to_string(k);
            locks[k] = std::make_unique<rlock::mutex>(redis, "example11:lock:" + std::to_string(k));
            freeReplyObject(redisCommand(raw, "SET %s %lld", names[k].c_str(), initial_stock));
        }

        // Declared after the client, so destroyed first when an exception leaves coroutines
        // waiting: rlock cancels their waits and destroys their frames (releasing what they
        // hold), and the client then goes cleanly. The other order is safe too.
        asio::io_context io;
        std::array<int, keys> served{};
        std::exception_ptr failed;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < requests; ++i) {
            const int k = (i * 7) % keys;  // spread, unevenly over time
            asio::co_spawn(io, request(*locks[k], raw, names[k], served, k),
                           [&](std::exception_ptr e) {
                               if (e && !failed) failed = e;
                           });
        }
        io.run();  // one thread: every coroutine waits on its lock without holding it
        if (failed) std::rethrow_exception(failed);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();

        bool ok = true;
        for (int k = 0; k < keys; ++k) {
            const long long stock = command_integer(raw, "GET %s", names[k]);
            const long long expected = initial_stock - served[k];
            std::printf("%s: %d requests, stock %lld (expected %lld)\n", names[k].c_str(), served[k],
                        stock, expected);
            ok = ok && stock == expected;
            freeReplyObject(redisCommand(raw, "DEL %s", names[k].c_str()));
        }
        redisFree(raw);
        std::printf("%d requests on one thread in %lld ms: %s\n", requests, static_cast<long long>(ms),
                    ok ? "no update lost" : "LOST UPDATES");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "11_asio_coroutines: %s\n", e.what());
        return 1;
    }
}
