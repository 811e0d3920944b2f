// The hiredis layer: owners for contexts and replies, connecting (AUTH, SELECT, timeouts),
// sending commands and scripts, and the one function that maps every hiredis or Redis failure
// to an rlock::error.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rlock/detail/sha1.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

struct context_deleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using context_ptr = std::unique_ptr<redisContext, context_deleter>;

inline std::string_view reply_text(const redisReply* r) noexcept {
    return r && r->str ? std::string_view(r->str, r->len) : std::string_view{};
}

inline bool reply_is_error(const redisReply* r, std::string_view prefix = {}) noexcept {
    return r && r->type == REDIS_REPLY_ERROR && reply_text(r).substr(0, prefix.size()) == prefix;
}

/// The one place hiredis and Redis failures become rlock errors. `ctx` is consulted when it
/// carries an I/O or protocol error (then `reply` is usually null); otherwise `reply` is an
/// error reply. `lock` and `server` name where it happened.
inline error make_error(const redisContext* ctx, const redisReply* reply, std::string_view lock,
                        std::string_view server) {
    if (ctx && ctx->err) {
        const std::string_view what = ctx->errstr;
        errc code = errc::connection_failed;
#ifdef REDIS_ERR_TIMEOUT
        if (ctx->err == REDIS_ERR_TIMEOUT) code = errc::timeout;
#endif
        // A blocking hiredis context reports an expired SO_RCVTIMEO / connect timeout as an I/O
        // error whose text is strerror(EAGAIN) or strerror(ETIMEDOUT), in 0.14 and in 1.x.
        if (ctx->err == REDIS_ERR_IO &&
            (what.find("temporarily unavailable") != std::string_view::npos ||
             what.find("timed out") != std::string_view::npos ||
             what.find("Timeout") != std::string_view::npos)) {
            code = errc::timeout;
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
        if (what.substr(0, 9) == "WRONGTYPE") code = errc::wrong_type;
        if (what.substr(0, 6) == "NOAUTH" || what.substr(0, 9) == "WRONGPASS" ||
            what.substr(0, 6) == "NOPERM") {
            code = errc::auth_failed;
        }
        return error(code, lock, server, what);
    }
    if (!reply) return error(errc::connection_failed, lock, server, "no reply");
    return error(errc::protocol_error, lock, server, "unexpected reply type");
}

/// Where to connect, and the name used in messages ("host:port" or the socket path).
struct endpoint {
    client_options options;
    std::string name;

    explicit endpoint(client_options o) : options(std::move(o)) {
        if (!options.unix_socket.empty()) {
            name = options.unix_socket;
        } else if (options.host.find(':') != std::string::npos) {
            name = "[" + options.host + "]:" + std::to_string(options.port);
        } else {
            name = options.host + ":" + std::to_string(options.port);
        }
    }
};

inline timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
}

/// Sends one command and reads its reply. Returns null only with ctx->err set.
inline reply_ptr command_argv(redisContext* c, int argc, const char** argv, const std::size_t* lens) {
    return reply_ptr(static_cast<redisReply*>(redisCommandArgv(c, argc, argv, lens)));
}

