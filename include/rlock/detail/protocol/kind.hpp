// What a lock kind is: the contract a Kind supplies to basic_lock<Kind> (its keys, its scripts,
// its hooks), the defaults it may keep (kind_defaults), and check_kind<Kind>(), which names at
// compile time what a Kind lacks. Each kind's protocol is in its own header (mutex_kind.hpp,
// reentrant_kind.hpp, read_write_kind.hpp, fair_kind.hpp); docs/design.md, "Kind hooks",
// explains each member.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

/// A holder id as Redisson writes one: "<client id>:<thread number>", the field of a
/// reentrant_lock's hash and the start of a read/write hold's.
RLOCK_DECL std::string holder_id(std::string_view client_id, std::uint64_t thread);

/// The keys and channel of one lock.
struct lock_keys {
    std::string name;      // the lock key itself
    std::string channel;   // where unlocks are published (fair_lock: the prefix of each waiter's)
    std::string fencing;   // redisson_lock_token:{name}     (each: prefixed_key's rule for
    std::string queue;     // redisson_lock_queue:{name}      names that have a '{' of their
    std::string timeouts;  // redisson_lock_timeout:{name}    own)
};

/// The keys of the lock `name` of a kind whose unlocks go to `channel_prefix:{name}`. Throws
/// `error` (invalid_argument, naming `server`) for an empty name, and in a Redis Cluster
/// (`cluster`) for a name whose keys would land in different slots.
RLOCK_DECL lock_keys lock_keys_for(std::string_view channel_prefix, std::string name, bool cluster,
                                   std::string_view server);

/// What one acquire attempt asks for.
struct attempt_spec {
    std::string_view value;  // token or holder id (read_write_lock's write side: "<holder>:write")
    std::string_view lease;  // ms, decimal
    bool fencing = false;    // INCR the fencing counter on success
    bool want_ttl = false;   // the caller will wait: report the holder's TTL when refused
    bool reentry = false;    // this thread holds it already: must not create a hold that is gone
    bool may_queue = false;  // fair_lock: join the queue when refused
    std::string_view wait_timeout;  // fair_lock: ms a queued waiter may go silent before eviction
    bool scripts_allowed = false;  // a script has run on this client (client_core): until
                                   // then the mutex acquires by script even without fencing
};

/// What one acquire attempt said.
struct acquire_result {
    bool acquired = false;
    long long ttl = -2;        // when refused: the holder's remaining ms, -1 no expiry, -2 unknown
    std::uint64_t count = 1;   // reentry depth after the attempt (reentrant kinds)
    std::uint64_t fencing = 0;
    // When refused and the caller will wait: whether the holder's release wakes this waiter by
    // a message (false: a mutex holder of another library — redis-py, node-redlock — which
    // deletes the key and publishes nothing), and the holder's value when the kind reads it.
    bool holder_publishes = true;
    std::string holder;
};

