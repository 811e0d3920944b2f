// The Redis side of rlock::semaphore, rlock::permit_expirable_semaphore and
// rlock::count_down_latch, in Redisson's layouts (RSemaphore, RPermitExpirableSemaphore,
// RCountDownLatch): each is one string key `name` holding a count (the permit-expirable
// semaphore also a sorted set of its taken permits), and a change that waiters wait for is
// published on the object's channel. Every script reads and checks the
// key before its first write: a key of another type fails at GET, a string that is not a count
// is refused with a WRONGTYPE reply, nothing written. The channel is passed in ARGV: only the
// key is declared, as for the locks' release.
#pragma once

#include <charconv>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// Counts in scripts are texts, never Lua numbers: a Lua number is a double, exact only up to
/// 2^53, and a count (or an argument) above that compared or returned as one is wrong (a count
/// of 2^53 gave 2^53 + 1 permits). Redis's INCRBY / DECRBY do the arithmetic, exactly.
///   count_of(v)   the count a GET returned as its text ('0' for false), or nil and a
///                 WRONGTYPE error reply when the string is not what INCRBY / DECRBY take: a
///                 64-bit integer as Redis writes one (no '+', no leading zero, no "-0"). The
///                 same rule as parse_count below.
///   less(a, b)    a < b, for two such texts (and ARGV counts, written by std::to_string).
///   negated(a)    -a, as a text (also for the lowest 64-bit integer: a text has no range).
inline constexpr std::string_view lua_count_of = R"lua(
local function count_of(v)
    if v == false or v == '0' then return '0' end
    local sign, digits = string.match(v, '^(%-?)([1-9][0-9]*)$')
    local limit = sign == '-' and '9223372036854775808' or '9223372036854775807'
    if not digits or #digits > 19 or (#digits == 19 and digits > limit) then
        return nil, redis.error_reply('WRONGTYPE the key holds "' .. string.sub(v, 1, 40) ..
            '", not a count')
    end
    return v
end
local function less(a, b)
    local na, nb = string.byte(a, 1) == 45, string.byte(b, 1) == 45
    if na ~= nb then return na end
    if #a ~= #b then return (#a < #b) ~= na end
    for i = 1, #a do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then return (x < y) ~= na end
    end
    return false
end
local function negated(a)
    if a == '0' then return a end
    if string.byte(a, 1) == 45 then return string.sub(a, 2) end
    return '-' .. a
end
)lua";

/// `body` with count_of before it.
inline std::string with_count_of(std::string_view body) {
    return std::string(lua_count_of) + std::string(body);
}

/// A count as count_of accepts it: a 64-bit integer as Redis writes one. False otherwise.
RLOCK_DECL bool parse_count(std::string_view v, long long& out);

/// A count from a reply: nil 0, an integer as it is, a string by parse_count. Throws `error`
/// (wrong_type, naming `key`) for a string that is not a count, and an error reply as itself.
RLOCK_DECL long long count_from(const redisReply* r, std::string_view key, std::string_view server);

/// Runs `s` and reads its answer as a count (count_from): the scripts answer counts as texts.
RLOCK_DECL long long eval_count(const connection& c, const script& s, std::initializer_list<std::string_view> keys,
                            std::initializer_list<std::string_view> args, std::string_view key,
                            std::string_view server);

/// GET of a count key (0 when absent), checked by count_from.
RLOCK_DECL long long read_count(const connection& c, std::string_view key, std::string_view server);

struct count_scripts {
    /// Sets the count to ARGV[1] when the object has none (no key) and publishes ARGV[3] on
    /// ARGV[2] (the semaphore: the new count; the latch: its new-count message). Returns 1 set,
    /// 0 already set (nothing written).
    static const script& try_set() {
        static const script s(with_count_of(with_channel_check(R"lua(
local v = redis.call('get', KEYS[1])
local _, bad = count_of(v)
if bad then return bad end
if v ~= false then return 0 end
local refused = channel_refused(ARGV[2])
if refused then return refused end
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], ARGV[3])
return 1
)lua")));
        return s;
    }
};

