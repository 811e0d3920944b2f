// Embedded Lua scripts: the text and its SHA-1, the argv of one call (EVALSHA, or EVAL after
// NOSCRIPT), and running one.
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/sha1.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// An embedded Lua script: the text and its SHA-1, computed once; and, for a script that
/// publishes, its sharded form (Redis Cluster with sharded pub/sub): the same text with every
/// `'publish'` command named `'spublish'` instead, as Redisson's scripts choose by an argument.
/// The channels a script publishes to carry its lock's hash tag, so they hash to the slot the
/// script runs in, which SPUBLISH requires.
class script {
public:
    explicit script(const std::string& text);
    /// The text to run; `sharded`: its SPUBLISH form (the same text when it does not publish).
    std::string_view body(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? std::string_view(sharded_body_) : body_;
    }
    const std::string& sha(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? sharded_sha_ : sha_;
    }

private:
    /// `text` with a first statement that asks the ACL (redis.acl_check_cmd, Redis 7) about
    /// every command the text names (`redis.call('cmd'` or `redis.pcall('cmd'`), PUBLISH
    /// aside (its check names the channel: lua_checks.hpp, channel_refused). Redis does not roll
    /// back a script: a user whose ACL refused a command after the script's first write
    /// (PEXPIRE after HINCRBY, TIME or PTTL after the lock key was set) was left a key without a
    /// TTL, or one no one owned, or a fair queue entry. Now such a user gets NOPERM naming the
    /// command, and nothing is changed. Each command is asked with whole arguments and KEYS[1]
    /// as its key (Redis 7.0 crashes on a key command asked without its arguments; the declared
    /// keys themselves are checked by EVAL). A helper whose commands are asked about only where
    /// a call needs them (fencing's, lua_checks.hpp: a user without fencing needs no INCR or
    /// TIME) is marked and left out. A script without keys, and Redis 6, which has no
    /// acl_check_cmd, ask nothing.
    static std::string with_acl_check(const std::string& text);

    std::string body_;
    std::string sha_;
    std::string sharded_body_;  // empty when the script does not publish
    std::string sharded_sha_;
};

/// How a script is sent: EVALSHA with its digest, or EVAL with its text.
enum class script_form { sha, body };

/// The argv of one command: EVALSHA sha numkeys keys... args... (or a plain command), with the
/// first `inline_parts` parts in the object itself and the rest on the heap, so a lock's call
/// (three to eight parts) allocates nothing. The same object serves the NOSCRIPT retry and, kept
/// in a vector, a pipeline of many calls.
struct script_call {
    static constexpr std::size_t inline_parts = 10;

    const script* s = nullptr;
    char numkeys[12] = {};

    script_call() = default;
    script_call(const script& sc, std::initializer_list<std::string_view> keys,
                std::initializer_list<std::string_view> args);
    /// Room for `n` parts without a reallocation while pushing (a call of more than
    /// inline_parts parts).
    void reserve(std::size_t n);
    void start(const script& sc, std::size_t nkeys);
    void clear() noexcept {
        count_ = 0;
        more_argv_.clear();
        more_lens_.clear();
    }
    void push(std::string_view part);
    /// Arms the call as EVALSHA sha or EVAL body, in the form `c` asks for (SPUBLISH when
    /// c.sharded_publish). Also re-points numkeys at this object's own buffer, so a call that
    /// was copied or moved (kept in a vector) is safe to send.
    void use(script_form form, const connection& c);
    int argc() const noexcept { return static_cast<int>(count_); }
    const char** argv() noexcept { return more_argv_.empty() ? argv_ : more_argv_.data(); }
    const std::size_t* lens() const noexcept { return more_lens_.empty() ? lens_ : more_lens_.data(); }

private:
    void set(std::size_t i, std::string_view part) noexcept;

    std::size_t count_ = 0;
    const char* argv_[inline_parts] = {};
    std::size_t lens_[inline_parts] = {};
    std::vector<const char*> more_argv_;  // every part, once there are more than inline_parts
    std::vector<std::size_t> more_lens_;
};

/// Writes `call` after what `c` was sent (write_after, hiredis.hpp), reading no reply: a script
/// with its body, since nobody will read a NOSCRIPT; a plain command as it is. For an undo or a
/// second try that must follow a command left unanswered, on its connection. Best effort:
/// false when it could not be written whole, at once.
RLOCK_DECL bool write_after(const connection& c, script_call& call) noexcept;

/// Runs a script: EVALSHA, and after NOSCRIPT (SCRIPT FLUSH, a restarted server) EVAL with the
/// body, which reloads the cache, once. Throws on I/O errors and on error replies.
RLOCK_DECL reply_ptr run_script(const connection& c, script_call& call, std::string_view lock,
                            std::string_view server);

