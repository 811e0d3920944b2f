// The reentrant protocol: Redisson's RLock layout, so rlock and Redisson exclude each other.
// Key = the lock name, a hash {"<clientId>:<threadId>" -> reentry count} with a PEXPIRE lease;
// the final unlock deletes it and publishes 0 on redisson_lock__channel:{name}.
#pragma once

#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

struct reentrant_kind : kind_defaults {
    static constexpr bool reentrant = true;
    static constexpr std::string_view channel_prefix = "redisson_lock__channel";

    /// The reentrant protocol's steps on one key, as Lua functions: this kind's acquire and
    /// release scripts and multi_lock's scripts (multi_lock.hpp) are made of them.
    ///   reentrant_take(key, holder, lease)    one more level, the lease from now; the new count
    static constexpr std::string_view lua_take = R"lua(
local function reentrant_take(key, holder, lease)
    local n = redis.call('hincrby', key, holder, 1)
    redis.call('pexpire', key, lease)
    return n
end
)lua";
    /// Need read_failed before them:
    ///   reentrant_read(key, holder)     the holder's count as Redis stores it (a string), false
    ///                                   when it has none (or the key is of another type), or
    ///                                   nil and the error reply to return
    ///   reentrant_last(count)           whether a release at `count` (as read) is the last
    ///                                   level: the one that deletes the key and publishes
    ///   reentrant_leave(key, channel, holder, count)  one level less (`count` as read): the
    ///                                   levels left, or 0 when the last one deleted the key and
    ///                                   woke the waiters, and then also how many subscribers
    ///                                   the message reached
    static constexpr std::string_view lua_release_steps = R"lua(
local function reentrant_read(key, holder)
    local v = redis.pcall('hget', key, holder)
    if read_failed(v) then return nil, v end
    return type(v) == 'string' and v
end
local function reentrant_last(count)
    return (tonumber(count) or 0) <= 1
end
local function reentrant_leave(key, channel, holder, count)
    if not reentrant_last(count) then
        return redis.call('hincrby', key, holder, -1)
    end
    redis.call('del', key)
    return 0, redis.call('publish', channel, '0')
end
)lua";

    /// Acquire or re-enter (Redisson's tryLockInnerAsync, with RFencedLock's counter).
    /// KEYS[1] lock hash, KEYS[2] redisson_lock_token:{name} (with fencing only);
    /// ARGV[1] lease ms, ARGV[2] holder id, ARGV[3] '1' to take the next fencing token,
    /// ARGV[4] '1' for a re-entry, which must find the holder's field: a re-entry never
    /// re-creates a hold that is gone.
    /// Returns {1, reentry count, fencing token or 0} when held, {0, PTTL} when refused.
    /// Nothing is written before the fencing counter is checked (lua_checks.hpp); HINCRBY, which
    /// refuses a count that is not an integer, is the first write.
    static const script& acquire_script() {
        static const script s(with_lua_checks(std::string(lua_take) + R"lua(
if redis.call('exists', KEYS[1]) == 0 then
    if ARGV[4] == '1' then
        return {0, -2}
    end
elseif redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return {0, redis.call('pttl', KEYS[1])}
end
local bad, had = counter_if(ARGV[3], KEYS[2])
if bad then return bad end
local n = reentrant_take(KEYS[1], ARGV[2], ARGV[1])
local token = 0
if ARGV[3] == '1' then
    token = next_token(KEYS[2], had)
end
return {1, n, token}
)lua"));
        return s;
    }

    /// Leave one level. KEYS[1] lock hash; ARGV[1] holder id, ARGV[2] channel.
    /// Returns -1 when the holder has no field (not held, expired, or not a hash; with no key
    /// at all `0` is published: the lock is free, wake_waiters), the count left when still
    /// held, {0, subscribers reached} when this was the last level (deleted, `0` published).
    /// An inner level keeps the TTL as it is: the watchdog or the lease governs it. The count is
    /// read first (HGET, which a key of another type answers with an error pcall keeps), so the
    /// last level costs no HINCRBY. Errors other than WRONGTYPE (an ACL's refusal) are returned
    /// as the script's error, not as "not held"; the other release scripts do the same.
    static const script& release_script() {
        static const script s(with_lua_checks(with_channel_check(lua_release_steps) + R"lua(
local count, failed = reentrant_read(KEYS[1], ARGV[1])
if failed then return failed end
if not count then
    if redis.call('exists', KEYS[1]) == 0 then wake_waiters(ARGV[2], '0') end
    return -1
end
if not can_step(count, -1) then return bad_count(KEYS[1], ARGV[1]) end
if reentrant_last(count) then
    local refused = channel_refused(ARGV[2])
    if refused then return refused end
end
local left, woken = reentrant_leave(KEYS[1], ARGV[2], ARGV[1], count)
if woken then return {left, woken} end
return left
)lua"));
        return s;
    }

    /// Batch renewal (Redisson's renewExpiration, many at once; batch_renew_lua): ARGV[i+1]
    /// the holder id for KEYS[i].
    static const script& renew_script() {
        static const script s(batch_renew_lua("redis.pcall('hexists', KEYS[i], ARGV[i + 1])", "got == 1",
                                              "redis.call('pexpire', KEYS[i], ARGV[1])"));
        return s;
    }

    static inline const kind_info info{"reentrant_lock", &renew_script};
    static constexpr char multi_code = 'r';  // multi_scripts.hpp

    static acquire_result acquire(const connection& c, const lock_keys& k, const attempt_spec& a,
                                  std::string_view server);

    /// Reads {1, count, token} / {0, ttl}, the reply of every hash-lock acquire script.
    static acquire_result parse_acquire(const redisReply* r, std::string_view lock,
                                        std::string_view server);

    static long long release(const connection& c, const lock_keys& k, std::string_view holder,
                             std::string_view server, long long* woken = nullptr) {
        return release_by(release_script(), c, k, holder, server, woken);
    }
    static std::vector<script_call> undo_calls(const lock_keys& k, std::string_view holder) {
        std::vector<script_call> out;
        out.emplace_back(release_script(), std::initializer_list<std::string_view>{k.name},
                         std::initializer_list<std::string_view>{holder, k.channel});
        return out;
    }

    static bool held(const connection& c, const lock_keys& k, std::string_view holder,
                     std::string_view server);
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL acquire_result reentrant_kind::acquire(const connection& c, const lock_keys& k,
                                                  const attempt_spec& a, std::string_view server) {
    script_call call =
        acquire_call(acquire_script(), k, a.fencing,
                     {a.lease, a.value, a.fencing ? "1" : "0", a.reentry ? "1" : "0"});
    return parse_acquire(run_script(c, call, k.name, server).get(), k.name, server);
}

RLOCK_DECL acquire_result reentrant_kind::parse_acquire(const redisReply* r, std::string_view lock,
                                                        std::string_view server) {
    acquire_result out;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        throw error(errc::protocol_error, lock, server, "unexpected reply from the acquire script");
    }
    out.acquired = r->element[0]->integer == 1;
    if (!out.acquired) {
        out.ttl = r->element[1]->integer;
        return out;
    }
    out.count = static_cast<std::uint64_t>(r->element[1]->integer);
    if (r->elements > 2 && r->element[2]->type == REDIS_REPLY_INTEGER) {
        out.fencing = static_cast<std::uint64_t>(r->element[2]->integer);
    }
    return out;
}

RLOCK_DECL bool reentrant_kind::held(const connection& c, const lock_keys& k,
                                     std::string_view holder, std::string_view server) {
    reply_ptr r = run_command(c, {"HEXISTS", k.name, holder}, k.name, server);
    return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
