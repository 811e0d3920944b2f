// rlock::client — one per Redis deployment.
//
// A client owns:
//   - a pool of connections for lock commands (hiredis contexts are not thread-safe: each
//     command checks one out; broken ones are replaced, AUTH and SELECT run on each new one);
//   - one subscriber connection and thread, on which every waiter of every lock of this client
//     waits for its lock's unlock message;
//   - one watchdog thread and connection, which renews every watched hold (one taken without an
//     explicit lease) every lock_watchdog_timeout / 3, many holds per script call, and reports
//     holds it finds lost to `on_lock_lost`.
//
// Thread-safety: all members may be called from any thread. A client is neither copyable nor
// movable. It should outlive the lock objects made from it; those share its internals, so a
// thread that is blocked in lock() / try_lock_for() when the client is destroyed wakes and gets
// `errc::connection_failed` ("the client was destroyed while this thread waited"), no crash.
//
// Destruction stops the subscriber and the watchdog promptly (a blocked waiter's wait ends with
// its next attempt or its deadline) and never joins a thread from itself (a client destroyed
// from inside on_lock_lost is safe). Locks still held are NOT released: renewal stops and each
// is left to expire after its lease (watched holds: lock_watchdog_timeout). Releasing them would
// end mutual exclusion under a thread that may still be inside its critical section.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
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

