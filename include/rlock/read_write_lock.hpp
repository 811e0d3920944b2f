// rlock::read_write_lock — Redisson's RReadWriteLock, in C++; SharedTimedLockable.
//
//     rlock::read_write_lock rw(redis, "catalog");
//     {
//         std::shared_lock<rlock::read_write_lock> read(rw);   // many readers at once
//     }
//     {
//         std::unique_lock<rlock::read_write_lock> write(rw);  // one writer, no readers
//     }
//
// The write side is lock() / try_lock*() / unlock(); the read side lock_shared() /
// try_lock_shared*() / unlock_shared(); each has the lease overloads of rlock::mutex (a hold
// with a lease expires after it and is never renewed; one without is watched).
//
// Rules:
//   - many readers at once; a writer excludes readers and other writers;
//   - reentrant on both sides (per thread);
//   - the write holder may also take the read side, then release the write side: a downgrade.
//     Waiting readers are woken when it completes;
//   - a thread holding only the read side that asks for the write side gets `rlock::error` with
//     `errc::would_deadlock` at once instead of waiting for itself;
//   - every read hold has its own expiry key, renewed only by its own client's watchdog, so a
//     crashed reader's share expires on its own lease even while other readers live: a writer
//     is never blocked by a dead reader for longer than that reader's lease.
//   - readers entering while a writer waits are let in (as in Redisson): a steady stream of
//     readers can keep a writer waiting.
//
// In Redis: see rlock/detail/protocol/read_write_kind.hpp (Redisson's layout; the channel is
// `redisson_rwlock:{name}`: `0` when the last reader leaves, `1` when the writer leaves).
//
// Thread-safety: as rlock::mutex — share the object freely; a hold belongs to its thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "rlock/client.hpp"
#include "rlock/detail/front/async_lockable.hpp"
#include "rlock/detail/front/basic_lock.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/read_write_kind.hpp"
#include "rlock/options.hpp"

