// The watchdog: one thread per client that renews every watched hold each
// lock_watchdog_timeout / 3, in batched scripts pipelined per server, and tells the owner of
// each hold it finds lost. A broken connection asks it for a tick at once (verify_soon): the
// server may have come back without the holds. Where the server tells key changes
// (loss_watch.hpp), its connection reads every hold's key after renewing it, and an
// invalidation of a held key asks it to renew that hold at once (suspect): a hold deleted,
// overwritten, flushed or expired is told within milliseconds. Leased holds are read and
// verified likewise, by a check that renews nothing (check_leased). In a Redis Cluster it keeps,
// per master, a tracked connection that renews and reads the holds of that master's slots and
// a connection their invalidations are redirected to.
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/pool.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/deferred_undos.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/detail/runtime/loss_watch.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

class watchdog {
public:
    using clock = std::chrono::steady_clock;
    static constexpr std::size_t renew_batch = 100;

    /// How soon a hold newly taken is read on the tracked connection (armed), once it still
    /// exists: holds shorter than this never cost the server a read.
    static constexpr std::chrono::milliseconds arm_delay{25};
    /// Polls in a row without a hold after which the watchdog stops polling (about
    /// 100 ms): a lock taken now and then does not keep it waking 40 times a second.
    static constexpr unsigned idle_after = 4;

    /// `route`: where the server's invalidations go (null: detection off). In a cluster the
    /// watchdog has them sent to connections of its own, one per master (tracked_node), and
    /// uses `route` only to tell a refusal once.
    watchdog(const endpoint& ep, detail::pool& p, registry& reg, tracking_route* route = nullptr)
        : ep(ep), pool(p), reg(reg), events_(ep.options.listener), route_(ep.slots ? nullptr : route),
          cluster_route_(ep.slots ? route : nullptr) {
        if (route) reg.on_added([this] { wake(); });
    }
    watchdog(const watchdog&) = delete;
    watchdog& operator=(const watchdog&) = delete;

    /// Starts the thread. It keeps `owner` (the client's core) alive while it runs, so that a
    /// client destroyed from inside on_lock_lost, on this thread, is freed after it has left.
    void start(std::shared_ptr<const void> owner);

    /// Asks the thread to stop after its current tick, without waiting for it.
    void request_stop();

    /// Stops the thread and waits for it (detaches it when called on it).
    void stop();

    /// Wakes the thread to look again (a hold was added while it did not poll).
    void wake() noexcept;

    /// Asks for a tick now rather than at the next period (see client_core::verify_holds_soon).
    void verify_soon() noexcept;

    /// Keeps `undo`, which its waiter could not do with the server out of reach, and tries it
    /// again at the thread's retry pace until it is done or `until` passes (deferred_undos),
    /// and once more when the thread stops (the client is destroyed).
    void defer(std::string key, deferred_undos::step undo, clock::time_point until);
    /// Forgets the undo kept under `key` (deferred_undos::forget).
    void forget_undo(const std::string& key) { undos_.forget(key); }

    /// The server invalidated `keys` (or, `flushed`, every key): the holds of those keys are
    /// renewed now, which tells the owner of one that is gone (on the subscriber's thread).
    /// No keys and not `flushed`: only wakes the watchdog (the route has just come up: holds
    /// are armed from now on).
    void suspect(const std::vector<std::string>& keys, bool flushed) noexcept;

    /// One watchdog tick: renews every watched hold, in batches of up to `renew_batch` holds of
    /// one kind (and, in a cluster, one slot) per script call, all calls to one server
    /// pipelined: on the watchdog's connection, or (Redis Cluster) on a pooled connection to
    /// each master. `conn_epoch` is the endpoint epoch `conn` was opened in (Sentinel: a stale
    /// one is replaced). False when a connection failed (not when a hold was gone, nor on an
    /// error reply): then the watchdog tries again soon.
    /// Which holds a tick renews: every one (a period's tick, a verify), or those whose key was
    /// invalidated.
    struct selection {
        bool all = true;
        std::vector<std::string> keys;  // sorted
        bool tracks = true;  // the connection is tracked and the holds armed (loss_watch.hpp)

        bool picks(const hold& h) const;
    };

    /// Checks the leased holds `pick` chooses (their key changed; loss_watch.hpp) with their
    /// kinds' renewal scripts at lease "0", which write nothing, and reads them again on the
    /// tracked connection. One that is gone before its lease ran out is lost, and its owner
    /// told. False when a connection failed.
    bool check_leased(context_ptr& conn, std::uint64_t& conn_epoch, const selection& pick);

    /// One tick of every hold on `conn`, without tracking (bench/footprint times it from its
    /// own thread: the tracking state is the watchdog thread's).
    bool renew_all(context_ptr& conn, std::uint64_t& conn_epoch) {
        selection all;
        all.tracks = false;
        return renew_all(conn, conn_epoch, all);
    }
    bool renew_all(context_ptr& conn, std::uint64_t& conn_epoch, const selection& pick);


private:
    /// One renew script call: holds [first, first + count) of the tick's list, all of one kind
    /// and one slot.
    struct batch {
        script_call call;
        std::size_t first = 0, count = 0;
        int slot = 0;
    };
    /// Redis Cluster: the batches of one master (`master` empty: a slot the map does not know).
    struct node_batches {
        std::string at;
        std::optional<server_address> master;
        std::vector<batch*> list;
    };
    /// What one watchdog tick found, per hold, and the last failure.
    struct renewal {
        explicit renewal(std::size_t n) : ok(n, 0), gone(n, 0), refusal(n, 0) {}
        std::vector<char> ok, gone;
        // Per hold: 0, or 1 + the index in `refusals` of the error its renewal was refused with
        // (an ACL's NOPERM, OOM, a script error): not "gone", and told as that error.
        std::vector<std::size_t> refusal;
        std::vector<error> refusals;
        std::vector<batch> batches;
        std::string lease;  // the calls point into it
        std::optional<error> failure;
        // Redis Cluster: a node said TRYAGAIN or CLUSTERDOWN to the end, or redirected batches
        // were left for want of time
        bool retry_soon = false;
    };

