// Reading a name's layout (rlock::inspect): one read-only script that returns every key any kind
// of lock, semaphore or latch keeps for the name, and the C++ that tells the kind from what it
// returned. The layouts are the kinds' own (docs/design.md, "Keys in Redis"); nothing here
// writes, so nothing here needs the checks before a first write (lua_checks.hpp).
//
// Kind detection, in this order (the first that applies):
//   1. `{name}:timeout` is a sorted set                 -> permit_expirable (the count at `name`,
//      if any, must be an integer string)
//   2. `redisson_lock_queue:{name}` or `redisson_lock_timeout:{name}` exists -> fair (a hash at
//      `name`, if any, must be a lock hash without `mode`)
//   3. `name` is a hash with a `mode` field              -> read_write (`mode` read or write)
//   4. `name` is a hash                                  -> reentrant (a fair_lock held with
//      nobody queued has only this hash: the same layout)
//   5. `name` is a string that is an integer as Redis writes one (what INCRBY takes) and has no
//      TTL                                               -> count (semaphore or count_down_latch)
//   6. `name` is any other string                        -> token
//   7. none of them exists                               -> not_found
// A lock's token is random (rlock's starts with `rlock:`, redis-py's and node-redlock's are hex)
// and every lock kind sets a TTL on it, while a semaphore's and a latch's count never has one.
// So only a token of a lock taken without a lease by a foreign client (redis-py's `timeout=None`)
// whose random value happens to be all digits reads as a count.
// Any other type at one of these keys, a hash whose values are not counts, a `mode` that is
// neither `read` nor `write`: errc::wrong_type naming the key and the server. A fencing counter
// that is not an integer is left out (fencing_counter empty) rather than refused: it does not
// stop the lock from being read.
#pragma once

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/read_write_kind.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/errors.hpp"
#include "rlock/lock_info.hpp"

namespace rlock::detail {

/// Every key of one name that the inspect script reads, in its KEYS order.
struct inspect_keys {
    std::string name, queue, deadlines, permits, counter;

    explicit inspect_keys(std::string_view n)
        : name(n),
          queue(prefixed_key("redisson_lock_queue", n)),
          deadlines(prefixed_key("redisson_lock_timeout", n)),
          permits(n.find('{') != std::string_view::npos ? std::string(n) + ":timeout"
                                                        : "{" + std::string(n) + "}:timeout"),
          counter(prefixed_key("redisson_lock_token", n)) {}
};

/// Redisson's score for a permit taken without a lease (never ends).
inline constexpr long long permanent_permit_score = 922337203685477;

/// KEYS  [1] name  [2] redisson_lock_queue:{name}  [3] redisson_lock_timeout:{name}
///       [4] {name}:timeout  [5] redisson_lock_token:{name}
/// ARGV  none
/// Reads, besides, the read hold keys `{name}:<holder>:rwlock_timeout:<n>` of every reader of a
/// hash with `mode` (not declared: their names are in the hash, as for the read-write scripts;
/// the same slot by the hash tag). At most 1000 per reader are read.
/// Returns {now ms (server TIME), TYPE name, PTTL name, GET name or nil, HGETALL name or {},
///          {reader field, {PTTL of its hold keys 1..n}}... or {}, TYPE queue, LRANGE queue or {},
///          TYPE deadlines, ZRANGE deadlines WITHSCORES or {}, TYPE permits,
///          ZRANGE permits WITHSCORES or {}, TYPE counter, GET counter or nil}
/// Writes nothing.
inline const script& inspect_script() {
    static const script s(std::string(lua_reader_hold_key) + R"lua(
local function type_of(k) return redis.call('type', k)['ok'] end
local t = redis.call('time')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local main = type_of(KEYS[1])
out[2] = main
out[3] = redis.call('pttl', KEYS[1])
out[4] = false
out[5] = {}
out[6] = {}
if main == 'string' then
    out[4] = redis.call('get', KEYS[1])
elseif main == 'hash' then
    local all = redis.call('hgetall', KEYS[1])
    out[5] = all
    if redis.call('hexists', KEYS[1], 'mode') == 1 then
        for i = 1, #all, 2 do
            local f = all[i]
            if f ~= 'mode' and string.sub(f, -6) ~= ':write' then
                local ttls = {}
                for n = 1, math.min(tonumber(all[i + 1]) or 0, 1000) do
                    ttls[n] = redis.call('pttl', hold_key(KEYS[1], f, n))
                end
                table.insert(out[6], f)
                table.insert(out[6], ttls)
            end
        end
    end
end
local function read(k, as, f)
    local ty = type_of(k)
    table.insert(out, ty)
    if ty == as then table.insert(out, f(k)) else table.insert(out, {}) end
end
read(KEYS[2], 'list', function(k) return redis.call('lrange', k, 0, -1) end)
read(KEYS[3], 'zset', function(k) return redis.call('zrange', k, 0, -1, 'WITHSCORES') end)
read(KEYS[4], 'zset', function(k) return redis.call('zrange', k, 0, -1, 'WITHSCORES') end)
local ct = type_of(KEYS[5])
table.insert(out, ct)
if ct == 'string' then table.insert(out, redis.call('get', KEYS[5])) else table.insert(out, false) end
return out
)lua");
    return s;
}

/// Turns the inspect script's reply into a lock_info (module comment: the rules). `client_id`
/// marks the inspecting client's own holders.
class inspect_reader {
public:
    inspect_reader(const inspect_keys& keys, std::string_view server, std::string_view client_id)
        : keys_(keys), server_(server), client_id_(client_id) {}

