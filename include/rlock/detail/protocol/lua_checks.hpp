// Lua helpers for checks a script makes before its first write, and the fencing counter.
//
// Redis does not roll back a script that fails midway: the writes it made before the error
// stay. A lock script that wrote the lock key and then failed on the fencing counter left a
// lock nobody owned for a whole lease. So every rlock script keeps one rule: a command that can
// fail is either the script's first write, or checked before the first write. The checks read
// with commands the lock kinds use anyway (GET, HGET, ...), so the ACL README documents needs
// nothing more; a check that fails returns an error reply that names the key and says that
// nothing was changed (`WRONGTYPE ...` for a key of another type, which rlock reports as
// errc::wrong_type; `ERR ...` for a value, errc::server_error).
// An ACL's refusal of a command is asked about before anything else: every script begins by
// asking redis.acl_check_cmd about each command it names (script.hpp, with_acl_check).
#pragma once

#include <string>
#include <string_view>

#include "rlock/config.hpp"

namespace rlock::detail {

/// read_failed(v): true when `v`, what redis.pcall answered for a read, is an error the script
/// must return as its own (an ACL's refusal, OOM, ...). WRONGTYPE is not one: a key of another
/// type holds nothing of ours, and the script answers "not held". Every release script reads
/// its key this way.
inline constexpr std::string_view lua_read_failed = R"lua(
local function read_failed(v)
    return type(v) == 'table' and v.err ~= nil and not string.find(v.err, 'WRONGTYPE', 1, true)
end
)lua";

/// channel_refused(channel): nil when this script's user may publish on `channel`, else the
/// error reply to return. A script that publishes does it last, after the writes it announces;
/// a user whose ACL covers the lock's keys but not its channel (Redis >= 7 refuses channels by
/// default) got NOPERM from that PUBLISH with the writes already made: an unlock told failed
/// although the lock was gone, and its waiters never woken. So every script that may publish
/// asks first, before its first write. Redis 6 has no redis.acl_check_cmd (nor channel rules
/// before 6.2, whose default allows every channel): nothing to ask there. In a cluster with
/// sharded pub/sub the script's 'publish' is renamed 'spublish' here too (script.hpp).
///
/// wake_waiters(channel, message): publishes `message` unless the channel is refused. For a
/// release that found its hold gone (deleted, flushed, expired) and the lock's key absent: the
/// lock is free, and nothing else would wake its waiters before the holder's TTL they last
/// read (a waiter with none: its deadline). The release is told "not held" either way.
inline constexpr std::string_view lua_publish_check = R"lua(
local function channel_refused(channel)
    if redis.acl_check_cmd and not redis.acl_check_cmd('publish', channel, '0') then
        return redis.error_reply("NOPERM this user has no permissions to access the channel " ..
            channel .. ", where the lock's waiters listen; nothing was changed")
    end
end
local function wake_waiters(channel, message)
    if not channel_refused(channel) then redis.call('publish', channel, message) end
end
)lua";

/// not_a_lock(key, shape): reads `key` with a command only a key of the lock's `shape` accepts
/// ('string': GET; 'hash': HLEN), under pcall; nil when that read worked (or found no key),
/// else the error reply to return: WRONGTYPE naming the key for a key of another type, or the
/// read's own error. force_unlock deletes whoever holds the lock, but never a key that is not a
/// lock of its kind (a list, a Redisson hash at a mutex's name): that is another's data.
inline constexpr std::string_view lua_not_a_lock = R"lua(
local function not_a_lock(key, shape)
    local v
    if shape == 'hash' then v = redis.pcall('hlen', key) else v = redis.pcall('get', key) end
    if type(v) == 'table' and v.err then
        if string.find(v.err, 'WRONGTYPE', 1, true) then
            return redis.error_reply('WRONGTYPE ' .. key .. ' is not a ' .. shape ..
                ', as a lock of this kind is; nothing was changed')
        end
        return v
    end
end
)lua";

