// The hiredis layer: owners for contexts and replies, connecting (AUTH, SELECT, timeouts),
// sending commands and scripts, and the one function that maps every hiredis or Redis failure
// to an rlock::error.
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlock/detail/cluster.hpp"
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

/// A refusal to write by a replica (a master demoted by a failover): the command did not run.
/// The whole phrase, so that a lock name cannot pass for it ("slave" before Redis 5).
inline bool is_readonly(std::string_view what) noexcept {
    return what.find("READONLY You can't write against a read only ") != std::string_view::npos;
}

/// Redis Cluster: the redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) in the last error reply
/// make_error turned into an error on this thread. The pool clears it before it runs a
/// command and reads it when the command threw.
inline redirect& last_redirect() noexcept {
    static thread_local redirect r;
    return r;
}

/// Redis Cluster: true on a thread while the pool retries a command on the node an ASK named
/// (its slot is being migrated there). Every command is then sent as ASKING + command, and a
/// script as EVAL with its body: the node may not have it cached, and a NOSCRIPT reply would
/// use up the ASKING.
inline bool& asking() noexcept {
    static thread_local bool a = false;
    return a;
}

/// Redis Cluster with sharded pub/sub: true on a thread while the pool runs a command there.
/// Scripts then run in their SPUBLISH form (script::body(true)), so that their unlock messages
/// reach the waiters of both libraries, which listen with SSUBSCRIBE.
inline bool& sharded_publish() noexcept {
    static thread_local bool s = false;
    return s;
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
        if (redirect r = parse_redirect(what); r.kind != redirect::none) last_redirect() = std::move(r);
        if (what.substr(0, 9) == "WRONGTYPE") code = errc::wrong_type;
        // A master turned replica by a failover: the connection is to the wrong server.
        // Anywhere in the text: Redis 6 wraps it in a script error ("ERR Error running
        // script ... -READONLY ...").
        if (is_readonly(what)) code = errc::connection_failed;
        if (what.substr(0, 6) == "NOAUTH" || what.substr(0, 9) == "WRONGPASS" ||
            what.substr(0, 6) == "NOPERM") {
            code = errc::auth_failed;
        }
        return error(code, lock, server, what);
    }
    if (!reply) return error(errc::connection_failed, lock, server, "no reply");
    return error(errc::protocol_error, lock, server, "unexpected reply type");
}

/// "host:port", IPv6 hosts in brackets: how messages name a server.
inline std::string address_name(const std::string& host, int port) {
    const std::string p = std::to_string(port);
    return host.find(':') != std::string::npos ? "[" + host + "]:" + p : host + ":" + p;
}

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
    void master_switched(server_address to) {
        {
            std::lock_guard<std::mutex> g(switch_mu_);
            switched_to_ = std::move(to);
        }
        ++epoch;
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

    explicit endpoint(client_options o) : options(std::move(o)) {
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

private:
    mutable std::mutex switch_mu_;
    std::optional<server_address> switched_to_;
};

inline timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
}