    /// The watchdog's connection, (re)opened when it is missing, was closed, or belongs to an
    /// endpoint epoch gone by (Sentinel). `tracks`: the watchdog thread's own (not a bench's).
    void ensure_open(context_ptr& conn, std::uint64_t& conn_epoch, bool tracks);

    /// Arms the holds (watched, or leased with lease left) not armed yet and taken arm_delay
    /// ago or more: a read of their keys on the tracked connection, no renewal. A key already
    /// gone (fewer exist than asked) makes its hold a suspect, renewed (or, leased, checked) at
    /// once. False when the server could not be reached.
    bool arm_fresh(context_ptr& conn, std::uint64_t& conn_epoch);

    /// Turns tracking on for `c` (invalidations to the subscriber's connection, the
    /// connection's own writes not told) when it is not on yet for this connection and the
    /// route's current epoch. True when `c` is tracked. A refusal (an ACL, a server before
    /// Redis 6) leaves detection off until the route changes, told once; a broken connection
    /// throws.
    bool track(redisContext* c);

    /// Reads the keys of `holds` (those `ok` says) on the tracked connection `c` — after their
    /// renewal (a write there stops the server tracking them for it), or newly taken: from now
    /// on their change is told.
    void arm(const connection& c, const std::vector<registry::hold_ptr>& holds, const std::vector<char>& ok);

    /// Sorts `holds` by slot (in a cluster) and kind, and cuts them into script calls.
    /// `lease`: the renewal's, in ms as text; "0" checks without renewing (check_leased).
    void make_batches(std::vector<registry::hold_ptr>& holds, renewal& r, std::string lease) const;

    /// Pipelines `list` on `c` and records each renewal. A call a cluster node redirected
    /// (MOVED, ASK, TRYAGAIN) goes to `redirected` when given, to be sent on its own; any
    /// other error reply, and a broken connection, throw.
    void send_batches(const connection& c, const std::vector<batch*>& list,
                      const std::vector<registry::hold_ptr>& holds, renewal& r,
                      std::vector<batch*>* redirected) const {
        write_batches(c, list);
        read_batches(c, list, holds, r, redirected);
    }
    /// send_batches' two halves: the calls written (flushed: the server runs them now)...
    void write_batches(const connection& c, const std::vector<batch*>& list) const;
    /// ...and their replies read and recorded.
    void read_batches(const connection& c, const std::vector<batch*>& list,
                      const std::vector<registry::hold_ptr>& holds, renewal& r,
                      std::vector<batch*>* redirected) const;

    /// Records the reply of one renew call: per hold 1 renewed, 0 gone, or an error (the
    /// whole call's, or one hold's) that refused it. No reply at all throws.
    void record(const redisReply* reply, const batch& b, const std::vector<registry::hold_ptr>& holds,
                renewal& r, const connection& c) const;

    /// Redis Cluster: the batches of each master pipelined on its tracked connection
    /// (`tracks`, then the holds renewed are read there) or on a pooled connection to it; a
    /// batch redirected there (its slot has moved) is sent again on its own, where the pool
    /// follows the redirection. A master that fails does not stop the others' renewals.
    void renew_in_cluster(const std::vector<registry::hold_ptr>& holds, renewal& r, bool tracks);

    // ---- Redis Cluster: tracking per master (loss_watch.hpp) ----

    /// A master's two connections, the watchdog thread's own: `conn` renews and reads the holds
    /// of the master's slots, tracked, its invalidations redirected to `listen`, which listens
    /// for them (RESP2: a subscribed connection cannot read keys). Kept while both work.
    struct tracked_node {
        server_address at;
        std::string name;
        context_ptr conn, listen;
        bool refused = false;  // the node refused tracking: its holds are renewed through the pool
    };

    /// The tracked pair of master `at`, opened when missing. Null when the node refused what
    /// tracking needs (told once: losses there are found by the ticks). Throws when it cannot
    /// be reached.
    tracked_node* node_at(const server_address& at);

    /// Forgets a pair that failed; every hold is renewed and read again (an invalidation may
    /// have gone by unseen).
    void drop_node(const tracked_node* t);

    /// The pair of master `at` if the watchdog has one (or knows it refused), else null.
    tracked_node* find_node(const server_address& at) const;

    /// Renews each master's batches on its tracked connection and reads the holds renewed;
    /// batches a node redirected go to `redirected`, masters that cannot be tracked (refused,
    /// broken, unknown) to `through_pool`. Every master whose pair is open is sent its
    /// renewals before any reply is read, so that a master that does not answer (paused, a
    /// full backlog) delays no other master's renewals; pairs opened now come after those.
    void renew_on_tracked(std::vector<node_batches>& per_node, const std::vector<registry::hold_ptr>& holds,
                          renewal& r, std::vector<batch*>& redirected, std::vector<node_batches*>& through_pool);

    /// Reads the replies of `list`, written on t's tracked connection, and reads the holds
    /// renewed. False when the pair failed (dropped) in a way the pool's connection may not:
    /// the caller renews through the pool.
    bool finish_tracked(tracked_node& t, const std::vector<batch*>& list,
                        const std::vector<registry::hold_ptr>& holds, renewal& r, std::vector<batch*>& redirected);

    /// A master that did not answer within command_timeout is not asked again through the
    /// pool in the same tick (it would cost the tick a second timeout, and every master after
    /// it its renewal): the failure is the tick's, tried again soon. True when `e` is that.
    static bool gave_up_on(const error& e, renewal& r);

    /// Reads the keys of `holds` (those `which` says) on t's tracked connection, one EXISTS
    /// each (a cluster refuses one over several slots). A key gone makes its hold a suspect. A
    /// key the node redirects stays unarmed, to be read at the next poll where the slot is
    /// then (MOVED updates the map; under ASK, a migration, until it ends); another error
    /// reply (an ACL) leaves it to the ticks.
    void arm_each(tracked_node& t, const std::vector<registry::hold_ptr>& holds, const std::vector<char>& which);

