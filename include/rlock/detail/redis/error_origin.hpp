// detail::error_origin: what rlock itself reads from an rlock::error beyond its code and its
// words — where the Redis reply that caused it sent the command (a Redis Cluster redirection),
// and whether the command ran at all — and detail::error_access, which makes errors that carry
// it (make_error, hiredis.hpp) and re-addresses them. The origin rides in the error's parts
// (errors.hpp, error::parts), so copies of the error keep it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

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
    bool unsent = false;    // the command did not run: no connection could be had, or (Redis
                            // Cluster) each node asked said it could not run it yet
    bool undone = false;    // it may have run, and its undo is sent already (after it, on its
                            // connection, or since): nothing is owed
    bool no_connection_free = false;  // a timeout waiting for a free pooled connection: the
                                      // server was not asked
};

/// rlock's internal view of an error: the origin make_error recorded, and the same error
/// re-addressed (naming the lock a connection was opened for, the cluster node that failed).
/// Derived from error only to reach its protected parts; never thrown as itself.
class error_access : public error {
public:
    static error with_origin(errc code, std::string_view lock, std::string_view server,
                             std::string_view cause, error_origin origin);
    /// The origin of `e`; an empty one for an error rlock did not make from a reply.
    static const error_origin& origin(const error& e) noexcept;
    /// `e`, naming `lock` when it named none.
    static error about(const error& e, std::string_view lock);
    /// `e`, naming `server` instead of the server it named.
    static error on(const error& e, std::string_view server);
    /// "<server>: <cause>" (or the cause alone): `e` told inside another error's cause.
    static std::string brief(const error& e);
    /// `e`, naming `lock` (when it named none), marked as met before anything was sent.
    static error unsent(const error& e, std::string_view lock);
    /// `e`, marked as undone: what its command may have done is undone already.
    static error undone(const error& e);
    /// `e` without its redirection: an error a redirection must not be followed for.
    static error unredirected(const error& e);

private:
    struct located final : parts {
        located(std::string l, std::string s, std::string c, error_origin o)
            : parts(std::move(l), std::move(s), std::move(c)), origin(std::move(o)) {}
        const void* tag() const noexcept override { return &mark; }
        static constexpr char mark = 0;  // its address tells located parts from others'
        error_origin origin;
    };
    using error::error;
};

/// True for the errors after which a command may or may not have run: the connection broke
/// (connection_failed) or the reply did not come in time (timeout).
inline bool is_ambiguous(const error& e) noexcept {
    return e.value() == errc::connection_failed || e.value() == errc::timeout;
}

/// True for the errors after which a command may run if sent again later: an ambiguous one,
/// or one the server could not run yet (Redis Cluster: a slot migrating, TRYAGAIN, the
/// cluster down; a replica that was the master: READONLY).
inline bool may_run_later(const error& e) noexcept {
    if (is_ambiguous(e)) return true;
    const error_origin& o = error_access::origin(e);
    return o.to.kind != redirect::none || o.readonly;
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL error error_access::with_origin(errc code, std::string_view lock,
                                           std::string_view server, std::string_view cause,
                                           error_origin origin) {
    // The error is made as an error_access, whose constructor may reach error's, and handed
    // on as the error it is: its parts, the origin with them, go along.
    const error_access made(code, std::make_shared<const located>(std::string(lock), std::string(server),
                                                                std::string(cause), std::move(origin)));
    return static_cast<const error&>(made);
}

RLOCK_DECL const error_origin& error_access::origin(const error& e) noexcept {
    static const error_origin none;
    const parts& p = parts_of(e);
    return p.tag() == &located::mark ? static_cast<const located&>(p).origin : none;
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

RLOCK_DECL error error_access::undone(const error& e) {
    error_origin o = origin(e);
    o.undone = true;
    return with_origin(e.value(), e.lock(), e.server(), e.cause(), std::move(o));
}

RLOCK_DECL error error_access::unredirected(const error& e) {
    error_origin o = origin(e);
    o.to = redirect{};
    return with_origin(e.value(), e.lock(), e.server(), e.cause(), std::move(o));
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