namespace rlock {

class read_write_lock : public detail::timed_lockable<read_write_lock>,
                        public detail::async_lockable<read_write_lock> {
public:
    using write_side = detail::basic_lock<detail::rw_write_kind>;
    using read_side = detail::basic_lock<detail::rw_read_kind>;

    /// Names a lock on `c`; sends nothing. Throws `error` (invalid_argument) for an empty name.
    read_write_lock(client& c, const std::string& name, lock_options options = {})
        : write_(c, name, options), read_(c, name, options) {}

    // --- write side (exclusive) -------------------------------------------------------------
    // lock(), try_lock(), try_lock_for(), try_lock_until() (timed_lockable) take the write side
    // (exclusive). They throw would_deadlock when the thread holds only the read side.

    /// Leaves one write level; the last publishes `1` (wakes every waiter). Throws not_owner
    /// only to a thread without a write hold; never throws for runtime failures.
    void unlock() { write_.unlock(); }

    // --- read side (shared) -----------------------------------------------------------------
    // std::shared_timed_mutex's names. A read level is shared with other readers; a writer
    // waits for every reader to leave. Each call throws what the write side's throws, except
    // would_deadlock: a thread may hold both sides (a writer taking the read side is the first
    // step of a downgrade). Waits end on the unlock message or the holder's TTL, never a poll.

    /// Blocks until this thread holds a read level (no time limit); the hold is watched (renewed
    /// until unlock_shared). Throws lock_lost on re-entry of a lost read hold, connection and
    /// server errors (connection_failed also when the client is destroyed while waiting).
    void lock_shared() { read_.lock(); }
    /// As lock_shared(), but the level expires after `lease` and is never renewed. Throws
    /// invalid_argument for a lease not positive or over 100 years (nothing sent).
    template <class Rep, class Period>
    void lock_shared(const std::chrono::duration<Rep, Period>& lease) { read_.lock(lease); }
    /// One attempt, no wait: true when this thread now holds a read level (watched).
    [[nodiscard]] bool try_lock_shared() { return read_.try_lock(); }
    /// Waits up to `wait` (steady_clock) for a read level: true when held (watched), false when
    /// the wait ran out, leaving nothing behind.
    template <class Rep, class Period>
    [[nodiscard]] bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& wait) {
        return read_.try_lock_for(wait);
    }
    /// As try_lock_shared_for(wait), with a level that expires after `lease`, never renewed.
    template <class Rep, class Period, class Rep2, class Period2>
    [[nodiscard]] bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& wait,
                                           const std::chrono::duration<Rep2, Period2>& lease) {
        return read_.try_lock_for(wait, lease);
    }
    /// Waits until `t` for a read level (a deadline on another clock is converted to
    /// steady_clock once, so later wall-clock jumps do not move it).
    template <class Clock, class Duration>
    [[nodiscard]] bool try_lock_shared_until(const std::chrono::time_point<Clock, Duration>& t) {
        return read_.try_lock_until(t);
    }
    /// As try_lock_shared_until(t), with a level that expires after `lease`, never renewed.
    template <class Clock, class Duration, class Rep, class Period>
    [[nodiscard]] bool try_lock_shared_until(const std::chrono::time_point<Clock, Duration>& t,
                                             const std::chrono::duration<Rep, Period>& lease) {
        return read_.try_lock_until(t, lease);
    }
    /// The read side's asynchronous forms: async_lock's (async_lock.hpp, docs/api.md), each
    /// completing with a hold of one read level.
    template <class... Args>
    auto async_lock_shared(Args&&... args) {
        return read_.async_lock(std::forward<Args>(args)...);
    }
    template <class... Args>
    auto async_try_lock_shared(Args&&... args) {
        return read_.async_try_lock(std::forward<Args>(args)...);
    }
    template <class... Args>
    auto async_try_lock_shared_for(Args&&... args) {
        return read_.async_try_lock_for(std::forward<Args>(args)...);
    }
    template <class... Args>
    auto async_try_lock_shared_until(Args&&... args) {
        return read_.async_try_lock_until(std::forward<Args>(args)...);
    }

    /// Leaves one read level (and deletes that level's key); the last reader out deletes the
    /// lock and publishes `0`. One round trip; before it returns the level is out of the
    /// watchdog. Throws not_owner only to a thread without a read hold; a lost hold or an
    /// unreachable Redis is told through on_lock_lost instead, so it never throws in a guard.
    void unlock_shared() { read_.unlock(); }

    // --- queries ----------------------------------------------------------------------------
    /// Anyone holds either side (one round trip).
    [[nodiscard]] bool is_locked() const { return write_.is_locked(); }
    /// This thread holds the write side and Redis agrees (one round trip).
    [[nodiscard]] bool is_held_by_current_thread() const { return write_.is_held_by_current_thread(); }
    /// This thread holds the read side and Redis agrees (one round trip).
    [[nodiscard]] bool is_held_shared_by_current_thread() const {
        return read_.is_held_by_current_thread();
    }
    /// PTTL of the lock hash: zero when free.
    [[nodiscard]] std::chrono::milliseconds remaining_lease() const { return write_.remaining_lease(); }
    /// This thread's write hold is lost (no round trip). False without a write hold.
    [[nodiscard]] bool lost() const { return write_.lost(); }
    /// This thread's read hold is lost (no round trip). False without a read hold.
    [[nodiscard]] bool lost_shared() const { return read_.lost(); }
    /// Deletes the lock, every reader's hold keys included, and wakes all waiters.
    bool force_unlock() { return write_.force_unlock(); }
    /// Fencing token of this thread's write / read hold (lock_options::fencing).
    [[nodiscard]] std::uint64_t fencing_token() const { return write_.fencing_token(); }
    [[nodiscard]] std::uint64_t fencing_token_shared() const { return read_.fencing_token(); }
    /// Id of this thread's write / read hold, as on_lock_lost is told it (lost_hold::hold_id).
    /// Throws `error` (not_owner) without such a hold.
    [[nodiscard]] std::uint64_t hold_id() const { return write_.hold_id(); }
    [[nodiscard]] std::uint64_t hold_id_shared() const { return read_.hold_id(); }

    const std::string& name() const noexcept { return write_.name(); }
    write_side& writer() noexcept { return write_; }
    read_side& reader() noexcept { return read_; }

private:
    friend class detail::timed_lockable<read_write_lock>;
    friend class detail::async_lockable<read_write_lock>;
    bool acquire(detail::wait_call call, detail::lease_request lease) { return write_.acquire(call, lease); }
    template <class Token>
    auto start_async(detail::wait_call call, detail::lease_request lease, std::uint64_t owner, Token&& token) {
        return write_.start_async(call, lease, owner, std::forward<Token>(token));
    }
    std::string_view server() const noexcept { return write_.server(); }
    // As a multi_lock part it is its write side.
    friend struct detail::part_access;
    detail::part_view as_part() { return detail::part_access::view(write_); }

    write_side write_;
    read_side read_;
};

}  // namespace rlock
