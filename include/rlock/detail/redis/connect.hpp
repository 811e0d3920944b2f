// Connecting: where a client connects (endpoint), dialing and logging in, Sentinel discovery of
// the master, and Redis Cluster's nodes and slot map.
#pragma once

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

/// "host:port", IPv6 hosts in brackets: how messages name a server.
RLOCK_DECL std::string address_name(const std::string& host, int port);

/// Where to connect, and the name used in messages ("host:port", the socket path, or
/// "master <name> via sentinel").
struct endpoint {
    client_options options;
    std::string name;
    /// Sentinel: bumped at every master switch; a connection opened before is stale.
    std::atomic<std::uint64_t> epoch{0};

    /// Sentinel: the master the last +switch-master named, if any.
    std::optional<server_address> switched_to() const {
        std::lock_guard<std::mutex> g(switch_mu_);
        return switched_to_;
    }
    /// Sentinel: a +switch-master to `to`: remembers it and makes every connection stale.
    void master_switched(server_address to);

    /// Sentinel: a connection was opened to the master at `at`.
    void opened_to(const server_address& at) const;
    /// Sentinel: the master every connection opened so far went to ("host:port"); empty when
    /// none was opened, or when they went to different masters.
    std::string opened_all_to() const;
    /// Sentinel: the master the last connection was opened to, if any.
    std::optional<server_address> last_opened() const {
        std::lock_guard<std::mutex> g(switch_mu_);
        return last_opened_;
    }

    /// Redis Cluster: which master serves each slot; null without client_options::cluster.
    std::unique_ptr<slot_map> slots;
    /// Redis Cluster: the seed nodes (cluster_nodes, or host:port when that is empty).
    std::vector<server_address> seeds;
    /// Redis Cluster with sharded pub/sub (Redis 7+): waiters SSUBSCRIBE on the master of their
    /// channel's slot and releases SPUBLISH, as Redisson does there (shardedSubscriptionMode
    /// AUTO). Decided once by the client's constructor, before any other thread uses the
    /// endpoint; false otherwise (classic PUBLISH / SUBSCRIBE).
    bool sharded_pubsub = false;

    /// Whether the client finds a new master by itself after a failover (Sentinel, Cluster): a
    /// replica's READONLY is then a passing state of the deployment, not its settings.
    bool follows_failovers() const noexcept { return slots != nullptr || !options.sentinels.empty(); }

    /// Replica sync: WAIT's two arguments, formatted once.
    std::string wait_replicas, wait_timeout;

    explicit endpoint(client_options o);

private:
    mutable std::mutex switch_mu_;
    std::optional<server_address> switched_to_;
    mutable std::string opened_to_;  // opened_all_to(), "\n" once they differed
    mutable std::optional<server_address> last_opened_;
};

/// Opens a TCP (or, with an empty host, unix socket) connection with connect_timeout, sets
/// command_timeout and TCP keep-alive. `server` names it in errors. Throws rlock::error.
RLOCK_DECL context_ptr dial(const client_options& o, const std::string& host, int port,
                        std::string_view server);

/// An error of the client's own settings (a refused AUTH or SELECT, or an ACL that refuses a
/// command): trying another sentinel or node will not help.
inline bool settings_error(const error& e) noexcept {
    return e.value() == errc::auth_failed || error_access::origin(e).settings_refused;
}

/// AUTH (with the ACL user when one is given) and SELECT, each only when asked for. A refusal
/// is marked settings_refused.
RLOCK_DECL void login(redisContext* c, const std::string& username, const std::string& password,
                  int db, std::string_view server);

/// Sentinel: a connection to sentinel `s`, AUTHed as the sentinel user. `where` names it.
RLOCK_DECL context_ptr open_sentinel(const client_options& o, const server_address& s,
                                 std::string_view where);

/// Sentinel: `SENTINEL get-master-addr-by-name` on `c`; empty when the sentinel does not know
/// the master. Throws on I/O errors and error replies (NOAUTH: auth_failed).
RLOCK_DECL std::optional<server_address> ask_master(redisContext* c, const client_options& o,
                                                std::string_view where);

