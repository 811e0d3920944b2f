// The hiredis layer: owners for contexts and replies, sending commands, and the one function
// that maps every hiredis or Redis failure to an rlock::error. Connecting is in connect.hpp,
// scripts in script.hpp.
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

struct context_deleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using context_ptr = std::unique_ptr<redisContext, context_deleter>;

RLOCK_DECL std::string_view reply_text(const redisReply* r) noexcept;

RLOCK_DECL bool reply_is_error(const redisReply* r, std::string_view prefix = {}) noexcept;

/// A refusal to write by a replica (a master demoted by a failover): the command did not run.
/// The whole phrase, so that a lock name cannot pass for it ("slave" before Redis 5).
inline bool is_readonly(std::string_view what) noexcept {
    return what.find("READONLY You can't write against a read only ") != std::string_view::npos;
}

/// A command connection as the pool hands it to a callback, with how commands are to be sent
/// on it for this one run.
struct connection {
    redisContext* ctx = nullptr;
    /// Redis Cluster: the pool is retrying on the node an ASK named (the slot is being migrated
    /// there). Every command is then sent as ASKING + command, and a script as EVAL with its
    /// body: the node may not have it cached, and a NOSCRIPT reply would use up the ASKING.
    bool asking = false;
    /// Redis Cluster with sharded pub/sub: scripts run in their SPUBLISH form
    /// (script::body(true)), so that their unlock messages reach the waiters of both
    /// libraries, which listen with SSUBSCRIBE.
    bool sharded_publish = false;
    /// server_identity of the server behind ctx (0: unknown).
    std::uint64_t server_id = 0;
};

/// The one place hiredis and Redis failures become rlock errors. `ctx` is consulted when it
/// carries an I/O or protocol error (then `reply` is usually null); otherwise `reply` is an
/// error reply. `lock` and `server` name where it happened.
RLOCK_DECL error make_error(const redisContext* ctx, const redisReply* reply, std::string_view lock,
                        std::string_view server);

inline error make_error(const connection& c, const redisReply* reply, std::string_view lock,
                        std::string_view server) {
    return make_error(c.ctx, reply, lock, server);
}

RLOCK_DECL timeval to_timeval(std::chrono::milliseconds ms);

/// Appends one command to `c`'s output buffer, in the protocol's form (`*argc`, then `$len` and
/// the bytes of each part), formatted here into a buffer of the calling thread and handed to
/// hiredis whole. hiredis's own redisAppendCommandArgv formats each part with sdscatfmt: that
/// was half the client's instructions in a lock + unlock cycle (docs/benchmarks.md). Returns
/// REDIS_OK or REDIS_ERR, as hiredis's append functions do. `lens` null: the parts are C strings.
RLOCK_DECL int append_command(redisContext* c, int argc, const char* const* argv, const std::size_t* lens);

/// Sends one command and reads its reply. Returns null only with ctx->err set.
RLOCK_DECL reply_ptr command_argv(const connection& conn, int argc, const char** argv,
                              const std::size_t* lens);

inline reply_ptr command_argv(redisContext* c, int argc, const char** argv, const std::size_t* lens) {
    return command_argv(connection{c}, argc, argv, lens);
}

/// Writes a command on c's socket after what was sent on it before, reading no reply,
/// whatever state hiredis left the context in (a read that timed out): the server runs it
/// after those, in order, when it runs them at all. For an undo that must follow a command
/// whose reply never came on the same connection, before that connection is given up (sent
/// on another, it could run first, or wait behind a paused server's backlog in any order).
/// Best effort: false when it could not be written whole, at once.
RLOCK_DECL bool write_after(const redisContext* c, int argc, const char** argv,
                            const std::size_t* lens) noexcept;

/// A command from string views: up to 16 parts on the stack, more on the heap.
RLOCK_DECL reply_ptr command(const connection& c, std::initializer_list<std::string_view> parts);

inline reply_ptr command(redisContext* c, std::initializer_list<std::string_view> parts) {
    return command(connection{c}, parts);
}

