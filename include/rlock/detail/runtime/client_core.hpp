// detail::client_core: everything an rlock::client owns — its endpoint, connection pool,
// subscriber, registry of holds and watchdog — shared with the lock objects made from it and
// with its own threads. rlock::client (client.hpp) is the public face; lock types reach the
// core through client_access.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>  // sigaction (POSIX, declared by glibc's <signal.h>)
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/limits.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/pool.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/redis/sentinel.hpp"
#include "rlock/detail/runtime/count_memory.hpp"
#include "rlock/detail/runtime/engine.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/detail/runtime/loss_watch.hpp"
#include "rlock/detail/runtime/queue_pass.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/runtime/subscriber.hpp"
#include "rlock/detail/runtime/watchdog.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock {

class client;

namespace detail {

/// The local hand-off's bound (local_gate.hpp) as the client's options set it.
RLOCK_DECL handoff_bound handoff_bound_of(const client_options& o) noexcept;

RLOCK_DECL client_options validated(client_options o);

/// What one client has seen of the races for a lock (race_pacing, wait_pacing.hpp; names
/// share these by hash).
struct race_record {
    /// How much the client's waiters have been losing races for the lock lately: +2 per race
    /// lost, -1 per acquisition, at most 8.
    std::atomic<int> lost{0};
    /// How many other clients were waiting for the lock when a waiter of this client last
    /// asked the server (PUBSUB NUMSUB of its channel), and when (steady_clock ticks).
    std::atomic<int> rivals{0};
    std::atomic<std::chrono::steady_clock::rep> rivals_at{0};
};

class client_core;

/// What hears that a client is being destroyed although nothing of it is pending on that
/// client's engine: a multi_lock's asynchronous acquire waiting for a part of another client
/// (multi_parts.hpp) must still complete.
class stop_listener {
public:
    /// Called once per listen_for_stop(), from the thread destroying `core` (which is still
    /// whole), outside every lock of the core's; must not block.
    virtual void client_stopping(const client_core& core) noexcept = 0;

protected:
    stop_listener() = default;
    stop_listener(const stop_listener&) = default;
    stop_listener& operator=(const stop_listener&) = default;
    ~stop_listener() = default;
};

/// Everything a client owns. Shared with the watchdog thread so that a client destroyed from
/// inside on_lock_lost (on that thread) stays alive until the thread has left.
class client_core : public std::enable_shared_from_this<client_core> {
public:
    using clock = std::chrono::steady_clock;

    explicit client_core(client_options o);

    /// Redis Cluster: sharded pub/sub where a node answers PUBSUB SHARDNUMSUB without an error
    /// (Redis 7+), as Redisson's shardedSubscriptionMode AUTO decides; classic pub/sub where it
    /// refuses. Sharded and classic channels are separate namespaces: both libraries must
    /// choose alike for either's unlock to wake the other's waiters.
    void detect_sharded_pubsub();

    void start() { watchdog_.start(shared_from_this()); }

    /// Tells the listener (notice_event), once, when the server may evict lock keys under
    /// memory pressure: any maxmemory-policy but noeviction (a volatile-* policy picks among
    /// keys with a TTL, which every lock key has). A lock that can be evicted is not a lock.
    /// Nothing is told when the server will not say (an ACL without CONFIG, a managed Redis).
    void warn_if_evicting();

    /// Stops the threads: the watchdog is asked first, so that its last tick ends while the
    /// sentinel watch stops; the subscriber, which calls into the watchdog, goes last.
    void stop();

    /// Tells `l` when this client is destroyed (stop()), unless forget_stop_listener(l) came
    /// first. False, with nothing kept, when the client is being destroyed already.
    RLOCK_DECL bool listen_for_stop(const std::shared_ptr<stop_listener>& l);
    RLOCK_DECL void forget_stop_listener(const stop_listener* l) noexcept;

    /// Throws `error` (connection_failed, naming `lock`, this server and `what`) once the
    /// rlock::client that owned this core is destroyed: nothing would renew or release a hold
    /// taken through it, and a waiter must stop waiting.
    void throw_if_destroyed(std::string_view lock, const char* what) const;

    /// Asks the watchdog for a tick now rather than at its next period: a connection broke, and
    /// the server may have come back without the holds (a restart without persistence, a
    /// failover to a replica that never had them). A renewal is the check: a hold whose key is
    /// gone is told at once.
    void verify_holds_soon() noexcept { watchdog_.verify_soon(); }