/// Sentinel: connects to `host:port` and checks with ROLE that it is a master (an ACL that
/// refuses ROLE skips the check; a READONLY reply catches a replica later). Null, with `why`
/// set, when it is not one.
RLOCK_DECL context_ptr connect_master(const endpoint& ep, const std::string& host, int port,
                                  std::string_view named_by, std::string& why);

/// Sentinel: finds the master and connects to it. First the address the last +switch-master
/// named (endpoint::switched_to: sentinels that did not run the failover may still name the old
/// master, which stays a master until it is converted); then each sentinel in turn, asked
/// `SENTINEL get-master-addr-by-name`. Every candidate must answer ROLE as a master. When no
/// sentinel answered in a round (all down, paused or unreachable), the master the client last
/// connected to, if it still answers ROLE as one: with no sentinel up no failover can move it,
/// and the connections the client has go there anyway. Tries again every 50 ms until
/// connect_timeout has passed. Errors of the client's settings (a refused AUTH or SELECT) are
/// final.
RLOCK_DECL context_ptr connect_via_sentinel(const endpoint& ep);

/// Redis Cluster: a connection to the node `at`, AUTHed (a cluster has db 0 only).
RLOCK_DECL context_ptr connect_node(const endpoint& ep, const server_address& at);

/// Redis Cluster: calls `f(connection, address)` on the first node that can be reached — the
/// masters the slot map knows, then the seeds — and returns what it returns. Errors of the
/// client's settings (a refused AUTH), and whatever `f` throws, end the search at once.
template <class F>
auto on_any_node(const endpoint& ep, F&& f) -> decltype(f(std::declval<context_ptr>(), ep.seeds.front())) {
    std::vector<server_address> candidates = ep.slots->masters();
    candidates.insert(candidates.end(), ep.seeds.begin(), ep.seeds.end());
    std::string why;
    for (const server_address& a : candidates) {
        context_ptr c;
        try {
            c = connect_node(ep, a);
        } catch (const error& e) {
            if (settings_error(e)) throw;
            why = error_access::brief(e);
            continue;
        }
        return f(std::move(c), a);
    }
    throw error(errc::connection_failed, "", ep.name, "no cluster node could be reached; last: " + why);
}

/// Redis Cluster: loads the slot map with CLUSTER SLOTS from the first node that answers.
/// Throws when none does, or when the node refuses (a server without cluster support).
RLOCK_DECL void load_slots(const endpoint& ep);

/// Opens a connection: to the configured server, through the sentinels to the master, or (Redis
/// Cluster) to any node; then AUTH and SELECT. Throws rlock::error.
RLOCK_DECL context_ptr connect(const endpoint& ep);

/// Replica sync: `WAIT sync_replicas sync_timeout` on `c`, the connection that just wrote;
/// returns how many replicas acknowledged. Throws as any command does.
RLOCK_DECL long long wait_for_replicas(const connection& c, const endpoint& ep, std::string_view lock);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string address_name(const std::string& host, int port) {
    const std::string p = std::to_string(port);
    return host.find(':') != std::string::npos ? "[" + host + "]:" + p : host + ":" + p;
}

RLOCK_DECL void endpoint::master_switched(server_address to) {
    {
        std::lock_guard<std::mutex> g(switch_mu_);
        switched_to_ = std::move(to);
    }
    ++epoch;
}

RLOCK_DECL void endpoint::opened_to(const server_address& at) const {
    const std::string address = address_name(at.host, at.port);
    std::lock_guard<std::mutex> g(switch_mu_);
    last_opened_ = at;
    if (opened_to_.empty()) {
        opened_to_ = address;
    } else if (opened_to_ != address) {
        opened_to_ = "\n";
    }
}

RLOCK_DECL std::string endpoint::opened_all_to() const {
    std::lock_guard<std::mutex> g(switch_mu_);
    return opened_to_ == "\n" ? std::string() : opened_to_;
}