/// Deletes the key whoever holds it and, if it existed, publishes `0` on its channel.
/// KEYS[1] lock key; ARGV[1] channel (not a key: in a cluster a declared key that does not
/// exist makes a migrating slot refuse the script); ARGV[2] 'string' (mutex) or 'hash'
/// (reentrant_lock): a key of another type is refused (not_a_lock), not deleted.
/// Returns 1 when a key was deleted, else 0.
inline const script& force_unlock_script() {
    static const script s(std::string(lua_not_a_lock) + with_channel_check(R"lua(
local bad = not_a_lock(KEYS[1], ARGV[2])
if bad then return bad end
local refused = channel_refused(ARGV[1])
if refused then return refused end
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', ARGV[1], '0')
    return 1
end
return 0
)lua"));
    return s;
}

/// The text of a batch renewal script (the watchdog's, one per kind): KEYS[i] lock keys;
/// ARGV[1] lease ms, ARGV[i+1] the value that holds KEYS[i]. `read` is a redis.pcall that reads
/// KEYS[i] (its answer is `got`), `held` a Lua condition on `got`, true when ARGV[i + 1] still
/// holds KEYS[i]; `extend` the statement that renews KEYS[i]. Returns one reply per key: 1
/// renewed, 0 gone or someone else's (a key of another type among them: a renewal never creates
/// a key), or the error that refused the read (an ACL's): that hold's owner is told that
/// error, not that the lock is lost, and the other keys of the batch are renewed all the same.
/// A lease of "0" only checks (the verification of leased holds, loss_watch.hpp): the same
/// replies, nothing written. Every kind's renewal script follows this contract.
RLOCK_DECL std::string batch_renew_lua(std::string_view read, std::string_view held, std::string_view extend);

/// An acquire script call: KEYS[1] the lock key, KEYS[2] the fencing counter only when fencing
/// is on (in a cluster a declared key that does not exist makes a migrating slot refuse the
/// script with TRYAGAIN), then `args`.
RLOCK_DECL script_call acquire_call(const script& s, const lock_keys& k, bool fencing,
                                std::initializer_list<std::string_view> args);

/// Reads a release script's answer: an integer (-1 not held, or the levels left), or, from a
/// release that deleted the lock and published, {0, subscribers reached}. False for any other
/// shape; `woken` is 0 unless the answer carried a count.
RLOCK_DECL bool read_release(const redisReply* r, long long& left, long long& woken) noexcept;

/// Kind hooks with their usual meaning; a Kind derives from this and hides what it changes.
/// One run of `release_script`, for the kinds whose release takes KEYS[1] the lock, ARGV[1] the
/// holder's value and ARGV[2] the channel (mutex, reentrant_lock, both sides of
/// read_write_lock). Returns what the script does: -1 not held, else the levels left. A
/// release that published answers {0, subscribers reached}: that count goes to `woken` (0 when
/// it did not publish), so that a releaser knows it woke someone (client_core::note_woken).
RLOCK_DECL long long release_by(const script& release_script, const connection& c, const lock_keys& k,
                            std::string_view value, std::string_view server, long long* woken = nullptr);

struct kind_defaults {
    /// multi_lock's one-script path (multi_scripts.hpp) takes and releases a part of this kind
    /// by its own Lua step, named by this code ('m' mutex, 'r' reentrant_lock); 0: it has none,
    /// and a multi_lock with such a part takes the parts one by one.
    static constexpr char multi_code = 0;
    /// A hold of this other kind, of the same name and owner, makes a fresh (not re-entrant)
    /// acquisition would_deadlock, for `refused_while_holding_why` (read_write_lock: a reader
    /// asking for the write side would wait for itself for ever). Null: none.
    static const kind_info* refused_while_holding() noexcept { return nullptr; }
    static constexpr const char* refused_while_holding_why = "";
    /// The channel this waiter listens on.
    static std::string wait_channel(const lock_keys& k, std::string_view /*value*/) {
        return k.channel;
    }
    /// Undoes what a refused attempt left behind when the waiter gives up (fair_lock's queue).
    static void abandon(const connection&, const lock_keys&, std::string_view /*value*/,
                        std::string_view /*server*/) {}
    /// What undoes an acquire attempt whose reply never came, as script calls sent after it on
    /// its own connection without reading their replies (lock_site::attempt): the kind's
    /// release with the same value (and fair_lock's leave first). Empty: not sent that way.
    static std::vector<script_call> undo_calls(const lock_keys&, std::string_view /*value*/) { return {}; }
    static constexpr bool abandons = false;
    /// Redis Cluster: the kind's scripts touch only keys they declare, so they may follow an
    /// ASK to a slot's new node before all of the lock's keys are there (false:
    /// read_write_lock, whose hold keys are not declared, waits for the migration to end).
    static constexpr bool follows_ask = true;
    /// Waiters that race for a released lock yield to older ones (race_pacing, wait_pacing.hpp);
    /// false for a kind whose waiters are queued in Redis (fair_lock), which orders them itself.
    static constexpr bool races = true;
    /// Holders share the lock (read_write_lock's read side): when one asynchronous waiter of a
    /// client gets it, the next may too (async_lock.hpp).
    static constexpr bool shared = false;
    /// A hold may pass from one owner of this client to the next without a round trip (local
    /// hand-off, local_gate.hpp): true where the value in Redis names no owner (the mutex's
    /// random token). A kind whose value names the holding thread (Redisson's hash fields)
    /// would need a write per pass.
    static constexpr bool hands_off = false;
    /// A final unlock may pass the hold, in its own script, to the queue's next waiter when that
    /// waiter is a thread of this client (fair_lock; queue_pass.hpp): release_or_pass.
    static constexpr bool passes_in_queue = false;
    /// Longest single wait: a queued fair waiter must refresh its place (0: no limit).
    static std::chrono::milliseconds heartbeat(const lock_options&) {
        return std::chrono::milliseconds(0);
    }
    /// Deletes the lock whoever holds it and wakes its waiters; true when it was held. The
    /// lock is a hash here (reentrant_lock's layout); mutex_kind hides this for its string.
    static bool force_unlock(const connection& c, const lock_keys& k, std::string_view server);
    /// The value stored for this thread's hold, on the client whose id is `client_id`.
    static std::string value_for(std::string_view client_id, std::uint64_t thread, bool reentrant) {
        return reentrant ? holder_id(client_id, thread) : random_token();
    }
};


// The type of a Kind member's use, or `missing` when the Kind has no such member: lets
// check_kind name what is missing in its own words instead of a compiler's lookup error.
struct missing {};
template <template <class> class Use, class K, class = void>
struct kind_member {
    using type = missing;
};
template <template <class> class Use, class K>
struct kind_member<Use, K, std::void_t<Use<K>>> {
    using type = Use<K>;
};
template <template <class> class Use, class K>
using kind_member_t = typename kind_member<Use, K>::type;

template <class K>
using kind_reentrant = std::remove_cv_t<decltype(K::reentrant)>;
template <class K>
using kind_channel_prefix = std::remove_cv_t<decltype(K::channel_prefix)>;
template <class K>
using kind_info_of = std::remove_cv_t<decltype(K::info)>;
template <class K>
using kind_acquire = decltype(K::acquire(std::declval<const connection&>(), std::declval<const lock_keys&>(),
                                         std::declval<const attempt_spec&>(), std::string_view()));
template <class K>
using kind_release = decltype(K::release(std::declval<const connection&>(), std::declval<const lock_keys&>(),
                                         std::string_view(), std::string_view()));
template <class K>
using kind_held = decltype(K::held(std::declval<const connection&>(), std::declval<const lock_keys&>(),
                                   std::string_view(), std::string_view()));

/// Names what `Kind` lacks of the contract basic_lock<Kind> relies on; true when nothing.
/// Used as `static_assert(check_kind<Kind>())` in basic_lock.
template <class Kind>
constexpr bool check_kind() {
    static_assert(std::is_base_of_v<kind_defaults, Kind>,
                  "a lock Kind derives from kind_defaults (and hides the hooks it changes)");
    static_assert(std::is_same_v<kind_member_t<kind_reentrant, Kind>, bool>,
                  "a lock Kind needs `static constexpr bool reentrant`");
    static_assert(std::is_same_v<kind_member_t<kind_channel_prefix, Kind>, std::string_view>,
                  "a lock Kind needs `static constexpr std::string_view channel_prefix`");
    static_assert(std::is_same_v<kind_member_t<kind_info_of, Kind>, kind_info>,
                  "a lock Kind needs `static inline const kind_info info` (name, renew script)");
    static_assert(std::is_same_v<kind_member_t<kind_acquire, Kind>, acquire_result>,
                  "a lock Kind needs `static acquire_result acquire(const connection&, const "
                  "lock_keys&, const attempt_spec&, std::string_view server)`: one attempt");
    static_assert(std::is_same_v<kind_member_t<kind_release, Kind>, long long>,
                  "a lock Kind needs `static long long release(const connection&, const lock_keys&, "
                  "std::string_view value, std::string_view server)`: -1 not held, else levels left");
    static_assert(std::is_same_v<kind_member_t<kind_held, Kind>, bool>,
                  "a lock Kind needs `static bool held(const connection&, const lock_keys&, "
                  "std::string_view value, std::string_view server)`");
    return true;
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string holder_id(std::string_view client_id, std::uint64_t thread) {
    std::string h(client_id);
    h += ':';
    h += std::to_string(thread);
    return h;
}

RLOCK_DECL std::string batch_renew_lua(std::string_view read, std::string_view held,
                                       std::string_view extend) {
    std::string body = "local out = {}\nfor i = 1, #KEYS do\n    local got = ";
    body.append(read).append("\n    if read_failed(got) then\n        out[i] = got\n    elseif ");
    body.append(held).append(" then\n        if ARGV[1] ~= '0' then\n            ").append(extend);
    body.append(
        "\n        end\n        out[i] = 1\n    else\n        out[i] = 0\n    end\nend\nreturn "
        "out\n");
    return with_read_failed(body);
}

RLOCK_DECL lock_keys lock_keys_for(std::string_view channel_prefix, std::string name, bool cluster,
                                   std::string_view server) {
    if (name.empty()) throw error(errc::invalid_argument, "", server, "lock name is empty");
    lock_keys k;
    k.channel = prefixed_key(channel_prefix, name);
    k.fencing = prefixed_key("redisson_lock_token", name);
    k.queue = prefixed_key("redisson_lock_queue", name);
    k.timeouts = prefixed_key("redisson_lock_timeout", name);
    if (cluster && key_slot(name) != key_slot(k.channel)) {
        // "a{b" or "a{}b": no hash tag, so `prefix:name` hashes apart from `name`.
        throw error(errc::invalid_argument, name, server,
                    "in a cluster a lock name with '{' needs a hash tag ({tag} with a non-empty "
                    "tag), or its keys land in different slots");
    }
    k.name = std::move(name);
    return k;
}

RLOCK_DECL script_call acquire_call(const script& s, const lock_keys& k, bool fencing,
                                    std::initializer_list<std::string_view> args) {
    script_call call;
    call.reserve(4 + args.size());
    call.start(s, fencing ? 2 : 1);
    call.push(k.name);
    if (fencing) call.push(k.fencing);
    for (std::string_view a : args) call.push(a);
    return call;
}

RLOCK_DECL bool read_release(const redisReply* r, long long& left, long long& woken) noexcept {
    woken = 0;
    if (r && r->type == REDIS_REPLY_INTEGER) {
        left = r->integer;
        return true;
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        return false;
    }
    left = r->element[0]->integer;
    woken = r->element[1]->integer;
    return true;
}

RLOCK_DECL long long release_by(const script& release_script, const connection& c,
                                const lock_keys& k, std::string_view value, std::string_view server,
                                long long* woken) {
    script_call call(release_script, {k.name}, {value, k.channel});
    reply_ptr r = run_script(c, call, k.name, server);
    long long left = 0, reached = 0;
    if (!read_release(r.get(), left, reached)) {
        throw error(errc::protocol_error, k.name, server,
                    "unexpected reply from the release script");
    }
    if (woken) *woken = reached;
    return left;
}

RLOCK_DECL bool kind_defaults::force_unlock(const connection& c, const lock_keys& k,
                                            std::string_view server) {
    return eval_integer(c, force_unlock_script(), {k.name}, {k.channel, "hash"}, k.name, server) ==
           1;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
