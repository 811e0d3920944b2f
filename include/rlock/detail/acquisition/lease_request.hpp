// The lease an acquisition asks for, as one value: watched, or a fixed duration.
#pragma once

#include <chrono>

namespace rlock::detail {

/// The lease an acquisition asks for: watched (held until unlocked, its key's expiry renewed by
/// the client's watchdog, each renewal for lock_watchdog_timeout) or a fixed duration, never
/// renewed. Every lock call turns its arguments into one (timed_lockable, async_lockable), and
/// everything below asks it, instead of reading "0 ms" as "watched".
class lease_request {
public:
    /// Watched.
    constexpr lease_request() noexcept = default;
    static constexpr lease_request watched() noexcept { return {}; }
    /// A fixed lease of `duration`, which is positive (lease_ms checks what a user gives).
    static constexpr lease_request fixed(std::chrono::milliseconds duration) noexcept {
        lease_request l;
        l.fixed_ = duration;
        return l;
    }

    constexpr bool is_watched() const noexcept { return fixed_.count() == 0; }
    /// The fixed duration (0 when watched).
    constexpr std::chrono::milliseconds fixed_duration() const noexcept { return fixed_; }
    /// What each acquisition asks Redis for: `watchdog_timeout` when watched, else the fixed
    /// duration.
    constexpr std::chrono::milliseconds duration(std::chrono::milliseconds watchdog_timeout) const noexcept {
        return is_watched() ? watchdog_timeout : fixed_;
    }

private:
    std::chrono::milliseconds fixed_{0};  // 0: watched (never a fixed lease: those are >= 1 ms)
};

}  // namespace rlock::detail
