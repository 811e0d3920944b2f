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
// Members (from basic_lock): see rlock/detail/front/basic_lock.hpp for the full contract of each.
//   lock / try_lock / try_lock_for / try_lock_until / unlock      TimedLockable
//   is_locked()                  anyone holds it (one round trip)
//   is_held_by_current_thread()  this thread holds it and Redis agrees (one round trip)
//   remaining_lease()            PTTL of the key: zero when free
//   lost()                       this thread's hold is gone (no round trip)
//   force_unlock()               delete whoever holds it, wake waiters
//   fencing_token()              with lock_options::fencing: this hold's token
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
