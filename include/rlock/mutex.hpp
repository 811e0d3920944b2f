// rlock::mutex — the standard single-instance Redis lock.
//
//     rlock::client redis("redis://127.0.0.1:6380");
//     rlock::mutex m(redis, "orders");
//     {
//         std::lock_guard<rlock::mutex> guard(m);   // blocks until held; watched (renewed)
//         ...                                      // critical section
//     }                                            // released; waiters wake at once
//
// In Redis: key `name` holds a token — `rlock:` and 128 random bits (from the OS CSPRNG) as 32
// hex digits — set with SET NX PX; release and renewal compare the token (compare-and-delete /
// compare-and-pexpire scripts), and release publishes `0` on `rlock_lock__channel:{name}`. The
// same layout as redis-py's Lock, node-redlock and go-redsync, so an rlock::mutex and those
// clients exclude each other.
//
// Not reentrant: a thread that holds the mutex and locks it again gets `rlock::error` with
// `errc::would_deadlock` at once rather than waiting for itself. Use rlock::reentrant_lock for
// nested locking.
//
// Holds:
//   lock(), try_lock(), try_lock_for(wait), try_lock_until(t)   watched: lease =
//        client_options::lock_watchdog_timeout, renewed every third of it until unlock
//   lock(lease), try_lock_for(wait, lease), try_lock_until(t, lease)   leased: expires after
//        `lease`, never renewed; lost() turns true once it has run out
//
// Waiting: a refused locker subscribes to the lock's channel (through the client's one
// subscriber connection), tries again, then sleeps until the unlock message or the holder's
// remaining TTL, whichever comes first. It never polls on a fixed interval. The one exception
// is a holder of another library (redis-py, node-redlock, go-redsync: a token without the
// `rlock:` mark), which deletes the key without publishing: behind it the waiter also tries
// again after 1 ms, doubling to 100 ms, from 1 ms again when the holder changes — so such a
// release costs it about 100 ms, not the holder's TTL.
//
// Thread-safety: one mutex object may be shared by many threads (like std::mutex); a hold
// belongs to the thread that took it, and only that thread may unlock it.
//
// Members. Every blocking call throws rlock::error naming the lock and the server: would_deadlock
// (this thread holds it already), connection_failed (the client was destroyed, or an outage
// outlasted the wait), timeout, wrong_type (the key holds something else), invalid_argument
// (a lease not positive or over 100 years; nothing sent).
//
//   void lock()                       blocks until this thread holds it; watched
//   void lock(lease)                  the same; the hold expires after `lease`, never renewed
//   bool try_lock()                   one attempt, no wait (watched); true when held
//   bool try_lock_for(wait[, lease])  waits up to `wait` (steady_clock); true when held
//   bool try_lock_until(t[, lease])   waits until `t` (any clock, measured on steady_clock)
//   void unlock()                     releases this thread's hold: deletes the key, publishes the
//        unlock message, and (local hand-off, client_options::local_handoff_passes) may instead
//        pass the hold to the next waiting thread of this client with no round trip. Throws
//        not_owner only when this thread holds none; a hold found lost or a Redis that cannot
//        be reached is told through on_lock_lost (once), never thrown, so a guard's destructor
//        never throws. The hold is out of the watchdog before it returns.
//   bool is_locked() const            anyone holds it (EXISTS; one round trip)
//   bool is_held_by_current_thread() const   this thread has a hold not lost by this client's
//        clock, and Redis confirms it (one round trip)
//   milliseconds remaining_lease() const     the key's PTTL: zero when free
//   bool lost() const                 this thread's hold is gone: the watchdog found it gone,
//        its lease ran out by this client's clock, or its final unlock found it lost (until
//        the thread takes it again). Sends nothing.
//   bool force_unlock()               deletes it whoever holds it and wakes the waiters; true
//        when it was held. Holders on this client find their holds lost at the next renewal.
//   std::uint64_t fencing_token() const      with lock_options::fencing: the token this hold's
//        acquisition INCRed (invalid_argument without fencing, not_owner without a hold)
//   std::uint64_t hold_id() const     this hold's id, as on_lock_lost names it (not_owner
//        without a hold). No round trip.
//   const std::string& name() const; const std::string& server() const
//
// Asynchronous forms (docs/api.md, "Asynchronous acquisition"), each with a completion token
// last — a callback void(std::exception_ptr, rlock::hold) (returns rlock::pending),
// rlock::use_future (std::future<rlock::hold>), or with <rlock/asio.hpp> any Asio token:
//   async_lock(token), async_lock(lease, token), async_lock(owner, token)
//   async_try_lock(token), async_try_lock_for(wait[, lease], token),
//   async_try_lock_until(t[, lease], token)
// An empty hold means the wait ran out (leaving nothing behind); the hold releases the lock
// when it is destroyed or unlocked.
#pragma once

#include "rlock/client.hpp"
#include "rlock/detail/front/basic_lock.hpp"
#include "rlock/detail/protocol/mutex_kind.hpp"
#include "rlock/options.hpp"

namespace rlock {

class mutex : public detail::basic_lock<detail::mutex_kind> {
public:
    using basic_lock::basic_lock;
};

}  // namespace rlock