    /// Arms the holds taken arm_delay ago or more and not armed yet, on the tracked
    /// connection of their slot's master. Holds of a master that refused tracking count as
    /// armed (nothing more can be done for them). False when a master could not be reached.
    bool arm_fresh_in_cluster();

    /// Reads what the masters' listening connections have: the keys invalidated become
    /// suspects. A pair that broke is dropped, and every hold renewed and read again.
    void drain_in_cluster();

    void loop();

    const endpoint& ep;
    detail::pool& pool;
    registry& reg;
    event_sink events_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    bool verify_ = false;  // verify_soon() asked for a tick now
    std::vector<std::string> suspects_;  // keys invalidated since the last tick
    bool poke_ = false;                  // suspect() was called: look at once
    bool woken_ = false;                 // wake() was called (a hold after idling)
    bool deferred_ = false;              // defer() was called: schedule its first retry
    deferred_undos undos_;
    // Server-assisted detection (loss_watch.hpp); the rest is the watchdog thread's own.
    tracking_route* const route_;
    // Redis Cluster: the route, for telling a refusal once (null: detection off, or not a
    // cluster), and the masters' tracked pairs.
    tracking_route* const cluster_route_;
    std::vector<std::unique_ptr<tracked_node>> nodes_;
    bool cluster_armed_ = false;  // a hold has been armed: a master's new pair reads every hold
    unsigned empty_polls_ = 0;          // polls in a row that found no hold
    std::uint64_t conn_serial_ = 0;     // bumped for each new connection
    std::uint64_t tracked_serial_ = 0;  // the connection and route epoch tracking was set for
    std::uint64_t tracked_epoch_ = 0;
    bool tracking_ = false;             // on for that connection and epoch
    bool rearm_ = false;                // it has just been turned on again: every hold is read
    bool ever_tracked_ = false;         // it has been on before
    bool refused_ = false;              // the server refused it for that connection and epoch
    bool failing_ = false;              // the last tick could not reach the server
    std::thread thread_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void watchdog::start(std::shared_ptr<const void> owner) {
    thread_ = std::thread([this, owner = std::move(owner)] { loop(); });
}

RLOCK_DECL void watchdog::request_stop() {
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
    }
    cv_.notify_all();
}

RLOCK_DECL void watchdog::stop() {
    request_stop();
    if (thread_.joinable()) {
        if (thread_.get_id() == std::this_thread::get_id()) {
            thread_.detach();
        } else {
            thread_.join();
        }
    }
}

RLOCK_DECL void watchdog::wake() noexcept {
    {
        std::lock_guard<std::mutex> g(mu_);
        poke_ = true;
        woken_ = true;
    }
    cv_.notify_all();
}

RLOCK_DECL void watchdog::verify_soon() noexcept {
    {
        std::lock_guard<std::mutex> g(mu_);
        verify_ = true;
    }
    cv_.notify_all();
}

RLOCK_DECL void watchdog::defer(std::string key, deferred_undos::step undo, clock::time_point until) {
    undos_.add(std::move(key), std::move(undo), until);
    {
        std::lock_guard<std::mutex> g(mu_);
        deferred_ = true;
    }
    cv_.notify_all();
}

RLOCK_DECL void watchdog::suspect(const std::vector<std::string>& keys, bool flushed) noexcept {
    try {
        std::lock_guard<std::mutex> g(mu_);
        poke_ = true;
        if (flushed) {
            verify_ = true;
        } else {
            suspects_.insert(suspects_.end(), keys.begin(), keys.end());
        }
    } catch (...) {  // bad_alloc: every hold, then
        std::lock_guard<std::mutex> g(mu_);
        verify_ = true;
    }
    cv_.notify_all();
}

RLOCK_DECL bool watchdog::selection::picks(const hold& h) const {
    if (all) return true;
    const std::string& key = h.renewed_key();
    return std::binary_search(keys.begin(), keys.end(), key) ||
           (!h.key.empty() && std::binary_search(keys.begin(), keys.end(), h.name));
}

RLOCK_DECL bool watchdog::check_leased(context_ptr& conn, std::uint64_t& conn_epoch,
                                       const selection& pick) {
    std::vector<registry::hold_ptr> holds =
        reg.take_leased([&](const hold& h) { return pick.picks(h); });
    if (holds.empty()) return true;
    renewal r(holds.size());
    make_batches(holds, r, "0");
    if (ep.slots) {
        renew_in_cluster(holds, r, true);
    } else {
        try {
            ensure_open(conn, conn_epoch, true);
            const bool tracked = track(conn.get());
            std::vector<batch*> all;
            for (batch& b : r.batches) all.push_back(&b);
            const connection c{conn.get()};
            send_batches(c, all, holds, r, nullptr);
            if (tracked) arm(c, holds, r.ok);
        } catch (const error& e) {
            r.failure = e;
            if (conn && (conn->err || e.value() == errc::connection_failed)) conn.reset();
        }
    }
    for (const std::size_t i : reg.checked(holds, r.gone)) {
        const hold& h = *holds[i];
        const error gone(
            errc::lock_lost, h.name, ep.name,
            "the key was deleted or taken by another holder before the hold's lease ran out");
        reg.tell_hold(h, gone);
        reg.tell_handed_from(h, gone);
    }
    return !r.failure ||
           (r.failure->value() != errc::connection_failed && r.failure->value() != errc::timeout);
}