    lock_info read(const redisReply* r) const;

private:
    [[noreturn]] void malformed() const {
        throw error(errc::protocol_error, keys_.name, server_, "inspect: a reply rlock cannot read");
    }
    [[noreturn]] void wrong(std::string_view key, const std::string& what) const;
    void expect_type(std::string_view key, std::string_view type, std::initializer_list<std::string_view> ok) const;
    long long integer(const redisReply* r) const {
        if (!r || r->type != REDIS_REPLY_INTEGER) malformed();
        return r->integer;
    }
    std::string_view text(const redisReply* r) const;
    const redisReply* array(const redisReply* r) const {
        if (!r || r->type != REDIS_REPLY_ARRAY) malformed();
        return r;
    }
    /// PTTL's answer as a remaining_ttl: -1 (no expiry) and -2 (no key) have no value.
    static remaining_ttl ttl_of(long long pttl) {
        if (pttl < 0) return std::nullopt;
        return std::chrono::milliseconds(pttl);
    }
    long long count_at(std::string_view v) const;
    holder_origin origin_of(std::string_view id) const;

    /// A lock hash: holder id -> count, and for a read/write lock `mode`, `<id>:write` and the
    /// readers' hold key TTLs (`reads`). Sets the kind to read_write when `mode` is there.
    void read_hash(const redisReply* all, const redisReply* reads, lock_info& info) const;

    /// A reader's lease: the longest of its live hold keys (none: zero), no value when one of
    /// them has no expiry.
    void read_holds(const std::map<std::string_view, const redisReply*>& hold_ttls, std::string_view field,
                    lock_holder& h) const;

    /// A sorted set's score as a time in ms: none when it is not a number, or not a finite one
    /// within ±2^53 (no time rlock or Redisson writes is outside; llround and the subtraction
    /// of now stay exact and in range).
    static std::optional<double> score(std::string_view s);

    void read_queue(const redisReply* queue, const redisReply* deadlines, long long now, lock_info& info) const;

    void read_permits(const redisReply* permits, long long now, lock_info& info) const;

    const inspect_keys& keys_;
    std::string_view server_;
    std::string_view client_id_;
};

/// The names a key found by SCAN may belong to: the key itself, or the lock whose queue,
/// deadlines or permit set it is (prefixed_key and the `{name}:timeout` rule read backwards).
/// None for a read hold key and a fencing counter: the name they belong to has keys of its own
/// whenever it is held or waited for.
RLOCK_DECL std::vector<std::string> names_of_key(std::string_view key);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL lock_info inspect_reader::read(const redisReply* r) const {
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 14) malformed();
    const redisReply* const* e = r->element;
    const long long now = integer(e[0]);
    lock_info info;
    info.name = keys_.name;
    info.server = std::string(server_);
    const std::string_view main = text(e[1]);
    info.ttl = ttl_of(integer(e[2]));
    const std::string_view queue_type = text(e[6]), deadlines_type = text(e[8]),
                           permits_type = text(e[10]), counter_type = text(e[12]);
    expect_type(keys_.name, main, {"string", "hash"});
    expect_type(keys_.queue, queue_type, {"list"});
    expect_type(keys_.deadlines, deadlines_type, {"zset"});
    expect_type(keys_.permits, permits_type, {"zset"});
    if (counter_type == "string") {
        long long c = 0;
        if (parse_count(text(e[13]), c)) info.fencing_counter = c;
    }

