// rlock::fair_lock — Redisson's RFairLock, in C++: a reentrant lock granted first come, first
// served across every client.
//
//     rlock::fair_lock f(redis, "payments");
//     std::lock_guard<rlock::fair_lock> turn(f);   // waits its turn in the queue
//
// A refused locker joins the queue `redisson_lock_queue:{name}` (deadlines in
// `redisson_lock_timeout:{name}`) and waits on its own channel
// `redisson_lock__channel:{name}:<holder id>`; a release wakes exactly the queue head. Nobody
// overtakes a queued waiter: a newcomer finding the lock free but waiters queued joins the end.
//
// Waiters that go away:
//   - one that gives up (try_lock_for timed out, or an error while waiting) leaves the queue
//     before the call returns, and the next in line is woken if the lock is free;
//   - one that died (its process is gone) is evicted once it has not renewed its place for
//     lock_options::fair_lock_wait_timeout (default 5 min, as in Redisson). A live waiter
//     renews it every third of that while it waits, so it is never evicted.
// try_lock() (no wait) never joins the queue.
//
// Everything else — reentry, leases, watchdog, lost holds, fencing, thread-safety — is as for
// rlock::reentrant_lock (same hash layout). Details and the scripts: detail/protocol/fair_kind.hpp.
#pragma once

#include "rlock/client.hpp"
#include "rlock/detail/front/basic_lock.hpp"
#include "rlock/detail/protocol/fair_kind.hpp"
#include "rlock/options.hpp"

namespace rlock {

class fair_lock : public detail::basic_lock<detail::fair_kind> {
public:
    using basic_lock::basic_lock;
};

}  // namespace rlock