RLOCK_DECL bool watchdog::renew_all(context_ptr& conn, std::uint64_t& conn_epoch,
                                    const selection& pick) {
    std::vector<registry::hold_ptr> expired;
    std::vector<registry::hold_ptr> holds =
        reg.take_watched(expired, [&](const hold& h) { return pick.picks(h); });
    // Owners are told once the batch's holds are out of flight (renewed(), below): an
    // on_lock_lost handler may release any hold of the client, and a release waits for its
    // hold's renewal to end — which, told from inside the batch, it never would.
    const auto tell_expired = [&] {
        for (const auto& h : expired) {
            reg.tell_hold(*h, error(errc::lock_lost, h->name, ep.name,
                                    "the lease ran out before the watchdog could renew it"));
        }
    };
    if (holds.empty()) {
        tell_expired();
        return true;
    }
    renewal r(holds.size());
    const auto sent = clock::now();
    make_batches(holds, r, std::to_string(ep.options.lock_watchdog_timeout.count()));
    if (ep.slots) {
        renew_in_cluster(holds, r, pick.tracks && cluster_route_);
    } else {
        try {
            ensure_open(conn, conn_epoch, pick.tracks);
            const bool tracked = pick.tracks && track(conn.get());
            if (tracked && !pick.all && rearm_) {
                // Tracking began again with this tick: every hold is renewed and read.
                std::lock_guard<std::mutex> g(mu_);
                verify_ = true;
            }
            std::vector<batch*> all;
            for (batch& b : r.batches) all.push_back(&b);
            const connection c{conn.get()};
            send_batches(c, all, holds, r, nullptr);
            if (tracked) arm(c, holds, r.ok);
            // Replica sync: a shortfall is not a loss (the renewals are on the master).
            if (ep.options.sync_replicas > 0) wait_for_replicas(c, ep, "");
        } catch (const error& e) {
            r.failure = e;
            // Broken, or READONLY (a failover made it a replica): make a new one next time.
            if (conn && (conn->err || e.value() == errc::connection_failed)) conn.reset();
        }
    }
    std::vector<std::size_t> refused;
    for (std::size_t i = 0; i < holds.size(); ++i) {
        if (r.refusal[i] != 0 && reg.refused(*holds[i])) refused.push_back(i);
    }
    const std::vector<std::size_t> lost = reg.renewed(holds, r.ok, r.gone, sent);
    tell_expired();
    for (const std::size_t i : refused) {
        reg.tell_hold(*holds[i], r.refusals[r.refusal[i] - 1], /*refused=*/true);
    }
    if (!r.failure) events_.renewed(ep.name, holds.size(), sent);
    for (const std::size_t i : lost) {
        const hold& h = *holds[i];
        if (r.gone[i]) {
            const error gone(errc::lock_lost, h.name, ep.name,
                             h.kind->gone != nullptr
                                 ? h.kind->gone
                                 : "the watchdog found the hold gone: the key expired, was "
                                   "deleted or belongs to another holder now");
            reg.tell_hold(h, gone);
            reg.tell_handed_from(h, gone);
        } else {
            reg.tell_hold(
                h, error(errc::lock_lost, h.name, ep.name,
                         std::string("the lease ran out before the watchdog could renew it: ") +
                             (r.failure ? error_access::brief(*r.failure) : "no reply")));
        }
    }
    // Only a connection that failed, or a cluster that could not run the renewal yet, is
    // worth trying again soon; another error reply is not.
    if (r.retry_soon) return false;
    return !r.failure ||
           (r.failure->value() != errc::connection_failed && r.failure->value() != errc::timeout);
}

RLOCK_DECL void watchdog::ensure_open(context_ptr& conn, std::uint64_t& conn_epoch, bool tracks) {
    if (conn && !closed_while_idle(conn.get()) && conn_epoch == ep.epoch.load()) return;
    conn.reset();
    conn_epoch = ep.epoch.load();
    conn = connect(ep);
    if (tracks) ++conn_serial_;
}

RLOCK_DECL bool watchdog::arm_fresh(context_ptr& conn, std::uint64_t& conn_epoch) {
    // Those taken arm_delay ago or more: most holds are released sooner, at no cost here.
    std::vector<registry::hold_ptr> fresh = reg.unarmed(clock::now() - arm_delay);
    if (fresh.empty()) return true;
    try {
        ensure_open(conn, conn_epoch, true);
        if (!track(conn.get())) return true;
        if (rearm_) {
            // Tracking began again with this pass: every hold is renewed and read.
            std::lock_guard<std::mutex> g(mu_);
            verify_ = true;
            return true;
        }
        arm(connection{conn.get()}, fresh, std::vector<char>(fresh.size(), 1));
        return true;
    } catch (const error& e) {
        if (conn && (conn->err || e.value() == errc::connection_failed)) conn.reset();
        return false;
    }
}

RLOCK_DECL bool watchdog::track(redisContext* c) {
    if (!route_) return false;
    const std::uint64_t epoch = route_->epoch.load();
    if (tracked_serial_ == conn_serial_ && tracked_epoch_ == epoch) return tracking_;
    tracked_serial_ = conn_serial_;
    tracked_epoch_ = epoch;
    tracking_ = false;
    refused_ = false;
    const long long to = route_->client_id.load();
    if (to == 0) return false;
    const std::string id = std::to_string(to);
    reply_ptr r = command(c, {"CLIENT", "TRACKING", "on", "REDIRECT", id, "NOLOOP"});
    if (!r) throw make_error(c, nullptr, "", ep.name);
    if (r->type == REDIS_REPLY_ERROR) {
        // The subscriber's connection is gone (a failover or a restart it has not followed
        // yet): its next connection moves the route on, and this is asked again then.
        if (reply_text(r.get()).find("does not exist") != std::string_view::npos) return false;
        refused_ = true;
        route_->tell_off(events_, ep.name,
                         "CLIENT TRACKING was refused: " + std::string(reply_text(r.get())));
        return false;
    }
    tracking_ = true;
    // Tracking again after a break (another connection, or invalidations that went to a
    // subscriber connection gone by): what changed meanwhile was not told, so every hold is
    // renewed. The first time, nothing was armed: the holds are read as they come.
    rearm_ = ever_tracked_;
    ever_tracked_ = true;
    return true;
}

// Arming reads a key that holds its hold's own value (kind_info::token_value: mutex, red_lock)
// and compares it, not only whether it exists.
inline bool reads_token(const hold& h) noexcept { return h.kind && h.kind->token_value; }

// That read (GET's reply, or one of MGET's) shows the key gone, of another type, or another's.
inline bool token_changed(const redisReply* r, std::string_view token) noexcept {
    return r->type == REDIS_REPLY_NIL || reply_is_error(r, "WRONGTYPE") ||
           (r->type == REDIS_REPLY_STRING && reply_text(r) != token);
}

