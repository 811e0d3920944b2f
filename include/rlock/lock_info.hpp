// The vocabulary of rlock::inspect (inspect.hpp): what the keys of one name in Redis say about
// the lock, semaphore or latch of that name — its kind as the layout shows it, its holders and
// their leases, the fair queue, permits and the fencing counter. Plain data, read at one moment;
// it names no client and keeps no connection.
//
//     rlock::lock_info i = rlock::inspect(redis, "orders");
//     if (i.found()) for (const rlock::lock_holder& h : i.holders) std::cout << h.id << '\n';
//
// docs/api.md, "Inspecting a lock", has the rules by which a kind is recognised.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlock/config.hpp"

namespace rlock {

/// The kind of a name, as its keys in Redis show it. Several classes share a layout (docs/design.md,
/// "Keys in Redis"), so a kind names the layout and the classes that write it.
enum class lock_kind {
    /// None of the name's keys exists (a fencing counter alone may: it never expires).
    not_found,
    /// A string token at `name` (a TTL, or a value that is not an integer): rlock::mutex, a
    /// red_lock node, redis-py's Lock, node-redlock, go-redsync.
    token,
    /// A hash of holder id -> count without `mode`, and no fair queue: rlock::reentrant_lock,
    /// Redisson's RLock — and a fair_lock (RFairLock) held while nobody is queued, whose keys
    /// are then exactly an RLock's.
    reentrant,
    /// A fair queue (`redisson_lock_queue:{name}` or `redisson_lock_timeout:{name}`), with or
    /// without the hash: rlock::fair_lock, Redisson's RFairLock. The hash is absent when the
    /// lock is free and waiters are still queued.
    fair,
    /// A hash with a `mode` field: rlock::read_write_lock, Redisson's RReadWriteLock.
    read_write,
    /// An integer string at `name`, with or without a TTL (Redisson's RSemaphore and
    /// RCountDownLatch are RExpirable): rlock::semaphore (free permits) or
    /// rlock::count_down_latch (its count), Redisson's RSemaphore / RCountDownLatch. Redis holds
    /// the same value for both, so the layout cannot tell them apart. A
    /// permit_expirable_semaphore with no permit taken has this layout too.
    count,
    /// A sorted set `{name}:timeout` of permit ids (with or without the count at `name`):
    /// rlock::permit_expirable_semaphore, Redisson's RPermitExpirableSemaphore.
    permit_expirable,
};

/// The kind's name as `rlock inspect --json` writes it: "not_found", "token", "reentrant",
/// "fair", "read_write", "count", "permit_expirable".
RLOCK_DECL const char* to_string(lock_kind k) noexcept;

/// A remaining time to live: a duration, or none when the key has no expiry.
using remaining_ttl = std::optional<std::chrono::milliseconds>;

/// What a holder is to the inspecting client, as far as the layout tells.
enum class holder_origin {
    unknown,      ///< a holder id or token of any client (a Redisson UUID reads like rlock's)
    rlock,        ///< a token with rlock's `rlock:` mark: an rlock::mutex or red_lock of some client
    this_client,  ///< a holder id that starts with the inspecting client's id (client::id())
};

RLOCK_DECL const char* to_string(holder_origin o) noexcept;

/// How a holder holds.
enum class holder_role {
    exclusive,  ///< the token, or a reentrant / fair lock's hash field
    writer,     ///< read_write_lock: the `<holder id>:write` field
    reader,     ///< read_write_lock: a `<holder id>` field with its own hold keys
};

RLOCK_DECL const char* to_string(holder_role r) noexcept;

/// One holder of a lock.
struct lock_holder {
    /// The token (token kind), or the holder id `<client id>:<thread number>` (the hash kinds;
    /// for a writer without its `:write` suffix).
    std::string id;
    holder_role role = holder_role::exclusive;
    /// The reentry count (its hash field); 1 for a token.
    std::int64_t count = 1;
    /// What is left of the hold: the key's TTL for a token, a hash holder and a writer; for a
    /// reader the longest TTL of its own hold keys (zero when none is left: a dead reader that
    /// the next writer drops). No value: no expiry.
    remaining_ttl lease;
    /// read_write_lock readers: how many of their `count` hold keys still exist.
    std::int64_t live_holds = 0;
    holder_origin origin = holder_origin::unknown;
};

/// One waiter in a fair lock's queue.
struct lock_waiter {
    std::string id;  ///< its holder id, as queued in `redisson_lock_queue:{name}`
    /// Time until its deadline in `redisson_lock_timeout:{name}` (server time); negative when
    /// past, and the waiter is then evicted once it reaches the head. No value: the queue
    /// entry has no deadline (dropped when it reaches the head).
    std::optional<std::chrono::milliseconds> deadline_in;
    holder_origin origin = holder_origin::unknown;
};

/// One taken permit of a permit_expirable_semaphore.
struct permit_info {
    /// The permit id in its public form (lowercase hex of the stored bytes), as
    /// permit_expirable_semaphore::release(id) and Redisson's release(permitId) take it.
    std::string id;
    /// Time until its lease ends (server time); zero or negative when ended, and the permit is
    /// given back by the next acquire. No value: a Redisson permit taken without a lease
    /// (permanent).
    remaining_ttl lease;
};

/// What Redis holds for one name (rlock::inspect).
struct lock_info {
    std::string name;    ///< the name inspected
    std::string server;  ///< the server that answered (client::server(); with Redis Cluster the client's seeds)
    lock_kind kind = lock_kind::not_found;
    /// The TTL of the key `name`; no value when it has none or does not exist.
    remaining_ttl ttl;
    /// Holders, in the hash's order (a token: one). Empty when nobody holds it.
    std::vector<lock_holder> holders;
    /// read_write_lock: "read" or "write"; empty otherwise.
    std::string mode;
    /// fair kind: the queue, oldest first.
    std::vector<lock_waiter> waiters;
    /// count kind: the integer at `name`; permit_expirable: the free permits stored there (0
    /// when absent), not counting taken permits whose lease has ended.
    std::optional<std::int64_t> count;
    /// permit_expirable: the taken permits, the soonest to end first.
    std::vector<permit_info> permits;
    /// `redisson_lock_token:{name}`: the last fencing token handed out for this name, when the
    /// name was ever locked with lock_options::fencing (the counter never expires).
    std::optional<std::int64_t> fencing_counter;

    [[nodiscard]] bool found() const noexcept { return kind != lock_kind::not_found; }
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL const char* to_string(lock_kind k) noexcept {
    switch (k) {
        case lock_kind::not_found:
            return "not_found";
        case lock_kind::token:
            return "token";
        case lock_kind::reentrant:
            return "reentrant";
        case lock_kind::fair:
            return "fair";
        case lock_kind::read_write:
            return "read_write";
        case lock_kind::count:
            return "count";
        case lock_kind::permit_expirable:
            return "permit_expirable";
    }
    return "unknown";
}

RLOCK_DECL const char* to_string(holder_origin o) noexcept {
    switch (o) {
        case holder_origin::unknown:
            return "unknown";
        case holder_origin::rlock:
            return "rlock";
        case holder_origin::this_client:
            return "this_client";
    }
    return "unknown";
}

RLOCK_DECL const char* to_string(holder_role r) noexcept {
    switch (r) {
        case holder_role::exclusive:
            return "exclusive";
        case holder_role::writer:
            return "writer";
        case holder_role::reader:
            return "reader";
    }
    return "exclusive";
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