RLOCK_DECL endpoint::endpoint(client_options o)
    : options(std::move(o)),
      wait_replicas(std::to_string(options.sync_replicas)),
      wait_timeout(std::to_string(options.sync_timeout.count())) {
    if (options.cluster) {
        seeds = options.cluster_nodes;
        if (seeds.empty()) seeds.push_back({options.host, options.port});
        name = "cluster";
        for (std::size_t i = 0; i < seeds.size(); ++i) {
            name += i == 0 ? " " : ",";
            name += address_name(seeds[i].host, seeds[i].port);
        }
        slots = std::make_unique<slot_map>();
    } else if (!options.sentinels.empty()) {
        name = "master " + options.sentinel_master + " via sentinel";
    } else if (!options.unix_socket.empty()) {
        name = options.unix_socket;
    } else {
        name = address_name(options.host, options.port);
    }
}

RLOCK_DECL context_ptr dial(const client_options& o, const std::string& host, int port,
                            std::string_view server) {
    const timeval ctv = to_timeval(o.connect_timeout);
    context_ptr c(host.empty() ? redisConnectUnixWithTimeout(o.unix_socket.c_str(), ctv)
                               : redisConnectWithTimeout(host.c_str(), port, ctv));
    if (!c) throw error(errc::connection_failed, "", server, "cannot allocate a hiredis context");
    if (c->err) throw make_error(c.get(), nullptr, "", server);
    if (redisSetTimeout(c.get(), to_timeval(o.command_timeout)) != REDIS_OK) {
        throw make_error(c.get(), nullptr, "", server);
    }
    if (!host.empty()) redisEnableKeepAlive(c.get());
    return c;
}

RLOCK_DECL void login(redisContext* c, const std::string& username, const std::string& password,
                      int db, std::string_view server) {
    if (!password.empty()) {
        reply_ptr r = username.empty() ? command(c, {"AUTH", password})
                                       : command(c, {"AUTH", username, password});
        if (!r) throw make_error(c, nullptr, "", server);
        if (r->type == REDIS_REPLY_ERROR) {
            error_origin refused;
            refused.settings_refused = true;
            throw error_access::with_origin(errc::auth_failed, "", server,
                                            std::string("AUTH: ") += reply_text(r.get()),
                                            std::move(refused));
        }
    }
    if (db != 0) {
        const std::string n = std::to_string(db);
        reply_ptr r = command(c, {"SELECT", n});
        if (!r) throw make_error(c, nullptr, "", server);
        if (r->type == REDIS_REPLY_ERROR) {
            // A database the server does not have is server_error; only an ACL that forbids
            // SELECT (NOPERM) is auth_failed.
            const errc code = make_error(c, r.get(), "", server).value();
            error_origin refused;
            refused.settings_refused = true;
            throw error_access::with_origin(
                code, "", server,
                "SELECT " + n + " (client_options::db) refused: " += reply_text(r.get()),
                std::move(refused));
        }
    }
}

RLOCK_DECL context_ptr open_sentinel(const client_options& o, const server_address& s,
                                     std::string_view where) {
    context_ptr c = dial(o, s.host, s.port, where);
    login(c.get(), o.sentinel_username, o.sentinel_password, 0, where);
    return c;
}

RLOCK_DECL std::optional<server_address> ask_master(redisContext* c, const client_options& o,
                                                    std::string_view where) {
    reply_ptr r = command(c, {"SENTINEL", "get-master-addr-by-name", o.sentinel_master});
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), "", where);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        return std::nullopt;
    }
    return server_address{std::string(reply_text(r->element[0])),
                          std::atoi(std::string(reply_text(r->element[1])).c_str())};
}

RLOCK_DECL context_ptr connect_master(const endpoint& ep, const std::string& host, int port,
                                      std::string_view named_by, std::string& why) {
    const client_options& o = ep.options;
    const std::string master = address_name(host, port);
    context_ptr c = dial(o, host, port, master);
    login(c.get(), o.username, o.password, o.db, master);
    reply_ptr role = command(c.get(), {"ROLE"});
    if (!role) throw make_error(c.get(), nullptr, "", master);
    if (role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
        reply_text(role->element[0]) != "master") {
        why = master;
        why.append(", named master by ").append(named_by).append(", is a ");
        why.append(reply_text(role->element[0])).append(" (a failover is under way)");
        return nullptr;
    }
    return c;
}