RLOCK_DECL void watchdog::arm(const connection& c, const std::vector<registry::hold_ptr>& holds,
                              const std::vector<char>& ok) {
    // EXISTS of every key, and MGET of the keys that hold their hold's value (token_value),
    // compared: a key another holder wrote before it was armed is found as well as one gone.
    // Its invalidation may never come: the key was not tracked yet, or (a hold passed in the
    // process) it came while no hold named the key, and was dropped.
    std::vector<std::string_view> exists{"EXISTS"}, mget{"MGET"};
    std::vector<std::string> values;  // of the MGET keys, in order
    std::vector<char> which(holds.size(), 0);
    reg.with([&] {
        for (std::size_t i = 0; i < holds.size(); ++i) {
            if (!ok[i]) continue;
            which[i] = 1;
            exists.push_back(holds[i]->renewed_key());
            if (reads_token(*holds[i])) {
                mget.push_back(holds[i]->renewed_key());
                values.push_back(holds[i]->value);
            }
        }
    });
    if (exists.size() == 1) return;
    auto send = [&](const std::vector<std::string_view>& argv) {
        std::vector<const char*> args;
        std::vector<std::size_t> lens;
        for (std::string_view a : argv) {
            args.push_back(a.data());
            lens.push_back(a.size());
        }
        if (append_command(c.ctx, static_cast<int>(args.size()), args.data(), lens.data()) != REDIS_OK)
            throw make_error(c, nullptr, "", ep.name);
    };
    auto receive = [&] {
        void* raw = nullptr;
        if (redisGetReply(c.ctx, &raw) != REDIS_OK) throw make_error(c, nullptr, "", ep.name);
        return reply_ptr(static_cast<redisReply*>(raw));
    };
    send(exists);
    if (mget.size() > 1) send(mget);
    const reply_ptr reply = receive();
    const reply_ptr read = mget.size() > 1 ? receive() : nullptr;
    if (!reply || reply->type != REDIS_REPLY_INTEGER) return;
    reg.armed(holds, which);
    bool changed = false;
    if (read && read->type == REDIS_REPLY_ARRAY && read->elements == values.size()) {
        for (std::size_t i = 0; i < values.size() && !changed; ++i) changed = token_changed(read->element[i], values[i]);
    }
    if (changed || reply->integer < static_cast<long long>(exists.size() - 1)) {
        // A key went, or another holder wrote it, between its renewal (or acquisition) and
        // this read (no invalidation comes for that: the renewal's write had stopped the
        // tracking): renewed again at once, which tells whose.
        std::lock_guard<std::mutex> g(mu_);
        for (std::size_t i = 1; i < exists.size(); ++i) suspects_.emplace_back(exists[i]);
        poke_ = true;
    }
}

RLOCK_DECL void watchdog::make_batches(std::vector<registry::hold_ptr>& holds, renewal& r,
                                       std::string lease) const {
    std::vector<int> slot(holds.size(), 0);
    std::vector<std::size_t> order(holds.size());
    for (std::size_t i = 0; i < holds.size(); ++i) {
        order[i] = i;
        if (ep.slots) slot[i] = key_slot(holds[i]->name);
    }
    // Stable, so that batches are deterministic.
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return slot[a] != slot[b] ? slot[a] < slot[b] : holds[a]->kind < holds[b]->kind;
    });
    std::vector<registry::hold_ptr> sorted;
    std::vector<int> sorted_slot;
    for (const std::size_t i : order) {
        sorted.push_back(std::move(holds[i]));
        sorted_slot.push_back(slot[i]);
    }
    holds.swap(sorted);
    r.lease = std::move(lease);
    r.batches.reserve(holds.size() / renew_batch + 4);
    for (std::size_t i = 0; i < holds.size();) {
        std::size_t j = i;
        while (j < holds.size() && j - i < renew_batch && holds[j]->kind == holds[i]->kind &&
               sorted_slot[j] == sorted_slot[i]) {
            ++j;
        }
        batch& b = r.batches.emplace_back();
        b.first = i;
        b.count = j - i;
        b.slot = sorted_slot[i];
        b.call.start(holds[i]->kind->renew(), j - i);
        for (std::size_t k = i; k < j; ++k) {
            b.call.push(holds[k]->renewed_key());
        }
        b.call.push(r.lease);
        for (std::size_t k = i; k < j; ++k) b.call.push(holds[k]->value);
        i = j;
    }
}

RLOCK_DECL void watchdog::write_batches(const connection& c,
                                        const std::vector<batch*>& list) const {
    for (batch* b : list) {
        b->call.use(script_form::sha, c);
        if (append_command(c.ctx, b->call.argc(), b->call.argv(), b->call.lens()) != REDIS_OK) {
            throw make_error(c, nullptr, "", ep.name);
        }
    }
    int done = 0;
    while (done == 0) {
        if (redisBufferWrite(c.ctx, &done) != REDIS_OK) throw make_error(c, nullptr, "", ep.name);
    }
}

RLOCK_DECL void watchdog::read_batches(const connection& c, const std::vector<batch*>& list,
                                       const std::vector<registry::hold_ptr>& holds, renewal& r,
                                       std::vector<batch*>* redirected) const {
    std::vector<reply_ptr> replies;
    for (std::size_t i = 0; i < list.size(); ++i) {
        void* raw = nullptr;
        if (redisGetReply(c.ctx, &raw) != REDIS_OK) throw make_error(c, nullptr, "", ep.name);
        replies.emplace_back(static_cast<redisReply*>(raw));
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
        batch& b = *list[i];
        reply_ptr& reply = replies[i];
        if (redirected && reply && reply->type == REDIS_REPLY_ERROR &&
            parse_redirect(reply_text(reply.get())).kind != redirect::none) {
            redirected->push_back(&b);
            continue;
        }
        if (reply_is_error(reply.get(), "NOSCRIPT")) {
            // Sent again as EVAL; its answer is recorded as it is (an error reply, such as
            // an ACL's refusal, is a refusal of the renewal, not a failed connection).
            b.call.use(script_form::body, c);
            reply = command_argv(c, b.call.argc(), b.call.argv(), b.call.lens());
        }
        record(reply.get(), b, holds, r, c);
    }
}

