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
// 1 s. A reconnect makes every waiter look again.
//
// Failures: a count_down whose connection broke or timed out may or may not have run and is not
// repeated (it could count twice): it throws `error` (connection_failed / timeout). Bad counts
// throw invalid_argument with nothing sent; a key of another type, or a string that is not a
// count, throws wrong_type with Redis unchanged.
//
// Thread-safety: one object may be used by many threads at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "rlock/client.hpp"
#include "rlock/detail/channel_wait.hpp"
#include "rlock/detail/cluster.hpp"
#include "rlock/detail/synchronizer_scripts.hpp"
#include "rlock/detail/timed_lockable.hpp"
#include "rlock/errors.hpp"

namespace rlock {

class count_down_latch {
    using clock = std::chrono::steady_clock;

    // Runs f(connection) on the latch's server (its key's master in a cluster). Above the
    // members that call it: its return type is deduced.
    template <class F>
    auto run(detail::on_break broken, F&& f) const {
        core_->throw_if_destroyed(name_, "the client this latch was made from has been destroyed");
        return core_->pool.run(name_, broken, f);
    }

public:
    /// Names a latch on `c`; sends nothing. Throws `error` (invalid_argument) for an empty name,
    /// or (Redis Cluster) a name whose key and channel would land in different slots.
    count_down_latch(client& c, std::string name)
        : core_(detail::client_access::core(c).shared_from_this()),
          // Redisson wraps the name in braces whatever it holds.
          channel_("redisson_countdownlatch__channel__{" + name + "}") {
        if (name.empty()) {
            throw error(errc::invalid_argument, "", core_->ep.name, "latch name is empty");
        }
        if (core_->ep.slots && detail::key_slot(name) != detail::key_slot(channel_)) {
            throw error(errc::invalid_argument, name, core_->ep.name,
                        "in a cluster a latch name with '{' or '}' puts its key and its channel "
                        "in different slots");
        }
        name_ = std::move(name);
    }
    count_down_latch(const count_down_latch&) = delete;
    count_down_latch& operator=(const count_down_latch&) = delete;

    /// Sets the count when the latch has none (its key is absent, i.e. it is at 0) and wakes
    /// the waiters; true when this call set it. `count` must be at least 1.
    bool try_set_count(long long count) {
        if (count < 1) bad_count(count, "try_set_count: count must be at least 1");
        const std::string n = std::to_string(count);
        return run(detail::on_break::fail, [&](const detail::connection& c) {
            return detail::eval_integer(c, detail::latch_scripts::try_set(), {name_}, {n, channel_},
                                        name_, server()) == 1;
        });
    }

    /// Counts down by `n` (at least 1); the step that reaches 0 deletes the key and wakes every
    /// waiter. Returns the count left (0 once it reached 0; a latch already at 0 stays so).
    long long count_down(long long n = 1) {
        if (n < 1) bad_count(n, "count_down: n must be at least 1");
        const std::string by = std::to_string(n);
        return run(detail::on_break::fail, [&](const detail::connection& c) {
            return detail::eval_integer(c, detail::latch_scripts::count_down(), {name_},
                                        {by, channel_}, name_, server());
        });
    }

    /// The count now (0 when the key is absent).
    [[nodiscard]] long long count() const {
        return run(detail::on_break::retry, [&](const detail::connection& c) {
            return detail::read_count(c, name_, server());
        });
    }

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

    const std::string& name() const noexcept { return name_; }
    /// The server as messages name it.
    const std::string& server() const noexcept { return core_->ep.name; }

private:
    [[noreturn]] void bad_count(long long count, std::string_view what) const {
        throw error(errc::invalid_argument, name_, server(),
                    std::string(what) + " (was " + std::to_string(count) + ")");
    }

    bool wait_until_steady(clock::time_point deadline) const {
        return detail::wait_on_channel(*core_, channel_, name_, deadline,
                                       [&] { return count() <= 0; });
    }

    std::shared_ptr<detail::client_core> core_;
    std::string channel_;
    std::string name_;
};

}  // namespace rlock