    /// A waiter that gave up could not undo what it left (a fair_lock queue entry) with the
    /// server out of reach: the watchdog thread tries `undo` again until the server takes it or
    /// `until` passes (deferred_undos.hpp). `key`: the lock and the waiter's value.
    void defer_undo(std::string key, deferred_undos::step undo, clock::time_point until) {
        watchdog_.defer(std::move(key), std::move(undo), until);
    }
    /// A command of this client for `lock` got no reply within command_timeout (a paused or
    /// hung server), or spent its whole command_timeout failing to reach a server for it (a
    /// master that refuses connections until a failover, a cluster slot nobody serves): for the
    /// next command_timeout, unanswered(lock) is true, and a waiter that gives up hands what it
    /// leaves to the watchdog (defer_undo) instead of waiting for the server too, and
    /// asynchronous waits send nothing (on_engine, async_lock.hpp). With Redis Cluster this is
    /// the master the slot map names for `lock`'s slot (the slot itself when it names none):
    /// one master out of reach says nothing of the others, and a slot whose master changed
    /// (a failover) is asked again at once.
    RLOCK_DECL void note_unanswered(std::string_view lock) noexcept;
    RLOCK_DECL bool unanswered(std::string_view lock) const noexcept;
    /// note_unanswered(lock) after a command for `lock`, sent (or tried) from `began`, failed
    /// with `e`: a timeout, or any failure that took the whole command_timeout — but not one
    /// met waiting for a free pooled connection (the server was not asked).
    void note_if_unanswered(const error& e, std::string_view lock, clock::time_point began) noexcept {
        if (error_access::origin(e).no_connection_free) return;
        if (e.value() == errc::timeout || clock::now() - began >= ep.options.command_timeout) {
            note_unanswered(lock);
        }
    }
    /// What a command not sent because of unanswered(lock) fails with: timeout, naming `lock` and
    /// the server, marked as met before anything was sent (nothing ran).
    RLOCK_DECL error unanswered_error(std::string_view lock) const;
    /// The waiter `key` names queues again: it will leave by itself (deferred_undos::forget).
    void forget_undo(const std::string& key) { watchdog_.forget_undo(key); }

    std::string holder_id(std::uint64_t thread) const { return detail::holder_id(id, thread); }

    /// The thread numbered `thread` has exited: its holds on this client can never be
    /// unlocked. The watchdog stops renewing them (each ends with its lease) and the owner is
    /// told of each watched one. They are not deleted: the thread may have left the data they
    /// guard half-written, and the lease is what a crashed process would leave too.
    void thread_exited(std::uint64_t thread) noexcept;

    /// Replica sync: `WAIT sync_replicas sync_timeout` on `c`, the connection that just wrote;
    /// returns how many replicas acknowledged. Throws as any command does.
    long long wait_for_replicas(const connection& c, std::string_view lock) const {
        return detail::wait_for_replicas(c, ep, lock);
    }

    /// Records a hold just taken: the one place a hold record is made. A watched hold is
    /// renewed by the watchdog, and told lost when its thread exits without unlocking it.
    registry::hold_ptr add_hold(const kind_info& kind, std::string name, std::string value,
                                std::uint64_t thread, const hold_terms& terms,
                                std::uint64_t fencing = 0,
                                std::shared_ptr<hold_group> group = nullptr,
                                std::shared_ptr<local_gate> gate = nullptr,
                                std::shared_ptr<hold> handed_from = nullptr);

    /// Records a hold owned by a handle (a permit) rather than a thread: found by its hold id,
    /// renewed under `key` (when watched), and not ended by any thread's exit.
    registry::hold_ptr add_handle_hold(const kind_info& kind, std::string name, std::string key,
                                       std::string value, const hold_terms& terms);