/// Sends a plain command; throws on I/O errors and on error replies.
RLOCK_DECL reply_ptr run_command(const connection& c, std::initializer_list<std::string_view> parts,
                             std::string_view lock, std::string_view server);

RLOCK_DECL long long reply_integer(const redisReply* r, std::string_view lock, std::string_view server);

/// Reads what the socket of `c` has and calls `f(reply)` (a `const redisReply*`) for each whole
/// reply in it, for connections that poll() themselves (pub/sub). False on an I/O or protocol
/// error: the connection is then unusable.
template <class F>
bool read_replies(redisContext* c, F&& f) {
    if (redisBufferRead(c) != REDIS_OK) return false;
    for (;;) {
        void* raw = nullptr;
        if (redisGetReplyFromReader(c, &raw) != REDIS_OK) return false;
        if (!raw) return true;
        const reply_ptr r(static_cast<redisReply*>(raw));
        f(r.get());
    }
}

/// True when a connection with no command in flight has something to read or has failed.
/// Redis sends nothing unasked on a command connection, so this is the server having closed it
/// (a restart, CLIENT KILL, its idle `timeout`). A command sent into such a connection fails
/// after it was written, and its sender cannot tell whether it ran; the same command sent on a
/// new connection can tell. So a pooled connection is checked before it is reused.
RLOCK_DECL bool closed_while_idle(const redisContext* c) noexcept;

/// Who the server process behind `c` is: a hash of its run_id (INFO server), which changes
/// whenever the server restarts and differs between a master and the replica that replaces it.
/// 0 when the server will not say (an ACL without `+info`). Throws on I/O errors.
RLOCK_DECL std::uint64_t server_identity(redisContext* c, std::string_view server);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string_view reply_text(const redisReply* r) noexcept {
    return r && r->str ? std::string_view(r->str, r->len) : std::string_view{};
}

RLOCK_DECL bool reply_is_error(const redisReply* r, std::string_view prefix) noexcept {
    return r && r->type == REDIS_REPLY_ERROR && reply_text(r).substr(0, prefix.size()) == prefix;
}

// strerror_r's text, whichever of its two forms the C library declares (GNU: the text; XSI: 0).
inline const char* strerror_text(int rc, const char* buf) noexcept { return rc == 0 ? buf : ""; }
inline const char* strerror_text(const char* text, const char* /*buf*/) noexcept {
    return text ? text : "";
}

// Whether hiredis's error text `what` says `number` (strerror_r, in the program's locale, as
// hiredis wrote it: LC_MESSAGES translates it), or `english`, as C locale's text reads.
inline bool says_errno(std::string_view what, int number, std::string_view english) noexcept {
    if (what.find(english) != std::string_view::npos) return true;
    char buf[256] = {};
    const std::string_view text = strerror_text(strerror_r(number, buf, sizeof buf), buf);
    return !text.empty() && what.find(text) != std::string_view::npos;
}

