// rlock::reentrant_lock — Redisson's RLock, in C++.
//
//     rlock::reentrant_lock l(redis, "inventory");
//     std::unique_lock<rlock::reentrant_lock> outer(l);
//     std::unique_lock<rlock::reentrant_lock> inner(l);   // same thread: count 2, no wait
//
// In Redis (the Redisson RLock layout, so Java services using Redisson and C++ services using
// rlock exclude each other on the same name): key `name` is a hash with one field,
// "<clientId>:<threadId>" -> reentry count, and a PEXPIRE lease. The final unlock deletes the key
// and publishes `0` on `redisson_lock__channel:{name}`, which wakes Redisson's waiters too.
//
// Re-entry: the same thread may lock again (each lock() needs one unlock()). A re-entry without
// a lease makes the hold watched; a re-entry with a lease on a watched hold keeps it watched;
// a re-entry with a lease on a leased hold restarts the lease. A thread whose hold was lost gets
// `errc::lock_lost` when it tries to re-enter: it must unlock first.
//
// Everything else — leases, watchdog, waiting, lost holds, fencing, thread-safety — and every
// member, blocking and asynchronous, are as for rlock::mutex: mutex.hpp lists them (re-entry
// aside; no local hand-off: each acquisition goes to Redis).
#pragma once

#include "rlock/client.hpp"
#include "rlock/detail/front/basic_lock.hpp"
#include "rlock/detail/protocol/reentrant_kind.hpp"
#include "rlock/options.hpp"

namespace rlock {

class reentrant_lock : public detail::basic_lock<detail::reentrant_kind> {
public:
    using basic_lock::basic_lock;
};

}  // namespace rlock
