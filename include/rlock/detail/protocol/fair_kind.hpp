// The fair-lock protocol: Redisson's RFairLock layout, so rlock and Redisson waiters share one
// queue. Keys: the lock hash `name` (as reentrant_lock), the FIFO `redisson_lock_queue:{name}`
// (list of holder ids) and `redisson_lock_timeout:{name}` (zset holder id -> deadline, epoch
// ms). A release publishes `0` on the queue head's own channel
// `redisson_lock__channel:{name}:<holder id>`, so exactly the next waiter wakes.
//
// Deadlines follow Redisson's arithmetic, so that one queue serves both libraries' waiters in
// arrival order (finding F1 of the interop suite, docs/comparison.md):
//   - a deadline is chained: a waiter queues with the deadline of the waiter just ahead of it
//     plus its own slot, and the head that takes the lock moves every deadline left by -wait
//     (Redisson's ZINCRBY). rlock's acquisitions do the same with fair_lock_wait_timeout;
//   - stale waiters are evicted from the head only, while the head's deadline is due, as
//     Redisson does; a waiter further back is never evicted, whatever its deadline;
//   - an rlock waiter renews its deadline on every attempt (at least every third of
//     fair_lock_wait_timeout): at least now + one wait per waiter ahead of it, and at least the
//     deadline of the waiter just ahead (the chain), plus its own wait and a heartbeat of
//     margin. Until it is the head at most that many departures shift it, each by one wait
//     (Redisson's: its own wait), so it keeps more than a wait in hand until its next renewal:
//     a live rlock waiter is never evicted, as long as no waiter ahead has a longer wait
//     (Redisson's and rlock's both default to 5 min). A dead one is evicted once it is the
//     head and its deadline is due: a wait + a heartbeat after the later of its last renewal
//     and its turn as the chain reckons it, later by what waiters ahead of it left without
//     shifting it by a whole wait (rlock give-ups, evictions, shorter Redisson waits).
// Where rlock still differs from Redisson, on purpose (each is a reported Redisson failure):
//   - "now" is the server's TIME, one clock for every client (Redisson passes each client's
//     wall clock);
//   - a waiter that gives up leaves both keys at once and wakes the new head if the lock is
//     free (Redisson can leave a failed tryLock queued);
//   - the wait a refused waiter is told is never negative: the holder's TTL, or the time until
//     the head's deadline when the lock is free for an earlier waiter;
//   - queue entries without a deadline are dropped when they reach the head instead of
//     compared (no "attempt to compare nil with number").
// The queue keys carry no TTL, as Redisson's: Redisson's waiters queue (RPUSH, ZADD) without
// touching one, so a TTL that rlock set would expire under a Redisson waiter that queued after
// rlock's last script and erase it from the queue (never woken, its place lost). Dead waiters'
// entries are evicted by the next fair-lock script on the name, of either library.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/protocol/reentrant_kind.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

/// Lua helpers shared by the fair-lock scripts (prepended to their bodies, after lua_checks).
/// evict reads the queue (LINDEX) and the head's deadline (ZSCORE) before it writes, so a key
/// of another type fails it with WRONGTYPE before anything is changed. wake_head_if_gone: a
/// release that found its hold gone, with the hash absent (the lock is free) and a queue,
/// evicts and wakes the head, whose channel permitting.
inline constexpr std::string_view fair_lua_helpers = R"lua(
local function now_ms()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Redisson's eviction rule: waiters leave from the head only, while the head's deadline is due
-- (<= now); a head without a deadline (out of sync, e.g. a half-written entry) is dropped too
-- (Redisson would stop there and hang the queue). A waiter further back is never evicted, whatever
-- its deadline: Redisson's never renew theirs, and its own shift (-wait at each acquisition) can
-- leave a live one's past due. Returns the head left (false if none) and whether it differs from
-- the head before. O(evicted) + O(1), not O(queue).
local function evict(queue, deadlines, now)
    local first = redis.call('lindex', queue, 0)
    local head = first
    while head do
        local due = redis.call('zscore', deadlines, head)
        if due and tonumber(due) > now then break end
        if due then redis.call('zrem', deadlines, head) end
        redis.call('lpop', queue)
        head = redis.call('lindex', queue, 0)
    end
    return head, head ~= first
end
-- Redisson's acquisition step, once the head takes the lock: it leaves the queue and every
-- deadline left moves by -wait, the slot the new holder used (each waiter's deadline holds one
-- slot per waiter ahead of it, see the acquire script).
local function head_leaves(queue, deadlines, wait)
    redis.call('lpop', queue)
    for _, w in ipairs(redis.call('zrange', deadlines, 0, -1)) do
        redis.call('zincrby', deadlines, -wait, w)
    end
end
local function wake(prefix, head)
    if head then redis.call('publish', prefix .. ':' .. head, '0') end