    if (permits_type == "zset") {
        info.kind = lock_kind::permit_expirable;
        info.count = 0;
        if (main == "hash") wrong(keys_.name, "is a hash beside the permit set " + keys_.permits);
        if (main == "string") info.count = count_at(text(e[3]));
        read_permits(e[11], now, info);
        return info;
    }
    if (queue_type == "list" || deadlines_type == "zset") {
        info.kind = lock_kind::fair;
        if (main == "string") wrong(keys_.name, "is a string beside the fair queue " + keys_.queue);
        if (main == "hash") read_hash(e[4], e[5], info);
        if (info.kind != lock_kind::fair) {
            wrong(keys_.name, "is a read/write lock beside the fair queue " + keys_.queue);
        }
        read_queue(e[7], e[9], now, info);
        return info;
    }
    if (main == "hash") {
        info.kind = lock_kind::reentrant;
        read_hash(e[4], e[5], info);
        return info;
    }
    if (main == "string") {
        const std::string_view value = text(e[3]);
        long long n = 0;
        if (parse_count(value, n)) {
            info.kind = lock_kind::count;
            info.count = n;
            return info;
        }
        info.kind = lock_kind::token;
        lock_holder h;
        h.id = std::string(value);
        h.lease = info.ttl;
        h.origin = value.substr(0, 6) == "rlock:" ? holder_origin::rlock : holder_origin::unknown;
        info.holders.push_back(std::move(h));
    }
    return info;
}

RLOCK_DECL void inspect_reader::wrong(std::string_view key, const std::string& what) const {
    std::string m = "key ";
    m.append(key).append(" ").append(what).append(": not a layout of any rlock or Redisson lock");
    throw error(errc::wrong_type, keys_.name, server_, m);
}

RLOCK_DECL void inspect_reader::expect_type(std::string_view key, std::string_view type,
                                            std::initializer_list<std::string_view> ok) const {
    if (type == "none") return;
    for (std::string_view t : ok) {
        if (type == t) return;
    }
    wrong(key, "is a " + std::string(type));
}

RLOCK_DECL std::string_view inspect_reader::text(const redisReply* r) const {
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS &&
               r->type != REDIS_REPLY_NIL)) {
        malformed();
    }
    return reply_text(r);
}

RLOCK_DECL long long inspect_reader::count_at(std::string_view v) const {
    long long n = 0;
    if (!parse_count(v, n))
        wrong(keys_.name, "holds \"" + std::string(v.substr(0, 40)) + "\", not a count");
    return n;
}

RLOCK_DECL holder_origin inspect_reader::origin_of(std::string_view id) const {
    if (!client_id_.empty() && id.size() > client_id_.size() &&
        id.substr(0, client_id_.size()) == client_id_ && id[client_id_.size()] == ':') {
        return holder_origin::this_client;
    }
    return holder_origin::unknown;
}

RLOCK_DECL void inspect_reader::read_hash(const redisReply* all, const redisReply* reads,
                                          lock_info& info) const {
    array(all);
    array(reads);
    std::map<std::string_view, const redisReply*> hold_ttls;
    for (std::size_t i = 0; i + 1 < reads->elements; i += 2) {
        hold_ttls[text(reads->element[i])] = array(reads->element[i + 1]);
    }
    for (std::size_t i = 0; i + 1 < all->elements; i += 2) {
        if (text(all->element[i]) == "mode") {
            info.kind = lock_kind::read_write;
            info.mode = std::string(text(all->element[i + 1]));
            if (info.mode != "read" && info.mode != "write") {
                wrong(keys_.name, "has mode \"" + info.mode.substr(0, 40) + "\"");
            }
        }
    }
    for (std::size_t i = 0; i + 1 < all->elements; i += 2) {
        const std::string_view field = text(all->element[i]);
        if (field == "mode") continue;
        lock_holder h;
        const std::string_view value = text(all->element[i + 1]);
        long long n = 0;
        // A level count: every lock writes 1 or more (a hold of no level is deleted).
        if (!parse_count(value, n) || n < 1) {
            wrong(keys_.name,
                  "is a hash whose field " + std::string(field.substr(0, 80)) + " is not a count");
        }
        h.count = n;
        h.id = std::string(field);
        h.lease = info.ttl;
        constexpr std::string_view write_suffix = ":write";
        if (info.kind == lock_kind::read_write) {
            if (field.size() > write_suffix.size() &&
                field.substr(field.size() - write_suffix.size()) == write_suffix) {
                h.role = holder_role::writer;
                h.id.resize(h.id.size() - write_suffix.size());
            } else {
                h.role = holder_role::reader;
                read_holds(hold_ttls, field, h);
            }
        }
        h.origin = origin_of(h.id);
        info.holders.push_back(std::move(h));
    }
}

RLOCK_DECL void inspect_reader::read_holds(
    const std::map<std::string_view, const redisReply*>& hold_ttls, std::string_view field,
    lock_holder& h) const {
    h.lease = std::chrono::milliseconds(0);
    h.live_holds = 0;
    const auto it = hold_ttls.find(field);
    if (it == hold_ttls.end()) return;
    bool forever = false;
    for (std::size_t k = 0; k < it->second->elements; ++k) {
        const long long t = integer(it->second->element[k]);
        if (t == -2) continue;
        ++h.live_holds;
        if (t == -1) forever = true;
        if (t > h.lease->count()) h.lease = std::chrono::milliseconds(t);
    }
    if (forever) h.lease.reset();
}