    endpoint ep;
    std::string id;
    /// This client's listener (client_options::listener), as the core tells it.
    event_sink events;
    /// Set once an acquire script has run on this client. Until then the mutex acquires by
    /// script too (not a plain SET), so that a user who may not run scripts (an ACL without
    /// EVALSHA) is refused at lock(), with nothing written, rather than at unlock().
    std::atomic<bool> scripts_allowed{false};
    /// What this client's waiters for `lock` have seen of the races for it (race_pacing,
    /// wait_pacing.hpp). Names share 64 records by hash: a shared one only makes a waiter
    /// yield when it need not.
    race_record& races(std::string_view lock);
    /// A release of `lock` by this client whose unlock message reached subscribers (other
    /// clients' waiters, or this one's) opens a short courtesy: until it ends, a new acquire of
    /// the lock on this client holds back its first attempt (courtesy_left), so that a thread
    /// that locks again right after its unlock does not beat, every time, the waiters its own
    /// message has just woken (docs/benchmarks.md, "loops that come back at once"). A woken
    /// waiter takes the lock within a hand-over (about 0.2 ms here); when none does, the lock
    /// stays free for at most the courtesy. Names share 64 slots by hash, as races() does.
    void note_woken(std::string_view lock) noexcept;
    std::chrono::microseconds courtesy_left(std::string_view lock) const noexcept;
    static constexpr std::chrono::microseconds release_courtesy{1000};

    detail::pool pool;
    registry reg;
    /// Where this client's threads meet before Redis for a lock they want at once (local
    /// hand-off).
    gate_table gates;
    /// Where this client's threads meet before Redis for a semaphore's permits (local hand-off).
    permit_gate_table permit_gates;
    /// This client's fair_lock waiters that a final unlock may pass the hold to when they are
    /// next in the lock's queue (local hand-off; used while gates.enabled()).
    queue_passes fair_passes;
    /// The semaphore counts this client saw set, and the permits it holds of each.
    count_memory counts;
    /// The renewal thread (bench/footprint times its ticks).
    detail::watchdog& watch() noexcept { return watchdog_; }

private:
    std::mutex stop_mu_;
    bool stop_told_ = false;
    std::vector<std::pair<const stop_listener*, std::weak_ptr<stop_listener>>> stop_listeners_;
    std::array<race_record, 64> races_{};
    std::atomic<clock::rep>& courtesy_slot(std::string_view lock) const noexcept;
    mutable std::array<std::atomic<clock::rep>, 64> courtesy_until_{};  // steady_clock ticks
    // note_unanswered(), steady_clock ticks: the server's, or with Redis Cluster the latest of
    // the masters' (none is marked past it), which are kept under the mutex, each with its
    // "host:port" (or "slot <n>" for a slot the map named no master of).
    std::atomic<clock::rep> unanswered_until_{0};
    mutable std::mutex unanswered_mu_;
    std::vector<std::pair<std::string, clock::rep>> unanswered_at_;
    // The mark of `lock` in unanswered_at_: its slot's master, or its slot.
    std::string unanswered_mark(std::string_view lock) const;
    // Where the server's invalidations go (loss_watch.hpp): shared by the subscriber, which
    // listens for them, and the watchdog, whose connection is tracked.
    tracking_route route_;
    // Before the threads that call into it (the subscriber's and the sentinel watch's
    // callbacks ask for a verify tick), so that it outlives them.
    watchdog watchdog_;

public:
    std::unique_ptr<subscriber> sub;
    std::unique_ptr<sentinel_watch> sentinel;  // with client_options::sentinels only

    /// The asynchronous operations' thread, started by the first (engine.hpp), and their state
    /// (async_waits in async_lock.hpp, made with it). After the subscriber: they are destroyed
    /// first, and stop() stops them first.
    engine eng;
    std::once_flag async_once;
    std::shared_ptr<void> async_state;
};

/// Tells the clients a thread took watched holds on when that thread exits (client_core::
/// thread_exited): nothing can unlock those holds any more, and left alone the watchdog would
/// renew them for as long as the client lives. One per thread, made on its first watched hold.
class thread_exit_watch {
public:
    /// Remembers `core` for the calling thread (once).
    static void enlist(client_core& core);

