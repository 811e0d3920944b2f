// The connection pool: hiredis contexts are not thread-safe, so each command checks one out.
// With Redis Cluster there is one pool per master, and run() routes each command by its lock's
// slot, following the cluster's redirections.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/wake_pipe.hpp"

namespace rlock::detail {

/// Whether a command may be sent again on a new connection after its connection broke (or
/// timed out) while it was in flight: an idempotent one (a read, a DEL of our own key) may.
/// `retry_broken`: only after its connection broke (a restart, a killed connection), not after
/// a timeout — the server is not answering, and a new connection would wait as long (for a
/// command that may keep what it took each time it runs: a semaphore's acquire).
enum class on_break : unsigned char { fail, retry, retry_broken };

/// Whether `broken_then` lets a command that failed with `e` (its connection discarded) be sent
/// again on a new connection.
inline bool may_send_again(on_break broken_then, const error& e) noexcept {
    return broken_then == on_break::retry ||
           (broken_then == on_break::retry_broken && e.value() != errc::timeout);
}

class pool {
    struct node_pool;

public:
    using clock = std::chrono::steady_clock;
    /// Redirections one command may follow (a resharding under way moves a slot once or twice).
    static constexpr int max_redirects = 16;

    explicit pool(const endpoint& ep) : ep_(ep) {}

    /// Called (on the thread that found it, outside the pool's lock) when a connection turned
    /// out broken: an I/O error or timeout on it, or an idle one the server had closed. The
    /// client verifies its holds at once then: the server may have restarted without them.
    /// Set before the pool is used.
    std::function<void()> on_broken;
    pool(const pool&) = delete;
    pool& operator=(const pool&) = delete;

    /// A checked-out connection; goes back to the pool on destruction unless it broke or a
    /// master switch (Sentinel) made it stale.
    class handle {
    public:
        handle(pool* p, node_pool* n, context_ptr c, std::uint64_t epoch, std::uint64_t server_id)
            : pool_(p), node_(n), ctx_(std::move(c)), epoch_(epoch), server_id_(server_id) {}
        handle(handle&& o) noexcept
            : pool_(o.pool_),
              node_(o.node_),
              ctx_(std::move(o.ctx_)),
              epoch_(o.epoch_),
              server_id_(o.server_id_) {}
        handle& operator=(handle&&) = delete;
        ~handle();
        redisContext* get() const noexcept { return ctx_.get(); }
        /// server_identity() as this connection found it when it was opened (0: unknown).
        std::uint64_t server_id() const noexcept { return server_id_; }
        /// Closes the connection instead of pooling it: a reply may still be on its way.
        void discard() noexcept {
            if (!ctx_) return;
            ctx_.reset();
            pool_->forget(*node_);
        }
        /// Takes the connection out of the pool, open: the caller owns it from now on (a reply
        /// may still be on its way, and something may have to follow what was sent on it).
        context_ptr detach() noexcept {
            if (ctx_) pool_->forget(*node_);
            return std::move(ctx_);
        }

    private:
        pool* pool_;
        node_pool* node_;
        context_ptr ctx_;
        std::uint64_t epoch_;
        std::uint64_t server_id_;
    };

    /// Waits up to command_timeout for an idle connection or room to open one: to the server,
    /// or (Redis Cluster) to the master the slot map names for `lock`'s slot.
    handle checkout(std::string_view lock);

    /// An idle connection for `lock`, or none: never waits and never connects (Redis Cluster:
    /// none either while the slot map must be loaded first).
    std::optional<handle> try_checkout(std::string_view lock);

    /// A connection being opened by open_ahead: `conn` or `failure` once `done`.
    struct opening {
        std::mutex mu;
        bool done = false;
        std::optional<handle> conn;     // taken by the first caller that wants it
        std::optional<error> failure;   // why none could be opened
        std::vector<std::weak_ptr<wake_pipe>> wake;  // poked when done
    };

