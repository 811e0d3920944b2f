// rlock — the one error type.
//
// Every failure rlock reports is an `rlock::error`, a `std::system_error` whose code belongs to
// `rlock::error_category()` and whose value is an `rlock::errc`. The message names the lock (when
// there is one), the server as host:port (or the socket path) and the cause, e.g.
//
//     rlock: lock "orders" on 127.0.0.1:6380: WRONGTYPE Operation against a key holding the
//     wrong kind of value
//
// Compare codes, not messages:  `catch (const rlock::error& e) { if (e.code() ==
// rlock::errc::timeout) ... }`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "rlock/config.hpp"

namespace rlock {

/// What went wrong. The numeric values are stable.
enum class errc {
    invalid_argument = 1,  ///< bad input (empty name, bad URI, non-positive lease); nothing was sent
    connection_failed,     ///< could not connect, or the connection broke mid-command
    timeout,               ///< connect or command timeout, or no pooled connection in time
    auth_failed,           ///< AUTH refused, or an ACL forbids a command or key (NOAUTH, WRONGPASS, NOPERM)
    wrong_type,            ///< the lock's key exists and holds another kind of value
    server_error,          ///< any other error reply from Redis (the message carries it)
    protocol_error,        ///< a reply rlock cannot understand
    not_owner,             ///< unlock by a thread that does not hold the lock
    would_deadlock,        ///< the calling thread would wait for itself
    lock_lost,             ///< a hold expired, was deleted or taken over (see on_lock_lost)
    quorum_not_reached,    ///< a multi-node lock could not win a majority
    replica_sync_failed,   ///< fewer replicas acknowledged a write than were asked for
    operation_aborted,     ///< an asynchronous operation was cancelled before it completed
};

namespace detail {

class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "rlock"; }
    std::string message(int value) const override;
};

}  // namespace detail

/// The category of all rlock error codes.
RLOCK_DECL const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

namespace detail {

/// Where a Redis Cluster node sent a command instead of running it (MOVED, ASK), or that it
/// could not run it yet (TRYAGAIN, CLUSTERDOWN, a script that reached a key migrated away).
/// An empty host means the node that answered.
struct redirect {
    enum kind_t : unsigned char { none, moved, ask, try_again } kind = none;
    int slot = -1;
    std::string host;  // moved and ask: the node to ask instead
    int port = 0;
};

/// What rlock itself reads from an error, beyond its code: filled by make_error from the reply
/// that caused it, carried unchanged when the error is re-addressed (error_access).
struct error_origin {
    redirect to;            // Redis Cluster: the redirection in the reply
    bool readonly = false;  // a replica refused a write (READONLY): the command did not run
    bool settings_refused = false;  // AUTH or SELECT refused: every server will say the same
    bool unsent = false;    // no connection could be had: the command was not sent
};

struct error_access;

}  // namespace detail

/// The exception rlock throws, and the reason it passes to `on_lock_lost`.
///
/// what() reads "rlock: lock "<lock>" on <server>: <cause>: <code's message>" (empty parts
/// left out); lock(), server() and cause() give the parts. Copying never throws, and a moved-from
/// error keeps its parts (a move is a copy).
class error : public std::system_error {
public:
    /// An error with `what` as its cause, naming no lock or server; what() reads
    /// "<what>: <code's message>", as std::system_error's.
    error(errc code, const std::string& what)
        : std::system_error(make_error_code(code), what),
          parts_(std::make_shared<const parts>(parts{{}, {}, what, {}})) {}

    /// An error about `lock` (empty: none) on `server` (empty: none) because of `cause`.
    error(errc code, std::string_view lock, std::string_view server, std::string_view cause)
        : error(code, std::make_shared<const parts>(parts{std::string(lock), std::string(server),
                                                          std::string(cause), {}})) {}

    error(const error&) = default;
    error& operator=(const error&) = default;
    ~error() override = default;

    errc value() const noexcept { return static_cast<errc>(code().value()); }

    /// The name of the lock the error concerns; empty when it concerns none (a client's own
    /// connection, bad client options).
    const std::string& lock() const noexcept { return parts_->lock; }
    /// The server as messages name it: "host:port", a socket path, "master <name> via
    /// sentinel", "cluster node host:port"; empty when no server was involved.
    const std::string& server() const noexcept { return parts_->server; }
    /// What went wrong, in words (a Redis error reply's text, or rlock's own).
    const std::string& cause() const noexcept { return parts_->cause; }

private:
    friend struct detail::error_access;
    struct parts {
        std::string lock, server, cause;
        detail::error_origin origin;
    };