namespace detail {

inline client_options validated(client_options o) {
    auto bad = [](const std::string& why) { throw error(errc::invalid_argument, "", "", why); };
    if (!o.sentinels.empty()) {
        if (o.sentinel_master.empty()) bad("client_options: sentinel_master is empty");
        for (const server_address& s : o.sentinels) {
            if (s.host.empty()) bad("client_options: a sentinel's host is empty");
            if (s.port <= 0 || s.port > 65535) {
                bad("client_options: sentinel port " + std::to_string(s.port) + " is out of range");
            }
        }
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
        // Fail fast: unreachable server, wrong or missing password (NOAUTH), bad db.
        pool.run("", true, [&](redisContext* c) { return run_command(c, {"PING"}, "", ep.name); });
        sub = std::make_unique<subscriber>(ep);
        if (!ep.options.sentinels.empty()) {
            sentinel = std::make_unique<sentinel_watch>(ep, [this] {
                pool.drop_idle();
                sub->master_switched();
            });
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

    std::string holder_id(std::uint64_t thread) const {
        std::string h = id;
        h += ':';
        h += std::to_string(thread);
        return h;
    }

    /// Calls on_lock_lost; never throws, never under an internal lock.
    void tell(std::string_view lock, const error& reason) const noexcept {
        if (!ep.options.on_lock_lost) return;
        try {
            ep.options.on_lock_lost(lock, reason);
        } catch (...) {
        }
    }

    /// Tells the owner of a lost hold: on_lock_lost for a plain hold; for a member of a group
    /// (a red_lock node) the group decides, and tells its owner once.
    void tell_hold(const hold& h, const error& reason) const noexcept {
        const std::shared_ptr<hold_group> group = reg.with([&] { return h.group; });
        if (!group) {
            tell(h.name, reason);
            return;
        }
        if (group->part_lost() && group->tell) {
            try {
                group->tell(group->name,
                              error(errc::lock_lost, group->name, "",
                                    "too few of its parts are still held; the last loss: " +
                                        std::string(reason.what())));
            } catch (...) {
            }
        }
    }

    /// One watchdog tick: renews every watched hold, in batches of `renew_batch` holds per
    /// script call, all calls pipelined on the watchdog's connection. Public for tests/benches.
    /// `conn_epoch` is the endpoint epoch `conn` was opened in (Sentinel: a stale one is
    /// replaced). False when the connection failed (not when a hold was gone, nor on an error
    /// reply): then the watchdog tries again soon.
    bool renew_all(context_ptr& conn, std::uint64_t& conn_epoch) {
        std::vector<registry::hold_ptr> expired;
        std::vector<registry::hold_ptr> holds = reg.take_watched(expired);
        for (const auto& h : expired) {
            tell_hold(*h, error(errc::lock_lost, h->name, ep.name,
                                "the lease ran out before the watchdog could renew it"));
        }
        if (holds.empty()) return true;
        // Group by kind (one script per kind); stable so that batches are deterministic.
        std::stable_sort(holds.begin(), holds.end(),
                         [](const auto& a, const auto& b) { return a->kind < b->kind; });
        std::vector<char> ok(holds.size(), 0), gone(holds.size(), 0);
        std::optional<error> failure;
        const auto sent = clock::now();
        try {
            if (!conn || conn->err || conn_epoch != ep.epoch.load()) {
                conn.reset();
                conn_epoch = ep.epoch.load();
                conn = connect(ep);
            }
            const std::string lease = std::to_string(ep.options.lock_watchdog_timeout.count());
            std::vector<script_call> calls;
            std::vector<std::size_t> first;  // index of each call's first hold
            calls.reserve(holds.size() / renew_batch + 4);
            for (std::size_t i = 0; i < holds.size();) {
                std::size_t j = i;
                while (j < holds.size() && j - i < renew_batch && holds[j]->kind == holds[i]->kind) ++j;
                script_call& call = calls.emplace_back();
                call.start(holds[i]->kind->renew(), j - i);
                for (std::size_t k = i; k < j; ++k) call.push(holds[k]->name);
                call.push(lease);
                for (std::size_t k = i; k < j; ++k) call.push(holds[k]->value);
                first.push_back(i);
                i = j;
            }
            for (script_call& call : calls) {
                call.use_body(false);
                if (redisAppendCommandArgv(conn.get(), call.argc(), call.argv.data(),
                                           call.lens.data()) != REDIS_OK) {
                    throw make_error(conn.get(), nullptr, "", ep.name);
                }
            }
            std::vector<reply_ptr> replies;
            for (std::size_t c = 0; c < calls.size(); ++c) {
                void* raw = nullptr;
                if (redisGetReply(conn.get(), &raw) != REDIS_OK) {
                    throw make_error(conn.get(), nullptr, "", ep.name);
                }
                replies.emplace_back(static_cast<redisReply*>(raw));
            }
            for (std::size_t c = 0; c < calls.size(); ++c) {
                reply_ptr& r = replies[c];
                if (reply_is_error(r.get(), "NOSCRIPT")) {
                    r = run_script(conn.get(), calls[c], "", ep.name);
                }
                if (!r || r->type != REDIS_REPLY_ARRAY) {
                    throw make_error(conn.get(), r.get(), holds[first[c]]->name, ep.name);
                }
                for (std::size_t e = 0; e < r->elements; ++e) {
                    const bool renewed = r->element[e]->type == REDIS_REPLY_INTEGER &&
                                         r->element[e]->integer == 1;
                    ok[first[c] + e] = static_cast<char>(renewed);
                    gone[first[c] + e] = static_cast<char>(!renewed);
                }
            }
            // Replica sync: a shortfall is not a loss (the renewals are on the master).
            if (ep.options.sync_replicas > 0) wait_for_replicas(conn.get(), "");
        } catch (const error& e) {
            failure = e;
            // Broken, or READONLY (a failover made it a replica): make a new one next time.
            if (conn && (conn->err || e.value() == errc::connection_failed)) conn.reset();
        }
        for (const std::size_t i : reg.renewed(holds, ok, gone, sent)) {
            const hold& h = *holds[i];
            if (gone[i]) {
                tell_hold(h, error(errc::lock_lost, h.name, ep.name,
                                   "the watchdog found the hold gone: the key expired, was "
                                   "deleted or belongs to another holder now"));
            } else {
                tell_hold(h,
                     error(errc::lock_lost, h.name, ep.name,
                           std::string("the lease ran out before the watchdog could renew it: ") +
                               (failure ? failure->what() : "no reply")));
            }
        }
        // Only a connection that failed is worth trying again soon; an error reply is not.
        return !failure || (failure->value() != errc::connection_failed &&
                            failure->value() != errc::timeout);
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
    detail::pool pool;
    std::unique_ptr<subscriber> sub;
    std::unique_ptr<sentinel_watch> sentinel;  // with client_options::sentinels only
    registry reg;

private:
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
            if (wd_cv_.wait_until(g, next, [&] { return wd_stop_; })) break;
            g.unlock();
            const bool sent = renew_all(conn, conn_epoch);
            g.lock();
            next = sent ? std::max(next + period, clock::now()) : clock::now() + retry;
        }
    }

    const std::string sync_replicas_arg_;  // WAIT's arguments, formatted once
    const std::string sync_timeout_arg_;
    std::mutex wd_mu_;
    std::condition_variable wd_cv_;
    bool wd_stop_ = false;
    std::thread watchdog_;
};

struct client_access;

}  // namespace detail

/// A connection to one Redis server (or, later, deployment) for locks. See the file comment.
class client {
public:
    /// Connects (one connection, to fail fast) and starts the subscriber and watchdog threads.
    /// Throws `error`: invalid_argument for bad options, connection_failed / timeout /
    /// auth_failed when the server cannot be used.
    explicit client(client_options options)
        : core_(std::make_shared<detail::client_core>(std::move(options))) {
        core_->start();
    }

    /// From a URI: `redis://[user[:password]@]host[:port][/db]`, `unix:///path[?db=N]` or
    /// `redis-sentinel://[user[:password]@]host[:port][,host[:port]...]/master[/db]`; the other
    /// fields come from `base`.
    explicit client(std::string_view uri, client_options base = {})
        : client(client_options::from_uri(uri, std::move(base))) {}

    client(const client&) = delete;
    client& operator=(const client&) = delete;

    ~client() { core_->stop(); }

    /// The random UUID that starts every holder id of this client ("<id>:<threadId>").
    const std::string& id() const noexcept { return core_->id; }
    /// "host:port" (IPv6 in brackets), the unix socket path, or "master <name> via sentinel":
    /// what messages call the server.
    const std::string& server() const noexcept { return core_->ep.name; }
    const client_options& options() const noexcept { return core_->ep.options; }

private:
    friend struct detail::client_access;
    std::shared_ptr<detail::client_core> core_;
};

namespace detail {
struct client_access {
    static client_core& core(client& c) noexcept { return *c.core_; }
};
}  // namespace detail

}  // namespace rlock