    thread_exit_watch() = default;
    thread_exit_watch(const thread_exit_watch&) = delete;
    thread_exit_watch& operator=(const thread_exit_watch&) = delete;
    ~thread_exit_watch();

private:
    std::vector<std::pair<const client_core*, std::weak_ptr<client_core>>> cores_;
};

/// A hold record as add_hold and add_handle_hold make it, not yet in the registry.
RLOCK_DECL registry::hold_ptr make_hold(const kind_info& kind, std::string name, std::string value,
                                    std::uint64_t thread, const hold_terms& terms);



/// How rlock's own types reach a client's core (rlock::client keeps it private). A template,
/// so that detail headers need only a declaration of rlock::client.
struct client_access {
    template <class Client>
    static client_core& core(Client& c) noexcept {
        return *c.core_;
    }
};

/// hiredis writes with write(2), so a write to a connection the server has already closed
/// raises SIGPIPE, whose default action ends the process: a Redis restart, a CLIENT KILL or a
/// failover could kill the service that held a lock. So when SIGPIPE is still at its default,
/// a client sets it to ignored (as gRPC does); the write then fails with EPIPE, which rlock
/// handles like any broken connection. A handler or disposition the program set is left alone.
RLOCK_DECL void ignore_default_sigpipe() noexcept;

/// How many clients listen on `channel` (PUBSUB NUMSUB; SHARDNUMSUB with sharded pub/sub), on
/// the server of `name`: the waiters a new one races with (race_pacing). -1 when the server does
/// not say (an ACL without PUBSUB, a broken connection): pacing then keeps what it had. Reads
/// only; `follow_ask` as pool::run's.
RLOCK_DECL long long channel_subscribers(client_core& core, std::string_view name, const std::string& channel,
                                         bool follow_ask = true) noexcept;

}  // namespace detail

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL handoff_bound handoff_bound_of(const client_options& o) noexcept {
    return {o.local_handoff_passes,
            std::chrono::duration_cast<std::chrono::microseconds>(o.local_handoff_time)};
}

RLOCK_DECL error client_core::unanswered_error(std::string_view lock) const {
    error_origin unsent;
    unsent.unsent = true;
    return error_access::with_origin(
        errc::timeout, lock, ep.name,
        "not sent: another command of this client for this " +
            std::string(ep.slots ? "cluster master" : "server") + " got no reply, or reached no server, within " +
            std::to_string(ep.options.command_timeout.count()) +
            " ms (client_options::command_timeout) less than that long ago",
        std::move(unsent));
}

RLOCK_DECL std::string client_core::unanswered_mark(std::string_view lock) const {
    const int slot = key_slot(lock);
    if (std::optional<server_address> at = ep.slots->master_of(slot)) {
        return at->host + ':' + std::to_string(at->port);
    }
    return "slot " + std::to_string(slot);
}

RLOCK_DECL void client_core::note_unanswered(std::string_view lock) noexcept {
    const clock::rep now = clock::now().time_since_epoch().count();
    const clock::rep until = now + clock::duration(ep.options.command_timeout).count();
    if (ep.slots) {
        try {
            std::string mark = unanswered_mark(lock);
            std::lock_guard<std::mutex> g(unanswered_mu_);
            auto& marks = unanswered_at_;
            marks.erase(std::remove_if(marks.begin(), marks.end(), [&](const auto& m) { return m.second <= now; }),
                        marks.end());
            auto it = std::find_if(marks.begin(), marks.end(), [&](const auto& m) { return m.first == mark; });
            if (it == marks.end()) {
                marks.emplace_back(std::move(mark), until);
            } else {
                it->second = until;
            }
        } catch (...) {  // out of memory: nothing is marked, and the master is asked as before
            return;
        }
    }
    clock::rep was = unanswered_until_.load(std::memory_order_relaxed);
    while (was < until && !unanswered_until_.compare_exchange_weak(was, until, std::memory_order_relaxed)) {
    }
}

RLOCK_DECL bool client_core::unanswered(std::string_view lock) const noexcept {
    const clock::rep now = clock::now().time_since_epoch().count();
    if (now >= unanswered_until_.load(std::memory_order_relaxed)) return false;
    if (!ep.slots) return true;
    try {
        const std::string mark = unanswered_mark(lock);
        std::lock_guard<std::mutex> g(unanswered_mu_);
        for (const auto& [marked, until] : unanswered_at_) {
            if (marked == mark) return now < until;
        }
    } catch (...) {  // out of memory: asked
    }
    return false;
}

