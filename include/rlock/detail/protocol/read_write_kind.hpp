// The read-write protocol: Redisson's RReadWriteLock layout, so rlock and Redisson exclude each
// other. Key = the lock name, a hash:
//     mode                      -> "read" | "write"
//     <holder id>               -> read reentry count        (one field per reading thread)
//     <holder id>:write         -> write reentry count       (the writing thread)
// and for every read hold n of a holder a key `{name}:<holder id>:rwlock_timeout:<n>` with that
// hold's own PEXPIRE (`name:<holder id>:...` when the name has a '{' of its own, as Redisson's
// suffixName does). Unlocks publish on `redisson_rwlock:{name}`: `0` when the last reader
// leaves, `1` when the writer leaves (also when it leaves while keeping read holds: a
// downgrade, after which waiting readers may enter).
//
// Where rlock differs from Redisson, on purpose:
//   - read renewal renews only the renewing holder's own hold keys (Redisson renews every
//     reader's, so one live reader keeps a crashed reader's share alive for ever);
//   - a writer's acquire drops reader fields whose hold keys have all expired (dead readers),
//     so a dead reader blocks writers for at most its own lease;
//   - a completed downgrade publishes `1` (Redisson's waiting readers wait out the TTL).
#pragma once

#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/protocol/reentrant_kind.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

/// hold_key(hash, holder, n): the key of a reader's n-th hold, in the hash's slot (Redisson's
/// `{name}:<holder>:rwlock_timeout:<n>`; a name with a hash tag of its own keeps it). Also read
/// by rlock::inspect's script.
inline constexpr std::string_view lua_reader_hold_key = R"lua(local function hold_key(hash, holder, n)
    if string.find(hash, '{', 1, true) then
        return hash .. ':' .. holder .. ':rwlock_timeout:' .. n
    end
    return '{' .. hash .. '}:' .. holder .. ':rwlock_timeout:' .. n
end
)lua";

/// Lua helpers shared by the read-write scripts (prepended to their bodies).
/// touch_holds(hash) reads every reader's hold keys and changes nothing: in Redis Cluster,
/// while the lock's slot migrates, a hold key already moved makes the script fail there ("non
/// local key"), so a script calls it before its first write and fails with nothing changed
/// (the pool then waits for the migration to end; see follows_ask). Hold keys are created
/// before the hash counts them, for the same reason.
/// live_readers(hash) drops the reader fields none of whose hold keys is alive any more, and
/// returns how many readers are alive and the longest remaining hold (ms). Neither walks more
/// than max_walked_levels levels of one reader: a count above it, or any other count neither
/// rlock nor Redisson writes (text, 0, a negative or fractional one: walkable_levels), is not
/// walked, and live_readers keeps that reader for the hash's TTL.
/// fencing_token(counter, wanted, had) takes the next token (lua_checks' next_token) when asked.
/// They follow lua_checks, whose checks every script makes before its first write: the lock
/// hash's type (its first HGET), the fencing counter, and the holder's count where it HINCRBYs
/// after another write.
inline constexpr std::string_view rw_lua_helpers_before = R"lua(
-- A reader's field in the lock hash: neither 'mode' nor a writer's "<holder>:write".
local function is_reader(field)
    return field ~= 'mode' and string.sub(field, -6) ~= ':write'
end
)lua";
inline constexpr std::string_view rw_lua_helpers_after = R"lua(-- The most levels of one reader a script walks: rlock and Redisson step a count by one per
-- level, so a larger one was written by someone else, and walking it (up to 2^63 hold keys)
-- would keep the server in the script for ever.
local max_walked_levels = 999999
-- A reader's count as rlock and Redisson write it (1 to max_walked_levels), as a number;
-- false for any other value (text, 0, a negative or fractional count, one too large to walk).
local function walkable_levels(v)
    return type(v) == 'string' and string.match(v, '^[1-9]%d?%d?%d?%d?%d?$') and tonumber(v)
end
local function touch_holds(hash)
    for _, field in ipairs(redis.call('hkeys', hash)) do
        if is_reader(field) then
            local count = walkable_levels(redis.call('hget', hash, field)) or 0
            for i = 1, count do
                redis.call('pttl', hold_key(hash, field, i))
            end
        end
    end