    /// Opens a connection for `lock` (checkout(): dial, log in) on a thread of its own, for a
    /// caller that must not block on a server that hangs: red_lock's fan-out asks every node
    /// under one deadline, and polls `wake`, which is poked when the opening is done. One at a
    /// time (without Redis Cluster): a call while one is under way joins it. `keep` (the
    /// client core that owns this pool) is kept alive by the thread until it ends, at most
    /// connect_timeout plus two command_timeouts later. Throws connection_failed when no
    /// thread can be started.
    std::shared_ptr<opening> open_ahead(std::string_view lock, const std::shared_ptr<wake_pipe>& wake,
                                        std::shared_ptr<const void> keep);

    /// Runs f(const connection&) on a pooled connection. When the connection breaks (I/O error,
    /// timeout) the other idle connections are dropped too: after a restart they are all dead.
    /// With on_break::retry (the command is idempotent) it is tried once more on a new
    /// connection.
    ///
    /// Redis Cluster: on the master of `lock`'s slot. MOVED updates the slot map and goes
    /// there; ASK goes to the named node once, with ASKING; TRYAGAIN, CLUSTERDOWN and a master
    /// that cannot be reached (nothing was sent) are tried again with a fresh map every 25 ms
    /// until command_timeout has passed; an on_break::retry command whose connection broke too.
    ///
    /// Without `follow_ask` an ASK is waited out like TRYAGAIN: for scripts that touch keys they
    /// do not declare (read_write_lock's hold keys), which may still be on the source.
    template <class F>
    auto run(std::string_view lock, on_break broken_then, F&& f, bool follow_ask = true)
        -> decltype(f(std::declval<const connection&>())) {
        if (ep_.slots) return run_clustered(lock, broken_then, f, follow_ask);
        for (int attempt = 0;; ++attempt) {
            handle h = checkout(lock);
            try {
                return f(connection{h.get(), false, false, h.server_id()});
            } catch (const error& e) {
                // An error reply leaves the connection fine, unless it says the server is a
                // replica now (READONLY, reported as connection_failed): then all are stale.
                if (h.get()->err == 0 && e.value() != errc::connection_failed) throw;
                h.discard();
                drop_idle();
                broken();
                if (!may_send_again(broken_then, e) || attempt > 0) throw;
            }
        }
    }

    /// Closes every idle connection (of every node).
    void drop_idle();

    /// The client is destroyed: the idle connections are closed now, and every connection
    /// given back from now on (a hold's unlock after the client, which still works) is closed
    /// rather than kept. A lock object or hold outliving its client then keeps no connection.
    void close();

private:
    struct pooled {
        context_ptr ctx;
        std::uint64_t epoch = 0;
        std::uint64_t server_id = 0;
    };
    /// The connections to one server: the only one, or one cluster master.
    struct node_pool {
        server_address at;  // Redis Cluster: the master; otherwise unused
        std::string name;   // how messages name it
        std::vector<pooled> idle;
        std::size_t open = 0;
        std::condition_variable cv;
    };

    handle checkout_at(node_pool& n, std::string_view lock);

