// The client's record of the holds its threads have: what the watchdog renews, what lost()
// reports, and how a thread that already holds a lock is recognised (reentry, would_deadlock).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/local_gate.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

/// A hold id: unique in the process, never 0.
RLOCK_DECL std::uint64_t next_hold_id() noexcept;

/// The owners (threads' numbers, rlock::owner values) whose final unlock of one lock found
/// their hold lost, until they hold that lock again: its lost() stays true for them. The flag
/// spares the common path, where nobody is marked, the mutex.
class lost_at_unlock_owners {
public:
    void mark(std::uint64_t owner) {
        std::lock_guard<std::mutex> g(mu_);
        if (std::find(owners_.begin(), owners_.end(), owner) == owners_.end()) owners_.push_back(owner);
        any_.store(true, std::memory_order_relaxed);
    }
    bool marked(std::uint64_t owner) const {
        if (!any_.load(std::memory_order_relaxed)) return false;
        std::lock_guard<std::mutex> g(mu_);
        return std::find(owners_.begin(), owners_.end(), owner) != owners_.end();
    }
    void forget(std::uint64_t owner) {
        if (!any_.load(std::memory_order_relaxed)) return;
        std::lock_guard<std::mutex> g(mu_);
        owners_.erase(std::remove(owners_.begin(), owners_.end(), owner), owners_.end());
        any_.store(!owners_.empty(), std::memory_order_relaxed);
    }

private:
    mutable std::mutex mu_;
    std::vector<std::uint64_t> owners_;
    std::atomic<bool> any_{false};
};

/// Holds that stand or fall together (the nodes of a red_lock): the owner is told once, when
/// more than `tolerance` of them are lost. Set on each member hold.
struct hold_group {
    std::string name;
    std::uint64_t id = next_hold_id();  // the hold id of the whole (red_lock::hold_id())
    int tolerance = 0;
    std::atomic<int> lost_parts{0};  // lost, or refused by their server in an episode not ended
    std::atomic<bool> told{false};   // its owner was told it lost (registry::tell_group)
    std::atomic<bool> told_refused{false};  // ...or told of refusals, in an episode not ended
    lock_lost_handler tell;  // the owner's on_lock_lost (may be empty)
    /// red_lock: the round's own connections to the nodes that were sent the acquire and had
    /// not answered when it was decided (paused, slow), by node index, kept open so that the
    /// release follows the acquire on them (red_site::release): on another connection it may
    /// run first, or not reach the node at all. Closed with the group.
    std::mutex late_mu;
    std::vector<std::pair<std::size_t, context_ptr>> late;

    /// Counts one member lost (or refused); true when the group is lost with it.
    bool part_lost() noexcept { return lost_parts.fetch_add(1) + 1 > tolerance; }
    /// A member whose renewal was refused is renewed again: it no longer counts, and a later
    /// refusal may be told again.
    void part_back() noexcept {
        if (lost_parts.fetch_sub(1) - 1 <= tolerance) told_refused.store(false);
    }
};

/// Whether a hold is renewed by the client's watchdog or ends with its lease.
enum class renewal : unsigned char { leased, watched };

/// How a hold was taken: for how long, from when (the send time of the acquire that made it),
/// whether the watchdog renews it, and whether its acquire was answered (a red_lock node that
/// was sent the acquire but did not answer in the round may still have set the key).
struct hold_terms {
    std::chrono::milliseconds lease{0};
    detail::renewal renewal = renewal::leased;
    std::chrono::steady_clock::time_point sent;
    bool confirmed = true;
};

}  // namespace rlock::detail

namespace rlock {

/// One thread's hold on one lock.
struct hold::record {
    using clock = std::chrono::steady_clock;