end
local function live_readers(hash)
    local alive, longest = 0, 0
    for _, field in ipairs(redis.call('hkeys', hash)) do
        if is_reader(field) then
            local count = walkable_levels(redis.call('hget', hash, field))
            local live = false
            if not count then
                -- Not walked: a reader whose holds cannot be told (a count no one of ours
                -- writes) is kept, for the hash's time to live (a writer is never let in over
                -- a reader that may be alive).
                live = true
                local t = redis.call('pttl', hash)
                if t > longest then longest = t end
                count = 0
            end
            for i = 1, count do
                local t = redis.call('pttl', hold_key(hash, field, i))
                if t == -1 or t > 0 then
                    live = true
                    if t > longest then longest = t end
                end
            end
            if live then
                alive = alive + 1
            else
                redis.call('hdel', hash, field)
            end
        end
    end
    return alive, longest
end
local function fencing_token(counter, wanted, had)
    if wanted == '1' then return next_token(counter, had) end
    return 0
end
-- The hash's TTL raised to `lease` ms, never lowered (other holds may need it longer).
local function raise_ttl(hash, lease)
    if redis.call('pttl', hash) < tonumber(lease) then redis.call('pexpire', hash, lease) end
end
-- How both release scripts begin: the hash's mode and `field`'s count (a number, and the
-- string stored), or, as fourth value, the error reply of a read that failed (another type
-- reads as an empty hash: not held).
local function held_level(field)
    local got = redis.pcall('hmget', KEYS[1], 'mode', field)
    if read_failed(got) then return nil, nil, nil, got end
    return got[1], tonumber(got[2]), got[2]
end
-- How both acquire scripts begin: the mode, and the fencing counter checked when `fenced` is
-- '1' (KEYS[1] the hash, KEYS[2] the counter). Returns mode, the counter's error reply or
-- nil, and whether the counter existed. A hash whose mode is neither 'read' nor 'write' (none:
-- a Redisson RLock at this name, say) is not a read/write lock: an error reply, not "free".
local function begin_acquire(fenced)
    local mode = redis.call('hget', KEYS[1], 'mode')
    if mode ~= 'read' and mode ~= 'write' and (mode or redis.call('exists', KEYS[1]) == 1) then
        return mode, redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a hash but not a ' ..
            'read/write lock (its mode is ' .. (mode and ("'" .. mode .. "'") or 'missing') ..
            '); nothing was changed')
    end
    local bad, had = counter_if(fenced, KEYS[2])
    return mode, bad, had
end
)lua";

/// The helpers above in one text: is_reader, hold_key (lua_reader_hold_key), touch_holds,
/// live_readers, fencing_token.
RLOCK_DECL std::string rw_lua_helpers();

inline std::string with_rw_helpers(std::string_view body) {
    return with_lua_checks(rw_lua_helpers()) + std::string(body);
}

/// What the two sides share: Redisson's layout (one hash, one channel), re-entry, the
/// release through each side's own script, and force_unlock of the whole lock.
template <class Side>
struct rw_kind_base : kind_defaults {
    static constexpr bool reentrant = true;
    static constexpr std::string_view channel_prefix = "redisson_rwlock";
    static constexpr bool follows_ask = false;  // the hold keys are not declared

    /// `field`: the holder id (read side) or "<holder id>:write" (write side).
    static long long release(const connection& c, const lock_keys& k, std::string_view field,
                             std::string_view server, long long* woken = nullptr) {
        return release_by(Side::release_script(), c, k, field, server, woken);
    }
    static std::vector<script_call> undo_calls(const lock_keys& k, std::string_view field) {
        std::vector<script_call> out;
        out.emplace_back(Side::release_script(), std::initializer_list<std::string_view>{k.name},
                         std::initializer_list<std::string_view>{field, k.channel});
        return out;
    }

    static bool held(const connection& c, const lock_keys& k, std::string_view field,
                     std::string_view server) {
        return reentrant_kind::held(c, k, field, server);
    }

