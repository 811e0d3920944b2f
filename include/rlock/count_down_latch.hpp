// rlock::count_down_latch — a latch in Redis, in Redisson's RCountDownLatch layout.
//
//     rlock::client redis("redis://127.0.0.1:6380");
//     rlock::count_down_latch ready(redis, "batch-42:ready");
//     ready.try_set_count(3);         // once, by the coordinator (no-op while a count is set)
//     ...                             // in each of 3 workers, anywhere:  ready.count_down();
//     ready.wait();                   // returns once all 3 have counted down
//
// In Redis: key `name` is a string holding the count; it is deleted when the count reaches 0, so
// an absent key is a latch at 0 (Redisson's rule: a waiter before try_set_count passes at once).
// The count down that reaches 0 publishes `0` on `redisson_countdownlatch__channel__{name}`;
// try_set_count publishes `1`. The same layout and messages as Redisson's RCountDownLatch, so the
// two count down and wait on one latch.
//
// Waiting: a waiter subscribes to the channel (the client's one subscriber connection), reads the
// count, and sleeps until a message on the channel — never polling; only while the subscriber is
// reconnecting (no message can be counted on) does it also look again after 10 ms, doubling to
// 1 s. A reconnect makes every waiter look again. A look that fails with a broken connection is
// made again after a backoff (25 ms, doubling to 1 s) until the wait's deadline (the waiter
// rides out killed connections and a restart); then the wait throws that error.
//
// Data loss: as in Redisson, a latch whose key is missing has count 0 — a server that lost its
// data (a restart without persistence, a failover to a replica that missed the count) opens
// the latch for every waiter. Only the server's persistence (appendonly with fsync) keeps a
// count across a restart.
//
// Failures: a count_down whose connection broke or timed out may or may not have run and is not
// repeated (it could count twice): it throws `error` (connection_failed / timeout). Bad counts
// throw invalid_argument with nothing sent; a key of another type, or a string that is not a
// count, throws wrong_type with Redis unchanged.
//
// Thread-safety: one object may be used by many threads at once.
#pragma once

#include <chrono>
#include <string>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"
#include "rlock/detail/waiting/synchronizer.hpp"
#include "rlock/errors.hpp"

namespace rlock {

class count_down_latch : public detail::synchronizer {
    using clock = std::chrono::steady_clock;

public:
    /// Names a latch on `c`; sends nothing. Throws `error` (invalid_argument) for an empty name,
    /// or (Redis Cluster) a name whose key and channel would land in different slots.
    count_down_latch(client& c, const std::string& name)
        // Redisson wraps the name in braces whatever it holds.
        : synchronizer(detail::client_access::core(c), name,
                       "redisson_countdownlatch__channel__{" + name + "}", "latch") {}

    /// Sets the count when the latch has none (its key is absent, i.e. it is at 0) and wakes
    /// the waiters; true when this call set it. `count` must be at least 1.
    bool try_set_count(long long count);

    /// Counts down by `n` (at least 1); the step that reaches 0 deletes the key and wakes every
    /// waiter. Returns the count left (0 once it reached 0; a latch already at 0 stays so).
    long long count_down(long long n = 1);

    /// The count now (0 when the key is absent).
    [[nodiscard]] long long count() const;

    /// True when the count is 0 now (one round trip; std::latch's name).
    [[nodiscard]] bool try_wait() const { return count() <= 0; }

    /// Blocks until the count is 0.
    void wait() const { (void)wait_until_steady(clock::time_point::max()); }

    /// Waits up to `wait` (measured on steady_clock); true when the count reached 0.
    template <class Rep, class Period>
    [[nodiscard]] bool wait_for(const std::chrono::duration<Rep, Period>& wait) const {
        return wait_until_steady(detail::deadline_after(wait));
    }

    /// Waits until `deadline` (any clock; measured on steady_clock from now).
    template <class Clock, class Duration>
    [[nodiscard]] bool wait_until(const std::chrono::time_point<Clock, Duration>& deadline) const {
        return wait_until_steady(detail::to_steady(deadline));
    }

    /// count_down(n), then wait() (std::latch's arrive_and_wait).
    void arrive_and_wait(long long n = 1) {
        (void)count_down(n);
        wait();
    }

    // --- asynchronous forms (docs/api.md, "Asynchronous acquisition") ---------------------
    // Each completes `void(std::exception_ptr, bool)` — true when the count reached 0, false
    // when the wait ran out — for a callback (the call returns an rlock::pending), rlock::
    // use_future (std::future<bool>) or, with <rlock/asio.hpp>, an Asio token. Woken by the
    // count-down message, as wait() is; never inside the call; cancellable.

    /// Completes once the count is 0.
    template <class Token>
    auto async_wait(Token&& token) const {
        return async_wait_steady(detail::call_forever(), std::forward<Token>(token));
    }
    /// Completes once the count is 0 (true) or after `wait` (false).
    template <class Rep, class Period, class Token>
    auto async_wait_for(const std::chrono::duration<Rep, Period>& wait, Token&& token) const {
        return async_wait_steady(detail::call_for(wait), std::forward<Token>(token));
    }
    /// Completes once the count is 0 (true) or at `deadline` (false).
    template <class Clock, class Duration, class Token>
    auto async_wait_until(const std::chrono::time_point<Clock, Duration>& deadline, Token&& token) const {
        return async_wait_steady(detail::call_until(deadline), std::forward<Token>(token));
    }

private:
    template <class Token>
    auto async_wait_steady(detail::wait_call call, Token&& token) const {
        // Each read once: the wait makes a read that failed in an outage again (repeat::safe).
        auto read = [core = core_, name = name_]() -> detail::attempt_result {
            return core->pool.run(name, detail::on_break::fail, [&](const detail::connection& c) {
                return detail::read_count(c, name, core->ep.name) <= 0;
            });
        };
        return synchronizer::async_wait_until<bool>(call, detail::repeat::safe,
                                                    detail::bool_op<decltype(read)>{std::move(read)},
                                                    std::forward<Token>(token));
    }

    bool wait_until_steady(clock::time_point deadline) const;
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL bool count_down_latch::try_set_count(long long count) {
    if (count < 1) bad_count(count, "try_set_count: count must be at least 1");
    return set_count_if_absent(count, detail::latch_new_count_message);
}

RLOCK_DECL long long count_down_latch::count_down(long long n) {
    if (n < 1) bad_count(n, "count_down: n must be at least 1");
    const std::string by = std::to_string(n);
    return run(detail::on_break::fail, [&](const detail::connection& c) {
        return detail::eval_count(c, detail::latch_scripts::count_down(), {name_}, {by, channel_},
                                  name_, server());
    });
}

RLOCK_DECL long long count_down_latch::count() const {
    return run(detail::on_break::retry,
               [&](const detail::connection& c) { return detail::read_count(c, name_, server()); });
}

RLOCK_DECL bool count_down_latch::wait_until_steady(clock::time_point deadline) const {
    // Each read once, not as count() (on_break::retry): the wait makes a read that failed in
    // an outage again itself, so a repeat here would only double what a paused server costs
    // a wait past its deadline.
    return synchronizer::wait_until(deadline, detail::repeat::safe, [&] {
        return run(detail::on_break::fail, [&](const detail::connection& c) {
            return detail::read_count(c, name_, server()) <= 0;
        });
    });
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
