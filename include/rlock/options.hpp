// rlock — options for a client and for a lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlock/errors.hpp"
#include "rlock/events.hpp"

namespace rlock {

/// Which hold a loss report is about. A report can arrive on the watchdog thread after the
/// owner's unlock() returned, when the same thread may hold the same lock again: the hold id
/// tells the two holds apart.
struct lost_hold {
    std::string_view lock;            ///< the lock's name
    std::uint64_t hold_id = 0;        ///< what the owner's `hold_id()` returned for this hold
                                      ///< (unique in the process; 0 when unknown)
    std::uint64_t fencing_token = 0;  ///< the hold's fencing token; 0 without fencing
    /// A renewal was refused with an error (`reason`): the hold is not lost yet, and the
    /// watchdog keeps trying while its lease lasts.
    bool refused = false;
};

/// Called once for each hold that was lost: its lease ran out before the watchdog could renew
/// it, or its key was deleted or taken over, or its unlock could not reach Redis, or its thread
/// exited holding it; and once when a renewal was refused with an error (an ACL's NOPERM, OOM,
/// a script error: that error's code, not lock_lost). `reason` says what happened.
///
/// Either of two forms: `void(const lost_hold& hold, const error& reason)`, or the older
/// `void(std::string_view lock, const error& reason)` (the lock's name only).
///
/// Runs on the client's watchdog thread (or on the thread whose unlock found the loss, or on
/// an exiting thread), outside every rlock-internal lock, so it may call into rlock. It must not
/// throw; an exception is caught and dropped. Keep it short: renewal of other holds waits while
/// it runs.
class lock_lost_handler {
public:
    lock_lost_handler() noexcept = default;
    lock_lost_handler(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor)

    /// From `void(std::string_view lock, const error&)`: told the lock's name only.
    template <class F, std::enable_if_t<std::is_invocable_v<F&, std::string_view, const error&>, int> = 0>
    lock_lost_handler(F f)  // NOLINT(google-explicit-constructor): assigned from lambdas
        : f_([g = std::move(f)](const lost_hold& h, const error& e) mutable { g(h.lock, e); }) {}

    /// From `void(const lost_hold&, const error&)`.
    template <class F,
              std::enable_if_t<!std::is_invocable_v<F&, std::string_view, const error&> &&
                                   std::is_invocable_v<F&, const lost_hold&, const error&>,
                               long> = 0>
    lock_lost_handler(F f)  // NOLINT(google-explicit-constructor): assigned from lambdas
        : f_(std::move(f)) {}

    explicit operator bool() const noexcept { return static_cast<bool>(f_); }
    void operator()(const lost_hold& hold, const error& reason) const { f_(hold, reason); }
    void operator()(std::string_view lock, const error& reason) const {
        f_(lost_hold{lock, 0, 0}, reason);
    }

private:
    std::function<void(const lost_hold&, const error&)> f_;
};

/// A host and port (a sentinel's).
struct server_address {
    std::string host;
    int port = 26379;
};

/// How to reach Redis and how locks behave on this client. Every field has a usable default; a
/// URI fills in the connection fields (see `client_options::from_uri`).
struct client_options {
    std::string host = "127.0.0.1";  ///< host name or IP literal (IPv6 without brackets)
    int port = 6379;
    std::string unix_socket;         ///< when set, connect here instead of host:port
    std::string username;            ///< ACL user; empty: AUTH with the password alone
    std::string password;            ///< empty: no AUTH
    int db = 0;                      ///< SELECT on every connection when not 0

    /// Redis Sentinel. When not empty, `host`, `port` and `unix_socket` are not used: every new
    /// connection asks these sentinels (in order; the first that answers) where the master
    /// named `sentinel_master` is, connects there and checks with ROLE that it is a master. A
    /// failover (the sentinels' `+switch-master`, a READONLY reply or a broken connection)
    /// replaces every connection, the subscriber's included, with one to the new master.
    /// `username`, `password` and `db` apply to the master; the sentinels have their own.
    std::vector<server_address> sentinels;
    std::string sentinel_master;    ///< the name the sentinels monitor the master under
    std::string sentinel_username;  ///< ACL user on the sentinels; empty: AUTH with the password
    std::string sentinel_password;  ///< empty: no AUTH on the sentinels

