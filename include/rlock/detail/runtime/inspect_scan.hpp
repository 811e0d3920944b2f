// rlock::inspect and rlock::list_locks on a client: the inspect script sent to the master of the
// name's slot, and the SCAN of every master (Redis Cluster) or of the one server for the names
// that have a lock's keys.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/inspect_layout.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/pool.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/errors.hpp"
#include "rlock/lock_info.hpp"

namespace rlock::detail {

/// One round trip: the inspect script on the master of `name`'s slot. A read, so it is sent
/// again after a broken connection. ASK is waited out rather than followed, as for the read-write
/// scripts: the read hold keys it reads undeclared may still be on the source.
RLOCK_DECL lock_info inspect_name(client_core& core, std::string_view name);

/// Calls `f(key)` for every key SCAN finds on the connection `c` (COUNT 1000, no MATCH: a
/// lock's queue and permit keys are named after it, not like it).
template <class F>
void scan_keys(const connection& c, std::string_view server, F&& f) {
    std::string cursor = "0";
    do {
        const reply_ptr r = run_command(c, {"SCAN", cursor, "COUNT", "1000"}, "", server);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[1]->type != REDIS_REPLY_ARRAY) {
            throw error(errc::protocol_error, "", server, "SCAN: a reply rlock cannot read");
        }
        cursor = std::string(reply_text(r->element[0]));
        const redisReply* keys = r->element[1];
        for (std::size_t i = 0; i < keys->elements; ++i) f(reply_text(keys->element[i]));
    } while (cursor != "0");
}

/// Whether the class at `pattern[p]` (a `[`) takes `ch`, read as Redis's MATCH reads one
/// (stringmatchlen): `^` first negates it; `\` takes the next character as it is; `]` ends it,
/// even first (`[]x]` is an empty class, then `x]`); a character followed by `-` and one more
/// is a range, whatever that one is (`[a-]` is the range from `]` to `a`, and the class goes
/// on); a class left open ends with the pattern. Characters compare as `char` does (signed on
/// x86, as the server's). Sets `next` past the class.
inline bool glob_class(std::string_view pattern, std::size_t p, char ch, std::size_t& next) {
    std::size_t q = p + 1;
    const bool negate = q < pattern.size() && pattern[q] == '^';
    if (negate) ++q;
    bool hit = false;
    while (q < pattern.size()) {
        const std::size_t left = pattern.size() - q;
        if (pattern[q] == '\\' && left >= 2) {
            hit |= pattern[q + 1] == ch;
            q += 2;
        } else if (pattern[q] == ']') {
            ++q;
            break;
        } else if (left >= 3 && pattern[q + 1] == '-') {
            const char lo = std::min(pattern[q], pattern[q + 2]);
            const char hi = std::max(pattern[q], pattern[q + 2]);
            hit |= ch >= lo && ch <= hi;
            q += 3;
        } else {
            hit |= pattern[q] == ch;
            ++q;
        }
    }
    next = q;
    return hit != negate;
}

/// Whether `text` matches the glob `pattern` as Redis's MATCH reads one: `*`, `?`, a class
/// (glob_class), and `\` taking the next character as it is. Every byte counts, NUL included
/// (a name may hold one; fnmatch would stop there).
inline bool glob_match(std::string_view pattern, std::string_view text) {
    std::size_t p = 0, t = 0;
    std::size_t star = std::string_view::npos, resume = 0;  // the last '*' and where it matched to
    if (text.empty()) return pattern.empty();  // as Redis: not even "*" takes an empty text
    while (t < text.size()) {
        bool advanced = false;
        if (p < pattern.size()) {
            const char c = pattern[p];
            if (c == '*') {
                star = p++;
                resume = t;
                continue;
            }
            if (c == '?') {
                ++p;
                ++t;
                continue;
            }
            if (c == '[') {
                std::size_t next = p;
                if (glob_class(pattern, p, text[t], next)) {
                    p = next;
                    ++t;
                    advanced = true;
                }
            } else {
                const bool escaped = c == '\\' && p + 1 < pattern.size();
                if (pattern[escaped ? p + 1 : p] == text[t]) {
                    p += escaped ? 2 : 1;
                    ++t;
                    advanced = true;
                }
            }
        }
        if (advanced) continue;
        if (star == std::string_view::npos) return false;
        p = star + 1;  // let the last '*' take one more character
        t = ++resume;
    }
    while (p < pattern.size() && pattern[p] == '*') ++p;
    return p == pattern.size();
}

/// The names that have a key of some lock kind and match the glob `pattern` (empty: all),
/// sorted: every master of a Redis Cluster, or the one server (through Sentinel: its master).
/// A name is a candidate here; inspect tells whether its keys are a lock's.
RLOCK_DECL std::vector<std::string> scan_lock_names(client_core& core, const std::string& pattern);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL lock_info inspect_name(client_core& core, std::string_view name) {
    if (name.empty()) throw error(errc::invalid_argument, name, core.ep.name, "the name is empty");
    const inspect_keys keys(name);
    if (core.ep.slots) {
        // One script reads every key: they must share the name's slot (as a lock's do).
        const int slot = key_slot(keys.name);
        for (const std::string* k : {&keys.queue, &keys.deadlines, &keys.permits, &keys.counter}) {
            if (key_slot(*k) == slot) continue;
            throw error(errc::invalid_argument, name, core.ep.name,
                        "in a cluster a lock name with '{' needs a hash tag ({tag} with a "
                        "non-empty tag), or its keys land in different slots; nothing was sent");
        }
    }
    return core.pool.run(
        name, on_break::retry,
        [&](const connection& c) {
            script_call call(inspect_script(),
                             {keys.name, keys.queue, keys.deadlines, keys.permits, keys.counter},
                             {});
            const reply_ptr r = run_script(c, call, name, core.ep.name);
            return inspect_reader(keys, core.ep.name, core.id).read(r.get());
        },
        false);
}

RLOCK_DECL std::vector<std::string> scan_lock_names(client_core& core, const std::string& pattern) {
    std::set<std::string> names;
    auto take = [&](std::string_view key) {
        for (std::string& n : names_of_key(key)) {
            if (pattern.empty() || glob_match(pattern, n))
                names.insert(std::move(n));
        }
    };
    if (core.ep.slots) {
        if (core.ep.slots->masters().empty() || core.ep.slots->stale()) load_slots(core.ep);
        for (const server_address& m : core.ep.slots->masters()) {
            const std::string where = address_name(m.host, m.port);
            const context_ptr ctx = connect_node(core.ep, m);
            scan_keys(connection{ctx.get()}, where, take);
        }
    } else {
        core.pool.run("", on_break::retry, [&](const connection& c) {
            names.clear();  // a retry scans again from the start
            scan_keys(c, core.ep.name, take);
        });
    }
    return {names.begin(), names.end()};
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
