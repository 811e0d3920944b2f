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

#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/sha1.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// An embedded Lua script: the text and its SHA-1, computed once; and, for a script that
/// publishes, its sharded form (Redis Cluster with sharded pub/sub): the same text with every
/// `'publish'` command named `'spublish'` instead, as Redisson's scripts choose by an argument.
/// The channels a script publishes to carry its lock's hash tag, so they hash to the slot the
/// script runs in, which SPUBLISH requires.
class script {
public:
    explicit script(std::string text) : body_(std::move(text)), sha_(sha1_hex(body_)) {
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
    /// The text to run; `sharded`: its SPUBLISH form (the same text when it does not publish).
    std::string_view body(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? std::string_view(sharded_body_) : body_;
    }
    const std::string& sha(bool sharded = false) const noexcept {
        return sharded && !sharded_sha_.empty() ? sharded_sha_ : sha_;
    }

private:
    std::string body_;
    std::string sha_;
    std::string sharded_body_;  // empty when the script does not publish
    std::string sharded_sha_;
};

/// How a script is sent: EVALSHA with its digest, or EVAL with its text.
enum class script_form { sha, body };

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
    /// Arms the call as EVALSHA sha or EVAL body, in the form `c` asks for (SPUBLISH when
    /// c.sharded_publish). Also re-points numkeys at this object's own buffer, so a call that
    /// was moved (kept in a vector) is safe to send.
    void use(script_form form, const connection& c) {
        const bool body = form == script_form::body;
        const bool sharded = c.sharded_publish;
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
inline reply_ptr run_script(const connection& c, script_call& call, std::string_view lock,
                            std::string_view server) {
    call.use(c.asking ? script_form::body : script_form::sha, c);
    reply_ptr r = command_argv(c, call.argc(), call.argv.data(), call.lens.data());
    if (reply_is_error(r.get(), "NOSCRIPT")) {
        call.use(script_form::body, c);
        r = command_argv(c, call.argc(), call.argv.data(), call.lens.data());
    }
    if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), lock, server);
    return r;
}

/// Runs a script whose reply is one integer, and returns it.
inline long long eval_integer(const connection& c, const script& s,
                              std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args, std::string_view lock,
                              std::string_view server) {
    script_call call(s, keys, args);
    return reply_integer(run_script(c, call, lock, server).get(), lock, server);
}

}  // namespace rlock::detail