RLOCK_DECL std::optional<double> inspect_reader::score(std::string_view s) {
    const std::string copy(s);
    char* end = nullptr;
    const double d = std::strtod(copy.c_str(), &end);
    constexpr double limit = 9007199254740992.0;  // 2^53
    if (end == copy.c_str() || *end != '\0' || !std::isfinite(d) || d > limit || d < -limit) {
        return std::nullopt;
    }
    return d;
}

RLOCK_DECL void inspect_reader::read_queue(const redisReply* queue, const redisReply* deadlines,
                                           long long now, lock_info& info) const {
    array(queue);
    array(deadlines);
    std::map<std::string_view, double> due;
    for (std::size_t i = 0; i + 1 < deadlines->elements; i += 2) {
        if (auto d = score(text(deadlines->element[i + 1]))) due[text(deadlines->element[i])] = *d;
    }
    for (std::size_t i = 0; i < queue->elements; ++i) {
        lock_waiter w;
        w.id = std::string(text(queue->element[i]));
        w.origin = origin_of(w.id);
        const auto it = due.find(w.id);
        if (it != due.end()) {
            w.deadline_in = std::chrono::milliseconds(std::llround(it->second) - now);
        }
        info.waiters.push_back(std::move(w));
    }
}

RLOCK_DECL void inspect_reader::read_permits(const redisReply* permits, long long now,
                                             lock_info& info) const {
    array(permits);
    static constexpr char hex[] = "0123456789abcdef";
    for (std::size_t i = 0; i + 1 < permits->elements; i += 2) {
        permit_info p;
        for (const char c : text(permits->element[i])) {
            const auto b = static_cast<unsigned char>(c);
            p.id += hex[b >> 4];
            p.id += hex[b & 15];
        }
        const std::string_view written = text(permits->element[i + 1]);
        const std::optional<double> s = score(written);
        if (!s) {
            wrong(keys_.permits, "holds the score " + std::string(written.substr(0, 40)) +
                                     ", not the end of a permit's lease");
        }
        if (*s < static_cast<double>(permanent_permit_score)) {
            p.lease = std::chrono::milliseconds(std::llround(*s) - now);
        }
        info.permits.push_back(std::move(p));
    }
}

// Whether `key` has a read hold key's shape, `<prefix>:<id>:<thread>:rwlock_timeout:<n>` (a
// holder id is `<client id>:<thread number>`): a key that merely contains the words is a name.
inline bool is_read_hold_key(std::string_view key) {
    constexpr std::string_view mark = ":rwlock_timeout:";
    const auto digits = [](std::string_view s) {
        return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
    };
    const std::size_t at = key.rfind(mark);
    if (at == std::string_view::npos || !digits(key.substr(at + mark.size()))) return false;
    const std::string_view before = key.substr(0, at);  // <prefix>:<id>:<thread>
    const std::size_t thread = before.rfind(':');
    if (thread == std::string_view::npos || !digits(before.substr(thread + 1))) return false;
    const std::size_t id = before.substr(0, thread).rfind(':');
    return id != std::string_view::npos && id > 0 && id + 1 < thread;
}

RLOCK_DECL std::vector<std::string> names_of_key(std::string_view key) {
    std::vector<std::string> out;
    if (is_read_hold_key(key)) return out;
    // `prefix:{name}` (a name without '{') or `prefix:name` (a name with one).
    auto unprefixed = [&](std::string_view prefix) -> std::optional<std::string> {
        if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix)
            return std::nullopt;
        const std::string_view rest = key.substr(prefix.size());
        if (rest.size() > 2 && rest.front() == '{' && rest.back() == '}' &&
            rest.substr(1, rest.size() - 2).find_first_of("{}") == std::string_view::npos) {
            return std::string(rest.substr(1, rest.size() - 2));
        }
        if (rest.find('{') != std::string_view::npos) return std::string(rest);
        return std::nullopt;
    };
    if (unprefixed("redisson_lock_token:")) return out;
    for (const std::string_view prefix :
         {std::string_view("redisson_lock_queue:"), std::string_view("redisson_lock_timeout:")}) {
        if (auto n = unprefixed(prefix)) {
            out.push_back(std::move(*n));
            return out;
        }
    }
    constexpr std::string_view suffix = ":timeout";
    if (key.size() > suffix.size() && key.substr(key.size() - suffix.size()) == suffix) {
        const std::string_view rest = key.substr(0, key.size() - suffix.size());
        if (rest.size() > 2 && rest.front() == '{' && rest.back() == '}' &&
            rest.substr(1, rest.size() - 2).find_first_of("{}") == std::string_view::npos) {
            out.emplace_back(rest.substr(1, rest.size() - 2));
        } else if (rest.find('{') != std::string_view::npos) {
            out.emplace_back(rest);
        }
    }
    out.emplace_back(key);
    return out;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
