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

/// The category of all rlock error codes.
RLOCK_DECL const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

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
          parts_(std::make_shared<const parts>(std::string(), std::string(), what)) {}

    /// An error about `lock` (empty: none) on `server` (empty: none) because of `cause`.
    error(errc code, std::string_view lock, std::string_view server, std::string_view cause)
        : error(code, std::make_shared<const parts>(std::string(lock), std::string(server),
                                                    std::string(cause))) {}

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

protected:
    /// What an error is made of. A type derived from error may make its errors of a type
    /// derived from this one, to carry more than the three parts: copies of the error share it
    /// (rlock's own errors record there what the Redis reply that caused them said, a Redis
    /// Cluster redirection for one).
    struct parts {
        parts(std::string l, std::string s, std::string c)
            : lock(std::move(l)), server(std::move(s)), cause(std::move(c)) {}
        parts(const parts&) = default;
        parts& operator=(const parts&) = delete;
        virtual ~parts() = default;
        /// Null for the parts error makes; a derived type's parts may answer a tag of their
        /// own, so that it knows them from others' without RTTI.
        virtual const void* tag() const noexcept { return nullptr; }
        std::string lock, server, cause;
    };

    /// An error of `code` made of `p` (not null).
    error(errc code, std::shared_ptr<const parts> p)
        : std::system_error(make_error_code(code), compose(*p)), parts_(std::move(p)) {}

    /// What `e` is made of.
    static const parts& parts_of(const error& e) noexcept { return *e.parts_; }

private:
    static std::string compose(const parts& p);

    std::shared_ptr<const parts> parts_;
};

}  // namespace rlock

template <>
struct std::is_error_code_enum<rlock::errc> : std::true_type {};

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL const std::error_category& error_category() noexcept {
    class category final : public std::error_category {
    public:
        const char* name() const noexcept override { return "rlock"; }
        std::string message(int value) const override {
            switch (static_cast<errc>(value)) {
                case errc::invalid_argument: return "invalid argument";
                case errc::connection_failed: return "connection failed";
                case errc::timeout: return "timed out";
                case errc::auth_failed: return "authentication failed";
                case errc::wrong_type: return "key holds the wrong kind of value";
                case errc::server_error: return "server error";
                case errc::protocol_error: return "protocol error";
                case errc::not_owner: return "not the owner of the lock";
                case errc::would_deadlock: return "would deadlock";
                case errc::lock_lost: return "lock lost";
                case errc::quorum_not_reached: return "quorum not reached";
                case errc::replica_sync_failed: return "replica sync failed";
                case errc::operation_aborted: return "operation aborted";
            }
            return "unknown rlock error";
        }
    };
    // Never destroyed: an error made on a thread that is still at work while the process exits
    // (one opening a connection to a red_lock node that hangs) must still find it whole.
    static const category* const instance =
        new category();  // NOLINT(cppcoreguidelines-owning-memory,bugprone-unhandled-exception-at-new)
    return *instance;
}

RLOCK_DECL std::string error::compose(const parts& p) {
    std::string m = "rlock:";
    if (!p.lock.empty()) {
        m.append(" lock \"").append(p.lock).append("\"");
    }
    if (!p.server.empty()) {
        m.append(" on ").append(p.server);
    }
    // std::system_error appends ": <code's message>": an empty part leaves no empty field.
    if (p.cause.empty()) return p.lock.empty() && p.server.empty() ? "rlock" : m;
    m.append(p.lock.empty() && p.server.empty() ? " " : ": ").append(p.cause);
    return m;
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