RLOCK_DECL context_ptr connect_via_sentinel(const endpoint& ep) {
    const client_options& o = ep.options;
    const auto deadline = std::chrono::steady_clock::now() + o.connect_timeout;
    std::string why = "no sentinel answered", fallback;
    for (;;) {
        if (const std::optional<server_address> last = ep.switched_to()) {
            try {
                if (context_ptr c =
                        connect_master(ep, last->host, last->port, "+switch-master", why)) {
                    ep.opened_to(*last);
                    return c;
                }
            } catch (const error& e) {
                if (settings_error(e)) throw;
                why = error_access::brief(e);
            }
        }
        bool answered = false;  // a sentinel answered this round
        for (const server_address& s : o.sentinels) {
            if (std::chrono::steady_clock::now() >= deadline) break;
            const std::string sentinel = "sentinel " + address_name(s.host, s.port);
            try {
                context_ptr sc = open_sentinel(o, s, sentinel);
                const std::optional<server_address> master = ask_master(sc.get(), o, sentinel);
                answered = true;
                if (!master) {
                    why = sentinel + " does not know a master named " + o.sentinel_master;
                    continue;
                }
                if (context_ptr c = connect_master(ep, master->host, master->port, sentinel, why)) {
                    ep.opened_to(*master);
                    return c;
                }
            } catch (const error& e) {
                if (settings_error(e)) throw;
                why = error_access::brief(e);
            }
        }
        // A sentinel that answered is believed, even when the master it named cannot be used
        // yet (a failover is under way); silence from all of them is no news of a failover.
        const std::optional<server_address> last = ep.last_opened(), named = ep.switched_to();
        if (!answered && last &&
            (!named || address_name(named->host, named->port) != address_name(last->host, last->port))) {
            try {
                const std::string named_by = "the client's last connection (no sentinel answered)";
                if (context_ptr c = connect_master(ep, last->host, last->port, named_by, fallback)) {
                    ep.opened_to(*last);
                    return c;
                }
            } catch (const error& e) {
                if (settings_error(e)) throw;
                fallback = error_access::brief(e);
            }
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            throw error(
                errc::connection_failed, "", ep.name,
                "no master found through the sentinels within connect_timeout; last: " + why +
                    (fallback.empty() ? "" : "; " + fallback));
        }
        // A backoff, not a wait for a lock: no sentinel named a usable master yet (a failover
        // is under way, or the master is down), and no message announces that one is ready.
        // Bounded by connect_timeout; lock waiters never sleep here.
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            std::chrono::milliseconds(50), deadline - now));
    }
}

RLOCK_DECL context_ptr connect_node(const endpoint& ep, const server_address& at) {
    const std::string where = address_name(at.host, at.port);
    context_ptr c = dial(ep.options, at.host, at.port, where);
    login(c.get(), ep.options.username, ep.options.password, 0, where);
    return c;
}

RLOCK_DECL void load_slots(const endpoint& ep) {
    on_any_node(ep, [&](context_ptr c, const server_address& a) {
        const std::string where = address_name(a.host, a.port);
        reply_ptr r = command(c.get(), {"CLUSTER", "SLOTS"});
        if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c.get(), r.get(), "", where);
        if (!ep.slots->load(r.get(), a.host)) {
            throw error(errc::protocol_error, "", where,
                        "CLUSTER SLOTS: no slots served, or a reply rlock cannot read");
        }
        return 0;
    });
}

RLOCK_DECL context_ptr connect(const endpoint& ep) {
    const client_options& o = ep.options;
    if (ep.slots) return on_any_node(ep, [](context_ptr c, const server_address&) { return c; });
    if (!o.sentinels.empty()) return connect_via_sentinel(ep);
    context_ptr c = dial(o, o.unix_socket.empty() ? o.host : std::string(), o.port, ep.name);
    login(c.get(), o.username, o.password, o.db, ep.name);
    return c;
}

RLOCK_DECL long long wait_for_replicas(const connection& c, const endpoint& ep,
                                       std::string_view lock) {
    reply_ptr r = run_command(c, {"WAIT", ep.wait_replicas, ep.wait_timeout}, lock, ep.name);
    return reply_integer(r.get(), lock, ep.name);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
