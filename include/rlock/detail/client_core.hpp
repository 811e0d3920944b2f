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

#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/pool.hpp"
#include "rlock/detail/random.hpp"
#include "rlock/detail/registry.hpp"
#include "rlock/detail/sentinel.hpp"
#include "rlock/detail/subscriber.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock {

class client;

namespace detail {

inline client_options validated(client_options o) {
    auto bad = [](const std::string& why) { throw error(errc::invalid_argument, "", "", why); };
    auto check_address = [&](const server_address& s, const char* what) {
        if (s.host.empty()) bad(std::string("client_options: a ") + what + "'s host is empty");
        if (s.port <= 0 || s.port > 65535) {
            bad(std::string("client_options: ") + what + " port " + std::to_string(s.port) +
                " is out of range");
        }
    };
    if (!o.cluster && !o.cluster_nodes.empty()) bad("client_options: cluster_nodes without cluster");
    if (o.cluster) {
        if (!o.sentinels.empty()) bad("client_options: cluster and sentinels exclude each other");
        if (!o.unix_socket.empty()) bad("client_options: a cluster is reached over TCP, not unix_socket");
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
    if (o.sync_replicas > 0 &&
        (o.sync_timeout.count() <= 0 || o.sync_timeout >= o.command_timeout)) {
        bad("client_options: sync_timeout must be positive and shorter than command_timeout");
    }
    if (o.lock_watchdog_timeout < std::chrono::milliseconds(30)) {
        bad("client_options: lock_watchdog_timeout must be at least 30ms");
    }
    return o;
}

/// Everything a client owns. Shared with the watchdog thread so that a client destroyed from
/// inside on_lock_lost (on that thread) stays alive until the thread has left.
class client_core : public std::enable_shared_from_this<client_core> {
public:
    using clock = std::chrono::steady_clock;
    static constexpr std::size_t renew_batch = 100;

    explicit client_core(client_options o)
        : ep(validated(std::move(o))),
          id(random_uuid()),
          pool(ep),
          sync_replicas_arg_(std::to_string(ep.options.sync_replicas)),
          sync_timeout_arg_(std::to_string(ep.options.sync_timeout.count())) {
        pool.on_broken = [this] { verify_holds_soon(); };
        // Fail fast: unreachable server, wrong or missing password (NOAUTH), bad db.
        pool.run("", true, [&](redisContext* c) { return run_command(c, {"PING"}, "", ep.name); });
        if (ep.slots) detect_sharded_pubsub();
        sub = std::make_unique<subscriber>(ep, [this] { verify_holds_soon(); });
        if (!ep.options.sentinels.empty()) {
            sentinel = std::make_unique<sentinel_watch>(ep, [this] {
                pool.drop_idle();
                sub->master_switched();
            });
        }
    }

    /// Redis Cluster: sharded pub/sub where a node answers PUBSUB SHARDNUMSUB without an error
    /// (Redis 7+), as Redisson's shardedSubscriptionMode AUTO decides; classic pub/sub where it
    /// refuses. Sharded and classic channels are separate namespaces: both libraries must
    /// choose alike for either's unlock to wake the other's waiters.
    void detect_sharded_pubsub() {
        try {
            pool.run("", true, [&](redisContext* c) {
                return run_command(c, {"PUBSUB", "SHARDNUMSUB"}, "", ep.name);
            });
            ep.sharded_pubsub = true;
        } catch (const error& e) {
            // An error reply (unknown subcommand, an ACL's NOPERM): classic. No answer at all
            // is the client's failure to start, as for the PING before.
            if (e.value() == errc::connection_failed || e.value() == errc::timeout) throw;
        }
    }

    void start() {
        auto self = shared_from_this();
        watchdog_ = std::thread([self] { self->watchdog_loop(); });
    }

    void stop() {
        {
            std::lock_guard<std::mutex> g(wd_mu_);
            wd_stop_ = true;
        }
        wd_cv_.notify_all();
        if (sentinel) sentinel->stop();
        if (watchdog_.joinable()) {
            if (watchdog_.get_id() == std::this_thread::get_id()) {
                watchdog_.detach();
            } else {
                watchdog_.join();
            }
        }
        sub->stop();
    }

    /// Throws `error` (connection_failed, naming `lock`, this server and `what`) once the
    /// rlock::client that owned this core is destroyed: nothing would renew or release a hold
    /// taken through it, and a waiter must stop waiting.
    void throw_if_destroyed(std::string_view lock, const char* what) const {
        if (sub->stopped()) throw error(errc::connection_failed, lock, ep.name, what);
    }

    /// Asks the watchdog for a tick now rather than at its next period: a connection broke, and
    /// the server may have come back without the holds (a restart without persistence, a
    /// failover to a replica that never had them). A renewal is the check: a hold whose key is
    /// gone is told at once.
    void verify_holds_soon() noexcept {
        {
            std::lock_guard<std::mutex> g(wd_mu_);
            wd_verify_ = true;
        }
        wd_cv_.notify_all();
    }

    std::string holder_id(std::uint64_t thread) const {
        std::string h = id;
        h += ':';
        h += std::to_string(thread);
        return h;
    }

    /// Calls on_lock_lost; never throws, never under an internal lock.
    void tell(const lost_hold& which, const error& reason) const noexcept {
        if (!ep.options.on_lock_lost) return;
        try {
            ep.options.on_lock_lost(which, reason);
        } catch (...) {
        }
    }

    /// The thread numbered `thread` has exited: its holds on this client can never be
    /// unlocked. The watchdog stops renewing them (each ends with its lease) and the owner is
    /// told of each watched one. They are not deleted: the thread may have left the data they
    /// guard half-written, and the lease is what a crashed process would leave too.
    void thread_exited(std::uint64_t thread) noexcept {
        try {
            for (const registry::hold_ptr& h : reg.take_thread(thread)) {
                tell_hold(*h, error(errc::lock_lost, h->name, ep.name,
                                    "the thread that held it exited without unlocking; it is no "
                                    "longer renewed and expires after its lease"));
            }
        } catch (...) {
        }
    }

    /// Tells the owner of a lost hold: on_lock_lost for a plain hold; for a member of a group
    /// (a red_lock node) the group decides, and tells its owner once.
    void tell_hold(const hold& h, const error& reason) const noexcept {
        const auto [group, fencing] = reg.with([&] { return std::make_pair(h.group, h.fencing); });
        if (!group) {
            tell(lost_hold{h.name, h.id, fencing}, reason);
            return;
        }
        if (group->part_lost() && group->tell) {
            try {
                group->tell(lost_hold{group->name, group->id, 0},
                              error(errc::lock_lost, group->name, "",
                                    "too few of its parts are still held; the last loss: " +
                                        std::string(reason.what())));
            } catch (...) {
            }
        }
    }

    /// One watchdog tick: renews every watched hold, in batches of up to `renew_batch` holds of
    /// one kind (and, in a cluster, one slot) per script call, all calls to one server
    /// pipelined: on the watchdog's connection, or (Redis Cluster) on a pooled connection to
    /// each master. `conn_epoch` is the endpoint epoch `conn` was opened in (Sentinel: a stale
    /// one is replaced). False when a connection failed (not when a hold was gone, nor on an
    /// error reply): then the watchdog tries again soon.
    bool renew_all(context_ptr& conn, std::uint64_t& conn_epoch) {
        std::vector<registry::hold_ptr> expired;
        std::vector<registry::hold_ptr> holds = reg.take_watched(expired);
        for (const auto& h : expired) {
            tell_hold(*h, error(errc::lock_lost, h->name, ep.name,
                                "the lease ran out before the watchdog could renew it"));
        }
        if (holds.empty()) return true;
        renewal r(holds.size());
        const auto sent = clock::now();
        make_batches(holds, r);
        if (ep.slots) {
            renew_in_cluster(holds, r);
        } else {
            try {
                if (!conn || closed_while_idle(conn.get()) || conn_epoch != ep.epoch.load()) {
                    conn.reset();
                    conn_epoch = ep.epoch.load();
                    conn = connect(ep);
                }
                std::vector<batch*> all;
                for (batch& b : r.batches) all.push_back(&b);
                send_batches(conn.get(), all, holds, r, nullptr);
                // Replica sync: a shortfall is not a loss (the renewals are on the master).
                if (ep.options.sync_replicas > 0) wait_for_replicas(conn.get(), "");
            } catch (const error& e) {
                r.failure = e;
                // Broken, or READONLY (a failover made it a replica): make a new one next time.
                if (conn && (conn->err || e.value() == errc::connection_failed)) conn.reset();
            }
        }
        for (std::size_t i = 0; i < holds.size(); ++i) {
            if (r.refusal[i] != 0 && reg.refused(*holds[i])) {
                tell_hold(*holds[i], r.refusals[r.refusal[i] - 1]);
            }
        }
        for (const std::size_t i : reg.renewed(holds, r.ok, r.gone, sent)) {
            const hold& h = *holds[i];
            if (r.gone[i]) {
                tell_hold(h, error(errc::lock_lost, h.name, ep.name,
                                   "the watchdog found the hold gone: the key expired, was "
                                   "deleted or belongs to another holder now"));
            } else {
                tell_hold(h,
                     error(errc::lock_lost, h.name, ep.name,
                           std::string("the lease ran out before the watchdog could renew it: ") +
                               (r.failure ? r.failure->what() : "no reply")));
            }
        }
        // Only a connection that failed, or a cluster that could not run the renewal yet, is
        // worth trying again soon; another error reply is not.
        if (r.retry_soon) return false;
        return !r.failure || (r.failure->value() != errc::connection_failed &&
                              r.failure->value() != errc::timeout);
    }

    /// Replica sync: `WAIT sync_replicas sync_timeout` on `c`, the connection that just wrote;
    /// returns how many replicas acknowledged. Throws as any command does.
    long long wait_for_replicas(redisContext* c, std::string_view lock) const {
        reply_ptr r = run_command(c, {"WAIT", sync_replicas_arg_, sync_timeout_arg_}, lock, ep.name);
        return reply_integer(r.get(), lock, ep.name);
    }

    endpoint ep;
    std::string id;
    /// Set once an acquire script has run on this client. Until then the mutex acquires by
    /// script too (not a plain SET), so that a user who may not run scripts (an ACL without
    /// EVALSHA) is refused at lock(), with nothing written, rather than at unlock().
    std::atomic<bool> scripts_allowed{false};
    /// How much this client's waiters for `lock` have been losing races for it lately
    /// (race_pacing, wait_pacing.hpp). Names share 64 counters by hash: a shared one only makes
    /// a waiter yield when it need not.
    std::atomic<int>& lost_races(std::string_view lock) {
        return lost_races_[std::hash<std::string_view>{}(lock) % lost_races_.size()];
    }
    detail::pool pool;
    std::unique_ptr<subscriber> sub;
    std::unique_ptr<sentinel_watch> sentinel;  // with client_options::sentinels only
    registry reg;

private:
    /// One renew script call: holds [first, first + count) of the tick's list, all of one kind
    /// and one slot.
    struct batch {
        script_call call;
        std::size_t first = 0, count = 0;
        int slot = 0;
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

    /// Sorts `holds` by slot (in a cluster) and kind, and cuts them into script calls.
    void make_batches(std::vector<registry::hold_ptr>& holds, renewal& r) const {
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
        r.lease = std::to_string(ep.options.lock_watchdog_timeout.count());
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
            for (std::size_t k = i; k < j; ++k) b.call.push(holds[k]->name);
            b.call.push(r.lease);
            for (std::size_t k = i; k < j; ++k) b.call.push(holds[k]->value);
            i = j;
        }
    }

    /// Pipelines `list` on `c` and records each renewal. A call a cluster node redirected
    /// (MOVED, ASK, TRYAGAIN) goes to `redirected` when given, to be sent on its own; any
    /// other error reply, and a broken connection, throw.
    void send_batches(redisContext* c, const std::vector<batch*>& list,
                      const std::vector<registry::hold_ptr>& holds, renewal& r,
                      std::vector<batch*>* redirected) const {
        for (batch* b : list) {
            b->call.use_body(false);
            if (redisAppendCommandArgv(c, b->call.argc(), b->call.argv.data(), b->call.lens.data()) !=
                REDIS_OK) {
                throw make_error(c, nullptr, "", ep.name);
            }
        }
        std::vector<reply_ptr> replies;
        for (std::size_t i = 0; i < list.size(); ++i) {
            void* raw = nullptr;
            if (redisGetReply(c, &raw) != REDIS_OK) throw make_error(c, nullptr, "", ep.name);
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
            if (reply_is_error(reply.get(), "NOSCRIPT")) reply = run_script(c, b.call, "", ep.name);
            record(reply.get(), b, holds, r, c);
        }
    }

    /// Records the reply of one renew call: per hold 1 renewed, 0 gone, or an error (the
    /// whole call's, or one hold's) that refused it. No reply at all throws.
    void record(const redisReply* reply, const batch& b, const std::vector<registry::hold_ptr>& holds,
                renewal& r, const redisContext* c) const {
        auto refuse = [&](std::size_t from, std::size_t count, const redisReply* why) {
            error e = make_error(c, why, holds[from]->name, ep.name);
            // A replica's READONLY (a failover) and a cluster's redirection are about where
            // the renewal went, not about the hold: the caller retries elsewhere.
            if (e.value() == errc::connection_failed || e.value() == errc::timeout ||
                last_redirect().kind != redirect::none) {
                throw error(e.value(), e.what());
            }
            r.refusals.push_back(std::move(e));
            for (std::size_t i = from; i < from + count; ++i) r.refusal[i] = r.refusals.size();
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

    /// Redis Cluster: the batches of each master pipelined on a pooled connection to it; a
    /// batch redirected there (its slot has moved) is sent again on its own, where the pool
    /// follows the redirection. A master that fails does not stop the others' renewals.
    void renew_in_cluster(const std::vector<registry::hold_ptr>& holds, renewal& r) {
        std::vector<std::pair<std::string, std::vector<batch*>>> per_node;
        for (batch& b : r.batches) {
            const std::optional<server_address> m = ep.slots->master_of(b.slot);
            const std::string at = m ? address_name(m->host, m->port) : std::string();
            auto it = std::find_if(per_node.begin(), per_node.end(), [&](const auto& p) { return p.first == at; });
            if (it == per_node.end()) it = per_node.insert(per_node.end(), {at, {}});
            it->second.push_back(&b);
        }
        std::vector<batch*> redirected;
        auto on_error = [&](const error& e) {
            if (!r.failure || e.value() == errc::connection_failed || e.value() == errc::timeout) r.failure = e;
            if (says_try_again(e.what())) r.retry_soon = true;
        };
        for (auto& node : per_node) {
            try {
                std::vector<batch*> moved;
                pool.run(holds[node.second.front()->first]->name, true, [&](redisContext* c) {
                    moved.clear();
                    send_batches(c, node.second, holds, r, &moved);
                    if (ep.options.sync_replicas > 0) wait_for_replicas(c, "");
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
                    name, true,
                    [&](redisContext* c) {
                        reply_ptr reply = run_script(c, b->call, name, ep.name);
                        record(reply.get(), *b, holds, r, c);
                        return 0;
                    },
                    holds[b->first]->kind->follows_ask);
            } catch (const error& e) {
                on_error(e);
            }
        }
    }

    void watchdog_loop() {
        context_ptr conn;
        std::uint64_t conn_epoch = 0;
        const auto period = ep.options.lock_watchdog_timeout / 3;
        // A tick that could not reach the server is tried again soon rather than a whole
        // period later (a failover, a dropped connection): two missed periods lose the holds.
        const auto retry = std::min<clock::duration>(
            period, std::max<clock::duration>(period / 10, std::chrono::milliseconds(50)));
        auto next = clock::now() + period;
        std::unique_lock<std::mutex> g(wd_mu_);
        while (!wd_stop_) {
            wd_cv_.wait_until(g, next, [&] { return wd_stop_ || wd_verify_; });
            if (wd_stop_) break;
            // An early tick (verify_holds_soon) leaves the schedule as it was.
            const bool early = wd_verify_ && clock::now() < next;
            wd_verify_ = false;
            g.unlock();
            const bool sent = renew_all(conn, conn_epoch);
            g.lock();
            if (!sent) {
                next = clock::now() + retry;
            } else if (!early) {
                next = std::max(next + period, clock::now());
            }
        }
    }

    std::array<std::atomic<int>, 64> lost_races_{};
    const std::string sync_replicas_arg_;  // WAIT's arguments, formatted once
    const std::string sync_timeout_arg_;
    std::mutex wd_mu_;
    std::condition_variable wd_cv_;
    bool wd_stop_ = false;
    bool wd_verify_ = false;  // verify_holds_soon() asked for a tick now
    std::thread watchdog_;
};

/// Tells the clients a thread took watched holds on when that thread exits (client_core::
/// thread_exited): nothing can unlock those holds any more, and left alone the watchdog would
/// renew them for as long as the client lives. One per thread, made on its first watched hold.
class thread_exit_watch {
public:
    /// Remembers `core` for the calling thread (once).
    static void enlist(client_core& core) {
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

    thread_exit_watch() = default;
    thread_exit_watch(const thread_exit_watch&) = delete;
    thread_exit_watch& operator=(const thread_exit_watch&) = delete;
    ~thread_exit_watch() {
        const std::uint64_t me = current_thread_number();
        for (auto& entry : cores_) {
            if (std::shared_ptr<client_core> core = entry.second.lock()) core->thread_exited(me);
        }
    }

private:
    std::vector<std::pair<const client_core*, std::weak_ptr<client_core>>> cores_;
};

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
inline void ignore_default_sigpipe() noexcept {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace detail

}  // namespace rlock