RLOCK_DECL error make_error(const redisContext* ctx, const redisReply* reply, std::string_view lock,
                            std::string_view server) {
    if (ctx && ctx->err) {
        const std::string_view what = ctx->errstr;
        errc code = errc::connection_failed;
#ifdef REDIS_ERR_TIMEOUT
        if (ctx->err == REDIS_ERR_TIMEOUT) code = errc::timeout;
#endif
        // A blocking hiredis context reports an expired SO_RCVTIMEO / connect timeout as an I/O
        // error whose text is strerror(EAGAIN) or strerror(ETIMEDOUT), in 0.14 and in 1.x, in
        // the program's locale (a program that calls setlocale gets it translated).
        const bool again = says_errno(what, EAGAIN, "temporarily unavailable") ||
                           says_errno(what, EWOULDBLOCK, "temporarily unavailable");
        if (ctx->err == REDIS_ERR_IO &&
            (again || says_errno(what, ETIMEDOUT, "timed out") ||
             what.find("Timeout") != std::string_view::npos)) {
            code = errc::timeout;
        }
        // strerror(EAGAIN) is how an expired SO_RCVTIMEO / SO_SNDTIMEO reads: say what it means,
        // with the timeout the socket had (client_options::command_timeout).
        if (code == errc::timeout && again) {
            std::string says = "the server did not answer in time";
            timeval tv{};
            socklen_t len = sizeof tv;
            if (ctx->fd >= 0 && ::getsockopt(ctx->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) == 0 &&
                (tv.tv_sec > 0 || tv.tv_usec > 0)) {
                says = "no reply within " +
                       std::to_string(static_cast<long long>(tv.tv_sec) * 1000 + tv.tv_usec / 1000) +
                       " ms";
            }
            return error(code, lock, server, says + " (client_options::command_timeout)");
        }
        if (ctx->err == REDIS_ERR_PROTOCOL) code = errc::protocol_error;
        if (ctx->err == REDIS_ERR_EOF) {
            return error(code, lock, server, "server closed the connection");
        }
        return error(code, lock, server, what);
    }
    if (reply && reply->type == REDIS_REPLY_ERROR) {
        const std::string_view what = reply_text(reply);
        errc code = errc::server_error;
        error_origin origin;
        origin.to = parse_redirect(what);
        if (what.substr(0, 9) == "WRONGTYPE") code = errc::wrong_type;
        // A master turned replica by a failover: the connection is to the wrong server.
        // Anywhere in the text: Redis 6 wraps it in a script error ("ERR Error running
        // script ... -READONLY ...").
        if (is_readonly(what)) {
            code = errc::connection_failed;
            origin.readonly = true;
        }
        // An ACL's refusal inside a script comes as "ERR The user executing the script
        // can't ..." (Redis 7.0) or "ERR ACL failure in script: ..." (7.2 and later).
        if (what.substr(0, 6) == "NOAUTH" || what.substr(0, 9) == "WRONGPASS" ||
            what.substr(0, 6) == "NOPERM" ||
            what.find("user executing the script can't") != std::string_view::npos ||
            what.find("ACL failure in script") != std::string_view::npos) {
            code = errc::auth_failed;
        }
        return error_access::with_origin(code, lock, server, what, std::move(origin));
    }
    if (!reply) return error(errc::connection_failed, lock, server, "no reply");
    return error(errc::protocol_error, lock, server, "unexpected reply type");
}

RLOCK_DECL timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
}

RLOCK_DECL int append_command(redisContext* c, int argc, const char* const* argv,
                              const std::size_t* lens) {
    // `*n\r\n` or `$n\r\n` written backwards from `end`; returns where it starts.
    auto header = [](char* end, char kind, std::size_t n) {
        *--end = '\n';
        *--end = '\r';
        do {
            *--end = static_cast<char>('0' + n % 10);
            n /= 10;
        } while (n != 0);
        *--end = kind;
        return end;
    };
    constexpr std::size_t header_max = 24;  // kind, 20 digits, CR LF
    std::size_t size = header_max;
    for (int i = 0; i < argc; ++i) size += header_max + (lens ? lens[i] : std::strlen(argv[i])) + 2;
    thread_local std::vector<char> buf;
    if (buf.size() < size) buf.resize(size);
    char* const begin = buf.data();
    char scratch[header_max];
    char* out = begin;
    auto put = [&](const char* from, std::size_t n) {
        std::memcpy(out, from, n);
        out += n;
    };
    const char* h = header(scratch + header_max, '*', static_cast<std::size_t>(argc));
    put(h, static_cast<std::size_t>(scratch + header_max - h));
    for (int i = 0; i < argc; ++i) {
        const std::size_t len = lens ? lens[i] : std::strlen(argv[i]);
        h = header(scratch + header_max, '$', len);
        put(h, static_cast<std::size_t>(scratch + header_max - h));
        put(argv[i], len);
        put("\r\n", 2);
    }
    const int status = redisAppendFormattedCommand(c, begin, static_cast<std::size_t>(out - begin));
    constexpr std::size_t keep_at_most = std::size_t{64} << 10;
    if (buf.size() > keep_at_most) std::vector<char>().swap(buf);  // a rare big command: not kept
    return status;
}

