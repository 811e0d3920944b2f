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

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/redis/uri.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/options.hpp"

namespace rlock {

/// Locks on one Redis deployment: a server, a master found through Sentinel, or a Redis
/// Cluster. See the file comment.
class client {
public:
    /// Connects (one connection, to fail fast) and starts the subscriber and watchdog threads.
    /// Throws `error`: invalid_argument for bad options, connection_failed / timeout /
    /// auth_failed when the server cannot be used.
    ///
    /// SIGPIPE: when it is at its default disposition (which ends the process), it is set to
    /// ignored, so that a write to a connection Redis has closed is an error, not the end of the
    /// process; a handler or disposition set by the program is left as it is.
    explicit client(client_options options)
        : core_((detail::ignore_default_sigpipe(),
                 std::make_shared<detail::client_core>(std::move(options)))) {
        core_->start();
    }

    /// From a URI: `redis://[[user:]password@]host[:port][/db]`, `unix:///path[?db=N]`,
    /// `redis-sentinel://[[user:]password@]host[:port][,host[:port]...]/master[/db]` or
    /// `redis-cluster://[[user:]password@]host[:port][,host[:port]...]`; the other fields come
    /// from `base` (client_options::from_uri).
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


}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL client_options client_options::from_uri(std::string_view uri, client_options base) {
    detail::uri_parts parts = detail::parse_uri(uri);
    base.host = std::move(parts.host);
    base.port = parts.port;
    base.unix_socket = std::move(parts.unix_socket);
    base.username = std::move(parts.username);
    base.password = std::move(parts.password);
    base.db = parts.db;
    base.sentinels.clear();
    for (auto& [host, port] : parts.sentinels) base.sentinels.push_back({std::move(host), port});
    base.sentinel_master = std::move(parts.sentinel_master);
    base.cluster = parts.cluster;
    base.cluster_nodes.clear();
    if (parts.cluster) {
        for (auto& [host, port] : parts.seeds)
            base.cluster_nodes.push_back({std::move(host), port});
    }
    return base;
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