RLOCK_DECL void watchdog::record(const redisReply* reply, const batch& b,
                                 const std::vector<registry::hold_ptr>& holds, renewal& r,
                                 const connection& c) const {
    auto refuse = [&](std::size_t from, std::size_t count, const redisReply* why) {
        // Each hold of the batch is told the refusal naming its own lock.
        for (std::size_t i = from; i < from + count; ++i) {
            error e = make_error(c, why, holds[i]->name, ep.name);
            // A replica's READONLY (a failover) and a cluster's redirection are about where
            // the renewal went, not about the hold: the caller retries elsewhere.
            if (is_ambiguous(e) || error_access::origin(e).to.kind != redirect::none) {
                throw make_error(c, why, holds[i]->name, ep.name);
            }
            r.refusals.push_back(std::move(e));
            r.refusal[i] = r.refusals.size();
        }
    };
    if (!reply) throw make_error(c, reply, holds[b.first]->name, ep.name);
    if (reply->type != REDIS_REPLY_ARRAY) {
        refuse(b.first, b.count, reply);
        return;
    }
    for (std::size_t e = 0; e < reply->elements && e < b.count; ++e) {
        const redisReply* one = reply->element[e];
        if (one->type == REDIS_REPLY_ERROR) {
            refuse(b.first + e, 1, one);
            continue;
        }
        const bool renewed = one->type == REDIS_REPLY_INTEGER && one->integer == 1;
        r.ok[b.first + e] = static_cast<char>(renewed);
        r.gone[b.first + e] = static_cast<char>(!renewed);
    }
}

RLOCK_DECL void watchdog::renew_in_cluster(const std::vector<registry::hold_ptr>& holds, renewal& r,
                                           bool tracks) {
    std::vector<node_batches> per_node;
    for (batch& b : r.batches) {
        std::optional<server_address> m = ep.slots->master_of(b.slot);
        const std::string at = m ? address_name(m->host, m->port) : std::string();
        auto it = std::find_if(per_node.begin(), per_node.end(),
                               [&](const node_batches& p) { return p.at == at; });
        if (it == per_node.end()) it = per_node.insert(per_node.end(), {at, std::move(m), {}});
        it->list.push_back(&b);
    }
    std::vector<batch*> redirected;
    auto on_error = [&](const error& e) {
        if (!r.failure || is_ambiguous(e)) r.failure = e;
        if (error_access::origin(e).to.kind == redirect::try_again) r.retry_soon = true;
    };
    std::vector<node_batches*> through_pool;
    if (tracks) {
        renew_on_tracked(per_node, holds, r, redirected, through_pool);
    } else {
        for (auto& node : per_node) through_pool.push_back(&node);
    }
    for (node_batches* n : through_pool) {
        node_batches& node = *n;
        try {
            std::vector<batch*> moved;
            pool.run(holds[node.list.front()->first]->name, on_break::retry,
                     [&](const connection& c) {
                         moved.clear();
                         send_batches(c, node.list, holds, r, &moved);
                         if (ep.options.sync_replicas > 0) wait_for_replicas(c, ep, "");
                         return 0;
                     });
            redirected.insert(redirected.end(), moved.begin(), moved.end());
        } catch (const error& e) {
            on_error(e);
        }
    }
    // Redirected batches are sent one by one, each bounded by command_timeout; together
    // they stop at one command_timeout too (more slots under TRYAGAIN at once than that
    // allows), and the rest are tried at the soon retry instead: a tick must not outlast
    // the leases of the holds on healthy masters.
    const auto redirected_until = clock::now() + ep.options.command_timeout;
    for (batch* b : redirected) {
        if (clock::now() >= redirected_until) {
            r.retry_soon = true;
            break;
        }
        try {
            const std::string& name = holds[b->first]->name;
            pool.run(
                name, on_break::retry,
                [&](const connection& c) {
                    reply_ptr reply = run_script(c, b->call, name, ep.name);
                    record(reply.get(), *b, holds, r, c);
                    return 0;
                },
                holds[b->first]->kind->follows_ask);
        } catch (const error& e) {
            on_error(e);
        }
    }
    if (tracks && !redirected.empty()) {
        // Their slot moved: read again on the tracked connection of its master now.
        std::vector<char> moved(holds.size(), 0);
        for (const batch* b : redirected) {
            for (std::size_t i = b->first; i < b->first + b->count; ++i) moved[i] = 1;
        }
        reg.disarmed(holds, moved);
    }
}

RLOCK_DECL auto watchdog::node_at(const server_address& at) -> tracked_node* {
    if (tracked_node* known = find_node(at)) return known->refused ? nullptr : known;
    auto n = std::make_unique<tracked_node>();
    n->at = at;
    n->name = address_name(at.host, at.port);
    auto refused = [&](const redisReply* why, const char* what) {
        n->refused = true;
        cluster_route_->tell_off(
            events_, n->name, std::string(what) + " was refused: " + std::string(reply_text(why)));
        nodes_.push_back(std::move(n));
        return nullptr;
    };
    context_ptr listen = connect_node(ep, at);
    reply_ptr id = command(listen.get(), {"CLIENT", "ID"});
    if (!id) throw make_error(listen.get(), nullptr, "", n->name);
    if (id->type != REDIS_REPLY_INTEGER) return refused(id.get(), "CLIENT ID");
    reply_ptr sub = command(listen.get(), {"SUBSCRIBE", tracking_route::channel});
    if (!sub) throw make_error(listen.get(), nullptr, "", n->name);
    if (sub->type == REDIS_REPLY_ERROR) return refused(sub.get(), "SUBSCRIBE __redis__:invalidate");
    context_ptr conn = connect_node(ep, at);
    reply_ptr on = command(conn.get(), {"CLIENT", "TRACKING", "on", "REDIRECT",
                                        std::to_string(id->integer), "NOLOOP"});
    if (!on) throw make_error(conn.get(), nullptr, "", n->name);
    if (on->type == REDIS_REPLY_ERROR) return refused(on.get(), "CLIENT TRACKING");
    n->conn = std::move(conn);
    n->listen = std::move(listen);
    if (cluster_armed_) {
        // Holds armed on a master gone by (a failover) are read here from the next tick.
        std::lock_guard<std::mutex> g(mu_);
        verify_ = true;
    }
    nodes_.push_back(std::move(n));
    return nodes_.back().get();
}