    template <class F>
    auto run_clustered(std::string_view lock, on_break broken_then, F& f, bool follow_ask)
        -> decltype(f(std::declval<const connection&>())) {
        const int slot = key_slot(lock);
        const auto deadline = clock::now() + ep_.options.command_timeout;
        std::optional<server_address> to;  // set: the next try goes there (MOVED, ASK)
        bool ask = false;                  // ... with ASKING (ASK)
        int redirects = 0;
        int resent = 0;  // sends again after a broken connection (retry_broken: at most one)
        for (;;) {
            node_pool* n = nullptr;
            std::optional<handle> h;
            try {
                n = &node(to ? *to : master_for(slot, lock));
                h.emplace(checkout_at(*n, lock));
            } catch (const error& e) {
                // Nothing was sent. A master that cannot be reached may have failed over: a
                // fresh map names its successor once the cluster has promoted one.
                if (!is_ambiguous(e)) throw;
                ep_.slots->mark_stale();
                to.reset();
                ask = false;
                if (!pause_before_retry(deadline)) throw;
                continue;
            }
            try {
                return f(connection{h->get(), ask, ep_.sharded_pubsub, h->server_id()});
            } catch (const error& e) {
                redirect r = error_access::origin(e).to;
                if (r.kind == redirect::ask && !follow_ask) r.kind = redirect::try_again;
                // Past max_redirects in a row (nodes that disagree on the slot): pause and go
                // by the map, as for TRYAGAIN. With the count reset at every pause, an ASK whose
                // target answers TRYAGAIN (a multi-key script mid-migration) is followed again
                // and again until command_timeout, never cut short by the count.
                if ((r.kind == redirect::moved || r.kind == redirect::ask) && ++redirects > max_redirects) {
                    r.kind = redirect::try_again;
                }
                if (r.kind == redirect::moved || r.kind == redirect::ask) {
                    // Straight to the node named: a map loaded now could still say otherwise
                    // (the cluster's gossip lags the migration). MOVED also corrects the map,
                    // and marks it for a full load (a failover moves many slots at once).
                    to = named_host(r, *n);
                    ask = r.kind == redirect::ask;
                    if (!ask) ep_.slots->moved(r.slot, *to);
                    continue;
                }
                if (r.kind == redirect::try_again) {
                    ep_.slots->mark_stale();
                    to.reset();
                    ask = false;
                    redirects = 0;
                    if (pause_before_retry(deadline)) continue;
                    // Every node asked answered that it could not run the command (MOVED, ASK,
                    // TRYAGAIN, CLUSTERDOWN), so nothing of it ran, unless a send before broke:
                    // a wait makes it again after this outage of the cluster (failure_ride),
                    // with nothing to undo.
                    if (resent == 0) throw error_access::unsent(on_node(e, lock, *n), lock);
                    throw on_node(e, lock, *n);
                }
                if (h->get()->err == 0 && e.value() != errc::connection_failed) throw on_node(e, lock, *n);
                h->discard();
                drop_idle(*n);
                broken();
                ep_.slots->mark_stale();
                to.reset();
                ask = false;
                const bool once_more = broken_then != on_break::retry_broken || resent++ == 0;
                if (!may_send_again(broken_then, e) || !once_more || !pause_before_retry(deadline)) {
                    throw on_node(e, lock, *n);
                }
            }
        }
    }

    /// Redis Cluster: the master of `slot`, from the slot map, which is loaded again first when
    /// a redirection or a failure made it stale. One load at a time, at most one per
    /// `reload_gap` while loads fail: a thread that finds another loading, or a load that
    /// failed just now, uses the map as it is when it names a master for the slot (a wrong one
    /// answers MOVED). Only a slot the map knows no master of waits for a load.
    server_address master_for(int slot, std::string_view lock);

    /// The pool of the node at `at`, made on first use.
    node_pool& node(const server_address& at);

    /// A redirection with an empty host means the node that sent it.
    static server_address named_host(const redirect& r, const node_pool& from);

    /// Waits before the next try of a command the cluster could not run yet; false when the
    /// command's time is up instead. A backoff bounded by command_timeout, not a wait for a
    /// lock: no message announces that a failover or a slot migration has finished.
    static bool pause_before_retry(clock::time_point deadline);

    /// `e`, thrown by a command that named the whole cluster, naming the node that failed.
    error on_node(const error& e, std::string_view lock, const node_pool& n) const;

    void drop_idle(node_pool& n);

    // Closes the connections after the pool's lock is released (`dead` outlives the guard).
    void drop_idle_locked(node_pool& n, std::vector<pooled>& dead);

    /// Whether `n` has an idle connection that is still open, last in its list (take_idle
    /// takes it); closes those the server closed (`closed` is set then) and those from before a
    /// master switch. `g` holds mu_.
    bool idle_ready(node_pool& n, const std::unique_lock<std::mutex>& g, bool& closed);
    /// The connection idle_ready found, checked out.
    handle take_idle(node_pool& n, const std::unique_lock<std::mutex>& g);

    /// open_ahead's thread: opens, then tells whoever waits.
    void opened(opening& op, const std::string& lock) noexcept;

