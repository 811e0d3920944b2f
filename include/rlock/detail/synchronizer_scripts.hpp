// The Redis side of rlock::semaphore and rlock::count_down_latch, in Redisson's layouts
// (RSemaphore, RCountDownLatch): each is one string key `name` holding a count, and a change
// that waiters wait for is published on the object's channel. Every script reads and checks the
// key before its first write: a key of another type fails at GET, a string that is not a count
// is refused with a WRONGTYPE reply, nothing written. The channel is passed in ARGV: only the
// key is declared, as for the locks' release.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <system_error>

#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/script.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// `count_of(v)`: the count a GET returned (false: 0), or nil and a WRONGTYPE error reply when
/// the string is not what INCRBY / DECRBY take: a 64-bit integer as Redis writes one (no '+',
/// no leading zero, no "-0"). The same rule as parse_count below.
inline constexpr std::string_view lua_count_of = R"lua(
local function count_of(v)
    if v == false or v == '0' then return 0 end
    local sign, digits = string.match(v, '^(%-?)([1-9][0-9]*)$')
    local limit = sign == '-' and '9223372036854775808' or '9223372036854775807'
    if not digits or #digits > 19 or (#digits == 19 and digits > limit) then
        return nil, redis.error_reply('WRONGTYPE the key holds "' .. string.sub(v, 1, 40) ..
            '", not a count')
    end
    return tonumber(v)
end
)lua";

/// A count as count_of accepts it: a 64-bit integer as Redis writes one. False otherwise.
inline bool parse_count(std::string_view v, long long& out) {
    long long n = 0;
    const char* end = v.data() + v.size();
    const auto [stop, failed] = std::from_chars(v.data(), end, n);
    // Back to text and compare: refuses what from_chars takes and Redis does not ("007", "-0").
    if (failed != std::errc() || stop != end || std::to_string(n) != v) return false;
    out = n;
    return true;
}

/// A count from a reply: nil 0, an integer as it is, a string by parse_count. Throws `error`
/// (wrong_type, naming `key`) for a string that is not a count.
inline long long count_from(const redisReply* r, std::string_view key, std::string_view server) {
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

/// GET of a count key (0 when absent), checked by count_from.
inline long long read_count(const connection& c, std::string_view key, std::string_view server) {
    return count_from(run_command(c, {"GET", key}, key, server).get(), key, server);
}

struct count_scripts {
    /// Sets the count to ARGV[1] when the object has none (no key) and publishes ARGV[3] on
    /// ARGV[2] (the semaphore: the new count; the latch: its new-count message). Returns 1 set,
    /// 0 already set (nothing written).
    static const script& try_set() {
        static const script s(std::string(lua_count_of) + R"lua(
local v = redis.call('get', KEYS[1])
local _, bad = count_of(v)
if bad then return bad end
if v ~= false then return 0 end
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], ARGV[3])
return 1
)lua");
        return s;
    }
};

struct semaphore_scripts {
    /// Takes ARGV[1] permits when that many are free. KEYS[1] the semaphore.
    /// Returns 1 taken, 0 not (nothing written).
    static const script& acquire() {
        static const script s(std::string(lua_count_of) + R"lua(
local have, bad = count_of(redis.call('get', KEYS[1]))
if bad then return bad end
if have < tonumber(ARGV[1]) then return 0 end
redis.call('decrby', KEYS[1], ARGV[1])
return 1
)lua");
        return s;
    }

    /// Adds ARGV[1] permits (release, add_permits; may be negative for add_permits) and
    /// publishes the new count on ARGV[2]. KEYS[1] the semaphore. Returns the new count.
    /// INCRBY refuses an overflow before it writes.
    static const script& add() {
        static const script s(std::string(lua_count_of) + R"lua(
local _, bad = count_of(redis.call('get', KEYS[1]))
if bad then return bad end
local now = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], now)
return now
)lua");
        return s;
    }

    /// Takes every free permit: the count becomes 0 (a negative count too, as Redisson's
    /// drainPermits does). Returns the count it had as the stored string (exact; a Lua number
    /// is not above 2^53), or 0 with no key, which stays absent.
    static const script& drain() {
        static const script s(std::string(lua_count_of) + R"lua(
local v = redis.call('get', KEYS[1])
local _, bad = count_of(v)
if bad then return bad end
if v == false then return 0 end
redis.call('set', KEYS[1], 0)
return v
)lua");
        return s;
    }
};

/// RCountDownLatch's message for a new count (its zero message, `0`, is count_down's).
inline constexpr std::string_view latch_new_count_message = "1";

struct latch_scripts {
    /// Counts down by ARGV[1]. At or below zero the key goes (as Redisson's countDown), and
    /// only the step that reaches zero from above publishes the zero message on ARGV[2].
    /// Returns the count left, 0 at or below zero (a count down of an absent latch changes
    /// nothing).
    static const script& count_down() {
        static const script s(std::string(lua_count_of) + R"lua(
local v = redis.call('get', KEYS[1])
local had, bad = count_of(v)
if bad then return bad end
if had <= 0 then
    if v ~= false then redis.call('del', KEYS[1]) end
    return 0
end
local left = redis.call('decrby', KEYS[1], ARGV[1])
if left > 0 then return left end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], '0')
return 0
)lua");
        return s;
    }
};

}  // namespace rlock::detail
