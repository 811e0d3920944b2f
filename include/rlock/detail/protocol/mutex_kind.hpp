// The mutex protocol: the single-instance lock of redis.io, also used by redis-py's Lock,
// node-redlock and go-redsync — key = the lock name, value = a random token, SET NX PX.
#pragma once

#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

struct mutex_kind : kind_defaults {
    static constexpr bool reentrant = false;
    static constexpr bool hands_off = true;  // the token names no owner
    static constexpr std::string_view channel_prefix = "rlock_lock__channel";

    /// Acquire by script: with fencing, and for a client's first acquisition (to learn that
    /// scripts may run before anything is written); otherwise a plain SET NX PX does it.
    /// KEYS[1] lock key, KEYS[2] redisson_lock_token:{name} (with fencing only); ARGV[1] token,
    /// ARGV[2] lease ms, ARGV[3] '1' to take the next fencing token.
    /// Returns {1, fencing token or 0} when set; when refused {0, PTTL of the holder's key, its
    /// value} (the wait tells by the value whether the holder's release will be
    /// published). A key of another type is not a lock a mutex can wait for (a list, or a hash:
    /// a lock of another kind): WRONGTYPE, with nothing written (SET NX wrote nothing). The counter is checked before the SET
    /// (lua_checks.hpp): a counter INCR would refuse is an error with nothing written, not a
    /// lock left without an owner.
    static const script& acquire_fenced_script() {
        static const script s(with_lua_checks(R"lua(
local bad, had = counter_if(ARGV[3], KEYS[2])
if bad then return bad end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if ARGV[3] == '1' then
        return {1, next_token(KEYS[2], had)}
    end
    return {1, 0}
end
local holder = redis.pcall('get', KEYS[1])
if type(holder) == 'table' and holder.err then
    if string.find(holder.err, 'WRONGTYPE', 1, true) then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. " holds another type than a mutex's string; " ..
            'nothing was changed')
    end
    return holder
end
if type(holder) ~= 'string' then holder = false end
return {0, redis.call('pttl', KEYS[1]), holder}
)lua"));
        return s;
    }

    /// The mutex protocol's steps on one key, as Lua functions: this kind's release script and
    /// multi_lock's scripts (multi_lock.hpp) are made of them.
    ///   mutex_take(key, value, lease)   takes the key, which must be free
    static constexpr std::string_view lua_take = R"lua(
local function mutex_take(key, value, lease)
    redis.call('set', key, value, 'PX', lease)
end
)lua";
    /// Need read_failed before them:
    ///   mutex_read(key)          the key's value (false: none, or a key of another type), or
    ///                            nil and the error reply to return
    ///   mutex_leave(key, channel)       deletes the key its holder released, wakes waiters;
    ///                                   returns how many subscribers the message reached
    static constexpr std::string_view lua_release_steps = R"lua(
local function mutex_read(key)
    local v = redis.pcall('get', key)
    if read_failed(v) then return nil, v end
    return type(v) == 'string' and v
end
local function mutex_leave(key, channel)
    redis.call('del', key)
    return redis.call('publish', channel, '0')