    const detail::kind_info* kind = nullptr;
    std::string name;   // the lock's name (its key)
    std::string value;  // mutex token, or holder id "<clientId>:<threadId>"; a permit's ids
    std::string key;    // the key a renewal names when it is not `name` (a permit: the timeout set)
    std::uint64_t thread = 0;  // 0: owned by a handle (a permit), not by a thread
    std::chrono::milliseconds lease{0};
    bool watched = false;
    std::uint64_t fencing = 0;
    std::uint64_t id = detail::next_hold_id();  // what hold_id() returns and on_lock_lost is told
    clock::time_point taken;            // when it was acquired, for released_event (stamped
                                        // only with a listener: event_sink::stamp)
    std::shared_ptr<detail::hold_group> group;  // set for the parts of a red_lock
    detail::gate_place gate;                    // taken through this client's gate (local hand-off)
    // Local hand-off: the hold this one was handed by (and so on back), each with when it was
    // handed on; kept while a loss found now may have happened during its tenure (a renewal
    // that finds the key cuts off those handed on before it was sent: registry::renewed).
    std::shared_ptr<record> handed_from;
    clock::time_point handed_at;

    record() = default;
    record(const record&) = delete;
    record& operator=(const record&) = delete;
    // A chain of many passes is let go one record at a time, not by a recursion as deep as
    // the chain.
    ~record() {
        std::shared_ptr<record> p = std::move(handed_from);
        while (p && p.use_count() == 1) p = std::move(p->handed_from);
    }

    /// The key a renewal (and a check of the hold) names: `key` when set, else `name`.
    const std::string& renewed_key() const noexcept { return key.empty() ? name : key; }

    // Only the hold's own thread reads or writes `count`; the rest is guarded by
    // registry::mu_ (the watchdog reads and writes it too).
    std::size_t count = 1;      // reentry depth
    clock::time_point expires;  // send time of the last acquire or renewal that worked + lease
    bool lost = false;          // known to be gone from Redis
    bool told = false;          // on_lock_lost already called
    bool in_flight = false;     // inside a watchdog renewal batch right now
    bool released = false;      // unlocked: no renewal, no report
    bool refused = false;       // counted out of its group (and not told again) until a
                                // renewal works: a renewal was refused with an error (the
                                // owner was told), or the hold is unconfirmed (below)
    bool unconfirmed = false;   // (a red_lock part) its acquire was sent but not answered in
                                // the round: the key may or may not be there until a renewal
                                // finds it; no part of the hold's validity meanwhile
    bool armed = false;         // its key read on the watchdog's tracked connection since the
                                // last write there (loss_watch.hpp)
};

}  // namespace rlock

namespace rlock::detail {

/// Where the registry finds a hold: a thread's by kind, thread and name; a handle's (thread 0),
/// which a thread may have several of on one name, by its hold id. `name` views the recorded
/// hold's own name, which does not change while it is recorded, so a lookup allocates nothing.
struct hold_key {
    const kind_info* kind = nullptr;
    std::uint64_t thread = 0;
    std::string_view name;
    std::uint64_t id = 0;

    bool operator==(const hold_key& o) const noexcept;
};

struct hold_key_hash {
    std::size_t operator()(const hold_key& k) const noexcept;
};

class registry {
public:
    using clock = std::chrono::steady_clock;
    using hold_ptr = std::shared_ptr<hold>;

    /// `on_lost`: the client's on_lock_lost (may be empty).
    explicit registry(lock_lost_handler on_lost = {}) : on_lost_(std::move(on_lost)) {}

    /// Runs `f` under the registry's lock (for the fields of a hold it guards).
    template <class F>
    decltype(auto) with(F&& f) const {
        std::lock_guard<std::mutex> g(mu_);
        return f();
    }

    /// Tells the owner of a lost hold: on_lock_lost for a plain hold; for a member of a group
    /// (a red_lock node, a multi_lock part) the group decides, and tells its owner once.
    /// `refused`: a renewal was refused with `reason` (lost_hold::refused; the hold is not lost
    /// yet). Never throws; never called under the registry's lock.
    void tell_hold(const hold& h, const error& reason, bool refused = false) const noexcept;