RLOCK_DECL client_options validated(client_options o) {
    auto bad = [](const std::string& why) { throw error(errc::invalid_argument, "", "", why); };
    auto check_address = [&](const server_address& s, const char* what) {
        if (s.host.empty()) bad(std::string("client_options: a ") + what + "'s host is empty");
        if (s.port <= 0 || s.port > 65535) {
            bad(std::string("client_options: ") + what + " port " + std::to_string(s.port) +
                " is out of range");
        }
    };
    if (!o.cluster && !o.cluster_nodes.empty())
        bad("client_options: cluster_nodes without cluster");
    if (o.cluster) {
        if (!o.sentinels.empty()) bad("client_options: cluster and sentinels exclude each other");
        if (!o.unix_socket.empty())
            bad("client_options: a cluster is reached over TCP, not unix_socket");
        if (o.db != 0) bad("client_options: Redis Cluster has only db 0");
        if (o.cluster_nodes.empty()) check_address({o.host, o.port}, "cluster node");
        for (const server_address& s : o.cluster_nodes) check_address(s, "cluster node");
    } else if (!o.sentinels.empty()) {
        if (o.sentinel_master.empty()) bad("client_options: sentinel_master is empty");
        for (const server_address& s : o.sentinels) check_address(s, "sentinel");
    } else {
        if (!o.sentinel_master.empty()) bad("client_options: sentinel_master without sentinels");
        if (o.unix_socket.empty() && o.host.empty()) bad("client_options: host is empty");
        if (o.unix_socket.empty() && (o.port <= 0 || o.port > 65535)) {
            bad("client_options: port " + std::to_string(o.port) + " is out of range");
        }
    }
    if (o.db < 0) bad("client_options: db must not be negative");
    if (o.connect_timeout.count() <= 0) bad("client_options: connect_timeout must be positive");
    if (o.command_timeout.count() <= 0) bad("client_options: command_timeout must be positive");
    if (o.pool_size == 0) bad("client_options: pool_size must be at least 1");
    if (o.sync_replicas < 0) bad("client_options: sync_replicas must not be negative");
    if (o.local_handoff_time.count() < 0) {
        bad("client_options: local_handoff_time must not be negative");
    }
    if (o.sync_replicas > 0 &&
        (o.sync_timeout.count() <= 0 || o.sync_timeout >= o.command_timeout)) {
        bad("client_options: sync_timeout must be positive and shorter than command_timeout");
    }
    if (o.lock_watchdog_timeout < std::chrono::milliseconds(30)) {
        bad("client_options: lock_watchdog_timeout must be at least 30ms");
    }
    // As a lease (max_lease): longer would overflow the client's steady_clock arithmetic (a
    // hold's expiry, a command's deadline).
    constexpr std::chrono::milliseconds longest = max_lease;
    const std::pair<std::chrono::milliseconds, const char*> durations[] = {
        {o.connect_timeout, "connect_timeout"},
        {o.command_timeout, "command_timeout"},
        {o.lock_watchdog_timeout, "lock_watchdog_timeout"},
        {o.local_handoff_time, "local_handoff_time"},
        {o.sync_timeout, "sync_timeout"}};
    for (const auto& [d, what] : durations) {
        if (d > longest) bad(std::string("client_options: ") + what + " must be at most 100 years");
    }
    // With a listener, every report to on_lock_lost is an event too (event_sink::telling).
    o.on_lock_lost = event_sink::telling(std::move(o.on_lock_lost), o.listener);
    return o;
}

RLOCK_DECL client_core::client_core(client_options o)
    : ep(validated(std::move(o))),
      id(random_uuid()),
      events(ep.options.listener),
      pool(ep),
      reg(ep.options.on_lock_lost),
      gates(handoff_bound_of(ep.options)),
      permit_gates(handoff_bound_of(ep.options)),
      watchdog_(ep, pool, reg, ep.options.loss_tracking ? &route_ : nullptr) {
    pool.on_broken = [this] { verify_holds_soon(); };
    // Fail fast: unreachable server, wrong or missing password (NOAUTH), bad db.
    pool.run("", on_break::retry,
             [&](const connection& c) { return run_command(c, {"PING"}, "", ep.name); });
    if (ep.slots) {
        switch (ep.options.cluster_pubsub) {
            case client_options::pubsub::automatic:
                detect_sharded_pubsub();
                break;
            case client_options::pubsub::sharded:
                ep.sharded_pubsub = true;
                break;
            case client_options::pubsub::classic:
                ep.sharded_pubsub = false;
                break;
        }
    }
    sub = std::make_unique<subscriber>(
        ep, [this] { verify_holds_soon(); }, ep.options.loss_tracking ? &route_ : nullptr,
        [this](const std::vector<std::string>& keys, bool flushed) {
            watchdog_.suspect(keys, flushed);
        });
    warn_if_evicting();
    if (!ep.options.sentinels.empty()) {
        sentinel = std::make_unique<sentinel_watch>(ep, [this] {
            pool.drop_idle();
            sub->master_switched();
        });
    }
}

