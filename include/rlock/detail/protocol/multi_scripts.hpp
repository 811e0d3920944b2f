// multi_lock's one-script path (every part a mutex or reentrant_lock of one client, one slot):
// its two scripts, each part taken or released by its kind's own Lua step.
#pragma once

#include <string>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/protocol/mutex_kind.hpp"
#include "rlock/detail/protocol/reentrant_kind.hpp"
#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

/// Take every part or none. KEYS[i] lock keys; ARGV[1] lease ms, then per part i
/// ARGV[2i] kind ('m' mutex, 'r' reentrant_lock) and ARGV[2i+1] its value (token or holder id).
/// Returns {1} when all were taken, {0, i, PTTL} when part i is held (nothing is changed).
/// Each part is taken by its kind's own step (mutex_kind / reentrant_kind::lua_take).
RLOCK_DECL const script& multi_acquire_script();

/// Release every part. KEYS[2i-1] lock key and KEYS[2i] its channel; ARGV[2i-1] kind ('m' or
/// 'r'), ARGV[2i] value. Per part: 0 released (its kind's release step), -1 not held by that
/// value. Every part is read before any is released: an error reading one (an ACL's refusal),
/// a count HINCRBY would refuse, or a channel this user may not publish on, is the script's
/// error with no part released.
RLOCK_DECL const script& multi_release_script();

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL const script& multi_acquire_script() {
    static const script s(std::string(mutex_kind::lua_take) +
                          std::string(reentrant_kind::lua_take) + R"lua(
for i = 1, #KEYS do
    if redis.call('exists', KEYS[i]) == 1 then
        return {0, i, redis.call('pttl', KEYS[i])}
    end
end
for i = 1, #KEYS do
    if ARGV[2 * i] == 'm' then
        mutex_take(KEYS[i], ARGV[2 * i + 1], ARGV[1])
    else
        reentrant_take(KEYS[i], ARGV[2 * i + 1], ARGV[1])
    end
end
return {1}
)lua");
    return s;
}

RLOCK_DECL const script& multi_release_script() {
    static const script s(with_lua_checks(with_channel_check(mutex_kind::lua_release_steps) +
                                          std::string(reentrant_kind::lua_release_steps) + R"lua(
local held = {}
for i = 1, #KEYS / 2 do
    local key, value = KEYS[2 * i - 1], ARGV[2 * i]
    local got, failed
    if ARGV[2 * i - 1] == 'm' then
        got, failed = mutex_read(key)
        got = got == value and got
    else
        got, failed = reentrant_read(key, value)
        if got and not can_step(got, -1) then return bad_count(key, value) end
    end
    if failed then return failed end
    if got and (ARGV[2 * i - 1] == 'm' or reentrant_last(got)) then
        local refused = channel_refused(KEYS[2 * i])
        if refused then return refused end
    end
    held[i] = got
end
local out = {}
for i = 1, #KEYS / 2 do
    local key, channel, value = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i]
    out[i] = -1
    if held[i] then
        if ARGV[2 * i - 1] == 'm' then
            mutex_leave(key, channel)
        else
            reentrant_leave(key, channel, value, held[i])
        end
        out[i] = 0
    end
end
return out
)lua"));
    return s;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
