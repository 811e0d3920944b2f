// The Redis side of rlock::semaphore, in Redisson's RSemaphore layout: key `name` is a string
// holding the number of free permits (missing: 0); a change that frees permits publishes the new
// count on `redisson_sc:{name}`. Every script reads and checks the key before its first write
// (a key of another type fails at GET, a string that is not a count is refused with nothing
// written). The channel is passed in ARGV: only the key is declared, as for the locks' release.
#pragma once

#include <string_view>

#include "rlock/detail/script.hpp"

namespace rlock::detail {

struct semaphore_scripts {
    /// `permits_of(v)`: the count a GET returned (false: 0), or nil and a WRONGTYPE error reply
    /// when the string is not a whole number INCRBY / DECRBY would take.
    static constexpr std::string_view lua_permits_of = R"lua(
local function permits_of(v)
    if v == false then return 0 end
    if string.len(v) > 20 or (v ~= '0' and not string.match(v, '^%-?[1-9][0-9]*$')) then
        return nil, redis.error_reply('WRONGTYPE the semaphore key holds "' ..
            string.sub(v, 1, 40) .. '", not a permit count')
    end
    return tonumber(v)
end
)lua";

    /// Takes ARGV[1] permits when that many are free. KEYS[1] the semaphore.
    /// Returns 1 taken, 0 not (nothing written).
    static const script& acquire() {
        static const script s(std::string(lua_permits_of) + R"lua(
local have, bad = permits_of(redis.call('get', KEYS[1]))
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
        static const script s(std::string(lua_permits_of) + R"lua(
local _, bad = permits_of(redis.call('get', KEYS[1]))
if bad then return bad end
local now = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], now)
return now
)lua");
        return s;
    }

    /// Sets the count to ARGV[1] when the semaphore has none yet (no key) and publishes it on
    /// ARGV[2]. Returns 1 set, 0 already set (nothing written).
    static const script& try_set() {
        static const script s(R"lua(
if redis.call('get', KEYS[1]) ~= false then return 0 end
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], ARGV[1])
return 1
)lua");
        return s;
    }

    /// Takes every free permit: the count becomes 0 (a negative count too, as Redisson's
    /// drainPermits does). Returns the count it had (0 with no key, which stays absent).
    static const script& drain() {
        static const script s(std::string(lua_permits_of) + R"lua(
local v = redis.call('get', KEYS[1])
local have, bad = permits_of(v)
if bad then return bad end
if v == false then return 0 end
redis.call('set', KEYS[1], 0)
return have
)lua");
        return s;
    }
};

}  // namespace rlock::detail