    /// Redis Cluster. When true, `cluster_nodes` (or, when it is empty, `host`:`port`) are seed
    /// nodes: the client loads the slot map (CLUSTER SLOTS) from the first that answers and
    /// sends each lock's commands to the master that serves the lock's slot. MOVED replies
    /// (a resharding, a failover) update the map, ASK replies (a slot being migrated) are
    /// followed with ASKING, and TRYAGAIN / CLUSTERDOWN or an unreachable master are retried
    /// with a fresh map until command_timeout has passed. `db` must be 0 and `unix_socket`
    /// empty. Every key of a lock hashes to the slot of its name (see docs/design.md).
    bool cluster = false;
    std::vector<server_address> cluster_nodes;  ///< seed nodes (their port: set it)

    /// Redis Cluster: the pub/sub that waiters and releases use, Redisson's
    /// shardedSubscriptionMode. Sharded and classic channels are separate namespaces, so every
    /// rlock and Redisson client of a lock must choose alike, or an unlock wakes nobody (a
    /// waiter then waits out the holder's lease). `automatic` (Redisson's AUTO, its default):
    /// sharded (SSUBSCRIBE / SPUBLISH, on the master of the channel's slot) when the cluster
    /// answers PUBSUB SHARDNUMSUB (Redis 7+), classic otherwise. `sharded` (ON): sharded
    /// always. `classic` (OFF): SUBSCRIBE / PUBLISH, for a deployment whose Redisson clients
    /// set shardedSubscriptionMode OFF. Ignored without `cluster`.
    enum class pubsub { automatic, sharded, classic };
    pubsub cluster_pubsub = pubsub::automatic;

    std::chrono::milliseconds connect_timeout{1000};
    /// Bound on each command round trip, and on waiting for a free pooled connection.
    std::chrono::milliseconds command_timeout{1000};
    std::size_t pool_size = 8;  ///< connections for lock commands (the subscriber and the
                                ///< watchdog have one each besides)

    /// Lease of a watched hold (one taken without an explicit lease). The watchdog renews it
    /// every lock_watchdog_timeout / 3; a client that dies leaves it to expire after this long.
    std::chrono::milliseconds lock_watchdog_timeout{30000};

    /// Losses told at once (docs/design.md): the watchdog's connection asks the server to
    /// track the keys of the holds it renews (CLIENT TRACKING, invalidations to the
    /// subscriber's connection), so that a hold whose key is deleted, flushed, overwritten or
    /// expired is told within milliseconds instead of at the next renewal. Costs one more
    /// subscription and about 100 bytes of server memory per watched hold. false: a loss is
    /// found at the watchdog's next renewal or at unlock, as in Redisson. Not used in a
    /// Cluster (there the watchdog's renewals find a loss).
    bool loss_tracking = true;

    /// Local hand-off (docs/design.md, "Local hand-off"): when a thread of this client unlocks
    /// a mutex that another of its threads waits for, the hold passes to that thread without a
    /// round trip — no release, no unlock message, no new SET NX; the key, its token and its
    /// watchdog renewals stay. Only one thread of the client waits for the lock at Redis at a
    /// time; the others wait in order behind it, in the process. At most
    /// `local_handoff_passes` passes in a row and for at most `local_handoff_time` from the
    /// acquisition at Redis: then the hold is released through Redis, and another client's
    /// waiter has its turn. 0 passes turns it off for the client (lock_options::local_handoff
    /// for one lock). Watched holds of the blocking mutex (lock(), try_lock_for(),
    /// try_lock_until() without a lease) pass; a lease given, fencing, and the other kinds
    /// acquire at Redis every time.
    unsigned local_handoff_passes = 8;
    std::chrono::milliseconds local_handoff_time{10};

    /// Told of every lost hold; may be empty (then only `lost()` tells).
    lock_lost_handler on_lock_lost;

    /// Told what this client's locks do — acquired, released, renewed, renewal refused, lost,
    /// a wait that ran out or was cancelled — for metrics and tracing (events.hpp, which says
    /// on which thread each runs). Null: nothing is measured.
    std::shared_ptr<lock_listener> listener;

