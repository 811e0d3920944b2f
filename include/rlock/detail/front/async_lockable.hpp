// The asynchronous forms of every lock (async_lock, async_try_lock, async_try_lock_for,
// async_try_lock_until), written once: async_lockable<Derived>, as timed_lockable is for the
// blocking ones.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>

#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/waiting/async_lock.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// The asynchronous forms, written once for every lock type. A lock type derives from
/// async_lockable<itself> and supplies (as a friend: it may be private)
///   template <class Token> auto start_async(wait_call call, lease_request lease,
///                                           std::uint64_t owner, Token&& token);
/// with timed_lockable's meaning of call and lease (one attempt's deadline is
/// time_point::min()), and owner 0 for "a new owner".
/// Each form takes a completion token last: a callback `void(std::exception_ptr, rlock::hold)`
/// (returns an rlock::pending), rlock::use_future (returns std::future<rlock::hold>), or with
/// <rlock/asio.hpp> any Asio token. Invalid arguments (a lease not positive or over 100
/// years) and a destroyed client throw `error` from the call itself; everything else
/// completes the operation.
template <class Derived>
class async_lockable {
    static constexpr lease_request watched = lease_request::watched();

public:
    /// Completes with a hold once this (new) owner holds the lock: watched, no time limit.
    template <class Token>
    auto async_lock(Token&& token) {
        return self().start_async(call_forever(), watched, 0, std::forward<Token>(token));
    }
    /// As async_lock(token), with a hold that expires after `lease`, never renewed.
    template <class Rep, class Period, class Token>
    auto async_lock(const std::chrono::duration<Rep, Period>& lease, Token&& token) {
        return self().start_async(call_forever(), checked(lease), 0, std::forward<Token>(token));
    }
    /// As async_lock(token), for `who`: a reentrant kind re-enters when `who` holds it already.
    template <class Token>
    auto async_lock(const owner& who, Token&& token) {
        return self().start_async(call_forever(), watched, who.number(), std::forward<Token>(token));
    }
    template <class Rep, class Period, class Token>
    auto async_lock(const owner& who, const std::chrono::duration<Rep, Period>& lease, Token&& token) {
        return self().start_async(call_forever(), checked(lease), who.number(), std::forward<Token>(token));
    }

    /// One attempt, no wait: completes with a hold, or an empty one when the lock is taken.
    template <class Token>
    auto async_try_lock(Token&& token) {
        return self().start_async(once(), watched, 0, std::forward<Token>(token));
    }
    template <class Token>
    auto async_try_lock(const owner& who, Token&& token) {
        return self().start_async(once(), watched, who.number(),
                                  std::forward<Token>(token));
    }

    /// Waits up to `wait` (steady_clock): a hold, or an empty one when the wait ran out (leaving
    /// nothing behind).
    template <class Rep, class Period, class Token>
    auto async_try_lock_for(const std::chrono::duration<Rep, Period>& wait, Token&& token) {
        return self().start_async(call_for(wait), watched, 0, std::forward<Token>(token));
    }
    template <class Rep, class Period, class Rep2, class Period2, class Token>
    auto async_try_lock_for(const std::chrono::duration<Rep, Period>& wait,
                            const std::chrono::duration<Rep2, Period2>& lease, Token&& token) {
        const auto l = checked(lease);
        return self().start_async(call_for(wait), l, 0, std::forward<Token>(token));
    }
    template <class Rep, class Period, class Token>
    auto async_try_lock_for(const owner& who, const std::chrono::duration<Rep, Period>& wait, Token&& token) {
        return self().start_async(call_for(wait), watched, who.number(), std::forward<Token>(token));
    }
    template <class Rep, class Period, class Rep2, class Period2, class Token>
    auto async_try_lock_for(const owner& who, const std::chrono::duration<Rep, Period>& wait,
                            const std::chrono::duration<Rep2, Period2>& lease, Token&& token) {
        const auto l = checked(lease);
        return self().start_async(call_for(wait), l, who.number(), std::forward<Token>(token));
    }

    /// Waits until `deadline` (any clock; measured on steady_clock from now).
    template <class Clock, class Duration, class Token>
    auto async_try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline, Token&& token) {
        return self().start_async(call_until(deadline), watched, 0, std::forward<Token>(token));
    }
    template <class Clock, class Duration, class Rep, class Period, class Token>
    auto async_try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline,
                              const std::chrono::duration<Rep, Period>& lease, Token&& token) {
        const auto l = checked(lease);
        return self().start_async(call_until(deadline), l, 0, std::forward<Token>(token));
    }
    template <class Clock, class Duration, class Token>
    auto async_try_lock_until(const owner& who, const std::chrono::time_point<Clock, Duration>& deadline,
                              Token&& token) {
        return self().start_async(call_until(deadline), watched, who.number(), std::forward<Token>(token));
    }
    template <class Clock, class Duration, class Rep, class Period, class Token>
    auto async_try_lock_until(const owner& who, const std::chrono::time_point<Clock, Duration>& deadline,
                              const std::chrono::duration<Rep, Period>& lease, Token&& token) {
        const auto l = checked(lease);
        return self().start_async(call_until(deadline), l, who.number(), std::forward<Token>(token));
    }

private:
    Derived& self() { return static_cast<Derived&>(*this); }
    // One attempt: its deadline is time_point::min().
    static wait_call once() {
        return {std::chrono::steady_clock::time_point::min(), std::chrono::steady_clock::now()};
    }
    template <class Rep, class Period>
    lease_request checked(const std::chrono::duration<Rep, Period>& lease) {
        return lease_request::fixed(lease_ms(lease, self().name(), self().server()));
    }
};

/// An async_lockable's start_async for a lock whose acquires start through `start` (red_lock,
/// multi_lock).
template <class Token>
auto start_with(async_start start, wait_call call, lease_request lease, std::uint64_t owner, Token&& token) {
    return initiate<acquire_signature>(std::forward<Token>(token),
                                       [start = std::move(start), call, lease, owner](completion done) {
                                           return start(call, lease, owner, std::move(done));
                                       });
}

}  // namespace rlock::detail