RLOCK_DECL reply_ptr command_argv(const connection& conn, int argc, const char** argv,
                                  const std::size_t* lens) {
    redisContext* c = conn.ctx;
    // With `asking`, ASKING and the command in one round trip; ASKING's own +OK is dropped.
    if (conn.asking && redisAppendCommand(c, "ASKING") != REDIS_OK) return nullptr;
    if (append_command(c, argc, argv, lens) != REDIS_OK) return nullptr;
    void* raw = nullptr;
    if (conn.asking) {
        if (redisGetReply(c, &raw) != REDIS_OK) return nullptr;
        reply_ptr ok(static_cast<redisReply*>(raw));
        raw = nullptr;
    }
    if (redisGetReply(c, &raw) != REDIS_OK) return nullptr;
    return reply_ptr(static_cast<redisReply*>(raw));
}

RLOCK_DECL bool write_after(const redisContext* c, int argc, const char** argv,
                            const std::size_t* lens) noexcept {
    // Something hiredis has not written yet would be cut by this one.
    if (!c || c->fd < 0 || (c->obuf && c->obuf[0] != '\0')) return false;
    char* cmd = nullptr;
    const long long len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len <= 0 || !cmd) return false;
    long long done = 0;
    while (done < len) {
        const ssize_t n = ::send(c->fd, cmd + done, static_cast<std::size_t>(len - done),
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += n;
    }
    redisFreeCommand(cmd);
    return done == len;
}

RLOCK_DECL reply_ptr command(const connection& c, std::initializer_list<std::string_view> parts) {
    constexpr std::size_t small = 16;
    const char* argv_small[small];
    std::size_t lens_small[small];
    std::vector<const char*> argv_big;
    std::vector<std::size_t> lens_big;
    const char** argv = argv_small;
    std::size_t* lens = lens_small;
    if (parts.size() > small) {
        argv_big.resize(parts.size());
        lens_big.resize(parts.size());
        argv = argv_big.data();
        lens = lens_big.data();
    }
    int n = 0;
    for (std::string_view p : parts) {
        argv[n] = p.data();
        lens[n] = p.size();
        ++n;
    }
    return command_argv(c, n, argv, lens);
}

RLOCK_DECL reply_ptr run_command(const connection& c, std::initializer_list<std::string_view> parts,
                                 std::string_view lock, std::string_view server) {
    reply_ptr r = command(c, parts);
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), lock, server);
    return r;
}

RLOCK_DECL long long reply_integer(const redisReply* r, std::string_view lock,
                                   std::string_view server) {
    // An error reply is itself (an ACL's NOPERM is auth_failed), not a malformed answer.
    if (r && r->type == REDIS_REPLY_ERROR)
        throw make_error(static_cast<const redisContext*>(nullptr), r, lock, server);
    if (!r || r->type != REDIS_REPLY_INTEGER) {
        throw error(errc::protocol_error, lock, server, "expected an integer reply");
    }
    return r->integer;
}

RLOCK_DECL bool closed_while_idle(const redisContext* c) noexcept {
    if (c->err != 0) return true;
    pollfd p{c->fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable (EOF), hung up, in error, or poll() failed
}

RLOCK_DECL std::uint64_t server_identity(redisContext* c, std::string_view server) {
    reply_ptr r = command(c, {"INFO", "server"});
    if (!r) throw make_error(c, nullptr, "", server);
    if (r->type != REDIS_REPLY_STRING) return 0;
    const std::string_view info = reply_text(r.get());
    constexpr std::string_view field = "run_id:";
    const std::size_t at = info.find(field);
    if (at == std::string_view::npos || (at != 0 && info[at - 1] != '\n')) return 0;
    const std::size_t from = at + field.size();
    const std::size_t to = info.find_first_of("\r\n", from);
    const std::string_view id = info.substr(from, to == std::string_view::npos ? to : to - from);
    if (id.empty()) return 0;
    return std::max<std::uint64_t>(1, std::hash<std::string_view>{}(id));
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
