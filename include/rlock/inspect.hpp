// rlock::inspect, rlock::list_locks, rlock::force_unlock — the operator's view of locks by name:
// what Redis holds for a name, whoever wrote it (rlock, Redisson, redis-py, node-redlock), which
// names have locks, and deleting a stuck lock so that its waiters wake.
//
//     rlock::client redis("redis://127.0.0.1:6380");
//     rlock::lock_info i = rlock::inspect(redis, "orders");
//     if (!i.found()) ...                                  // no key of any lock kind
//     else if (i.kind == rlock::lock_kind::fair)
//         for (const rlock::lock_waiter& w : i.waiters) ...   // the queue, oldest first
//
// The kind comes from the layout alone (lock_info.hpp, lock_kind; the rules are at the top of
// detail/protocol/inspect_layout.hpp and in docs/api.md): classes that write the same layout —
// a mutex and redis-py's Lock, a semaphore and a count_down_latch — are one kind here.
//
// `rlock` (tools/rlock.cpp), installed with the package, is these three calls on the command
// line: `rlock inspect NAME`, `rlock list [PATTERN]`, `rlock force-unlock NAME`.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/runtime/force_unlock.hpp"
#include "rlock/detail/runtime/inspect_scan.hpp"
#include "rlock/errors.hpp"
#include "rlock/lock_info.hpp"

namespace rlock {

/// What Redis holds for `name`: one read-only script reading every key of every kind's layout
/// for the name (in Redis Cluster they share the name's slot; through Sentinel, on the master).
/// Writes nothing, takes no lock, and is not a lock's own query: the answer is the state at the
/// moment the script ran.
///
/// A name with no key is a normal answer: `kind == lock_kind::not_found` (`found()` false).
/// Throws `error`: wrong_type when one of the name's keys holds something no lock kind writes
/// (a list at the name, a hash whose values are not counts, a string beside a fair queue), the
/// message naming the key and the server; invalid_argument for an empty name, and in a Redis
/// Cluster for a name with '{' but no usable hash tag (its keys would land in different slots;
/// nothing is sent); connection_failed / timeout / auth_failed as any command.
/// Thread-safe, as every call on a client.
[[nodiscard]] inline lock_info inspect(client& c, std::string_view name) {
    return detail::inspect_name(detail::client_access::core(c), name);
}

/// The names that have a lock, semaphore or latch in Redis, inspected, sorted by name: a SCAN of
/// every key (every master of a Redis Cluster; otherwise the one server), each name found
/// inspected as inspect() does, one round trip each. `pattern`: a glob as Redis's MATCH takes it
/// (`*`, `?`, `[...]`), matched against names, not keys (empty: every name). A name whose keys are
/// no lock's (wrong_type) is left out, and so is one gone between the scan and its inspection;
/// any string key reads as a token or a count, so a pattern narrows it to the locks on a server
/// that also keeps other strings. A name whose keys the user's ACL does not let it read is left
/// out too (a user limited to `~app:*` lists the locks under `app:`). O(keys on the server): an
/// operator's call, not a hot path. Throws `error` as inspect() does, but never wrong_type.
[[nodiscard]] RLOCK_DECL std::vector<lock_info> list_locks(client& c, const std::string& pattern = {});

/// What force_unlock found and did.
struct forced_unlock {
    lock_info before;      ///< inspect()'s answer just before the delete
    bool deleted = false;  ///< the lock's key was deleted by this call (false: it was free by then)
    /// force_unlock(c, name, expected) only: the lock was no longer held as `expected` showed
    /// it (another kind, other holders); nothing was deleted, and `before` is what it is now.
    bool changed = false;
};

/// Deletes the lock `name` whoever holds it, and wakes its waiters, as the `force_unlock()` of
/// the lock class its layout shows: token -> mutex (`0` on `rlock_lock__channel:{name}`),
/// reentrant -> reentrant_lock, fair -> fair_lock (the queue stays; its head is woken),
/// read_write -> read_write_lock (with every reader's hold keys). Holders on any client find
/// their holds lost at their next renewal. A name not found deletes nothing (`deleted` false).
/// Throws `error`: invalid_argument for a count or permit_expirable name (a semaphore's permits
/// are not a lock; nothing is deleted), wrong_type as inspect(), and as a command.
RLOCK_DECL forced_unlock force_unlock(client& c, std::string_view name);

/// force_unlock() of the lock as `expected` (an earlier inspect() of `name`) shows it: deletes
/// only when the lock still has that kind and those holders (their ids and roles; a renewal or
/// a re-entry by one of them is no change), else deletes nothing and sets `changed`. For an
/// operator who confirms what he saw: the lock may have expired and been taken by a live holder
/// meanwhile. The comparison is made on an inspect() one round trip before the delete, not in
/// the delete's script: a change inside that round trip is not seen.
RLOCK_DECL forced_unlock force_unlock(client& c, std::string_view name, const lock_info& expected);

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL std::vector<lock_info> list_locks(client& c, const std::string& pattern) {
    std::vector<lock_info> out;
    for (const std::string& n : detail::scan_lock_names(detail::client_access::core(c), pattern)) {
        try {
            lock_info i = inspect(c, n);
            if (i.found()) out.push_back(std::move(i));
        } catch (const error& e) {
            // No lock's keys, or (Redis Cluster) a name no lock can have: its keys would land
            // in different slots; or keys the user's ACL does not let it read (SCAN names every
            // key, those outside the user's key patterns too).
            const bool keys_refused =
                e.value() == errc::auth_failed && e.cause().find("NOPERM") != std::string::npos &&
                e.cause().find("key") != std::string::npos;
            if (e.value() != errc::wrong_type && e.value() != errc::invalid_argument && !keys_refused) throw;
        }
    }
    return out;
}

RLOCK_DECL forced_unlock force_unlock(client& c, std::string_view name) {
    forced_unlock out;
    out.before = inspect(c, name);
    out.deleted = detail::force_unlock_as(detail::client_access::core(c), name, out.before.kind);
    return out;
}

RLOCK_DECL forced_unlock force_unlock(client& c, std::string_view name, const lock_info& expected) {
    forced_unlock out;
    out.before = inspect(c, name);
    if (!detail::same_holders(out.before, expected)) {
        out.changed = true;
        return out;
    }
    out.deleted = detail::force_unlock_as(detail::client_access::core(c), name, out.before.kind);
    return out;
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