    void broken() const noexcept {
        try {
            if (on_broken) on_broken();
        } catch (...) {
        }
    }

    void forget(node_pool& n) noexcept;

    void give_back(node_pool& n, context_ptr c, std::uint64_t epoch, std::uint64_t server_id);

    const endpoint& ep_;
    std::mutex mu_;
    std::mutex load_mu_;  // one slot map load at a time
    static constexpr std::chrono::milliseconds reload_gap{25};
    clock::time_point last_load_{};  // the last load's start; guarded by load_mu_
    node_pool single_;    // the connections without Redis Cluster
    std::vector<std::unique_ptr<node_pool>> nodes_;  // Redis Cluster: one per master, kept
    // open_ahead's opening under way (without Redis Cluster); guarded by mu_. Its thread keeps
    // the client core, and so this pool, alive: it is null by the time the pool is destroyed.
    std::shared_ptr<opening> opening_;
    bool closed_ = false;  // close(): connections given back are closed; guarded by mu_
};

/// Runs a release `f(connection)`: a script that frees only what its holder holds, so running
/// it twice frees nothing twice. With on_break::retry a broken connection gets one more try,
/// on a new one. Returns f's answer, and whether that answer came from the repeat while the
/// first try most likely ran: it reached the same server process (the run_id each connection
/// read when it was opened; when either is unknown, an ACL without +info, it is assumed) and
/// no replica refused it (READONLY: it did not run). Then a "not held" answer is the first
/// try's own work. When the first try went to a server since replaced (a restart, a failover:
/// the run_id changed, so what that server did is gone with it), the answer is the truth.
template <class F>
auto run_release(pool& p, std::string_view lock, on_break broken_then, F&& f, bool follow_ask = true)
    -> std::pair<decltype(f(std::declval<const connection&>())), bool> {
    bool first_ran = true;           // as far as anyone can tell
    std::uint64_t first_server = 0;  // server_identity behind the first try's connection
    for (int round = 0;; ++round) {
        std::uint64_t server_id = 0;
        try {
            auto answer = p.run(lock, on_break::fail, [&](const connection& c) {
                server_id = c.server_id;
                return f(c);
            }, follow_ask);
            const bool repeat_of_one_that_ran =
                round > 0 && first_ran && (first_server == 0 || server_id == 0 || first_server == server_id);
            return {std::move(answer), repeat_of_one_that_ran};
        } catch (const error& e) {
            if (!is_ambiguous(e) || broken_then != on_break::retry || round > 0) throw;
            first_ran = !error_access::origin(e).readonly;
            first_server = server_id;
        }
    }
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL pool::handle::~handle() {
    if (ctx_) pool_->give_back(*node_, std::move(ctx_), epoch_, server_id_);
}

RLOCK_DECL auto pool::checkout(std::string_view lock) -> handle {
    if (!ep_.slots) return checkout_at(single_, lock);
    return checkout_at(node(master_for(key_slot(lock), lock)), lock);
}

RLOCK_DECL auto pool::try_checkout(std::string_view lock) -> std::optional<handle> {
    node_pool* n = &single_;
    if (ep_.slots) {
        if (ep_.slots->stale()) return std::nullopt;
        std::optional<server_address> m = ep_.slots->master_of(key_slot(lock));
        if (!m) return std::nullopt;
        n = &node(*m);
    }
    std::unique_lock<std::mutex> g(mu_);
    bool closed = false;
    std::optional<handle> h;
    if (idle_ready(*n, g, closed)) h.emplace(take_idle(*n, g));
    g.unlock();
    if (closed) broken();
    return h;
}

RLOCK_DECL auto pool::open_ahead(std::string_view lock, const std::shared_ptr<wake_pipe>& wake,
                                 std::shared_ptr<const void> keep) -> std::shared_ptr<opening> {
    std::shared_ptr<opening> op;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (!ep_.slots && opening_) op = opening_;
    }
    if (op) {
        std::unique_lock<std::mutex> g(op->mu);
        if (!op->done) {
            op->wake.push_back(wake);
            return op;
        }
    }
    op = std::make_shared<opening>();
    op->wake.push_back(wake);
    try {
        std::thread([this, op, name = std::string(lock), keep = std::move(keep)]() mutable {
            opened(*op, name);
            op.reset();  // before `keep`: an unclaimed connection goes back to this pool
            keep.reset();
        }).detach();
    } catch (const std::system_error&) {
        throw error(errc::connection_failed, lock, ep_.name, "cannot start a thread to connect");
    }
    if (!ep_.slots) {
        // The opening this one replaces is let go after the lock: when it was the last
        // reference, its unclaimed connection goes back to this pool (give_back takes mu_;
        // released under it, the thread deadlocked on itself — seen under TSan's slowness).
        std::shared_ptr<opening> replaced;
        std::lock_guard<std::mutex> g(mu_);
        replaced = std::exchange(opening_, op);
    }
    return op;
}

RLOCK_DECL void pool::close() {
    {
        std::lock_guard<std::mutex> g(mu_);
        closed_ = true;
    }
    drop_idle();
}

RLOCK_DECL void pool::drop_idle() {
    std::vector<pooled> dead;
    std::lock_guard<std::mutex> g(mu_);
    drop_idle_locked(single_, dead);
    for (auto& n : nodes_) drop_idle_locked(*n, dead);
}

RLOCK_DECL auto pool::checkout_at(node_pool& n, std::string_view lock) -> handle {
    std::unique_lock<std::mutex> g(mu_);
    const auto deadline = clock::now() + ep_.options.command_timeout;
    const std::size_t cap = ep_.options.pool_size;  // at least 1 (checked by client)
    const std::uint64_t epoch = ep_.epoch.load();
    bool closed = false;  // an idle connection the server had closed was found
    for (;;) {
        while (n.idle.empty() && n.open >= cap) {
            if (n.cv.wait_until(g, deadline) == std::cv_status::timeout && n.idle.empty() &&
                n.open >= cap) {
                error_origin none_free;
                none_free.unsent = true;
                none_free.no_connection_free = true;
                throw error_access::with_origin(
                    errc::timeout, lock, ep_.slots ? n.name : ep_.name,
                    "no pooled connection free within command_timeout (pool_size " +
                        std::to_string(cap) + ")",
                    std::move(none_free));
            }
        }
        if (idle_ready(n, g, closed)) {
            handle h = take_idle(n, g);
            g.unlock();
            if (closed) broken();
            return h;
        }
        if (n.open < cap) break;
    }
    ++n.open;
    g.unlock();
    if (closed) broken();
    try {
        context_ptr c = ep_.slots ? connect_node(ep_, n.at) : connect(ep_);
        const std::uint64_t id = server_identity(c.get(), ep_.slots ? n.name : ep_.name);
        return handle(this, &n, std::move(c), epoch, id);
    } catch (const error& e) {
        g.lock();
        --n.open;
        n.cv.notify_one();
        // Name the lock the connection was for, as a failed command on it would; nothing
        // was sent on it.
        throw error_access::unsent(e, lock);
    } catch (...) {
        g.lock();
        --n.open;
        n.cv.notify_one();
        throw;
    }
}

RLOCK_DECL server_address pool::master_for(int slot, std::string_view lock) {
    if (ep_.slots->stale()) {
        const bool known = ep_.slots->master_of(slot).has_value();
        std::unique_lock<std::mutex> g(load_mu_, std::defer_lock);
        if (known) {
            (void)g.try_lock();
        } else {
            g.lock();
        }
        // Not loaded by another thread meanwhile, and not tried just now.
        if (g.owns_lock() && ep_.slots->stale() &&
            (!known || clock::now() - last_load_ >= reload_gap)) {
            last_load_ = clock::now();
            try {
                load_slots(ep_);
            } catch (const error& e) {
                if (!ep_.slots->master_of(slot)) throw error_access::about(e, lock);
            }
        }
    }
    if (std::optional<server_address> m = ep_.slots->master_of(slot)) return std::move(*m);
    throw error(errc::server_error, lock, ep_.name,
                "no master serves slot " + std::to_string(slot) + " (the cluster is down)");
}

RLOCK_DECL auto pool::node(const server_address& at) -> node_pool& {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& n : nodes_) {
        if (n->at.port == at.port && n->at.host == at.host) return *n;
    }
    auto& n = nodes_.emplace_back(std::make_unique<node_pool>());
    n->at = at;
    n->name = "cluster node " + address_name(at.host, at.port);
    return *n;
}