    /// Replica sync (opt-in; Redisson's answer to a master lost before its replicas have the
    /// lock). When > 0, every acquire, renewal batch and release of mutex, reentrant_lock,
    /// read_write_lock and fair_lock is followed by `WAIT sync_replicas sync_timeout` on the
    /// same connection. An acquire fewer replicas acknowledged is undone (released) and throws
    /// `replica_sync_failed`: a lock is granted only once it would survive the master's loss. A
    /// renewal or release that falls short is not an error (the hold is still there; a
    /// release not yet replicated leaves a lease to run out after a failover). Each costs one
    /// more round trip. Not applied to red_lock and multi_lock.
    int sync_replicas = 0;
    /// How long WAIT may block; must be positive and shorter than command_timeout.
    std::chrono::milliseconds sync_timeout{500};

    /// Parses `redis://[[user:]password@]host[:port][/db]`, `unix:///path/to.sock[?db=N]` or
    /// `redis-sentinel://[[user:]password@]host[:port][,host[:port]...]/master-name[/db]` (the
    /// sentinels, port 26379 by default; user and password are the master's) or
    /// `redis-cluster://[[user:]password@]host[:port][,host[:port]...]` (seed nodes, port 6379
    /// by default; sets `cluster`) into the connection
    /// fields of a copy of `base` (user and password percent-decoded, IPv6 hosts in brackets).
    /// Throws `error` with `errc::invalid_argument` on a malformed URI.
    /// (Defined in <rlock/client.hpp>, which every lock header includes.)
    static client_options from_uri(std::string_view uri, client_options base);
    static client_options from_uri(std::string_view uri) { return from_uri(uri, {}); }
};

/// Options of a red_lock (red_lock.hpp): Redlock's clock drift, each node's timeout, the pause
/// between rounds.
struct red_lock_options {
    double clock_drift_factor = 0.01;     ///< drift = lease * factor + 2 ms
    double node_timeout_fraction = 0.05;  ///< per-node timeout, as a fraction of the lease
    std::chrono::milliseconds retry_delay{50};  ///< longest random delay between rounds
};

/// Options of a semaphore (semaphore.hpp).
struct semaphore_options {
    /// The number of permits the semaphore has when none is taken, when its users know it
    /// (0: not known, as for Redisson's RSemaphore). With it, a count the server lost (a
    /// restart without persistence, a flush, a DEL) is set back to it by the next acquire or
    /// release instead of leaving every waiter waiting; a release never raises the count above
    /// it; and the holders of permits taken before the loss are told (on_lock_lost: those of
    /// the client that set it back at once, others at their release). Bound (guarantees.md):
    /// until those holders release, up to twice `capacity` may hold at once. Without it, an
    /// acquire that finds the count gone after its client saw it set throws lock_lost.
    long long capacity = 0;
};

/// Per-lock options. An aggregate: C++20 may write `rlock::lock_options{.fencing = true}`,
/// C++17 `rlock::lock_options{true}` or set the member.
struct lock_options {
    /// Each acquisition INCRs `redisson_lock_token:{name}` in the same script and the hold
    /// remembers the value (`fencing_token()`): tokens strictly increase across all clients.
    /// A missing counter (a name's first fenced acquisition, or a server that lost its data)
    /// starts from the server's clock in microseconds, so tokens keep increasing across a data
    /// loss (bound: docs/guarantees.md). Opt-in because that counter key never expires.
    bool fencing = false;

    /// fair_lock only: how long a queued waiter may go without renewing its place before the
    /// others evict it (a waiter that died; once it is the queue's head), and the slot each
    /// waiter holds in the chained deadlines Redisson's RFairLock keeps (its
    /// fairLockWaitTimeout). Live waiters renew it every third of this while they wait.
    /// Redisson's default: 5 minutes.
    std::chrono::milliseconds fair_lock_wait_timeout{300000};

    /// Local hand-off for this lock (client_options::local_handoff_passes): false makes every
    /// acquisition of it go to Redis.
    bool local_handoff = true;
};

}  // namespace rlock