    /// `h` was found gone from Redis (a renewal or its unlock found the key deleted or taken
    /// over): the owners it was handed on from within this client (local hand-off) are told
    /// too when they handed it on after its last confirmation (the acquire or renewal its
    /// expiry counts from) — the key may have been gone while they held it. Never throws.
    void tell_handed_from(const hold& h, const error& reason) noexcept;

    /// The same for a hold that has no record of its own (one handed to an ended asynchronous
    /// acquire and released unclaimed): `from` is the record it was handed on from, and
    /// `confirmed` when its expiry was last set.
    void tell_handed_from(const hold_ptr& from, clock::time_point confirmed, const error& reason) noexcept;

    /// A group's owner is told `why` (as `code`), once for the group, whoever tells first.
    static void tell_group(hold_group& group, const std::string& why, errc code = errc::lock_lost,
                           bool refused = false) noexcept;

    /// The one way a hold found lost by its own thread (at unlock, at re-entry) is reported:
    /// marked lost, and its owner told `reason` unless the watchdog already told it.
    void report(hold& h, const error& reason) {
        if (claim_report(h)) tell_hold(h, reason);
    }

    /// True when `h`, found no longer held at unlock, simply ran out: a leased hold past its
    /// lease is the expected end, not a loss.
    bool ended_by_lease(const hold& h) const;

    hold_ptr find(const kind_info* kind, std::string_view name, std::uint64_t thread) const;

    /// True when `pred(hold)` is true for a hold in the registry (a scan, under its lock: for
    /// rare questions, such as whether a handle of this client owns a permit id).
    template <class P>
    bool any_hold(P pred) const {
        std::lock_guard<std::mutex> g(mu_);
        return std::any_of(holds_.begin(), holds_.end(), [&](const auto& kv) { return pred(*kv.second); });
    }

    void add(hold_ptr h);

    /// Takes a hold out of the registry for its final unlock, and waits for a renewal batch that
    /// carries it to finish, so that no renewal of it reaches Redis after unlock returns —
    /// except with `await_renewal` false (a red_lock's parts), or for an unconfirmed red_lock
    /// part: its node may be hung, holding the renewal for a whole command_timeout, and the
    /// unlock is bounded by the per-node timeout. A late renewal there can only extend our own
    /// key (a red_lock's token is its hold's alone), which the unlock's release deletes or its
    /// lease ends; its answer, for a released hold, tells nobody.
    void remove(const hold_ptr& h, bool await_renewal = true);

    /// The watchdog's idle state (loss_watch.hpp): with `idle` true it stops polling when no
    /// hold (watched or leased: both are armed) is registered, and the next add() calls
    /// `on_added` (set once, before any hold is added). Returns false, and leaves it polling,
    /// when a hold is there after all.
    bool idle() noexcept;
    bool has_holds() const noexcept { return held_.load(std::memory_order_relaxed) != 0; }
    void on_added(std::function<void()> f) { on_added_ = std::move(f); }

    /// True when the hold is known lost, or its lease has run out by this client's clock. The
    /// verdict is final: it is latched, so a renewal answered later does not take it back (the
    /// owner may already have acted on it), and the watchdog tells on_lock_lost at its next
    /// tick if no one has yet.
    bool is_lost(hold& h) const;

    /// The watched holds still in force, each flagged in_flight until renewed() is called.
    /// Holds whose lease has already run out by this client's clock are lost for good (lost()
    /// has been saying so): they are not renewed, even if Redis still has them, and go to
    /// `expired` when their owner has not been told yet.
    /// `pick(hold)`, under the registry's lock: only those it is true for are taken (a tick
    /// for some holds only: loss_watch.hpp); every expired one is told either way.
    template <class Pick>
    std::vector<hold_ptr> take_watched(std::vector<hold_ptr>& expired, Pick&& pick) {
        std::vector<hold_ptr> out;
        std::lock_guard<std::mutex> g(mu_);
        const auto now = clock::now();
        for (auto& [k, h] : holds_) {
            if (!h->watched || h->released || (h->lost && h->told)) continue;
            if (h->lost || now >= h->expires) {
                if (mark_lost_locked(*h)) expired.push_back(h);
                continue;
            }
            if (!pick(static_cast<const hold&>(*h))) continue;
            h->in_flight = true;
            out.push_back(h);
        }
        return out;
    }
    std::vector<hold_ptr> take_watched(std::vector<hold_ptr>& expired) {
        return take_watched(expired, [](const hold&) { return true; });
    }