RLOCK_DECL void watchdog::drop_node(const tracked_node* t) {
    nodes_.erase(
        std::find_if(nodes_.begin(), nodes_.end(),
                     [&](const std::unique_ptr<tracked_node>& p) { return p.get() == t; }));
    std::lock_guard<std::mutex> g(mu_);
    verify_ = true;
}

RLOCK_DECL auto watchdog::find_node(const server_address& at) const -> tracked_node* {
    for (const auto& n : nodes_) {
        if (n->at.host == at.host && n->at.port == at.port) return n.get();
    }
    return nullptr;
}

RLOCK_DECL void watchdog::renew_on_tracked(std::vector<node_batches>& per_node,
                                           const std::vector<registry::hold_ptr>& holds, renewal& r,
                                           std::vector<batch*>& redirected,
                                           std::vector<node_batches*>& through_pool) {
    std::vector<std::pair<node_batches*, tracked_node*>> written;
    std::vector<node_batches*> to_open;
    for (auto& node : per_node) {
        tracked_node* t = node.master ? find_node(*node.master) : nullptr;
        if (!node.master || (t && t->refused)) {
            through_pool.push_back(&node);
        } else if (!t) {
            to_open.push_back(&node);
        } else {
            try {
                write_batches(connection{t->conn.get()}, node.list);
                written.emplace_back(&node, t);
            } catch (const error&) {
                drop_node(t);
                through_pool.push_back(&node);
            }
        }
    }
    for (auto& [node, t] : written) {
        if (!finish_tracked(*t, node->list, holds, r, redirected)) through_pool.push_back(node);
    }
    for (node_batches* node : to_open) {
        tracked_node* t = nullptr;
        try {
            t = node_at(*node->master);
            if (t) write_batches(connection{t->conn.get()}, node->list);
        } catch (const error& e) {
            if (t) drop_node(t);
            if (!gave_up_on(e, r)) through_pool.push_back(node);
            continue;
        }
        if (!t || !finish_tracked(*t, node->list, holds, r, redirected))
            through_pool.push_back(node);
    }
}

RLOCK_DECL bool watchdog::finish_tracked(tracked_node& t, const std::vector<batch*>& list,
                                         const std::vector<registry::hold_ptr>& holds, renewal& r,
                                         std::vector<batch*>& redirected) {
    try {
        std::vector<batch*> moved;
        const connection c{t.conn.get()};
        read_batches(c, list, holds, r, &moved);
        if (ep.options.sync_replicas > 0) wait_for_replicas(c, ep, "");
        redirected.insert(redirected.end(), moved.begin(), moved.end());
        std::vector<char> read(holds.size(), 0);
        for (const batch* b : list) {
            if (std::find(moved.begin(), moved.end(), b) != moved.end()) continue;
            for (std::size_t i = b->first; i < b->first + b->count; ++i) read[i] = r.ok[i];
        }
        arm_each(t, holds, read);
        return true;
    } catch (const error& e) {
        drop_node(&t);
        return gave_up_on(e, r);
    }
}

RLOCK_DECL bool watchdog::gave_up_on(const error& e, renewal& r) {
    if (e.value() != errc::timeout) return false;
    if (!r.failure || is_ambiguous(e)) r.failure = e;
    return true;
}

RLOCK_DECL void watchdog::arm_each(tracked_node& t, const std::vector<registry::hold_ptr>& holds,
                                   const std::vector<char>& which) {
    // As arm(): a key that holds its hold's value (token_value) is read with GET and
    // compared, the others with EXISTS.
    std::vector<std::size_t> sent;
    std::vector<std::string> values(holds.size());
    for (std::size_t i = 0; i < holds.size(); ++i) {
        if (!which[i]) continue;
        const std::string& key = holds[i]->renewed_key();
        const bool by_value = reads_token(*holds[i]);
        if (by_value) values[i] = reg.with([&] { return holds[i]->value; });
        const char* argv[2] = {by_value ? "GET" : "EXISTS", key.data()};
        const std::size_t lens[2] = {by_value ? 3u : 6u, key.size()};
        if (append_command(t.conn.get(), 2, argv, lens) != REDIS_OK)
            throw make_error(t.conn.get(), nullptr, "", t.name);
        sent.push_back(i);
    }
    if (sent.empty()) return;
    std::vector<char> armed(holds.size(), 0);
    std::vector<std::string> gone;
    for (const std::size_t i : sent) {
        void* raw = nullptr;
        if (redisGetReply(t.conn.get(), &raw) != REDIS_OK)
            throw make_error(t.conn.get(), nullptr, "", t.name);
        const reply_ptr reply(static_cast<redisReply*>(raw));
        const bool changed = reply && reads_token(*holds[i]) && token_changed(reply.get(), values[i]);
        if (changed || (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)) {
            gone.push_back(holds[i]->renewed_key());
            continue;
        }
        if (reply && reply->type == REDIS_REPLY_ERROR) {
            const redirect to = parse_redirect(reply_text(reply.get()));
            if (to.kind == redirect::moved) {
                ep.slots->moved(to.slot,
                                server_address{to.host.empty() ? t.at.host : to.host, to.port});
            }
            if (to.kind != redirect::none) continue;
        }
        armed[i] = 1;
    }
    reg.armed(holds, armed);
    cluster_armed_ = true;
    if (!gone.empty()) suspect(gone, false);
}