RLOCK_DECL void client_core::detect_sharded_pubsub() {
    try {
        pool.run("", on_break::retry, [&](const connection& c) {
            return run_command(c, {"PUBSUB", "SHARDNUMSUB"}, "", ep.name);
        });
        ep.sharded_pubsub = true;
    } catch (const error& e) {
        // An error reply (unknown subcommand, an ACL's NOPERM): classic. No answer at all
        // is the client's failure to start, as for the PING before.
        if (is_ambiguous(e)) throw;
    }
}

RLOCK_DECL void client_core::warn_if_evicting() {
    if (!events.on()) return;
    try {
        const std::string policy = pool.run("", on_break::retry, [&](const connection& c) {
            reply_ptr r = command(c, {"CONFIG", "GET", "maxmemory-policy"});
            if (!r) throw make_error(c, nullptr, "", ep.name);
            if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) return std::string();
            return std::string(reply_text(r->element[1]));
        });
        if (!policy.empty() && policy != "noeviction") {
            events.notice(ep.name, "the server's maxmemory-policy is " + policy +
                                       ": under memory pressure it may evict lock keys, and a lock "
                                       "whose key is evicted is free for another holder (set "
                                       "noeviction; docs/guarantees.md)");
        }
    } catch (const error&) {  // not told: the client works as well without it
    }
}

RLOCK_DECL bool client_core::listen_for_stop(const std::shared_ptr<stop_listener>& l) {
    std::lock_guard<std::mutex> g(stop_mu_);
    if (stop_told_) return false;
    stop_listeners_.erase(std::remove_if(stop_listeners_.begin(), stop_listeners_.end(),
                                         [](const auto& e) { return e.second.expired(); }),
                          stop_listeners_.end());
    stop_listeners_.emplace_back(l.get(), l);
    return true;
}

RLOCK_DECL void client_core::forget_stop_listener(const stop_listener* l) noexcept {
    std::lock_guard<std::mutex> g(stop_mu_);
    stop_listeners_.erase(std::remove_if(stop_listeners_.begin(), stop_listeners_.end(),
                                         [l](const auto& e) { return e.first == l; }),
                          stop_listeners_.end());
}

RLOCK_DECL void client_core::stop() {
    // First: what waits elsewhere for this client hears it (it may cancel a step pending on
    // this engine, which the stop below then runs).
    std::vector<std::pair<const stop_listener*, std::weak_ptr<stop_listener>>> told;
    {
        std::lock_guard<std::mutex> g(stop_mu_);
        stop_told_ = true;
        told.swap(stop_listeners_);
    }
    for (auto& entry : told) {
        if (std::shared_ptr<stop_listener> l = entry.second.lock()) l->client_stopping(*this);
    }
    // Then its pending operations complete (with an error) while everything they use still
    // runs.
    eng.stop();
    gates.stop();  // threads waiting for a local hand-off throw connection_failed
    permit_gates.stop();
    watchdog_.request_stop();
    if (sentinel) sentinel->stop();
    watchdog_.stop();
    sub->stop();
    // Last: the stops above may still send (a deferred undo's last try). A lock object or
    // hold that outlives the client keeps no connection open.
    pool.close();
}

RLOCK_DECL void client_core::throw_if_destroyed(std::string_view lock, const char* what) const {
    if (sub->stopped()) throw error(errc::connection_failed, lock, ep.name, what);
}

RLOCK_DECL void client_core::thread_exited(std::uint64_t thread) noexcept {
    // A hold taken through a gate frees it as its record goes (gate_place): the next local
    // waiter waits at Redis for the lease to run out.
    try {
        for (const registry::hold_ptr& h : reg.take_thread(thread)) {
            reg.tell_hold(*h, error(errc::lock_lost, h->name, ep.name,
                                    "the thread that held it exited without unlocking; it is "
                                    "no longer renewed and expires after its lease"));
        }
    } catch (...) {
    }
}

