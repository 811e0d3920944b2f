// The standard TimedLockable forms (lock, try_lock, try_lock_for, try_lock_until, each also
// with a lease), written once for every lock type, and the deadline and lease arithmetic they
// share. A lock type derives from timed_lockable<itself> and supplies one entry point,
// `acquire(call, lease)`.
#pragma once

#include <algorithm>
#include <chrono>
#include <string_view>
#include <type_traits>

#include "rlock/detail/acquisition/lease_request.hpp"
#include "rlock/detail/protocol/limits.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// `lease` in whole milliseconds (rounded up, at least 1). Throws `error` (invalid_argument,
/// naming `lock` and `server`) for a lease that is not positive or longer than max_lease.
template <class Duration>
std::chrono::milliseconds lease_ms(const Duration& lease, std::string_view lock, std::string_view server) {
    if (lease <= Duration::zero()) {
        throw error(errc::invalid_argument, lock, server, "lease must be positive");
    }
    // Compared in floating point: converting a huge lease to milliseconds first would overflow.
    if (std::chrono::duration<double, std::milli>(lease) >
        std::chrono::duration<double, std::milli>(max_lease)) {
        throw error(errc::invalid_argument, lock, server, "lease must be at most 100 years");
    }
    return std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(lease));
}

/// steady_clock deadline `wait` from `now`, saturating (hours::max() means "forever").
template <class Duration>
std::chrono::steady_clock::time_point deadline_after(const Duration& wait,
                                                     std::chrono::steady_clock::time_point now) {
    using clock = std::chrono::steady_clock;
    if (wait <= Duration::zero()) return now;
    const auto room = clock::time_point::max() - now;
    if (std::chrono::duration_cast<std::chrono::duration<double>>(wait) >=
        std::chrono::duration_cast<std::chrono::duration<double>>(room)) {
        return clock::time_point::max();
    }
    return now + std::chrono::ceil<clock::duration>(wait);
}

/// steady_clock deadline `wait` from now, saturating.
template <class Duration>
std::chrono::steady_clock::time_point deadline_after(const Duration& wait) {
    return deadline_after(wait, std::chrono::steady_clock::now());
}

/// A deadline on any clock as a steady_clock one, measured from now. A deadline too far away
/// for steady_clock's nanoseconds (a coarse time_point's max(), in seconds or hours) is never
/// reached (time_point::max()); one long past, or not a number, is past (now). Another clock's
/// deadline is measured from its now in floating point, never converted to nanoseconds
/// whole: a clock's epoch may itself be far away (libstdc++'s file_clock's is in 2174).
template <class Clock, class Duration>
std::chrono::steady_clock::time_point to_steady(const std::chrono::time_point<Clock, Duration>& t) {
    using steady = std::chrono::steady_clock;
    using seconds = std::chrono::duration<double>;
    if constexpr (std::is_same_v<Clock, steady>) {
        const double at = std::chrono::duration_cast<seconds>(t.time_since_epoch()).count();
        const double room =
            std::chrono::duration_cast<seconds>(steady::duration::max()).count() / 2;
        if (!(at > -room)) return steady::now();  // long past, or NaN
        if (at >= room) return steady::time_point::max();
        return std::chrono::time_point_cast<steady::duration>(t);
    } else {
        const auto now = Clock::now();
        const double away = std::chrono::duration_cast<seconds>(t.time_since_epoch()).count() -
                            std::chrono::duration_cast<seconds>(now.time_since_epoch()).count();
        if (!(away > 0)) return steady::now();  // past, or NaN
        return deadline_after(seconds(away));   // saturates at time_point::max()
    }
}

/// The wait_call of each timed form, the call's start read once: waiting for ever, one attempt
/// (its deadline now), up to `wait`, until `deadline` (any clock).
inline wait_call call_forever() {
    return {std::chrono::steady_clock::time_point::max(), std::chrono::steady_clock::now()};
}
inline wait_call call_no_wait() {
    const auto now = std::chrono::steady_clock::now();
    return {now, now};
}
template <class Duration>
wait_call call_for(const Duration& wait) {
    const auto now = std::chrono::steady_clock::now();
    return {deadline_after(wait, now), now};
}
template <class Clock, class Duration>
wait_call call_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    const auto now = std::chrono::steady_clock::now();
    return {to_steady(deadline), now};
}

/// What a lock type gives timed_lockable (as a friend: these may be private):
///   bool acquire(wait_call call, lease_request lease);
///       true when the calling thread now holds the lock. `call.deadline` is time_point::max()
///       for lock() (wait for ever); a deadline already past is one attempt; a listener's wait
///       is told from `call.began`. `lease`: watched
///       (renewed until unlock), or a fixed one already checked by lease_ms.
///   const std::string& name() const;  std::string_view server() const;  (lease errors)
/// read_write_lock's read side maps std::shared_timed_mutex's names onto a second lock object
/// of this kind (its read side), forwarding.
template <class Derived>
class timed_lockable {
    static constexpr lease_request watched = lease_request::watched();

public:
    /// Blocks until the calling thread holds the lock; the hold is watched (renewed until
    /// unlock).
    void lock() { (void)self().acquire(call_forever(), watched); }
    /// As lock(), but the hold expires after `lease` and is never renewed. Throws `error`
    /// (invalid_argument) for a lease not positive or over 100 years; nothing is sent.
    template <class Rep, class Period>
    void lock(const std::chrono::duration<Rep, Period>& lease) {
        const auto l = checked(lease);
        (void)self().acquire(call_forever(), l);
    }
    /// One attempt, no waiting. True when the calling thread now holds the lock (watched).
    [[nodiscard]] bool try_lock() { return self().acquire(call_no_wait(), watched); }
    /// Waits up to `wait` (measured on steady_clock); true when the thread now holds it.
    template <class Rep, class Period>
    [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& wait) {
        return self().acquire(call_for(wait), watched);
    }
    /// As try_lock_for(wait); on success the hold expires after `lease`, never renewed.
    template <class Rep, class Period, class Rep2, class Period2>
    [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& wait,
                                    const std::chrono::duration<Rep2, Period2>& lease) {
        const auto l = checked(lease);
        return self().acquire(call_for(wait), l);
    }
    /// Waits until `deadline` (any clock; measured on steady_clock from now).
    template <class Clock, class Duration>
    [[nodiscard]] bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline) {
        return self().acquire(call_until(deadline), watched);
    }
    /// As try_lock_until(deadline); on success the hold expires after `lease`, never renewed.
    template <class Clock, class Duration, class Rep, class Period>
    [[nodiscard]] bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                      const std::chrono::duration<Rep, Period>& lease) {
        const auto l = checked(lease);
        return self().acquire(call_until(deadline), l);
    }

private:
    Derived& self() { return static_cast<Derived&>(*this); }
    template <class Rep, class Period>
    lease_request checked(const std::chrono::duration<Rep, Period>& lease) {
        return lease_request::fixed(lease_ms(lease, self().name(), self().server()));
    }
};

}  // namespace rlock::detail