    /// The holds in force (watched, or leased with lease left) whose key has not been read on
    /// the tracked connection yet, taken (their acquire sent) at `taken_by` or before.
    std::vector<hold_ptr> unarmed(clock::time_point taken_by) const;

    /// The leased holds with lease left that `pick` chooses, each flagged in_flight until
    /// checked() is called: their key changed, and a check (a renewal script that writes
    /// nothing) tells whether they are still held.
    template <class Pick>
    std::vector<hold_ptr> take_leased(Pick&& pick) {
        std::vector<hold_ptr> out;
        std::lock_guard<std::mutex> g(mu_);
        const auto now = clock::now();
        for (auto& [k, h] : holds_) {
            if (h->watched || h->released || h->lost || now >= h->expires) continue;
            if (!pick(static_cast<const hold&>(*h))) continue;
            h->in_flight = true;
            out.push_back(h);
        }
        return out;
    }

    /// Ends a check of leased holds: `gone[i]` says Redis no longer has holds[i]. Gone while
    /// its lease had not run out by this client's clock (which runs out before the server's:
    /// it counts from the acquire's send time) is a loss; gone after is the lease's end.
    /// Returns the indexes of the holds whose owner must be told now.
    std::vector<std::size_t> checked(const std::vector<hold_ptr>& holds, const std::vector<char>& gone);

    /// `holds` were read on a connection whose keys the server tracks (loss_watch.hpp): a
    /// change of their keys will be told.
    void armed(const std::vector<hold_ptr>& holds, const std::vector<char>& which) {
        set_armed(holds, which, true);
    }
    /// `holds` (those `which` says) are to be read again, elsewhere: their slot moved to
    /// another master (Redis Cluster).
    void disarmed(const std::vector<hold_ptr>& holds, const std::vector<char>& which) {
        set_armed(holds, which, false);
    }

    /// Ends a renewal batch: ok[i] says whether holds[i] was renewed; a hold that was not is
    /// lost when Redis said so (`gone`) or when its lease ran out. A renewal sent after the
    /// lease had run out does not bring a hold back (lost() stays true). Returns the indexes of the
    /// holds whose owner must be told now.
    std::vector<std::size_t> renewed(const std::vector<hold_ptr>& holds, const std::vector<char>& ok,
                                     const std::vector<char>& gone, clock::time_point sent);

    /// A watched hold that lost() latched lost (its lease ran out by this client's clock) and
    /// whose owner was not told yet: the watchdog tells such a hold at its next tick, but not
    /// once it is released. True once, for the unlock to tell it.
    bool claim_untold_loss(hold& h);

    /// True when `h` is lost and its owner has been told.
    bool told_lost(const hold& h) const;

    /// Marks a hold lost on behalf of its own thread (unlock found it gone); true when the owner
    /// has not been told yet.
    bool claim_report(hold& h);

    /// Takes every hold of `thread` out of the registry (the thread has exited: nothing can
    /// unlock them), waiting for a renewal batch that carries one to finish. Returns the
    /// watched ones whose owner has not been told of a loss yet: the watchdog stops renewing
    /// them, so they end with their lease.
    std::vector<hold_ptr> take_thread(std::uint64_t thread);

    /// A renewal of `h` was refused with an error (not "gone"): true when the owner must be
    /// told now, which happens once until a renewal works again. The hold is not lost yet: the
    /// watchdog keeps trying while its lease lasts, and when the lease runs out lost() turns
    /// true without a second report.
    bool refused(hold& h);