end
local function wake_head_if_gone(hash, queue, deadlines, prefix)
    if redis.call('exists', hash) == 1 or redis.call('exists', queue) == 0 then return end
    local head = evict(queue, deadlines, now_ms())
    if head and not channel_refused(prefix .. ':' .. head) then wake(prefix, head) end
end
)lua";

/// Every fair_lock script may wake a queue head: each checks the channel (channel_refused).
inline std::string with_fair_helpers(std::string_view body) {
    return with_lua_checks(with_channel_check(fair_lua_helpers)) + std::string(body);
}

struct fair_kind : kind_defaults {
    static constexpr bool races = false;  // queued: release wakes the head alone
    static constexpr bool reentrant = true;
    static constexpr bool abandons = true;
    static constexpr std::string_view channel_prefix = "redisson_lock__channel";

    /// Acquire, re-enter, or queue.
    /// KEYS[1] lock hash, KEYS[2] queue, KEYS[3] deadlines, KEYS[4] fencing counter,
    /// KEYS[5] channel prefix; ARGV[1] lease ms, ARGV[2] holder id, ARGV[3] wait timeout ms,
    /// ARGV[4] '1' fencing, ARGV[5] '1' re-entry, ARGV[6] '1' join the queue when refused.
    /// Free lock + (empty queue or this holder at its head) -> taken. Refused -> queued (or its
    /// deadline renewed). Returns {1, count, token} / {0, ms to wait (>= 1, or -1: no expiry)}.
    /// Before the first write (an eviction may be one): the hash's type and this holder's count
    /// (HGET), the fencing counter, and the queue keys' types (evict reads them first).
    static const script& acquire_script() {
        static const script s(with_fair_helpers(R"lua(
local mine = redis.call('hget', KEYS[1], ARGV[2])
if mine and not can_step(mine, 1) then return bad_count(KEYS[1], ARGV[2]) end
local bad, had = counter_if(ARGV[4], KEYS[4])
if bad then return bad end
local now
local head, head_changed = false, false
if redis.call('exists', KEYS[2], KEYS[3]) > 0 then
    local refused = channel_refused(KEYS[5] .. ':' .. ARGV[2])
    if refused then return refused end
    now = now_ms()
    head, head_changed = evict(KEYS[2], KEYS[3], now)
end
local function token()
    if ARGV[4] == '1' then return next_token(KEYS[4], had) end
    return 0
end
if redis.call('exists', KEYS[1]) == 0 then
    if ARGV[5] == '1' then return {0, -2} end
    if head == false or head == ARGV[2] then
        if now then redis.call('zrem', KEYS[3], ARGV[2]) end
        if head then head_leaves(KEYS[2], KEYS[3], tonumber(ARGV[3])) end
        redis.call('hincrby', KEYS[1], ARGV[2], 1)
        redis.call('pexpire', KEYS[1], ARGV[1])
        return {1, 1, token()}
    end
    if head_changed then wake(KEYS[5], head) end
elseif mine then
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, n, token()}
elseif ARGV[5] == '1' then
    return {0, -2}
end
if ARGV[6] == '1' then
    -- Queue, or renew this waiter's deadline (every attempt is its heartbeat): chained as
    -- Redisson chains, to the waiter just ahead, and never less than one slot of `wait` per
    -- waiter ahead from now; plus its own slot and a heartbeat of margin. The departures ahead,
    -- each shifting it by -wait at most, leave it more than a wait in hand at the head.
    now = now or now_ms()
    local wait = tonumber(ARGV[3])
    local ids = redis.call('lrange', KEYS[2], 0, -1)
    local ahead = #ids
    for i, id in ipairs(ids) do
        if id == ARGV[2] then
            ahead = i - 1
            break
        end
    end
    local due = now + ahead * wait
    if ahead > 0 then
        local prev = redis.call('zscore', KEYS[3], ids[ahead])
        if prev then due = math.max(due, tonumber(prev)) end
    end
    due = due + wait + math.max(1, math.floor(wait / 3))
    if redis.call('zadd', KEYS[3], due, ARGV[2]) == 1 then
        redis.call('rpush', KEYS[2], ARGV[2])
    end
end
local ttl = redis.call('pttl', KEYS[1])
if ttl == -2 then
    local head = redis.call('lindex', KEYS[2], 0)
    local due = head and tonumber(redis.call('zscore', KEYS[3], head))
    ttl = due and (due - (now or now_ms())) or 0
end
if ttl ~= -1 and ttl < 1 then ttl = 1 end
return {0, ttl}
)lua"));
        return s;
    }