    /// Deletes the whole lock (every reader's hold keys too) and publishes `1`.
    /// KEYS[1] lock hash; ARGV[1] channel. Returns 1 when it was held.
    static const script& force_unlock_script() {
        static const script s(with_rw_helpers(std::string(lua_not_a_lock) + with_channel_check(R"lua(
local bad = not_a_lock(KEYS[1], 'hash')
if bad then return bad end
if redis.call('exists', KEYS[1]) == 0 then return 0 end
local refused = channel_refused(ARGV[1])
if refused then return refused end
touch_holds(KEYS[1])
for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    if is_reader(field) then
        local count = tonumber(redis.call('hget', KEYS[1], field)) or 0
        if count > max_walked_levels then count = 0 end  -- its hold keys expire on their own
        for n = 1, count do redis.call('del', hold_key(KEYS[1], field, n)) end
    end
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[1], '1')
return 1
)lua")));
        return s;
    }

    static bool force_unlock(const connection& c, const lock_keys& k, std::string_view server) {
        return eval_integer(c, force_unlock_script(), {k.name}, {k.channel}, k.name, server) == 1;
    }
};

struct rw_read_kind : rw_kind_base<rw_read_kind> {
    static constexpr bool shared = true;

    /// Take or re-enter a read hold.
    /// KEYS[1] lock hash, KEYS[2] redisson_lock_token:{name} (with fencing only);
    /// ARGV[1] lease ms, ARGV[2] holder id, ARGV[3] "<holder id>:write", ARGV[4] '1' fencing,
    /// ARGV[5] '1' re-entry (must find the holder's field).
    /// Allowed when the lock is free, in read mode, or in write mode held by this very holder
    /// (the first step of a downgrade). Each hold n gets its own key hold_key(name, holder, n)
    /// with PEXPIRE lease; the hash's TTL becomes the longer of its TTL and the lease.
    /// Returns {1, reentry count, fencing token or 0} / {0, PTTL} (-2: a re-entry found nothing).
    /// The holder's count is checked before the level's key is SET (HINCRBY comes after it).
    static const script& acquire_script() {
        static const script s(with_rw_helpers(R"lua(
local mode, bad, had = begin_acquire(ARGV[4])
if bad then return bad end
if mode == false then
    if ARGV[5] == '1' then return {0, -2} end
    redis.call('set', hold_key(KEYS[1], ARGV[2], 1), 1, 'PX', ARGV[1])
    redis.call('hset', KEYS[1], 'mode', 'read', ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1, fencing_token(KEYS[2], ARGV[4], had)}
elseif not (mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1)) then
    if ARGV[5] == '1' then return {0, -2} end
    return {0, redis.call('pttl', KEYS[1])}
elseif ARGV[5] == '1' and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return {0, -2}
end
local count = redis.call('hget', KEYS[1], ARGV[2])
if count and not can_step(count, 1) then return bad_count(KEYS[1], ARGV[2]) end
local n = (tonumber(count) or 0) + 1
redis.call('set', hold_key(KEYS[1], ARGV[2], n), 1, 'PX', ARGV[1])
redis.call('hincrby', KEYS[1], ARGV[2], 1)
raise_ttl(KEYS[1], ARGV[1])
return {1, n, fencing_token(KEYS[2], ARGV[4], had)}
)lua"));
        return s;
    }