/// Prepended to the scripts that use them (with_lua_checks), after read_failed.
///   can_step(v, by)       true when INCR / HINCRBY by `by` (1 or -1) accepts the string `v`:
///                         a 64-bit integer as Redis writes one (no '+', no leading zero, no
///                         blanks) with room for the step.
///   bad_count(key, field) the error reply for a reentry count HINCRBY would refuse.
///   check_counter(key)    reads the fencing counter: an error reply when it is of another type
///                         or not an integer from 0 to 2^53 - 1 (INCR refuses a non-integer
///                         and the int64 limit; above 2^53 a token would not pass through a
///                         Lua number, a double, exactly: two holders could get the same one),
///                         else nil and its value (false when missing), for next_token.
///   counter_if(fenced, key)  check_counter(key) when `fenced` is '1' (the scripts' fencing
///                         argument); else nil, false.
///   next_token(key, had)  the next fencing token: INCR; a missing counter (never made, or lost
///                         with the server's data) starts from the server's TIME in
///                         microseconds, so tokens keep increasing across a data loss as long
///                         as fewer than one token per microsecond was handed out since the
///                         lost counter was started, and the server's clock did not go back
///                         (docs/design.md, "Fencing counter").
inline constexpr std::string_view lua_checks = R"lua(
local function can_step(v, by)
    if v == '0' then return true end
    local sign, digits = string.match(v, '^(%-?)([1-9]%d*)$')
    if not digits or #digits > 19 then return false end
    if #digits < 19 then return true end
    if sign == '-' then
        return digits < '9223372036854775808' or (by > 0 and digits == '9223372036854775808')
    end
    return digits < '9223372036854775807' or (by < 0 and digits == '9223372036854775807')
end
local function bad_count(key, field)
    return redis.error_reply('ERR the reentry count of ' .. field .. ' in ' .. key ..
        ' is not an integer HINCRBY can step; nothing was changed')
end
-- acl: asked where used (fencing's commands are asked about in check_counter, when fenced)
local function check_counter(key)
    local v = redis.pcall('get', key)
    if type(v) == 'table' then
        if v.err and string.find(v.err, 'WRONGTYPE', 1, true) then
            return redis.error_reply('WRONGTYPE the fencing counter ' .. key ..
                ' is not a string; nothing was changed')
        end
        return v
    end
    if v and not (v == '0' or (string.match(v, '^[1-9]%d*$') and
                               (#v < 16 or (#v == 16 and v < '9007199254740992')))) then
        return redis.error_reply('ERR the fencing counter ' .. key ..
            ' is not an integer from 0 to 2^53 - 1 (INCR refuses a non-integer or the int64' ..
            ' limit; a larger token would lose precision in Lua); nothing was changed')
    end
    if redis.acl_check_cmd then
        local need = v and {{'incr', key}} or {{'time'}, {'set', key, '1'}}
        for _, c in ipairs(need) do
            if not redis.acl_check_cmd(unpack(c)) then
                return redis.error_reply("NOPERM this user has no permissions to run the '" .. c[1] ..
                    "' command, which fencing needs; nothing was changed")
            end
        end
    end
    return nil, v
end
local function counter_if(fenced, key)
    if fenced ~= '1' then return nil, false end
    return check_counter(key)
end
local function next_token(key, had)
    if had then return redis.call('incr', key) end
    local t = redis.call('time')
    local seed = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('set', key, seed)
    return tonumber(seed)
end
-- acl: end
)lua";

/// `body` with read_failed before it.
inline std::string with_read_failed(std::string_view body) {
    return std::string(lua_read_failed) + std::string(body);
}

/// `body` with read_failed and the checks before it.
RLOCK_DECL std::string with_lua_checks(std::string_view body);

/// `body` with channel_refused before it: for the scripts that publish, and only those (a
/// script's text naming 'publish' gets a sharded form, script.hpp).
inline std::string with_channel_check(std::string_view body) {
    return std::string(lua_publish_check) + std::string(body);
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string with_lua_checks(std::string_view body) {
    return std::string(lua_read_failed) + std::string(lua_checks) + std::string(body);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
