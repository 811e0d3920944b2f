// The Redis side of rlock::semaphore and rlock::count_down_latch, in Redisson's layouts
// (RSemaphore, RCountDownLatch): each is one string key `name` holding a count, and a change
// that waiters wait for is published on the object's channel. Every script reads and checks the
// key before its first write: a key of another type fails at GET, a string that is not a count
// is refused with a WRONGTYPE reply, nothing written. The channel is passed in ARGV: only the
// key is declared, as for the locks' release.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/script.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// `count_of(v)`: the count a GET returned (false: 0), or nil and a WRONGTYPE error reply when
/// the string is not a whole number INCRBY / DECRBY would take.
inline constexpr std::string_view lua_count_of = R"lua(
local function count_of(v)
    if v == false then return 0 end
    if string.len(v) > 20 or (v ~= '0' and not string.match(v, '^%-?[1-9][0-9]*$')) then
        return nil, redis.error_reply('WRONGTYPE the key holds "' .. string.sub(v, 1, 40) ..
            '", not a count')
    end
    return tonumber(v)
end
)lua";

/// GET of a count key, checked in C++ as count_of checks it in Lua: 0 when absent; throws
/// `error` (wrong_type, naming `key`) for a string that is not a whole number Redis's INCRBY
/// takes, and what any command throws.
inline long long read_count(const connection& c, std::string_view key, std::string_view server) {
    reply_ptr r = run_command(c, {"GET", key}, key, server);
    if (r->type == REDIS_REPLY_NIL) return 0;
    const std::string_view v = reply_text(r.get());
    const bool negative = !v.empty() && v.front() == '-';
    const std::string_view digits = negative ? v.substr(1) : v;
    bool ok = !digits.empty() && digits.size() <= 19 && (digits.size() == 1 || digits.front() != '0') &&
              !(negative && digits == "0");
    unsigned long long n = 0;
    for (std::size_t i = 0; ok && i < digits.size(); ++i) {
        ok = digits[i] >= '0' && digits[i] <= '9';
        n = n * 10 + static_cast<unsigned long long>(digits[i] - '0');
    }
    constexpr unsigned long long max = 9223372036854775807ULL;
    if (!ok || n > max + (negative ? 1 : 0)) {
        throw error(errc::wrong_type, key, server,
                    "the key holds \"" + std::string(v.substr(0, 40)) + "\", not a count");
    }
    return negative ? static_cast<long long>(0 - n) : static_cast<long long>(n);
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
    /// drainPermits does). Returns the count it had (0 with no key, which stays absent).
    static const script& drain() {
        static const script s(std::string(lua_count_of) + R"lua(
local v = redis.call('get', KEYS[1])
local have, bad = count_of(v)
if bad then return bad end
if v == false then return 0 end
redis.call('set', KEYS[1], 0)
return have
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