/// Sends one command and reads its reply. Returns null only with ctx->err set.
inline reply_ptr command_argv(redisContext* c, int argc, const char** argv, const std::size_t* lens) {
    if (asking()) {
        // ASKING and the command in one round trip; ASKING's own +OK is dropped.
        if (redisAppendCommand(c, "ASKING") != REDIS_OK ||
            redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK) {
            return nullptr;
        }
        void* raw = nullptr;
        if (redisGetReply(c, &raw) != REDIS_OK) return nullptr;
        reply_ptr ok(static_cast<redisReply*>(raw));
        raw = nullptr;
        if (redisGetReply(c, &raw) != REDIS_OK) return nullptr;
        return reply_ptr(static_cast<redisReply*>(raw));
    }
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

/// Opens a TCP (or, with an empty host, unix socket) connection with connect_timeout, sets
/// command_timeout and TCP keep-alive. `server` names it in errors. Throws rlock::error.
inline context_ptr dial(const client_options& o, const std::string& host, int port,
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

/// AUTH (with the ACL user when one is given) and SELECT, each only when asked for.
inline void login(redisContext* c, const std::string& username, const std::string& password,
                  int db, std::string_view server) {
    if (!password.empty()) {
        reply_ptr r = username.empty() ? command(c, {"AUTH", password})
                                       : command(c, {"AUTH", username, password});
        if (!r) throw make_error(c, nullptr, "", server);
        if (r->type == REDIS_REPLY_ERROR) {
            throw error(errc::auth_failed, "", server, std::string("AUTH: ") += reply_text(r.get()));
        }
    }
    if (db != 0) {
        const std::string n = std::to_string(db);
        reply_ptr r = command(c, {"SELECT", n});
        if (!r) throw make_error(c, nullptr, "", server);
        if (r->type == REDIS_REPLY_ERROR) {
            throw error(errc::auth_failed, "", server, "SELECT " + n + ": " += reply_text(r.get()));
        }
    }
}

/// True when a connection with no command in flight has something to read or has failed.
/// Redis sends nothing unasked on a command connection, so this is the server having closed it
/// (a restart, CLIENT KILL, its idle `timeout`). A command sent into such a connection fails
/// after it was written, and its sender cannot tell whether it ran; the same command sent on a
/// new connection can tell. So a pooled connection is checked before it is reused.
inline bool closed_while_idle(const redisContext* c) noexcept {
    if (c->err != 0) return true;
    pollfd p{c->fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable (EOF), hung up, in error, or poll() failed
}

/// Who the server process behind `c` is: a hash of its run_id (INFO server), which changes
/// whenever the server restarts and differs between a master and the replica that replaces it.
/// 0 when the server will not say (an ACL without `+info`). Throws on I/O errors.
inline std::uint64_t server_identity(redisContext* c, std::string_view server) {
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

/// The server_identity of the connection pool::run has handed to this thread's callback (0:
/// unknown). Valid during that callback.
inline std::uint64_t& current_server_id() noexcept {
    thread_local std::uint64_t id = 0;
    return id;
}

/// Sentinel: a connection to sentinel `s`, AUTHed as the sentinel user. `where` names it.
inline context_ptr open_sentinel(const client_options& o, const server_address& s,
                                 std::string_view where) {
    context_ptr c = dial(o, s.host, s.port, where);
    login(c.get(), o.sentinel_username, o.sentinel_password, 0, where);
    return c;
}

/// Sentinel: `SENTINEL get-master-addr-by-name` on `c`; empty when the sentinel does not know
/// the master. Throws on I/O errors and error replies (NOAUTH: auth_failed).
inline std::optional<server_address> ask_master(redisContext* c, const client_options& o,
                                                std::string_view where) {
    reply_ptr r = command(c, {"SENTINEL", "get-master-addr-by-name", o.sentinel_master});
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), "", where);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING) {
        return std::nullopt;
    }
    return server_address{std::string(reply_text(r->element[0])),
                          std::atoi(std::string(reply_text(r->element[1])).c_str())};
}

/// Sentinel: connects to `host:port` and checks with ROLE that it is a master (an ACL that
/// refuses ROLE skips the check; a READONLY reply catches a replica later). Null, with `why`
/// set, when it is not one.
inline context_ptr connect_master(const endpoint& ep, const std::string& host, int port,
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

/// Sentinel: finds the master and connects to it. First the address the last +switch-master
/// named (endpoint::switched_to: sentinels that did not run the failover may still name the old
/// master, which stays a master until it is converted); then each sentinel in turn, asked
/// `SENTINEL get-master-addr-by-name`. Every candidate must answer ROLE as a master. Tries
/// again every 50 ms until connect_timeout has passed. Auth errors are final.
inline context_ptr connect_via_sentinel(const endpoint& ep) {
    const client_options& o = ep.options;
    const auto deadline = std::chrono::steady_clock::now() + o.connect_timeout;
    std::string why = "no sentinel answered";
    for (;;) {
        if (const std::optional<server_address> last = ep.switched_to()) {
            try {
                if (context_ptr c = connect_master(ep, last->host, last->port, "+switch-master", why)) {
                    return c;
                }
            } catch (const error& e) {
                if (e.value() == errc::auth_failed) throw;
                why = e.what();
            }
        }
        for (const server_address& s : o.sentinels) {
            if (std::chrono::steady_clock::now() >= deadline) break;
            const std::string sentinel = "sentinel " + address_name(s.host, s.port);
            try {
                context_ptr sc = open_sentinel(o, s, sentinel);
                const std::optional<server_address> master = ask_master(sc.get(), o, sentinel);
                if (!master) {
                    why = sentinel + " does not know a master named " + o.sentinel_master;
                    continue;
                }
                if (context_ptr c = connect_master(ep, master->host, master->port, sentinel, why)) {
                    return c;
                }
            } catch (const error& e) {
                if (e.value() == errc::auth_failed) throw;
                why = e.what();
            }
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            throw error(errc::connection_failed, "", ep.name,
                        "no master found through the sentinels within connect_timeout; last: " +
                            why);
        }
        // A backoff, not a wait for a lock: no sentinel named a usable master yet (a failover
        // is under way, or the master is down), and no message announces that one is ready.
        // Bounded by connect_timeout; lock waiters never sleep here.
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(50), deadline - now));
    }
}