RLOCK_DECL race_record& client_core::races(std::string_view lock) {
    return races_[std::hash<std::string_view>{}(lock) % races_.size()];
}

RLOCK_DECL void client_core::note_woken(std::string_view lock) noexcept {
    courtesy_slot(lock).store((clock::now() + release_courtesy).time_since_epoch().count(),
                              std::memory_order_relaxed);
}

RLOCK_DECL std::chrono::microseconds client_core::courtesy_left(
    std::string_view lock) const noexcept {
    const clock::time_point until{
        clock::duration(courtesy_slot(lock).load(std::memory_order_relaxed))};
    const auto now = clock::now();
    if (until <= now) return std::chrono::microseconds(0);
    return std::chrono::duration_cast<std::chrono::microseconds>(until - now);
}

RLOCK_DECL auto client_core::courtesy_slot(std::string_view lock) const noexcept
    -> std::atomic<clock::rep>& {
    return courtesy_until_[std::hash<std::string_view>{}(lock) % courtesy_until_.size()];
}

RLOCK_DECL void thread_exit_watch::enlist(client_core& core) {
    thread_local thread_exit_watch watch;
    for (auto& [raw, weak] : watch.cores_) {
        if (raw == &core && !weak.expired()) return;
    }
    // Forget clients that are gone (an address may be reused by a new one).
    watch.cores_.erase(std::remove_if(watch.cores_.begin(), watch.cores_.end(),
                                      [](const auto& c) { return c.second.expired(); }),
                       watch.cores_.end());
    watch.cores_.emplace_back(&core, core.weak_from_this());
}

RLOCK_DECL thread_exit_watch::~thread_exit_watch() {
    const std::uint64_t me = current_thread_number();
    for (auto& entry : cores_) {
        if (std::shared_ptr<client_core> core = entry.second.lock()) core->thread_exited(me);
    }
}

RLOCK_DECL registry::hold_ptr make_hold(const kind_info& kind, std::string name, std::string value,
                                        std::uint64_t thread, const hold_terms& terms) {
    auto h = std::make_shared<hold>();
    h->kind = &kind;
    h->name = std::move(name);
    h->value = std::move(value);
    h->thread = thread;
    h->lease = terms.lease;
    h->watched = terms.renewal == renewal::watched;
    h->expires = terms.sent + terms.lease;
    h->unconfirmed = h->refused = !terms.confirmed;
    return h;
}

RLOCK_DECL registry::hold_ptr client_core::add_hold(const kind_info& kind, std::string name,
                                                    std::string value, std::uint64_t thread,
                                                    const hold_terms& terms, std::uint64_t fencing,
                                                    std::shared_ptr<hold_group> group,
                                                    std::shared_ptr<local_gate> gate,
                                                    std::shared_ptr<hold> handed_from) {
    registry::hold_ptr h = make_hold(kind, std::move(name), std::move(value), thread, terms);
    h->fencing = fencing;
    h->group = std::move(group);
    h->gate = gate_place(std::move(gate));
    h->handed_from = std::move(handed_from);
    h->taken = events.stamp();
    reg.add(h);
    if (h->watched) thread_exit_watch::enlist(*this);
    return h;
}

RLOCK_DECL registry::hold_ptr client_core::add_handle_hold(const kind_info& kind, std::string name,
                                                           std::string key, std::string value,
                                                           const hold_terms& terms) {
    registry::hold_ptr h = make_hold(kind, std::move(name), std::move(value), 0, terms);
    h->key = std::move(key);
    h->taken = events.stamp();
    reg.add(h);
    return h;
}

RLOCK_DECL void ignore_default_sigpipe() noexcept {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
}

RLOCK_DECL long long channel_subscribers(client_core& core, std::string_view name, const std::string& channel,
                                         bool follow_ask) noexcept {
    try {
        return core.pool.run(
            name, on_break::fail,
            [&](const connection& c) {
                reply_ptr r = command(c, {"PUBSUB", c.sharded_publish ? "SHARDNUMSUB" : "NUMSUB", channel});
                if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                    r->element[1]->type != REDIS_REPLY_INTEGER) {
                    return -1LL;
                }
                return r->element[1]->integer;
            },
            follow_ask);
    } catch (...) {
        return -1;
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