struct semaphore_scripts {
    /// Takes ARGV[1] permits when that many are free. KEYS[1] the semaphore. ARGV[2] its
    /// capacity ('0': not known) and ARGV[3] its channel: with a capacity, an absent count
    /// (the server lost it) is set back to the capacity first, and the permits left free by
    /// this call are published for the other waiters. Returns 1 taken, 0 not (nothing
    /// written), -1 not because there is no count and no capacity to restore (nothing
    /// written); 3 and 2 as 1 and 0 after the count was restored.
    static const script& acquire() {
        static const script s(with_count_of(with_channel_check(R"lua(
local v = redis.call('get', KEYS[1])
local have, bad = count_of(v)
if bad then return bad end
local restored = 0
if v == false then
    if ARGV[2] == '0' then return -1 end
    local refused = channel_refused(ARGV[3])
    if refused then return refused end
    redis.call('set', KEYS[1], ARGV[2])
    have = ARGV[2]
    restored = 2
end
if less(have, ARGV[1]) then
    if restored ~= 0 and have ~= '0' then redis.call('publish', ARGV[3], have) end
    return restored
end
redis.call('decrby', KEYS[1], ARGV[1])
if restored ~= 0 and less(ARGV[1], have) then
    redis.call('publish', ARGV[3], redis.call('get', KEYS[1]))
end
return 1 + restored
)lua")));
        return s;
    }

    /// Adds ARGV[1] permits (release, add_permits; may be negative for add_permits) and
    /// publishes the new count on ARGV[2] when it is positive (a count of 0 or less frees
    /// nobody, and Redisson's waiters take a message as a number of permits to wake, which must
    /// not be negative). KEYS[1] the semaphore. ARGV[3] a capacity ('0': none; release() of a
    /// semaphore that knows its capacity): the count never goes above it (an absent count
    /// counts as the capacity, set back) nor down (a count already above it stays), and what
    /// did not fit is returned, never more than ARGV[1]. Returns {the new
    /// count as its text (exact), the permits that did not fit ('0')}. INCRBY refuses an
    /// overflow before it writes.
    static const script& add() {
        static const script s(with_count_of(with_channel_check(R"lua(
local v = redis.call('get', KEYS[1])
local have, bad = count_of(v)
if bad then return bad end
local cap = ARGV[3]
if cap ~= '0' and v == false then
    -- Lost: set back to the capacity, which nothing released can be added to.
    local refused = channel_refused(ARGV[2])
    if refused then return refused end
    redis.call('set', KEYS[1], cap)
    redis.call('publish', ARGV[2], cap)
    return {cap, ARGV[1]}
end
if cap ~= '0' and not less(have, cap) then
    -- At the capacity already, or above it (a count set higher): nothing released fits, and
    -- the count stays as it is (clamping it would take free permits away).
    return {have, ARGV[1]}
end
local positive = less(negated(ARGV[1]), have)
if positive then
    local refused = channel_refused(ARGV[2])
    if refused then return refused end
end
redis.call('incrby', KEYS[1], ARGV[1])
local now = redis.call('get', KEYS[1])
local over = '0'
if cap ~= '0' and less(cap, now) then
    -- Back to the capacity by integer steps (exact, and the key keeps any TTL set on it,
    -- which a SET would drop): now - cap is what did not fit.
    redis.call('decrby', KEYS[1], cap)
    over = redis.call('get', KEYS[1])
    redis.call('incrby', KEYS[1], cap)
    redis.call('decrby', KEYS[1], over)
    now = cap
end
if positive then redis.call('publish', ARGV[2], now) end
return {now, over}
)lua")));
        return s;
    }

    /// Takes every free permit: the count becomes 0 (a negative count too, as Redisson's
    /// drainPermits does). ARGV[1] the semaphore's capacity ('0': none). Returns the count it
    /// had as the stored string (exact; a Lua number is not above 2^53). With no key: 0, and
    /// the key stays absent; with a capacity, an absent count is the capacity (the next
    /// acquire would set it back): that is returned, and the count is set to 0.
    static const script& drain() {
        static const script s(with_count_of(R"lua(
local v = redis.call('get', KEYS[1])
local _, bad = count_of(v)
if bad then return bad end
if v == false then
    if ARGV[1] == '0' then return 0 end
    redis.call('set', KEYS[1], 0)
    return ARGV[1]
end
redis.call('set', KEYS[1], 0)
return v
)lua"));
        return s;
    }
};

/// RCountDownLatch's message for a new count (its zero message, `0`, is count_down's).
inline constexpr std::string_view latch_new_count_message = "1";

struct latch_scripts {
    /// Counts down by ARGV[1]. At or below zero the key goes (as Redisson's countDown), and
    /// only the step that reaches zero from above publishes the zero message on ARGV[2].
    /// Returns the count left as its text (exact), 0 at or below zero (a count down of an
    /// absent latch changes nothing).
    static const script& count_down() {
        static const script s(with_count_of(with_channel_check(R"lua(
local v = redis.call('get', KEYS[1])
local had, bad = count_of(v)
if bad then return bad end
local above = less('0', had)
local stays = less(ARGV[1], had)
if above and not stays then
    local refused = channel_refused(ARGV[2])
    if refused then return refused end
end
if not above then
    if v ~= false then redis.call('del', KEYS[1]) end
    return 0
end
redis.call('decrby', KEYS[1], ARGV[1])
if stays then return redis.call('get', KEYS[1]) end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], '0')
return 0
)lua")));
        return s;
    }
};

/// The Lua pieces of the permit-expirable semaphore's scripts. KEYS[1] is the count, KEYS[2]
/// the sorted set of taken permits (member: the permit id's bytes, score: when its lease ends,
/// in Unix milliseconds). "Now" is the server's TIME, one clock for every client (Redisson
/// passes each client's own).
///   check(sem, set)      the free count (a text, as count_of's), or nil and an error reply when `sem` is not a count
///                        (GET refuses a key of another type) or `set` is not a sorted set.
///   server_ms()          the server's time in milliseconds.
///   put_back(sem, set, ids)  returns the taken permits `ids` to the count (the first write:
///                        INCRBY, which refuses an overflow before it writes) and takes them out
///                        of the set; the new count (a text), or nil and INCRBY's error reply.
///   reclaim(sem, set, channel, have, now)
///                        puts the permits whose lease ended back into the count and publishes
///                        the new count when positive (Redisson does both lazily too); returns
///                        the new free count, or nil and an error reply, with nothing
///                        written, when the count would overflow (INCRBY's) or this user may
///                        not publish on `channel` (channel_refused's).
///   live(set, id, now)   true when `id` is taken and its lease has not ended.
///   each_id(v)           the ids packed in `v` (16 bytes each, as rlock makes them).
inline constexpr std::string_view lua_permits = R"lua(
local function check(sem, set)
    local have, bad = count_of(redis.call('get', sem))
    if bad then return nil, bad end
    local t = redis.call('type', set)
    t = type(t) == 'table' and t.ok or t
    if t ~= 'none' and t ~= 'zset' then
        return nil, redis.error_reply('WRONGTYPE ' .. set .. ' is not a sorted set of permits')
    end
    return have
end
local function server_ms()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function put_back(sem, set, ids)
    local count = redis.pcall('incrby', sem, #ids)
    if type(count) == 'table' then return nil, count end
    for i = 1, #ids, 1000 do
        redis.call('zrem', set, unpack(ids, i, math.min(i + 999, #ids)))
    end
    return redis.call('get', sem)
end
local function reclaim(sem, set, channel, have, now)
    local ended = redis.call('zrangebyscore', set, '-inf', now)
    if #ended == 0 then return have end
    local refused = channel_refused(channel)
    if refused then return nil, refused end
    local count, bad = put_back(sem, set, ended)
    if bad then return nil, bad end
    if less('0', count) then redis.call('publish', channel, count) end
    return count
end
local function live(set, id, now)
    local score = redis.call('zscore', set, id)
    return score ~= false and tonumber(score) > now
end
local function each_id(v)
    local ids = {}
    for j = 1, #v, 16 do ids[#ids + 1] = string.sub(v, j, j + 15) end
    return ids
end
)lua";

struct permit_scripts {
    static std::string with_prelude(std::string_view body) {
        return with_count_of(with_channel_check(lua_permits) + std::string(body));
    }

    /// Takes ARGV[1] permits with the ids ARGV[4..] for a lease of ARGV[2] ms (the first
    /// write is reclaim's, after every check). ARGV[3] the channel. Returns {1, 0} taken now;
    /// {2, ms} when ARGV[4] is taken already (a repeat of an attempt whose reply was lost),
    /// ms its lease has left (0 or less: it has ended), nothing written; or {0, ms} not
    /// taken, ms until the earliest lease ends (-1: none will; Redisson's permanent permits,
    /// scored 922337203685477, never end), nothing written but the reclaiming of ended
    /// leases.
    static const script& acquire() {
        static const script s(with_prelude(R"lua(
local have, bad = check(KEYS[1], KEYS[2])
if bad then return bad end
local mine = redis.call('zscore', KEYS[2], ARGV[4])
if mine then return {2, tonumber(mine) - server_ms()} end
local now = server_ms()
have, bad = reclaim(KEYS[1], KEYS[2], ARGV[3], have, now)
if bad then return bad end
if less(have, ARGV[1]) then
    local first = redis.call('zrangebyscore', KEYS[2], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] and tonumber(first[2]) < 922337203685477 then
        return {0, tonumber(first[2]) - now}
    end
    return {0, -1}
end
redis.call('decrby', KEYS[1], ARGV[1])
local ends = now + tonumber(ARGV[2])
for i = 4, 3 + tonumber(ARGV[1]) do redis.call('zadd', KEYS[2], ends, ARGV[i]) end
local ttl = redis.call('pttl', KEYS[1])
if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
return {1, 0}
)lua"));
        return s;
    }

    /// A handle's release: returns its permits packed in ARGV[2] (those still taken, whether
    /// or not their lease has ended) to the count, publishes how many on ARGV[1]. Returns how
    /// many were still taken with their lease running: fewer than packed means some were lost.
    static const script& release_packed() {
        static const script s(with_prelude(R"lua(
local _, bad = check(KEYS[1], KEYS[2])
if bad then return bad end
local now = server_ms()
local back, kept = {}, 0
for _, id in ipairs(each_id(ARGV[2])) do
    local score = redis.call('zscore', KEYS[2], id)
    if score then
        back[#back + 1] = id
        if tonumber(score) > now then kept = kept + 1 end
    end
end
if #back == 0 then return 0 end
local refused = channel_refused(ARGV[1])
if refused then return refused end
local _, bad_count = put_back(KEYS[1], KEYS[2], back)
if bad_count then return bad_count end
redis.call('publish', ARGV[1], #back)
return kept
)lua"));
        return s;
    }

    /// Release by id, all or nothing: ARGV[2..] the ids (distinct). When each is taken with
    /// its lease running, returns them to the count, publishes how many on ARGV[1] and returns
    /// 0; else returns the index (from 1) of the first that is not, nothing written.
    static const script& release_ids() {
        static const script s(with_prelude(R"lua(
local _, bad = check(KEYS[1], KEYS[2])
if bad then return bad end
local now = server_ms()
for i = 2, #ARGV do
    if not live(KEYS[2], ARGV[i], now) then return i - 1 end
end
local refused = channel_refused(ARGV[1])
if refused then return refused end
local _, bad_count = put_back(KEYS[1], KEYS[2], {unpack(ARGV, 2)})
if bad_count then return bad_count end
redis.call('publish', ARGV[1], #ARGV - 1)
return 0
)lua"));
        return s;
    }

    /// Sets the lease of permit ARGV[1] to end ARGV[2] ms from now when it is taken with its
    /// lease running (1), else 0 with nothing written.
    static const script& update_lease() {
        static const script s(with_prelude(R"lua(
local _, bad = check(KEYS[1], KEYS[2])
if bad then return bad end
local now = server_ms()
if not live(KEYS[2], ARGV[1], now) then return 0 end
redis.call('zadd', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
)lua"));
        return s;
    }

    /// The free permits, the taken ones whose lease has ended (free too, not yet put back),
    /// and the taken ones with their lease running: {free as its text (exact), ended, taken}.
    /// Writes nothing.
    static const script& counts() {
        static const script s(with_prelude(R"lua(
local have, bad = check(KEYS[1], KEYS[2])
if bad then return bad end
local now = server_ms()
local ended = redis.call('zcount', KEYS[2], '-inf', now)
return {have, ended, redis.call('zcount', KEYS[2], '(' .. now, '+inf')}
)lua"));
        return s;
    }

    /// The watchdog's batch renewal of watched permits: KEYS[i] a timeout set, ARGV[i + 1] the
    /// ids of one handle, packed; each handle's leases are set to end ARGV[1] ms from now when
    /// every one is taken with its lease running (1), else 0 (lost) with nothing written, or
    /// the error that refused reading the set (an ACL's), told to that handle's owner as itself.
    /// A lease of "0" only checks (batch_renew_lua's contract).
    static const script& renew() {
        static const script s(with_read_failed(with_prelude(R"lua(
local now = server_ms()
local out = {}
for i = 1, #KEYS do
    local ids = each_id(ARGV[i + 1])
    local ok = redis.pcall('type', KEYS[i])
    local refused = read_failed(ok) and ok
    ok = not refused and (type(ok) == 'table' and ok.ok) == 'zset'
    for _, id in ipairs(ids) do
        if not ok then break end
        ok = live(KEYS[i], id, now)
    end
    if ok and ARGV[1] ~= '0' then
        for _, id in ipairs(ids) do
            redis.call('zadd', KEYS[i], 'XX', now + tonumber(ARGV[1]), id)
        end
    end
    out[i] = refused or (ok and 1 or 0)
end
return out
)lua")));
        return s;
    }
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL bool parse_count(std::string_view v, long long& out) {
    long long n = 0;
    const char* end = v.data() + v.size();
    const auto [stop, failed] = std::from_chars(v.data(), end, n);
    // Back to text and compare: refuses what from_chars takes and Redis does not ("007", "-0").
    if (failed != std::errc() || stop != end || std::to_string(n) != v) return false;
    out = n;
    return true;
}

RLOCK_DECL long long count_from(const redisReply* r, std::string_view key,
                                std::string_view server) {
    if (r->type == REDIS_REPLY_ERROR)
        throw make_error(static_cast<const redisContext*>(nullptr), r, key, server);
    if (r->type == REDIS_REPLY_NIL) return 0;
    if (r->type == REDIS_REPLY_INTEGER) return r->integer;
    const std::string_view v = reply_text(r);
    long long n = 0;
    if (r->type != REDIS_REPLY_STRING || !parse_count(v, n)) {
        throw error(errc::wrong_type, key, server,
                    "the key holds \"" + std::string(v.substr(0, 40)) + "\", not a count");
    }
    return n;
}

RLOCK_DECL long long eval_count(const connection& c, const script& s,
                                std::initializer_list<std::string_view> keys,
                                std::initializer_list<std::string_view> args, std::string_view key,
                                std::string_view server) {
    script_call call(s, keys, args);
    return count_from(run_script(c, call, key, server).get(), key, server);
}

RLOCK_DECL long long read_count(const connection& c, std::string_view key,
                                std::string_view server) {
    return count_from(run_command(c, {"GET", key}, key, server).get(), key, server);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