RLOCK_DECL server_address pool::named_host(const redirect& r, const node_pool& from) {
    return server_address{r.host.empty() ? from.at.host : r.host, r.port};
}

RLOCK_DECL bool pool::pause_before_retry(clock::time_point deadline) {
    const auto now = clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<clock::duration>(std::chrono::milliseconds(25), deadline - now));
    return true;
}

RLOCK_DECL error pool::on_node(const error& e, std::string_view lock, const node_pool& n) const {
    if (e.server() != ep_.name) return error_access::about(e, lock);
    return error_access::on(error_access::about(e, lock), n.name);
}

RLOCK_DECL void pool::drop_idle(node_pool& n) {
    std::vector<pooled> dead;
    std::lock_guard<std::mutex> g(mu_);
    drop_idle_locked(n, dead);
}

RLOCK_DECL void pool::drop_idle_locked(node_pool& n, std::vector<pooled>& dead) {
    n.open -= n.idle.size();
    for (pooled& p : n.idle) dead.push_back(std::move(p));
    n.idle.clear();
    n.cv.notify_all();
}

RLOCK_DECL bool pool::idle_ready(node_pool& n, const std::unique_lock<std::mutex>& g,
                                 bool& closed) {
    (void)g;
    const std::uint64_t epoch = ep_.epoch.load();
    while (!n.idle.empty()) {
        const pooled& p = n.idle.back();
        if (p.epoch == epoch && !closed_while_idle(p.ctx.get())) return true;
        --n.open;
        if (p.epoch == epoch) closed = true;
        n.idle.pop_back();
    }
    return false;
}