/// A command from string views: up to 16 parts on the stack, more on the heap.
inline reply_ptr command(redisContext* c, std::initializer_list<std::string_view> parts) {
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

/// Opens a connection: connect with connect_timeout, set command_timeout, TCP keep-alive,
/// AUTH (with the ACL user when one is given) and SELECT. Throws rlock::error.
inline context_ptr connect(const endpoint& ep) {
    const client_options& o = ep.options;
    const timeval ctv = to_timeval(o.connect_timeout);
    context_ptr c(o.unix_socket.empty() ? redisConnectWithTimeout(o.host.c_str(), o.port, ctv)
                                        : redisConnectUnixWithTimeout(o.unix_socket.c_str(), ctv));
    if (!c) throw error(errc::connection_failed, "", ep.name, "cannot allocate a hiredis context");
    if (c->err) throw make_error(c.get(), nullptr, "", ep.name);
    if (redisSetTimeout(c.get(), to_timeval(o.command_timeout)) != REDIS_OK) {
        throw make_error(c.get(), nullptr, "", ep.name);
    }
    if (o.unix_socket.empty()) redisEnableKeepAlive(c.get());
    if (!o.password.empty()) {
        reply_ptr r = o.username.empty() ? command(c.get(), {"AUTH", o.password})
                                         : command(c.get(), {"AUTH", o.username, o.password});
        if (!r) throw make_error(c.get(), nullptr, "", ep.name);
        if (r->type == REDIS_REPLY_ERROR) {
            throw error(errc::auth_failed, "", ep.name, std::string("AUTH: ") += reply_text(r.get()));
        }
    }
    if (o.db != 0) {
        const std::string db = std::to_string(o.db);
        reply_ptr r = command(c.get(), {"SELECT", db});
        if (!r) throw make_error(c.get(), nullptr, "", ep.name);
        if (r->type == REDIS_REPLY_ERROR) {
            throw error(errc::auth_failed, "", ep.name, "SELECT " + db + ": " += reply_text(r.get()));
        }
    }
    return c;
}

/// An embedded Lua script: the text and its SHA-1, computed once.
class script {
public:
    explicit script(std::string_view body) : body_(body), sha_(sha1_hex(body)) {}
    std::string_view body() const noexcept { return body_; }
    const std::string& sha() const noexcept { return sha_; }

private:
    std::string_view body_;
    std::string sha_;
};

/// Builds argv for EVALSHA (or EVAL) sha numkeys keys... args... into caller-owned vectors, so
/// the same buffers serve the retry and a pipeline of many calls.
struct script_call {
    const script* s = nullptr;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    char numkeys[12] = {};

    script_call() = default;
    script_call(const script& sc, std::initializer_list<std::string_view> keys,
                std::initializer_list<std::string_view> args) {
        start(sc, keys.size());
        argv.reserve(3 + keys.size() + args.size());
        lens.reserve(3 + keys.size() + args.size());
        for (std::string_view k : keys) push(k);
        for (std::string_view a : args) push(a);
    }
    void start(const script& sc, std::size_t nkeys) {
        s = &sc;
        argv.clear();
        lens.clear();
        // Decimal by hand: snprintf was a visible share of the hot path's instructions.
        char digits[12];
        std::size_t n = 0;
        do {
            digits[n++] = static_cast<char>('0' + nkeys % 10);
            nkeys /= 10;
        } while (nkeys != 0 && n < sizeof digits);
        for (std::size_t i = 0; i < n; ++i) numkeys[i] = digits[n - 1 - i];
        numkeys[n] = '\0';
        push("EVALSHA");
        push(sc.sha());
        push(numkeys);
    }
    void push(std::string_view part) {
        argv.push_back(part.data());
        lens.push_back(part.size());
    }
    /// Arms the call as EVALSHA sha or EVAL body. Also re-points numkeys at this object's own
    /// buffer, so a call that was moved (kept in a vector) is safe to send.
    void use_body(bool body) {
        argv[2] = numkeys;
        argv[0] = body ? "EVAL" : "EVALSHA";
        lens[0] = body ? 4 : 7;
        argv[1] = body ? s->body().data() : s->sha().data();
        lens[1] = body ? s->body().size() : s->sha().size();
    }
    int argc() const noexcept { return static_cast<int>(argv.size()); }
};

/// Runs a script: EVALSHA, and after NOSCRIPT (SCRIPT FLUSH, a restarted server) EVAL with the
/// body, which reloads the cache, once. Throws on I/O errors and on error replies.
inline reply_ptr run_script(redisContext* c, script_call& call, std::string_view lock,
                            std::string_view server) {
    call.use_body(false);
    reply_ptr r = command_argv(c, call.argc(), call.argv.data(), call.lens.data());
    if (reply_is_error(r.get(), "NOSCRIPT")) {
        call.use_body(true);
        r = command_argv(c, call.argc(), call.argv.data(), call.lens.data());
    }
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), lock, server);
    return r;
}

/// Sends a plain command; throws on I/O errors and on error replies.
inline reply_ptr run_command(redisContext* c, std::initializer_list<std::string_view> parts,
                             std::string_view lock, std::string_view server) {
    reply_ptr r = command(c, parts);
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), lock, server);
    return r;
}

inline long long reply_integer(const redisReply* r, std::string_view lock, std::string_view server) {
    if (!r || r->type != REDIS_REPLY_INTEGER) {
        throw error(errc::protocol_error, lock, server, "expected an integer reply");
    }
    return r->integer;
}

/// Runs a script whose reply is one integer, and returns it.
inline long long eval_integer(redisContext* c, const script& s,
                              std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args, std::string_view lock,
                              std::string_view server) {
    script_call call(s, keys, args);
    return reply_integer(run_script(c, call, lock, server).get(), lock, server);
}

}  // namespace rlock::detail