    /// Leave one level; the last deletes the hash, evicts dead waiters and wakes the queue head
    /// on its own channel. KEYS[1] hash, KEYS[2] queue, KEYS[3] deadlines, KEYS[4] channel
    /// prefix; ARGV[1] holder id. Returns -1 not held (with no hash at all the queue's head is
    /// woken, as Redisson's unlock does: wake_head_if_gone), n > 0 levels left, 0 released.
    /// The last level evicts before it deletes the hash: a queue key of another type then fails
    /// the script before anything is changed.
    static const script& release_script() {
        static const script s(with_fair_helpers(R"lua(
local count = redis.pcall('hget', KEYS[1], ARGV[1])
if read_failed(count) then return count end
if type(count) ~= 'string' then
    wake_head_if_gone(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
    return -1
end
if not can_step(count, -1) then return bad_count(KEYS[1], ARGV[1]) end
if tonumber(count) > 1 then return redis.call('hincrby', KEYS[1], ARGV[1], -1) end
local refused = channel_refused(KEYS[4] .. ':' .. ARGV[1])
if refused then return refused end
local queued = redis.call('exists', KEYS[2]) == 1
local head = queued and evict(KEYS[2], KEYS[3], now_ms())
redis.call('del', KEYS[1])
if queued then wake(KEYS[4], head) end
return 0
)lua"));
        return s;
    }

    /// A final unlock that may pass the hold to a waiter of its own client (queue_pass.hpp):
    /// as release_script, except that when the queue's head (after evicting) is one of
    /// ARGV[4..] (the client's waiters that may be passed a hold) the hold goes to it instead
    /// of being released: its field replaces the holder's, with one level, the hash's expiry
    /// becomes ARGV[2] ms, and it leaves the queue as its own acquisition would take it off
    /// (the deadlines left move by -ARGV[3]). Nothing is published then: the client tells its
    /// waiter. KEYS as the release; ARGV[1] holder id. Returns {-1} not held, {n} (n > 0 levels
    /// left, one released), {0} released, {0, head} passed to head. Everything that can fail is
    /// read first: this holder's count, the channel's ACL, the queue keys' types (evict reads
    /// them before it writes).
    static const script& pass_script() {
        static const script s(with_fair_helpers(R"lua(
local count = redis.pcall('hget', KEYS[1], ARGV[1])
if read_failed(count) then return count end
if type(count) ~= 'string' then
    wake_head_if_gone(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
    return {-1}
end
if not can_step(count, -1) then return bad_count(KEYS[1], ARGV[1]) end
if tonumber(count) > 1 then return {redis.call('hincrby', KEYS[1], ARGV[1], -1)} end
local refused = channel_refused(KEYS[4] .. ':' .. ARGV[1])
if refused then return refused end
if redis.call('exists', KEYS[2]) == 0 then
    redis.call('del', KEYS[1])
    return {0}
end
local now = now_ms()
local head = evict(KEYS[2], KEYS[3], now)
if head then
    for i = 4, #ARGV do
        if ARGV[i] == head then
            redis.call('hdel', KEYS[1], ARGV[1])
            redis.call('hset', KEYS[1], head, 1)
            redis.call('pexpire', KEYS[1], ARGV[2])
            redis.call('zrem', KEYS[3], head)
            head_leaves(KEYS[2], KEYS[3], tonumber(ARGV[3]))
            return {0, head}
        end
    end
end
redis.call('del', KEYS[1])
wake(KEYS[4], head)
return {0}
)lua"));
        return s;
    }

    /// A waiter gives up: out of the queue and the deadlines at once; if that (or an eviction)
    /// changed the head while the lock is free, the new head is woken. Same KEYS/ARGV as the
    /// release. Returns 0. A user whose ACL refuses the channel still leaves the queue (a
    /// waiter that gives up leaves nothing behind): only the wake-up is not sent, and the new
    /// head then tries at its heartbeat.
    static const script& leave_script() {
        static const script s(with_fair_helpers(R"lua(
local first = redis.call('lindex', KEYS[2], 0)
local refused = channel_refused(KEYS[4] .. ':' .. ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('lrem', KEYS[2], 0, ARGV[1])
local head = evict(KEYS[2], KEYS[3], now_ms())
if not refused and head and head ~= first and redis.call('exists', KEYS[1]) == 0 then
    wake(KEYS[4], head)
end
return 0
)lua"));
        return s;
    }

    /// Deletes the lock whoever holds it and wakes the queue head. Same KEYS as the release.
    /// Evicts first, so that queue keys of another type fail it with nothing deleted.
    static const script& force_unlock_script() {
        static const script s(with_fair_helpers(std::string(lua_not_a_lock) + R"lua(
local bad = not_a_lock(KEYS[1], 'hash')
if bad then return bad end
local refused = channel_refused(KEYS[4] .. ':' .. (redis.call('lindex', KEYS[2], 0) or ''))
if refused then return refused end
local head = evict(KEYS[2], KEYS[3], now_ms())
local held = redis.call('del', KEYS[1])
wake(KEYS[4], head)
return held
)lua"));
        return s;
    }

    static inline const kind_info info{"fair_lock", &reentrant_kind::renew_script};

    static std::string wait_channel(const lock_keys& k, std::string_view holder) {
        std::string c = k.channel;
        c += ':';
        c += holder;
        return c;
    }

    static std::chrono::milliseconds heartbeat(const lock_options& o) {
        return std::max(std::chrono::milliseconds(1), o.fair_lock_wait_timeout / 3);
    }

    static acquire_result acquire(const connection& c, const lock_keys& k, const attempt_spec& a,
                                  std::string_view server);

    /// A fair lock's release wakes its queue's head alone, and a newcomer queues behind it:
    /// nothing for the releaser to hold back for (no `woken`).
    static long long release(const connection& c, const lock_keys& k, std::string_view holder,
                             std::string_view server, long long* /*woken*/ = nullptr);

    static void abandon(const connection& c, const lock_keys& k, std::string_view holder,
                        std::string_view server);
    /// Leaves the queue, then releases.
    static std::vector<script_call> undo_calls(const lock_keys& k, std::string_view holder) {
        const std::initializer_list<std::string_view> keys{k.name, k.queue, k.timeouts, k.channel};
        std::vector<script_call> out;
        out.emplace_back(leave_script(), keys, std::initializer_list<std::string_view>{holder});
        out.emplace_back(release_script(), keys, std::initializer_list<std::string_view>{holder});
        return out;
    }

    static constexpr bool passes_in_queue = true;
    /// What release_or_pass did: the levels left (-1: not held), and to whom the hold passed
    /// (empty: released, or levels left).
    struct pass_result {
        long long left = 0;
        std::string passed_to;
    };
    /// The final unlock by `holder`, passing the hold to the queue's head with `lease` ms when it
    /// is one of `candidates` (pass_script); `wait`: fair_lock_wait_timeout in ms.
    static pass_result release_or_pass(const connection& c, const lock_keys& k,
                                       std::string_view holder,
                                       const std::vector<std::string>& candidates,
                                       std::string_view lease, std::string_view wait,
                                       std::string_view server);

    static bool held(const connection& c, const lock_keys& k, std::string_view holder,
                     std::string_view server) {
        return reentrant_kind::held(c, k, holder, server);
    }

    static bool force_unlock(const connection& c, const lock_keys& k, std::string_view server);
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL acquire_result fair_kind::acquire(const connection& c, const lock_keys& k,
                                             const attempt_spec& a, std::string_view server) {
    script_call call(acquire_script(), {k.name, k.queue, k.timeouts, k.fencing, k.channel},
                     {a.lease, a.value, a.wait_timeout, a.fencing ? "1" : "0",
                      a.reentry ? "1" : "0", a.may_queue ? "1" : "0"});
    return reentrant_kind::parse_acquire(run_script(c, call, k.name, server).get(), k.name, server);
}

RLOCK_DECL long long fair_kind::release(const connection& c, const lock_keys& k,
                                        std::string_view holder, std::string_view server,
                                        long long* /*woken*/) {
    return eval_integer(c, release_script(), {k.name, k.queue, k.timeouts, k.channel}, {holder},
                        k.name, server);
}

RLOCK_DECL fair_kind::pass_result fair_kind::release_or_pass(
    const connection& c, const lock_keys& k, std::string_view holder,
    const std::vector<std::string>& candidates, std::string_view lease, std::string_view wait,
    std::string_view server) {
    script_call call;
    call.reserve(3 + 4 + 3 + candidates.size());
    call.start(pass_script(), 4);
    for (std::string_view part : {std::string_view(k.name), std::string_view(k.queue),
                                  std::string_view(k.timeouts), std::string_view(k.channel), holder,
                                  lease, wait}) {
        call.push(part);
    }
    for (const std::string& id : candidates) call.push(id);
    const reply_ptr r = run_script(c, call, k.name, server);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        throw error(errc::protocol_error, k.name, server, "unexpected reply from the release script");
    }
    pass_result out;
    out.left = r->element[0]->integer;
    if (r->elements > 1) out.passed_to = std::string(reply_text(r->element[1]));
    return out;
}

RLOCK_DECL void fair_kind::abandon(const connection& c, const lock_keys& k, std::string_view holder,
                                   std::string_view server) {
    script_call call(leave_script(), {k.name, k.queue, k.timeouts, k.channel}, {holder});
    run_script(c, call, k.name, server);
}

RLOCK_DECL bool fair_kind::force_unlock(const connection& c, const lock_keys& k,
                                        std::string_view server) {
    return eval_integer(c, force_unlock_script(), {k.name, k.queue, k.timeouts, k.channel}, {},
                        k.name, server) == 1;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