RLOCK_DECL auto pool::take_idle(node_pool& n, const std::unique_lock<std::mutex>& g) -> handle {
    (void)g;
    pooled& p = n.idle.back();
    handle h(this, &n, std::move(p.ctx), p.epoch, p.server_id);
    n.idle.pop_back();
    return h;
}

RLOCK_DECL void pool::opened(opening& op, const std::string& lock) noexcept {
    std::optional<handle> h;
    std::optional<error> failure;
    try {
        h.emplace(checkout(lock));
    } catch (const error& e) {
        failure = e;
    } catch (...) {
        failure = error(errc::connection_failed, lock, ep_.name, "cannot open a connection");
    }
    std::vector<std::shared_ptr<wake_pipe>> poke;
    {
        std::lock_guard<std::mutex> g(op.mu);
        if (h) op.conn.emplace(std::move(*h));
        op.failure = std::move(failure);
        op.done = true;
        for (auto& w : op.wake) {
            if (auto p = w.lock()) poke.push_back(std::move(p));
        }
        op.wake.clear();
    }
    {
        std::shared_ptr<opening> done;  // let go after the lock, as in open_ahead
        std::lock_guard<std::mutex> g(mu_);
        if (opening_.get() == &op) done = std::move(opening_);
    }
    for (auto& p : poke) p->poke();
}

RLOCK_DECL void pool::forget(node_pool& n) noexcept {
    {
        std::lock_guard<std::mutex> g(mu_);
        --n.open;
    }
    n.cv.notify_one();
}

RLOCK_DECL void pool::give_back(node_pool& n, context_ptr c, std::uint64_t epoch,
                                std::uint64_t server_id) {
    {
        std::lock_guard<std::mutex> g(mu_);
        if (c->err || epoch != ep_.epoch.load() || closed_) {
            --n.open;
        } else {
            n.idle.push_back({std::move(c), epoch, server_id});
        }
    }
    n.cv.notify_one();
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