/// Runs a script whose reply is one integer, and returns it.
RLOCK_DECL long long eval_integer(const connection& c, const script& s,
                              std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args, std::string_view lock,
                              std::string_view server);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL script::script(const std::string& text)
    : body_(with_acl_check(text)), sha_(sha1_hex(body_)) {
    static constexpr std::string_view classic = "'publish'", sharded = "'spublish'";
    const std::string_view body = body_;
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

RLOCK_DECL std::string script::with_acl_check(const std::string& text) {
    // Each command the scripts use, with whole arguments to ask about it (`k`: KEYS[1]).
    static constexpr std::pair<std::string_view, std::string_view> shapes[] = {
        {"decrby", ", k, '1'"},
        {"del", ", k"},
        {"exists", ", k"},
        {"get", ", k"},
        {"hdel", ", k, 'f'"},
        {"hexists", ", k, 'f'"},
        {"hget", ", k, 'f'"},
        {"hincrby", ", k, 'f', '1'"},
        {"hkeys", ", k"},
        {"hlen", ", k"},
        {"hmget", ", k, 'f'"},
        {"hset", ", k, 'f', 'v'"},
        {"incr", ", k"},
        {"incrby", ", k, '1'"},
        {"lindex", ", k, '0'"},
        {"lpop", ", k"},
        {"lrange", ", k, '0', '1'"},
        {"lrem", ", k, '0', 'v'"},
        {"pexpire", ", k, '1'"},
        {"pttl", ", k"},
        {"rpush", ", k, 'v'"},
        {"set", ", k, 'v'"},
        {"time", ""},
        {"type", ", k"},
        {"zadd", ", k, '1', 'm'"},
        {"zcount", ", k, '0', '1'"},
        {"zincrby", ", k, '1', 'm'"},
        {"zrange", ", k, '0', '1'"},
        {"zrangebyscore", ", k, '0', '1'"},
        {"zrem", ", k, 'm'"},
        {"zrevrange", ", k, '0', '1'"},
        {"zscore", ", k, 'm'"}};
    // Helpers whose commands are asked about where they are used (fencing's: lua_checks.hpp)
    // are marked; their text is not scanned.
    static constexpr std::string_view from_mark = "-- acl: asked where used",
                                      to_mark = "-- acl: end";
    const std::size_t skip_from = text.find(from_mark);
    const std::size_t skip_to =
        skip_from == std::string::npos ? skip_from : text.find(to_mark, skip_from);
    auto used = [&](std::string_view name) {
        for (const std::string_view call :
             {std::string_view("redis.call('"), std::string_view("redis.pcall('")}) {
            const std::string named = std::string(call).append(name).append("'");
            for (std::size_t at = text.find(named); at != std::string::npos;
                 at = text.find(named, at + 1)) {
                if (skip_to == std::string::npos || at < skip_from || at > skip_to) return true;
            }
        }
        return false;
    };
    std::string asks;
    for (const auto& [name, args] : shapes) {
        if (used(name))
            asks.append("\n        {'").append(name).append("'").append(args).append("},");
    }
    if (asks.empty()) return text;
    return "if redis.acl_check_cmd and KEYS[1] then\n    local k = KEYS[1]\n    for _, c in "
           "ipairs({" +
           asks +
           "\n    }) do\n        if not redis.acl_check_cmd(unpack(c)) then\n"
           "            return redis.error_reply(\"NOPERM this user has no permissions to run the "
           "'\" .. c[1] ..\n"
           "                \"' command, which this script needs; nothing was changed\")\n"
           "        end\n    end\nend\n" +
           text;
}

RLOCK_DECL script_call::script_call(const script& sc, std::initializer_list<std::string_view> keys,
                                    std::initializer_list<std::string_view> args) {
    reserve(3 + keys.size() + args.size());
    start(sc, keys.size());
    for (std::string_view k : keys) push(k);
    for (std::string_view a : args) push(a);
}

RLOCK_DECL void script_call::reserve(std::size_t n) {
    if (n <= inline_parts) return;
    more_argv_.reserve(n);
    more_lens_.reserve(n);
}

RLOCK_DECL void script_call::start(const script& sc, std::size_t nkeys) {
    s = &sc;
    clear();
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

RLOCK_DECL void script_call::push(std::string_view part) {
    if (count_ < inline_parts && more_argv_.empty()) {
        argv_[count_] = part.data();
        lens_[count_] = part.size();
    } else {
        if (more_argv_.empty()) {  // the first part past the inline ones: move them over
            more_argv_.assign(argv_, argv_ + count_);
            more_lens_.assign(lens_, lens_ + count_);
        }
        more_argv_.push_back(part.data());
        more_lens_.push_back(part.size());
    }
    ++count_;
}

RLOCK_DECL void script_call::use(script_form form, const connection& c) {
    const bool body = form == script_form::body;
    const bool sharded = c.sharded_publish;
    set(0, body ? std::string_view("EVAL") : std::string_view("EVALSHA"));
    set(1, body ? s->body(sharded) : std::string_view(s->sha(sharded)));
    set(2, numkeys);
}

RLOCK_DECL void script_call::set(std::size_t i, std::string_view part) noexcept {
    argv()[i] = part.data();
    (more_lens_.empty() ? lens_ : more_lens_.data())[i] = part.size();
}

RLOCK_DECL bool write_after(const connection& c, script_call& call) noexcept {
    if (call.s) call.use(script_form::body, c);
    return write_after(c.ctx, call.argc(), call.argv(), call.lens());
}

RLOCK_DECL reply_ptr run_script(const connection& c, script_call& call, std::string_view lock,
                                std::string_view server) {
    call.use(c.asking ? script_form::body : script_form::sha, c);
    reply_ptr r = command_argv(c, call.argc(), call.argv(), call.lens());
    if (reply_is_error(r.get(), "NOSCRIPT")) {
        call.use(script_form::body, c);
        r = command_argv(c, call.argc(), call.argv(), call.lens());
    }
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), lock, server);
    return r;
}

RLOCK_DECL long long eval_integer(const connection& c, const script& s,
                                  std::initializer_list<std::string_view> keys,
                                  std::initializer_list<std::string_view> args,
                                  std::string_view lock, std::string_view server) {
    script_call call(s, keys, args);
    return reply_integer(run_script(c, call, lock, server).get(), lock, server);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