    /// Calls `f` (when set) with `which` and `reason`; what it throws is dropped.
    static void tell(const lock_lost_handler& f, const lost_hold& which,
                     const error& reason) noexcept;

private:
    void set_armed(const std::vector<hold_ptr>& holds, const std::vector<char>& which, bool armed);


    bool mark_lost_locked(hold& h);

    static hold_key key_of(const kind_info* kind, std::string_view name, std::uint64_t thread) noexcept {
        return hold_key{kind, thread, name, 0};
    }
    static hold_key key_of(const hold& h) noexcept;

    lock_lost_handler on_lost_;
    mutable std::mutex mu_;
    std::condition_variable quiet_;
    std::unordered_map<hold_key, hold_ptr, hold_key_hash> holds_;
    std::atomic<std::size_t> held_{0};  // records in holds_ (read without the lock)
    std::atomic<bool> idle_{false};         // the watchdog waits for one (idle())
    std::function<void()> on_added_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::uint64_t next_hold_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

RLOCK_DECL bool hold_key::operator==(const hold_key& o) const noexcept {
    return kind == o.kind && thread == o.thread && id == o.id && name == o.name;
}

RLOCK_DECL std::size_t hold_key_hash::operator()(const hold_key& k) const noexcept {
    std::size_t h = std::hash<std::string_view>{}(k.name);
    for (const std::size_t part :
         {reinterpret_cast<std::size_t>(k.kind), static_cast<std::size_t>(k.thread),
          static_cast<std::size_t>(k.id)}) {
        h ^= part + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
}

RLOCK_DECL void registry::tell_hold(const hold& h, const error& reason,
                                    bool refused) const noexcept {
    try {  // the copies and the message may throw bad_alloc; the owner is told or not
        const auto [group, fencing] = with([&] { return std::make_pair(h.group, h.fencing); });
        if (!group) {
            tell(on_lost_, lost_hold{h.name, h.id, fencing, refused}, reason);
        } else if (group->part_lost()) {
            // A part lost is the group's loss; a part that failed otherwise (a renewal or a
            // release an ACL refused, a server that did not answer) is told as that error, as
            // for a plain hold. Either names the part and its server.
            const std::string part = "part \"" + h.name + "\"" +
                                     (reason.server().empty() ? "" : " on " + reason.server()) +
                                     ": " + reason.cause();
            if (reason.value() == errc::lock_lost) {
                tell_group(*group, "too few of its parts are still held; the last loss: " + part);
            } else {
                tell_group(*group, "its " + part, reason.value(), refused);
            }
        }
    } catch (...) {
    }
}

RLOCK_DECL void registry::tell_handed_from(const hold& h, const error& reason) noexcept {
    tell_handed_from(h.handed_from, h.expires - h.lease, reason);
}

RLOCK_DECL void registry::tell_handed_from(const hold_ptr& from, clock::time_point confirmed,
                                           const error& reason) noexcept {
    try {
        std::vector<hold_ptr> tell;
        {
            std::lock_guard<std::mutex> g(mu_);
            for (hold_ptr p = from; p && p->handed_at > confirmed; p = p->handed_from) {
                if (p->told) continue;
                p->told = true;
                p->lost = true;
                tell.push_back(p);
            }
        }
        for (const hold_ptr& p : tell) {
            tell_hold(*p, error(reason.value(), p->name, reason.server(),
                                "the hold was found gone after this owner handed it on to "
                                "another thread of the client, and may have been gone while "
                                "it held it: " +
                                    error_access::brief(reason)));
        }
    } catch (...) {
    }
}

RLOCK_DECL void registry::tell_group(hold_group& group, const std::string& why, errc code,
                                     bool refused) noexcept {
    // A refusal is told once per episode, and leaves a later loss to be told.
    if (refused ? group.told.load() || group.told_refused.exchange(true)
                : group.told.exchange(true))
        return;
    try {
        tell(group.tell, lost_hold{group.name, group.id, 0, refused},
             error(code, group.name, "", why));
    } catch (...) {
    }
}

RLOCK_DECL bool registry::ended_by_lease(const hold& h) const {
    return with([&] { return !h.watched && clock::now() >= h.expires; });
}

RLOCK_DECL auto registry::find(const kind_info* kind, std::string_view name,
                               std::uint64_t thread) const -> hold_ptr {
    std::lock_guard<std::mutex> g(mu_);
    auto it = holds_.find(key_of(kind, name, thread));
    return it == holds_.end() ? nullptr : it->second;
}

RLOCK_DECL void registry::add(hold_ptr h) {
    {
        std::lock_guard<std::mutex> g(mu_);
        // A record with the same key (rare) is replaced whole: its key views the old
        // hold's name.
        const hold_key k = key_of(*h);
        auto old = holds_.find(k);
        if (old != holds_.end()) {
            holds_.erase(old);
        } else {
            held_.fetch_add(1);
        }
        holds_.emplace(k, std::move(h));
    }
    // The watchdog stopped polling while there was nothing to watch: it is woken to arm
    // this one (seq_cst with idle(): one of the two sees the other).
    if (idle_.load() && idle_.exchange(false) && on_added_) on_added_();
}

RLOCK_DECL void registry::remove(const hold_ptr& h, bool await_renewal) {
    std::unique_lock<std::mutex> g(mu_);
    // The record under h's key is h's (add() keeps one per key): one lookup, not two.
    if (holds_.erase(key_of(*h)) != 0) held_.fetch_sub(1);
    h->released = true;
    if (await_renewal && !h->unconfirmed) quiet_.wait(g, [&] { return !h->in_flight; });
}

RLOCK_DECL bool registry::idle() noexcept {
    idle_.store(true);
    if (held_.load() == 0) return true;
    idle_.store(false);
    return false;
}

RLOCK_DECL bool registry::is_lost(hold& h) const {
    std::lock_guard<std::mutex> g(mu_);
    if (!h.lost && clock::now() >= h.expires) h.lost = true;
    return h.lost;
}

RLOCK_DECL auto registry::unarmed(clock::time_point taken_by) const -> std::vector<hold_ptr> {
    std::vector<hold_ptr> out;
    std::lock_guard<std::mutex> g(mu_);
    const auto now = clock::now();
    for (const auto& [k, h] : holds_) {
        if ((h->watched || now < h->expires) && !h->armed && !h->released && !h->lost &&
            h->expires - h->lease <= taken_by) {
            out.push_back(h);
        }
    }
    return out;
}

RLOCK_DECL std::vector<std::size_t> registry::checked(const std::vector<hold_ptr>& holds,
                                                      const std::vector<char>& gone) {
    std::vector<std::size_t> tell;
    {
        std::lock_guard<std::mutex> g(mu_);
        const auto now = clock::now();
        for (std::size_t i = 0; i < holds.size(); ++i) {
            hold& h = *holds[i];
            h.in_flight = false;
            if (!h.released && gone[i] && now < h.expires && mark_lost_locked(h)) tell.push_back(i);
        }
    }
    quiet_.notify_all();
    return tell;
}

RLOCK_DECL std::vector<std::size_t> registry::renewed(const std::vector<hold_ptr>& holds,
                                                      const std::vector<char>& ok,
                                                      const std::vector<char>& gone,
                                                      clock::time_point sent) {
    std::vector<std::size_t> tell;
    std::vector<hold_ptr> cut;  // let go after the lock
    tell.reserve(holds.size());  // nothing to allocate under the lock, where a throw would
    cut.reserve(holds.size());   // leave holds in flight
    {
        std::lock_guard<std::mutex> g(mu_);
        const auto now = clock::now();
        for (std::size_t i = 0; i < holds.size(); ++i) {
            hold& h = *holds[i];
            h.in_flight = false;
            // Found held at `sent`: owners that handed it on before then held a lock that was
            // there, and no loss found later can be theirs (tell_handed_from).
            if (ok[i] && h.handed_from) {
                hold* at = &h;
                while (at->handed_from && at->handed_from->handed_at > sent) at = at->handed_from.get();
                if (at->handed_from) cut.push_back(std::move(at->handed_from));
            }
            if (h.released) {
                // Its final unlock waits for this reply (remove()), then hands the hold on
                // or releases it: what the renewal found is the unlock's to act on — a hold
                // renewed is handed on with its new expiry, one found gone is not handed on
                // (its release finds it gone and tells its owner). Nobody is told here.
                if (ok[i] && !h.lost && sent < h.expires) {
                    h.expires = sent + h.lease;
                } else if (gone[i]) {
                    h.lost = true;
                }
                continue;
            }
            if (ok[i] && !h.lost && sent < h.expires) {
                h.expires = sent + h.lease;
                if (h.refused && h.group) h.group->part_back();
                h.refused = false;
                h.unconfirmed = false;
            } else if ((gone[i] || ok[i] || now >= h.expires) && mark_lost_locked(h)) {
                tell.push_back(i);
            }
        }
    }
    quiet_.notify_all();
    return tell;
}

RLOCK_DECL bool registry::claim_untold_loss(hold& h) {
    std::lock_guard<std::mutex> g(mu_);
    if (!h.watched || !h.lost || h.told || h.refused) return false;
    h.told = true;
    return true;
}

RLOCK_DECL bool registry::told_lost(const hold& h) const {
    std::lock_guard<std::mutex> g(mu_);
    return h.lost && h.told;
}

RLOCK_DECL bool registry::claim_report(hold& h) {
    std::lock_guard<std::mutex> g(mu_);
    h.lost = true;
    if (h.told || h.refused) {  // a refused renewal was the report
        h.told = true;
        return false;
    }
    h.told = true;
    return true;
}

RLOCK_DECL auto registry::take_thread(std::uint64_t thread) -> std::vector<hold_ptr> {
    std::vector<hold_ptr> mine;
    std::vector<hold_ptr> untold;
    std::unique_lock<std::mutex> g(mu_);
    for (auto it = holds_.begin(); it != holds_.end();) {
        if (it->second->thread != thread) {
            ++it;
            continue;
        }
        hold_ptr& h = it->second;
        h->released = true;
        if (h->watched && !h->told && !h->refused) {
            h->lost = true;
            h->told = true;
            untold.push_back(h);
        }
        held_.fetch_sub(1);
        mine.push_back(std::move(h));
        it = holds_.erase(it);
    }
    quiet_.wait(g, [&] {
        return std::none_of(mine.begin(), mine.end(),
                            [](const hold_ptr& h) { return h->in_flight; });
    });
    return untold;
}

RLOCK_DECL bool registry::refused(hold& h) {
    std::lock_guard<std::mutex> g(mu_);
    if (h.released || h.told || h.refused) return false;
    h.refused = true;
    return true;
}

RLOCK_DECL void registry::tell(const lock_lost_handler& f, const lost_hold& which,
                               const error& reason) noexcept {
    if (!f) return;
    try {
        f(which, reason);
    } catch (...) {
    }
}

RLOCK_DECL void registry::set_armed(const std::vector<hold_ptr>& holds,
                                    const std::vector<char>& which, bool armed) {
    std::lock_guard<std::mutex> g(mu_);
    for (std::size_t i = 0; i < holds.size(); ++i) {
        if (which[i]) holds[i]->armed = armed;
    }
}

RLOCK_DECL bool registry::mark_lost_locked(hold& h) {
    h.lost = true;
    if (h.told || h.released || h.refused) return false;
    h.told = true;
    return true;
}

RLOCK_DECL hold_key registry::key_of(const hold& h) noexcept {
    return h.thread != 0 ? key_of(h.kind, h.name, h.thread) : hold_key{nullptr, 0, {}, h.id};
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