RLOCK_DECL bool watchdog::arm_fresh_in_cluster() {
    std::vector<registry::hold_ptr> fresh = reg.unarmed(clock::now() - arm_delay);
    // One slot-map lookup per hold, grouped by master (few): a burst of holds costs a pass.
    struct master_holds {
        server_address at;
        std::vector<char> which;
    };
    std::vector<master_holds> per_master;
    for (std::size_t i = 0; i < fresh.size(); ++i) {
        std::optional<server_address> m = ep.slots->master_of(key_slot(fresh[i]->name));
        if (!m) continue;  // a slot the map does not know yet: the next tick loads it
        auto it = std::find_if(per_master.begin(), per_master.end(), [&](const master_holds& g) {
            return g.at.host == m->host && g.at.port == m->port;
        });
        if (it == per_master.end()) {
            it = per_master.insert(per_master.end(),
                                   {std::move(*m), std::vector<char>(fresh.size(), 0)});
        }
        it->which[i] = 1;
    }
    bool reached = true;
    for (const master_holds& g : per_master) {
        tracked_node* t = nullptr;
        try {
            t = node_at(g.at);
            if (t) {
                arm_each(*t, fresh, g.which);
            } else {
                reg.armed(fresh, g.which);
            }
        } catch (const error&) {
            if (t) drop_node(t);
            reached = false;
        }
    }
    return reached;
}

RLOCK_DECL void watchdog::drain_in_cluster() {
    std::vector<std::string> keys;
    bool flushed = false;
    for (std::size_t i = 0; i < nodes_.size();) {
        tracked_node& t = *nodes_[i];
        bool ok = true;
        if (t.listen) {
            pollfd p{t.listen->fd, POLLIN, 0};
            if (::poll(&p, 1, 0) > 0) {
                ok = read_replies(t.listen.get(), [&](const redisReply* m) {
                    if (m->type != REDIS_REPLY_ARRAY || m->elements != 3 ||
                        reply_text(m->element[0]) != "message")
                        return;
                    const redisReply* payload = m->element[2];
                    if (payload->type != REDIS_REPLY_ARRAY) {
                        flushed = true;
                        return;
                    }
                    for (std::size_t k = 0; k < payload->elements; ++k)
                        keys.emplace_back(reply_text(payload->element[k]));
                });
            }
            if (ok && closed_while_idle(t.conn.get())) ok = false;
        }
        if (ok) {
            ++i;
        } else {
            drop_node(&t);
            flushed = true;
        }
    }
    if (flushed || !keys.empty()) suspect(keys, flushed);
}

RLOCK_DECL void watchdog::loop() {
    context_ptr conn;
    std::uint64_t conn_epoch = 0;
    const auto period = ep.options.lock_watchdog_timeout / 3;
    // A tick that could not reach the server is tried again soon rather than a whole
    // period later (a failover, a dropped connection): two missed periods lose the holds.
    const auto retry = std::min<clock::duration>(
        period, std::max<clock::duration>(period / 10, std::chrono::milliseconds(50)));
    auto next = clock::now() + period;
    // When the undos kept (defer) are tried next: at the retry pace while there are any.
    auto undo_next = clock::time_point::max();
    std::unique_lock<std::mutex> g(mu_);
    while (!stop_) {
        // While the server can tell key changes (detecting), holds are armed arm_delay after
        // they are taken, and a killed connection is noticed that soon (watching).
        // Not while the tracked connection is refused, nor while the last tick could not reach
        // the server: those ticks would only repeat what failed.
        // In a cluster, per master (tracked_node): a master that refuses is left out alone.
        const bool detecting =
            cluster_route_ != nullptr ||
            (route_ && route_->client_id.load() != 0 &&
             !(refused_ && tracked_epoch_ == route_->epoch.load()));
        const bool watching = detecting && !failing_;
        // Nothing to arm or to keep armed: after a few such polls it stops polling until
        // a hold is added (registry::idle: an idle client sleeps until its tick).
        bool polling = watching;
        if (woken_) empty_polls_ = 0;  // polls again for as long as before going idle
        woken_ = false;
        if (watching && !reg.has_holds()) {
            if (++empty_polls_ >= idle_after && reg.idle()) polling = false;
        } else {
            empty_polls_ = 0;
        }
        if (deferred_ && undo_next == clock::time_point::max()) undo_next = clock::now() + retry;
        deferred_ = false;
        const auto wake = std::min(polling ? std::min(next, clock::now() + arm_delay) : next, undo_next);
        cv_.wait_until(g, wake, [&] { return stop_ || verify_ || poke_ || deferred_; });
        poke_ = false;
        if (stop_) break;
        if (clock::now() >= undo_next) {
            g.unlock();
            undos_.try_all();
            g.lock();
            undo_next = undos_.empty() ? clock::time_point::max() : clock::now() + retry;
        }
        if (cluster_route_ && !nodes_.empty()) {
            g.unlock();
            drain_in_cluster();
            g.lock();
            poke_ = false;
        }
        const auto now = clock::now();
        selection pick;
        pick.all =
            verify_ || now >= next ||
            (route_ && watching && ever_tracked_ && route_->epoch.load() != tracked_epoch_) ||
            (conn && closed_while_idle(conn.get()));
        if (!pick.all) {
            pick.keys = std::move(suspects_);
            std::sort(pick.keys.begin(), pick.keys.end());
        }
        suspects_.clear();
        // An early tick (verify_holds_soon, an invalidation, arming) leaves the schedule as
        // it was.
        const bool early = now < next;
        verify_ = false;
        rearm_ = false;
        g.unlock();
        bool sent = pick.all || !pick.keys.empty() ? renew_all(conn, conn_epoch, pick) : true;
        // Not `watching`, which the tick before reckoned: the first tick to reach the server
        // after ticks that failed (a failover) is the one that finds the leased holds gone
        // too, as it finds the watched ones.
        if (sent && detecting && (pick.all || !pick.keys.empty()))
            sent = check_leased(conn, conn_epoch, pick);
        if (sent && watching && !pick.all) {
            sent = cluster_route_ ? arm_fresh_in_cluster() : arm_fresh(conn, conn_epoch);
        }
        failing_ = !sent;
        g.lock();
        if (!sent) {
            next = clock::now() + retry;
        } else if (!early) {
            next = std::max(next + period, clock::now());
        }
    }
    // The client is going: what its waiters left is tried once more (after the engine's
    // pending acquires, whose undos may be among them, have been failed).
    g.unlock();
    undos_.try_all();
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