end
)lua";

    /// Compare-and-delete, then wake the waiters.
    /// KEYS[1] lock key; ARGV[1] token, ARGV[2] channel.
    /// Returns {0, subscribers reached} when deleted (and `0` published), -1 when the key holds
    /// another value or none (or another type); none: `0` is published all the same
    /// (wake_waiters: the lock is free). Any other error reading it (an ACL's refusal) is the
    /// script's error.
    static const script& release_script() {
        static const script s(with_read_failed(with_channel_check(lua_release_steps) + R"lua(
local value, failed = mutex_read(KEYS[1])
if failed then return failed end
if value ~= ARGV[1] then
    if value == false then wake_waiters(ARGV[2], '0') end
    return -1
end
local refused = channel_refused(ARGV[2])
if refused then return refused end
return {0, mutex_leave(KEYS[1], ARGV[2])}
)lua"));
        return s;
    }

    /// Batch compare-and-pexpire (batch_renew_lua): ARGV[i+1] the token of KEYS[i].
    static const script& renew_script() {
        static const script s(batch_renew_lua("redis.pcall('get', KEYS[i])", "got == ARGV[i + 1]",
                                              "redis.call('pexpire', KEYS[i], ARGV[1])"));
        return s;
    }

    static inline const kind_info info{"mutex", &renew_script, true, nullptr, /*token_value=*/true};
    static constexpr char multi_code = 'm';  // multi_scripts.hpp

    /// The unscripted acquire, `SET key token NX PX lease`, as a call of its own (red_lock
    /// sends it to every node; acquire() below pipelines it with PTTL and GET).
    static script_call set_command(std::string_view key, std::string_view token, std::string_view lease);

    static acquire_result acquire(const connection& c, const lock_keys& k, const attempt_spec& a,
                                  std::string_view server);

    /// force_unlock_script on a string key: a key of another type is not a mutex's lock.
    static bool force_unlock(const connection& c, const lock_keys& k, std::string_view server);

    static long long release(const connection& c, const lock_keys& k, std::string_view token,
                             std::string_view server, long long* woken = nullptr) {
        return release_by(release_script(), c, k, token, server, woken);
    }
    static std::vector<script_call> undo_calls(const lock_keys& k, std::string_view token) {
        std::vector<script_call> out;
        out.emplace_back(release_script(), std::initializer_list<std::string_view>{k.name},
                         std::initializer_list<std::string_view>{token, k.channel});
        return out;
    }

    static bool held(const connection& c, const lock_keys& k, std::string_view token,
                     std::string_view server);

    static void parse_pair(const redisReply* r, acquire_result& out, std::string_view lock,
                           std::string_view server);

    /// What a refused attempt learnt of the holder from its value (`value` not a string: the
    /// key holds another type). Only a token with rlock's mark (token_prefix) belongs to a
    /// holder whose release publishes on this lock's channel; behind any other a waiter has to
    /// look again by itself.
    static void note_holder(const redisReply* value, acquire_result& out);
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL script_call mutex_kind::set_command(std::string_view key, std::string_view token,
                                               std::string_view lease) {
    script_call call;
    for (std::string_view part : {std::string_view("SET"), key, token, std::string_view("NX"),
                                  std::string_view("PX"), lease}) {
        call.push(part);
    }
    return call;
}

RLOCK_DECL acquire_result mutex_kind::acquire(const connection& c, const lock_keys& k,
                                              const attempt_spec& a, std::string_view server) {
    const std::string_view token = a.value, lease = a.lease;
    acquire_result out;
    // By script too while a Redis Cluster slot migrates (c.asking): ASKING applies to one
    // command, and the SET + PTTL + GET pipeline is three.
    if (a.fencing || !a.scripts_allowed || c.asking) {
        script_call call = acquire_call(acquire_fenced_script(), k, a.fencing,
                                        {token, lease, a.fencing ? "1" : "0"});
        reply_ptr r = run_script(c, call, k.name, server);
        parse_pair(r.get(), out, k.name, server);
        return out;
    }
    // SET NX PX, and when the caller will wait, PTTL and GET in the same round trip: how
    // long the holder may keep the key, and who it is (does its release publish?). A try that
    // will not wait (try_lock) sends GET with its SET: a key of another type refuses a SET NX
    // like a held lock, and only GET tells the two apart. A first try that may wait sends SET
    // alone (an uncontended lock() costs one command); its next try, the wait's, reads.
    const char* set[6] = {"SET", k.name.data(), token.data(), "NX", "PX", lease.data()};
    const std::size_t set_len[6] = {3, k.name.size(), token.size(), 2, 2, lease.size()};
    if (!a.want_ttl && a.may_queue) {
        reply_ptr r = command_argv(c, 6, set, set_len);
        if (!r || r->type == REDIS_REPLY_ERROR) throw make_error(c, r.get(), k.name, server);
        out.acquired = r->type == REDIS_REPLY_STATUS;
        return out;
    }
    const char* pttl[2] = {"PTTL", k.name.data()};
    const std::size_t pttl_len[2] = {4, k.name.size()};
    const char* get[2] = {"GET", k.name.data()};
    const std::size_t get_len[2] = {3, k.name.size()};
    append_command(c.ctx, 6, set, set_len);
    if (a.want_ttl) append_command(c.ctx, 2, pttl, pttl_len);
    append_command(c.ctx, 2, get, get_len);
    reply_ptr replies[3];  // SET, PTTL (when asked for), GET
    for (std::size_t i = 0; i < (a.want_ttl ? 3U : 2U); ++i) {
        void* raw = nullptr;
        const int status = redisGetReply(c.ctx, &raw);
        replies[i].reset(static_cast<redisReply*>(raw));
        if (status != REDIS_OK) throw make_error(c, nullptr, k.name, server);
    }
    const redisReply* set_reply = replies[0].get();
    if (set_reply->type == REDIS_REPLY_ERROR) throw make_error(c, set_reply, k.name, server);
    out.acquired = set_reply->type == REDIS_REPLY_STATUS;
    if (out.acquired) return out;
    if (a.want_ttl) out.ttl = reply_integer(replies[1].get(), k.name, server);
    const redisReply* holder = replies[a.want_ttl ? 2 : 1].get();
    if (holder->type == REDIS_REPLY_NIL) {
        out.ttl = -2;  // gone since the SET: free, try again now
    } else if (reply_is_error(holder, "WRONGTYPE")) {
        // Not a lock a mutex can wait for (a list; a hash: a lock of another kind). A wait
        // behind it would end only with its TTL, or never.
        throw error(
            errc::wrong_type, k.name, server,
            "WRONGTYPE the key holds another type than a mutex's string; nothing was changed");
    } else if (holder->type == REDIS_REPLY_ERROR) {
        throw make_error(c, holder, k.name, server);
    } else {
        note_holder(holder, out);
    }
    return out;
}

RLOCK_DECL bool mutex_kind::force_unlock(const connection& c, const lock_keys& k,
                                         std::string_view server) {
    return eval_integer(c, force_unlock_script(), {k.name}, {k.channel, "string"}, k.name,
                        server) == 1;
}

RLOCK_DECL bool mutex_kind::held(const connection& c, const lock_keys& k, std::string_view token,
                                 std::string_view server) {
    reply_ptr r = run_command(c, {"GET", k.name}, k.name, server);
    return reply_text(r.get()) == token && r->type == REDIS_REPLY_STRING;
}

RLOCK_DECL void mutex_kind::parse_pair(const redisReply* r, acquire_result& out,
                                       std::string_view lock, std::string_view server) {
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        throw error(errc::protocol_error, lock, server, "unexpected reply from the acquire script");
    }
    out.acquired = r->element[0]->integer == 1;
    if (out.acquired) {
        out.fencing = static_cast<std::uint64_t>(r->element[1]->integer);
    } else {
        out.ttl = r->element[1]->integer;
        note_holder(r->elements > 2 ? r->element[2] : nullptr, out);
    }
}

RLOCK_DECL void mutex_kind::note_holder(const redisReply* value, acquire_result& out) {
    out.holder_publishes = false;
    if (value && value->type == REDIS_REPLY_STRING) {
        out.holder.assign(value->str, value->len);
        out.holder_publishes = is_rlock_token(out.holder);
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