    /// Leave one read level. KEYS[1] lock hash; ARGV[1] holder id, ARGV[2] channel.
    /// Deletes the hold's own key. When the holder's last level goes and no live reader (nor
    /// writer) remains, deletes the hash and publishes `0`; otherwise the hash lives on for the
    /// longest remaining reader hold. Returns -1 not held (with no hash at all, this holder's
    /// level keys are deleted and `1` is published: the lock is free, wake_waiters), n > 0
    /// levels left, 0 released
    /// (readers remain), {0, subscribers reached} released and published.
    /// Mode and count come in one HMGET; when the hash holds nothing but `mode` and this
    /// holder (the common case), the last level deletes it without scanning for other readers.
    /// Every level checks that HINCRBY could step its count before it writes anything.
    static const script& release_script() {
        static const script s(with_rw_helpers(with_channel_check(R"lua(
local mode, count, stored, failed = held_level(ARGV[1])
if failed then return failed end
if (mode ~= 'read' and mode ~= 'write') or not count then
    if redis.call('exists', KEYS[1]) == 0 then
        -- The hash is gone (deleted, flushed, expired), and with it every hold it counted:
        -- this holder's level keys go too (levels 1..n, each unlock deletes the top one), or
        -- they would outlive the unlock by their lease. The lock is free: its waiters are woken.
        for n = 1, 1000 do
            if redis.call('del', hold_key(KEYS[1], ARGV[1], n)) == 0 then break end
        end
        wake_waiters(ARGV[2], '1')
    end
    return -1
end
-- A count HINCRBY cannot step is no level rlock wrote ("1.0" reads as 1 here): refused before
-- any write, or an inner release would delete the lock its owner still holds.
if not can_step(stored, -1) then return bad_count(KEYS[1], ARGV[1]) end
if count > 1 then
    redis.call('del', hold_key(KEYS[1], ARGV[1], count))
    return redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
local refused = channel_refused(ARGV[2])
if refused then return refused end
if mode == 'read' and redis.call('hlen', KEYS[1]) == 2 then
    redis.call('del', hold_key(KEYS[1], ARGV[1], 1), KEYS[1])
    return {0, redis.call('publish', ARGV[2], '0')}
end
if mode == 'read' then touch_holds(KEYS[1]) end
redis.call('del', hold_key(KEYS[1], ARGV[1], 1))
redis.call('hdel', KEYS[1], ARGV[1])
if mode == 'write' then return 0 end
local alive, longest = live_readers(KEYS[1])
if alive > 0 then
    if longest > 0 then redis.call('pexpire', KEYS[1], longest) end
    return 0
end
redis.call('del', KEYS[1])
return {0, redis.call('publish', ARGV[2], '0')}
)lua")));
        return s;
    }

    /// Batch renewal of read holds, each renewing only its own hold keys (never another
    /// reader's, never re-creating one): KEYS[i] lock hashes; ARGV[1] lease ms, ARGV[i+1] holder
    /// id. A holder whose field or any of whose hold keys is gone is reported 0 (lost); an error
    /// reading its field (an ACL's refusal) is that hold's reply, told to its owner as itself,
    /// and so is a count rlock never writes (a fraction, text, more levels than a script should
    /// walk: a count at the int64 limit would keep the server in this loop for ever) — someone
    /// wrote the field, which is not the hold gone. A lease of "0" only checks (batch_renew_lua).
    static const script& renew_script() {
        static const script s(with_rw_helpers(R"lua(
local out = {}
for i = 1, #KEYS do
    local holder = ARGV[i + 1]
    local got = redis.pcall('hget', KEYS[i], holder)
    local count = walkable_levels(got)
    local ok = 0
    if read_failed(got) then
        ok = got
    elseif type(got) == 'string' and not count then
        ok = redis.error_reply('ERR the read hold count of ' .. holder .. ' in ' .. KEYS[i] ..
            ' is not a level count rlock writes (1 to 999999): ' .. got .. '; nothing was changed')
    elseif count then
        ok = 1
        for n = 1, count do
            if redis.call('exists', hold_key(KEYS[i], holder, n)) == 0 then ok = 0 end
        end
        if ok == 1 and ARGV[1] ~= '0' then
            for n = 1, count do
                redis.call('pexpire', hold_key(KEYS[i], holder, n), ARGV[1])
            end
            if redis.call('pttl', KEYS[i]) < tonumber(ARGV[1]) then
                redis.call('pexpire', KEYS[i], ARGV[1])
            end
        end
    end
    out[i] = ok
end
return out
)lua"));
        return s;
    }

    static inline const kind_info info{"read_write_lock.read", &renew_script, follows_ask};

    static acquire_result acquire(const connection& c, const lock_keys& k, const attempt_spec& a,
                                  std::string_view server);

};

struct rw_write_kind : rw_kind_base<rw_write_kind> {

    /// Take or re-enter the write hold.
    /// KEYS[1] lock hash, KEYS[2] redisson_lock_token:{name} (with fencing only);
    /// ARGV[1] lease ms, ARGV[2] "<holder id>:write", ARGV[3] '1' fencing, ARGV[4] '1' re-entry.
    /// In read mode, readers whose hold keys have all expired are dropped first; the write
    /// side is free once no live reader is left. Returns {1, count, token} / {0, PTTL}.
    /// The fencing counter is checked before dead readers are dropped; a re-entry's HINCRBY
    /// runs only in write mode, where nothing was written before it.
    static const script& acquire_script() {
        static const script s(with_rw_helpers(R"lua(
local mode, bad, had = begin_acquire(ARGV[3])
if bad then return bad end
if mode == 'read' and ARGV[4] ~= '1' then
    local alive = live_readers(KEYS[1])
    if alive == 0 then
        redis.call('del', KEYS[1])
        mode = false
    end
end
if mode == false then
    if ARGV[4] == '1' then return {0, -2} end
    redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1, fencing_token(KEYS[2], ARGV[3], had)}
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    raise_ttl(KEYS[1], ARGV[1])
    return {1, n, fencing_token(KEYS[2], ARGV[3], had)}
end
if ARGV[4] == '1' then return {0, -2} end
return {0, redis.call('pttl', KEYS[1])}
)lua"));
        return s;
    }

    /// Leave one write level. KEYS[1] lock hash; ARGV[1] "<holder id>:write", ARGV[2] channel.
    /// The last level deletes the hash, or, when the holder still has read holds (a
    /// downgrade), switches mode to read and gives the hash the longest remaining read hold's
    /// TTL; either way it publishes `1` to wake every waiter.
    /// Returns -1 not held (with no hash at all `1` is published: the lock is free,
    /// wake_waiters), n > 0 levels left, {0, subscribers reached} released. A hash
    /// holding nothing but `mode` and this holder's field is deleted without the reader scan.
    static const script& release_script() {
        static const script s(with_rw_helpers(with_channel_check(R"lua(
local mode, count, stored, failed = held_level(ARGV[1])
if failed then return failed end
if mode ~= 'write' or not count then
    if redis.call('exists', KEYS[1]) == 0 then wake_waiters(ARGV[2], '1') end
    return -1
end
if not can_step(stored, -1) then return bad_count(KEYS[1], ARGV[1]) end  -- as the read side
if count > 1 then
    return redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
local refused = channel_refused(ARGV[2])
if refused then return refused end
if redis.call('hlen', KEYS[1]) == 2 then
    redis.call('del', KEYS[1])
else
    touch_holds(KEYS[1])
    redis.call('hdel', KEYS[1], ARGV[1])
    redis.call('hset', KEYS[1], 'mode', 'read')
    local alive, longest = live_readers(KEYS[1])
    if alive == 0 then
        redis.call('del', KEYS[1])
    elseif longest > 0 then
        redis.call('pexpire', KEYS[1], longest)
    end
end
return {0, redis.call('publish', ARGV[2], '1')}
)lua")));
        return s;
    }

    /// Batch renewal of write holds (batch_renew_lua): ARGV[i+1] "<holder id>:write". The
    /// hash's TTL only ever grows here: the writer may also hold longer-leased read holds
    /// (before a downgrade), whose lease the hash must keep.
    static const script& renew_script() {
        static const script s(batch_renew_lua("redis.pcall('hexists', KEYS[i], ARGV[i + 1])", "got == 1",
                                              "if redis.call('pttl', KEYS[i]) < tonumber(ARGV[1]) then\n"
                                              "            redis.call('pexpire', KEYS[i], ARGV[1])\n"
                                              "        end"));
        return s;
    }

    static inline const kind_info info{"read_write_lock.write", &renew_script, follows_ask};

    static std::string value_for(std::string_view client_id, std::uint64_t thread, bool) {
        return holder_id(client_id, thread) + ":write";
    }

    /// A thread with a read hold asking for the write side would wait for itself for ever.
    static const kind_info* refused_while_holding() noexcept { return &rw_read_kind::info; }
    static constexpr const char* refused_while_holding_why =
        "holds the read side; it cannot wait for the write side (release the read hold first)";

    static acquire_result acquire(const connection& c, const lock_keys& k, const attempt_spec& a,
                                  std::string_view server);

};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string rw_lua_helpers() {
    return std::string(rw_lua_helpers_before) + std::string(lua_reader_hold_key) +
           std::string(rw_lua_helpers_after);
}

RLOCK_DECL acquire_result rw_read_kind::acquire(const connection& c, const lock_keys& k,
                                                const attempt_spec& a, std::string_view server) {
    const std::string write_field = std::string(a.value) + ":write";
    script_call call =
        acquire_call(acquire_script(), k, a.fencing,
                     {a.lease, a.value, write_field, a.fencing ? "1" : "0", a.reentry ? "1" : "0"});
    return reentrant_kind::parse_acquire(run_script(c, call, k.name, server).get(), k.name, server);
}

RLOCK_DECL acquire_result rw_write_kind::acquire(const connection& c, const lock_keys& k,
                                                 const attempt_spec& a, std::string_view server) {
    script_call call =
        acquire_call(acquire_script(), k, a.fencing,
                     {a.lease, a.value, a.fencing ? "1" : "0", a.reentry ? "1" : "0"});
    return reentrant_kind::parse_acquire(run_script(c, call, k.name, server).get(), k.name, server);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