/// Redis Cluster: a connection to the node `at`, AUTHed (a cluster has db 0 only).
inline context_ptr connect_node(const endpoint& ep, const server_address& at) {
    const std::string where = address_name(at.host, at.port);
    context_ptr c = dial(ep.options, at.host, at.port, where);
    login(c.get(), ep.options.username, ep.options.password, 0, where);
    return c;
}

/// Redis Cluster: calls `f(connection, address)` on the first node that can be reached — the
/// masters the slot map knows, then the seeds — and returns what it returns. Auth errors, and
/// whatever `f` throws, end the search at once.
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
            if (e.value() == errc::auth_failed) throw;
            why = e.what();
            continue;
        }
        return f(std::move(c), a);
    }
    throw error(errc::connection_failed, "", ep.name, "no cluster node could be reached; last: " + why);
}

/// Redis Cluster: loads the slot map with CLUSTER SLOTS from the first node that answers.
/// Throws when none does, or when the node refuses (a server without cluster support).
inline void load_slots(const endpoint& ep) {
    on_any_node(ep, [&](context_ptr c, const server_address& a) {
        const std::string where = address_name(a.host, a.port);
        reply_ptr r = command(c.get(), {"CLUSTER", "SLOTS"});
        if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c.get(), r.get(), "", where);
        if (!ep.slots->load(r.get(), a.host)) {
            throw error(errc::protocol_error, "", where, "CLUSTER SLOTS: no slots served, or a reply rlock cannot read");
        }
        return 0;
    });
}

/// Opens a connection: to the configured server, through the sentinels to the master, or (Redis
/// Cluster) to any node; then AUTH and SELECT. Throws rlock::error.
inline context_ptr connect(const endpoint& ep) {
    const client_options& o = ep.options;
    if (ep.slots) return on_any_node(ep, [](context_ptr c, const server_address&) { return c; });
    if (!o.sentinels.empty()) return connect_via_sentinel(ep);
    context_ptr c = dial(o, o.unix_socket.empty() ? o.host : std::string(), o.port, ep.name);
    login(c.get(), o.username, o.password, o.db, ep.name);
    return c;
}

/// An embedded Lua script: the text and its SHA-1, computed once; and, for a script that
/// publishes, its sharded form (Redis Cluster with sharded pub/sub): the same text with every
/// `'publish'` command named `'spublish'` instead, as Redisson's scripts choose by an argument.
/// The channels a script publishes to carry its lock's hash tag, so they hash to the slot the
/// script runs in, which SPUBLISH requires.
class script {
public:
    explicit script(std::string_view body) : body_(body), sha_(sha1_hex(body)) {
        static constexpr std::string_view classic = "'publish'", sharded = "'spublish'";
        std::size_t at = body.find(classic);
        if (at == std::string_view::npos) return;
        std::size_t from = 0;
        for (; at != std::string_view::npos; at = body.find(classic, from)) {
            sharded_body_.append(body.substr(from, at - from)).append(sharded);
            from = at + classic.size();
        }
        sharded_body_.append(body.substr(from));
        sharded_sha_ = sha1_hex(sharded_body_);
    }
    /// The text to run; `sharded`: its SPUBLISH form (the same text when it does not publish).
    std::string_view body(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? std::string_view(sharded_body_) : body_;
    }
    const std::string& sha(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? sharded_sha_ : sha_;
    }

private:
    std::string_view body_;
    std::string sha_;
    std::string sharded_body_;  // empty when the script does not publish
    std::string sharded_sha_;
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
    /// The sharded form (SPUBLISH) is chosen on a thread where sharded_publish() is set.
    void use_body(bool body) {
        const bool sharded = sharded_publish();
        argv[2] = numkeys;
        argv[0] = body ? "EVAL" : "EVALSHA";
        lens[0] = body ? 4 : 7;
        argv[1] = body ? s->body(sharded).data() : s->sha(sharded).data();
        lens[1] = body ? s->body(sharded).size() : s->sha(sharded).size();
    }
    int argc() const noexcept { return static_cast<int>(argv.size()); }
};

/// Runs a script: EVALSHA, and after NOSCRIPT (SCRIPT FLUSH, a restarted server) EVAL with the
/// body, which reloads the cache, once. Throws on I/O errors and on error replies.
inline reply_ptr run_script(redisContext* c, script_call& call, std::string_view lock,
                            std::string_view server) {
    call.use_body(asking());
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