    error(errc code, std::shared_ptr<const parts> p)
        : std::system_error(make_error_code(code), compose(*p)), parts_(std::move(p)) {}

    static std::string compose(const parts& p);

    std::shared_ptr<const parts> parts_;
};

namespace detail {

/// rlock's internal view of an error: the origin make_error recorded, and the same error
/// re-addressed (naming the lock a connection was opened for, the cluster node that failed).
struct error_access {
    static error with_origin(errc code, std::string_view lock, std::string_view server,
                             std::string_view cause, error_origin origin);
    static const error_origin& origin(const error& e) noexcept { return e.parts_->origin; }
    /// `e`, naming `lock` when it named none.
    static error about(const error& e, std::string_view lock);
    /// `e`, naming `server` instead of the server it named.
    static error on(const error& e, std::string_view server);
    /// "<server>: <cause>" (or the cause alone): `e` told inside another error's cause.
    static std::string brief(const error& e);
    /// `e`, naming `lock` (when it named none), marked as met before anything was sent.
    static error unsent(const error& e, std::string_view lock);
    /// `e` without its redirection: an error a redirection must not be followed for.
    static error unredirected(const error& e);
};

/// True for the errors after which a command may or may not have run: the connection broke
/// (connection_failed) or the reply did not come in time (timeout).
inline bool is_ambiguous(const error& e) noexcept {
    return e.value() == errc::connection_failed || e.value() == errc::timeout;
}

}  // namespace detail

}  // namespace rlock

template <>
struct std::is_error_code_enum<rlock::errc> : std::true_type {};

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string error_category_impl::message(int value) const {
    switch (static_cast<errc>(value)) {
        case errc::invalid_argument:
            return "invalid argument";
        case errc::connection_failed:
            return "connection failed";
        case errc::timeout:
            return "timed out";
        case errc::auth_failed:
            return "authentication failed";
        case errc::wrong_type:
            return "key holds the wrong kind of value";
        case errc::server_error:
            return "server error";
        case errc::protocol_error:
            return "protocol error";
        case errc::not_owner:
            return "not the owner of the lock";
        case errc::would_deadlock:
            return "would deadlock";
        case errc::lock_lost:
            return "lock lost";
        case errc::quorum_not_reached:
            return "quorum not reached";
        case errc::replica_sync_failed:
            return "replica sync failed";
        case errc::operation_aborted:
            return "operation aborted";
    }
    return "unknown rlock error";
}

}  // namespace rlock::detail

namespace rlock {

RLOCK_DECL const std::error_category& error_category() noexcept {
    // Never destroyed: an error made on a thread that is still at work while the process exits
    // (one opening a connection to a red_lock node that hangs) must still find it whole.
    static const detail::error_category_impl* const category =
        new detail::error_category_impl();  // NOLINT(cppcoreguidelines-owning-memory,bugprone-unhandled-exception-at-new)
    return *category;
}

RLOCK_DECL std::string error::compose(const parts& p) {
    std::string m = "rlock:";
    if (!p.lock.empty()) {
        m.append(" lock \"").append(p.lock).append("\"");
    }
    if (!p.server.empty()) {
        m.append(" on ").append(p.server);
    }
    m.append(p.lock.empty() && p.server.empty() ? " " : ": ").append(p.cause);
    return m;
}

}  // namespace rlock

namespace rlock::detail {

RLOCK_DECL error error_access::with_origin(errc code, std::string_view lock,
                                           std::string_view server, std::string_view cause,
                                           error_origin origin) {
    return error(
        code, std::make_shared<const error::parts>(error::parts{
                  std::string(lock), std::string(server), std::string(cause), std::move(origin)}));
}

RLOCK_DECL error error_access::about(const error& e, std::string_view lock) {
    if (!e.lock().empty() || lock.empty()) return e;
    return with_origin(e.value(), lock, e.server(), e.cause(), origin(e));
}

RLOCK_DECL error error_access::on(const error& e, std::string_view server) {
    return with_origin(e.value(), e.lock(), server, e.cause(), origin(e));
}

RLOCK_DECL std::string error_access::brief(const error& e) {
    return e.server().empty() ? e.cause() : e.server() + ": " + e.cause();
}

RLOCK_DECL error error_access::unsent(const error& e, std::string_view lock) {
    error_origin o = origin(e);
    o.unsent = true;
    return with_origin(e.value(), e.lock().empty() ? lock : e.lock(), e.server(), e.cause(),
                       std::move(o));
}

RLOCK_DECL error error_access::unredirected(const error& e) {
    error_origin o = origin(e);
    o.to = redirect{};
    return with_origin(e.value(), e.lock(), e.server(), e.cause(), std::move(o));
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
