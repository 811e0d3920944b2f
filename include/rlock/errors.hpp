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

#include <string>
#include <string_view>
#include <system_error>

namespace rlock {

/// What went wrong. The numeric values are stable.
enum class errc {
    invalid_argument = 1,  ///< bad input (empty name, bad URI, non-positive lease); nothing was sent
    connection_failed,     ///< could not connect, or the connection broke mid-command
    timeout,               ///< connect or command timeout, or no pooled connection in time
    auth_failed,           ///< AUTH or SELECT refused (NOAUTH, WRONGPASS, NOPERM, bad db)
    wrong_type,            ///< the lock's key exists and holds another kind of value
    server_error,          ///< any other error reply from Redis (the message carries it)
    protocol_error,        ///< a reply rlock cannot understand
    not_owner,             ///< unlock by a thread that does not hold the lock
    would_deadlock,        ///< the calling thread would wait for itself
    lock_lost,             ///< a hold expired, was deleted or taken over (see on_lock_lost)
    quorum_not_reached,    ///< a multi-node lock could not win a majority
    replica_sync_failed,   ///< fewer replicas acknowledged a write than were asked for
};

namespace detail {

class error_category_impl final : public std::error_category {
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
        }
        return "unknown rlock error";
    }
};

}  // namespace detail

/// The category of all rlock error codes.
inline const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
}

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// The exception rlock throws, and the reason it passes to `on_lock_lost`.
class error : public std::system_error {
public:
    error(errc code, const std::string& what) : std::system_error(make_error_code(code), what) {}

    /// Builds the message "rlock: lock "<lock>" on <server>: <cause>"; empty parts are left out.
    error(errc code, std::string_view lock, std::string_view server, std::string_view cause)
        : error(code, compose(lock, server, cause)) {}

    errc value() const noexcept { return static_cast<errc>(code().value()); }

private:
    static std::string compose(std::string_view lock, std::string_view server,
                               std::string_view cause) {
        std::string m = "rlock:";
        if (!lock.empty()) {
            m.append(" lock \"").append(lock).append("\"");
        }
        if (!server.empty()) {
            m.append(" on ").append(server);
        }
        m.append(lock.empty() && server.empty() ? " " : ": ").append(cause);
        return m;
    }
};

}  // namespace rlock

template <>
struct std::is_error_code_enum<rlock::errc> : std::true_type {};
