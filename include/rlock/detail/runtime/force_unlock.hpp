// rlock::force_unlock on a client: the lock a name's layout shows deleted through its kind's own
// force-unlock script, and the comparison of holders that force_unlock(c, name, expected) makes.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/fair_kind.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/mutex_kind.hpp"
#include "rlock/detail/protocol/read_write_kind.hpp"
#include "rlock/detail/protocol/reentrant_kind.hpp"
#include "rlock/detail/redis/pool.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/errors.hpp"
#include "rlock/lock_info.hpp"

namespace rlock::detail {

/// Whether `a` and `b` show the same holders, as force_unlock(c, name, expected) compares them:
/// the kind, the mode, and the holders' ids and roles in any order; counts and leases may differ.
RLOCK_DECL bool same_holders(const lock_info& a, const lock_info& b);

/// Deletes the lock `name` whoever holds it, through the force-unlock script of the kind its
/// layout shows (`kind`, from inspect): true when a key was deleted. Nothing is sent for
/// not_found. Throws `error`: invalid_argument for a count or permit_expirable layout (a
/// semaphore's permits are not a lock; nothing is deleted), and as the kind's script.
RLOCK_DECL bool force_unlock_as(client_core& core, std::string_view name, lock_kind kind);

/// force_unlock_as for one Kind: its keys for `name`, its script on the master of their slot.
template <class Kind>
bool force_unlock_as(client_core& core, std::string_view name) {
    const lock_keys k = lock_keys_for(Kind::channel_prefix, std::string(name), core.ep.slots != nullptr,
                                      core.ep.name);
    return core.pool.run(
        k.name, on_break::retry, [&](const connection& c) { return Kind::force_unlock(c, k, core.ep.name); },
        Kind::follows_ask);
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL bool same_holders(const lock_info& a, const lock_info& b) {
    if (a.kind != b.kind || a.mode != b.mode || a.holders.size() != b.holders.size()) return false;
    auto keyed = [](const lock_info& i) {
        std::vector<std::pair<std::string, int>> v;
        v.reserve(i.holders.size());
        for (const lock_holder& h : i.holders) v.emplace_back(h.id, static_cast<int>(h.role));
        std::sort(v.begin(), v.end());
        return v;
    };
    return keyed(a) == keyed(b);
}

RLOCK_DECL bool force_unlock_as(client_core& core, std::string_view name, lock_kind kind) {
    switch (kind) {
        case lock_kind::not_found:
            return false;
        case lock_kind::token:
            return force_unlock_as<mutex_kind>(core, name);
        case lock_kind::reentrant:
            return force_unlock_as<reentrant_kind>(core, name);
        case lock_kind::fair:
            return force_unlock_as<fair_kind>(core, name);
        case lock_kind::read_write:
            return force_unlock_as<rw_write_kind>(core, name);
        case lock_kind::count:
        case lock_kind::permit_expirable:
            break;
    }
    throw error(errc::invalid_argument, name, core.ep.name,
                std::string("is a ") +
                    (kind == lock_kind::count ? "semaphore or count_down_latch" : "permit_expirable_semaphore") +
                    ", not a lock: force_unlock deletes locks only; nothing was deleted");
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
