// red_lock's site: its nodes, name and options, with one Redlock round (fan_out.hpp), one
// release and the validity of a hold for an owner; and red_acquisition, its acquisition
// operation (run by wait_blocking, and asynchronously by red_acquire, red_wait.hpp).
// rlock::red_lock (red_lock.hpp) is the public face; its contract is there.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/lease_request.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/protocol/mutex_kind.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/engine.hpp"
#include "rlock/detail/runtime/fan_out.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/errors.hpp"
#include "rlock/detail/runtime/held_site.hpp"
#include "rlock/hold.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {
inline const kind_info red_lock_info{"red_lock", &mutex_kind::renew_script, true, nullptr, /*token_value=*/true};

/// What a red_lock is apart from any thread: its nodes, name and options, with one round, one
/// release and the validity of a hold, each for an owner (a thread's number, or an
/// rlock::owner's). The red_lock shares it with its asynchronous acquires and their holds
/// (held_site), which therefore outlive the red_lock object.
class red_site final : public held_site {
public:
    using clock = std::chrono::steady_clock;

    /// `nodes`: the cores of the clients given (null for a null client).
    red_site(const std::vector<client_core*>& nodes, std::string name, red_lock_options options);

    std::size_t quorum() const noexcept { return nodes_.size() / 2 + 1; }
    std::size_t size() const noexcept { return nodes_.size(); }
    const std::string& name() const noexcept { return name_; }
    const std::vector<client_core*>& nodes() const noexcept { return nodes_; }
    /// What an error about the red_lock as a whole names as its server: every node, in order.
    const std::string& servers() const noexcept { return servers_; }
    const red_lock_options& options() const noexcept { return options_; }
    const std::string& channel() const noexcept { return keys_.channel; }

    /// What one round came to.
    /// Whether a node's answer to a round's acquire says it set the key.
    static bool took(const redisReply* r) noexcept;

    struct round {
        registry::hold_ptr held;  // the first node hold, when a majority accepted in time
        bool unreachable = false;  // fewer than a majority could even be asked or answered
        std::string detail;        // each node's answer, for quorum_not_reached
    };

    /// Throws what an acquire by `owner` must: connection_failed for a destroyed client,
    /// would_deadlock when `owner` holds the red_lock already.
    void check_acquire(std::uint64_t owner) const;
    /// invalid_argument for a lease no longer than the clock drift allowed for it: no round
    /// could leave validity (lease - elapsed - drift > 0), so a wait would never end.
    void check_lease(lease_request lease) const;

    /// One Redlock round for `owner`: a new token SET NX PX on every node in parallel (inside
    /// the mutex's acquire script, so that a key of another type is told: wrong_type once
    /// such keys leave no majority). Held
    /// when a majority accepted and validity is left: the node holds are registered (one group,
    /// told once). Otherwise every node is released (a reply may have been lost). Each node is
    /// waited for node_timeout(lease), or `at_most` when that is shorter (a wait's deadline).
    round try_once(std::uint64_t owner, std::chrono::milliseconds lease, bool watched,
                   std::chrono::milliseconds at_most = std::chrono::milliseconds::max()) const;

    /// Redlock's random delay before the next round (so competing clients do not retry in
    /// lockstep).
    std::chrono::milliseconds retry_pause() const;

    /// After a round that did not hold: whether the acquire ends now, empty (its deadline has
    /// passed; `deadline` max: no deadline). Throws quorum_not_reached when too few nodes could
    /// be asked: at once without a deadline, at the deadline with one.
    bool gives_up(const round& r, clock::time_point deadline) const;

    /// What releasing `owner`'s hold came to.
    struct released {
        std::size_t nodes = 0;  // on how many nodes our key was deleted
        bool lost = false;      // the hold was found lost (its owner was told)
    };

    /// Releases `owner`'s hold on every node in parallel (the renewals stop first). Throws
    /// not_owner when `owner` holds none; never throws for unreachable nodes. A majority of
    /// nodes answering "not held" (a node lost its data, a key was deleted) means the hold was
    /// lost: on_lock_lost hears of it, once. A node that does not answer in time, or refuses,
    /// may keep our key until its lease ends: when so many may keep it that the others cannot
    /// make a majority (the lock stays closed to everyone), the owner is told.
    /// `keep_verdict`: a hold found lost keeps lost() true for `owner` until it holds the
    /// red_lock again (a thread's unlock; an rlock::hold keeps its own).
    released release(std::uint64_t owner, bool keep_verdict = true) const;

    /// The end of `owner`'s validity: the quorum-th latest node expiry minus drift, over the
    /// node holds not lost. Empty when it holds nothing; the epoch when too few remain.
    std::optional<clock::time_point> validity_end(std::uint64_t owner) const;
    /// `owner`'s hold is lost; with none, whether its last unlock found it lost (until it
    /// holds the red_lock again), as a mutex's lost().
    bool lost(std::uint64_t owner) const {
        const auto valid = validity_end(owner);
        if (!valid) return lost_at_unlock_.marked(owner);
        return clock::now() >= *valid;
    }

    /// The id of `owner`'s hold (its group's); not_owner when it holds none.
    std::uint64_t hold_id(std::uint64_t owner) const;

    // held_site: an rlock::hold of a red_lock (its record is the first node hold; its owner
    // is the record's `thread`).
    void unlock_one(const std::shared_ptr<hold>& h, bool& lost_at_last) const override {
        lost_at_last = release(h->thread, /*keep_verdict=*/false).lost;
    }
    registry& holds() const override { return nodes_.front()->reg; }
    bool is_lost(hold& h) const override { return lost(h.thread); }
    const std::string& lock_name() const override { return name_; }
    const std::string& server_name() const override { return nodes_.front()->ep.name; }
    bool fenced() const override { return false; }
    bool post(unique_callback<> task) const override { return nodes_.front()->eng.post(std::move(task)); }

private:
    std::chrono::milliseconds drift(std::chrono::milliseconds lease) const;

    std::chrono::milliseconds node_timeout(std::chrono::milliseconds lease) const;

    std::vector<node_result> release_all(const std::string& token) const;

    /// The release of `token` on one node (the mutex's release script).
    script_call release_call(const std::string& token) const {
        return script_call(mutex_kind::release_script(), {keys_.name}, {token, keys_.channel});
    }

    /// Writes the release of `token` after the acquire on the round's kept connections to its
    /// late nodes (hold_group::late), and closes them. Best effort, after the release on every
    /// node (release_all, which counts): a second release of one token finds nothing.
    void release_after_late(hold_group& group, const std::string& token) const;

    /// A failed round's clean-up: the release of `token` on the nodes `needed` names, within
    /// `per_node` (the round's own per-node timeout).
    void release_on(const std::string& token, const std::vector<char>& needed,
                    std::chrono::milliseconds per_node) const;

    /// The nodes of a release that could not be asked or did not answer, with why.
    std::string unanswered_nodes(const std::vector<node_result>& results) const;

    std::string describe(const std::vector<node_result>& results) const;

    std::vector<client_core*> nodes_;
    // Keep each node's core alive as basic_lock does: a client destroyed before this red_lock
    // leaves a core whose threads have stopped, which an acquire refuses to use.
    std::vector<std::shared_ptr<client_core>> owners_;
    std::string name_;
    std::string servers_;  // servers(): "host:a, host:b, ..."
    red_lock_options options_;
    lock_keys keys_;
    mutable lost_at_unlock_owners lost_at_unlock_;  // lost() stays true for them
};

/// red_lock's acquisition operation, as the blocking driver runs it (wait_blocking, on the
/// first node's client, whose channel carries the unlock message): one try is one Redlock
/// round (red_site::try_once), which undoes itself on every node when it does not hold; a
/// refused round asks for the next after Redlock's random delay (red_site::retry_pause). A
/// round that could not ask a majority throws quorum_not_reached without a deadline, and at
/// the deadline with one (red_site::gives_up; the caller asks again when the driver returns
/// at its deadline, with last()).
class red_acquisition {
public:
    using clock = std::chrono::steady_clock;

    red_acquisition(const red_site& site, std::uint64_t owner, lease_request lease, clock::time_point deadline)
        : site_(site), owner_(owner),
          lease_(lease.duration(site.nodes().front()->ep.options.lock_watchdog_timeout)),
          watched_(lease.is_watched()), deadline_(deadline) {}

    const std::string& name() const noexcept { return site_.name(); }
    std::string channel() const { return site_.channel(); }
    const void* turns() const noexcept { return nullptr; }  // each waiter runs its own rounds
    long long turn_need() const noexcept { return 0; }
    bool shared() const noexcept { return true; }
    std::chrono::milliseconds heartbeat() const noexcept { return std::chrono::milliseconds(0); }
    race_record* races() const noexcept { return nullptr; }  // Redlock's random delay paces it
    bool subscribes_first() const noexcept { return false; }
    bool paces_newcomer() const noexcept { return true; }
    long long subscribers(const std::string& /*channel*/) const noexcept { return -1; }

    try_result attempt(try_phase /*phase*/);
    void undo() noexcept {}     // a round undoes itself
    void give_up() noexcept {}  // nothing queued

    /// The last round that did not hold.
    const red_site::round& last() const noexcept { return last_; }
    /// What each round asks for: the lease's duration (red_site::try_once).
    std::chrono::milliseconds lease() const noexcept { return lease_; }
    /// The first node's hold of the round that held.
    const registry::hold_ptr& held() const noexcept { return held_; }
    /// The rounds made (acquired_event::tries).
    unsigned tries() const noexcept { return tries_; }

private:
    const red_site& site_;
    std::uint64_t owner_;
    std::chrono::milliseconds lease_;
    bool watched_;
    clock::time_point deadline_;
    red_site::round last_;
    registry::hold_ptr held_;
    unsigned tries_ = 0;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL red_site::red_site(const std::vector<client_core*>& nodes, std::string name,
                              red_lock_options options)
    : name_(std::move(name)), options_(options) {
    for (const client_core* core : nodes) {
        servers_ += (servers_.empty() ? "" : ", ") + (core ? core->ep.name : std::string("(null)"));
    }
    auto bad = [&](const std::string& why) { throw error(errc::invalid_argument, name_, servers_, why); };
    if (name_.empty()) bad("lock name is empty");
    if (nodes.empty()) bad("a red_lock needs at least one node");
    if (!(options_.clock_drift_factor >= 0 && options_.clock_drift_factor < 1))
        bad("clock_drift_factor must be in [0, 1)");
    if (!(options_.node_timeout_fraction > 0 && options_.node_timeout_fraction < 1))
        bad("node_timeout_fraction must be in (0, 1)");
    for (client_core* core : nodes) {
        if (!core) bad("a node is null");
        if (std::find(nodes_.begin(), nodes_.end(), core) != nodes_.end())
            bad("the same client is given twice");
        nodes_.push_back(core);
        owners_.push_back(core->shared_from_this());
    }
    keys_.name = name_;
    keys_.channel = prefixed_key(mutex_kind::channel_prefix, name_);
}

RLOCK_DECL void red_site::check_acquire(std::uint64_t owner) const {
    for (client_core* n : nodes_) {
        n->throw_if_destroyed(name_, "the client of this node has been destroyed");
    }
    for (client_core* n : nodes_) {
        if (n->reg.find(&red_lock_info, name_, owner)) {
            throw error(errc::would_deadlock, name_, n->ep.name,
                        owner_name(owner) + " already holds the red_lock, which is not reentrant");
        }
    }
}

RLOCK_DECL void red_site::check_lease(lease_request lease) const {
    const std::chrono::milliseconds d = lease.duration(nodes_.front()->ep.options.lock_watchdog_timeout);
    if (d > drift(d)) return;
    throw error(errc::invalid_argument, name_, servers_,
                "a lease of " + std::to_string(d.count()) +
                    " ms is no longer than the clock drift allowed for it (" +
                    std::to_string(drift(d).count()) +
                    " ms: lease * clock_drift_factor + 2 ms): no round could hold it");
}

RLOCK_DECL auto red_site::try_once(std::uint64_t owner, std::chrono::milliseconds lease,
                                   bool watched, std::chrono::milliseconds at_most) const -> round {
    const std::string lease_text = std::to_string(lease.count());
    const std::size_t need = quorum(), n = nodes_.size();
    const std::string token = random_token();
    const auto start = clock::now();
    auto accepted = [](const node_result& r) { return took(r.reply.get()); };
    // Whether the round holds, judged once, when its replies are in: a majority accepted and
    // validity is left. When it does not, the nodes that were sent the SET and did not answer
    // (paused, slow) are sent the release on the same connection, after it: they run both in
    // order when they run again. Sent later on a new connection, the release could not reach
    // a paused node, or could run before the SET; the key would then keep the lock closed to
    // everyone, held by nobody, for the whole lease.
    bool holds = false;
    fan_out_undo undo;
    undo.needed = [&](const std::vector<node_result>& rs) {
        const auto validity =
            lease - std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start) -
            drift(lease);
        holds = static_cast<std::size_t>(std::count_if(rs.begin(), rs.end(), accepted)) >= need &&
                validity.count() > 0;
        return !holds;
    };
    undo.make = [&](std::size_t, script_call& call) { call = release_call(token); };
    undo.keep = true;  // a held round keeps its late nodes' connections for the release
    auto results = fan_out(
        nodes_, name_,
        [&](std::size_t, script_call& call) {
            // The mutex's acquire script, not a bare SET NX: a key of another type answers
            // WRONGTYPE rather than "held" (see below).
            call = acquire_call(mutex_kind::acquire_fenced_script(), keys_, false, {token, lease_text, "0"});
        },
        std::min(node_timeout(lease), at_most),
        [&](const std::vector<node_result>& so_far) {
            std::size_t yes = 0, no = 0;
            for (const auto& r : so_far) {
                if (accepted(r)) {
                    ++yes;
                } else if (r.reply || r.failure) {
                    ++no;
                }
            }
            return yes >= need || no > n - need;
        },
        std::chrono::milliseconds(2), &undo);
    std::vector<std::size_t> got;
    std::size_t failed = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (accepted(results[i])) got.push_back(i);
        // A node not waited for once the round was decided (a majority refused) was
        // reachable as far as anyone knows: the lock is busy, not the quorum out of reach.
        if ((results[i].failure && !results[i].abandoned) ||
            (results[i].reply && results[i].reply->type == REDIS_REPLY_ERROR)) {
            ++failed;
        }
    }
    round out;
    if (holds) {
        auto group = std::make_shared<hold_group>();
        group->name = name_;
        group->tolerance = static_cast<int>(n - need);
        group->tell = nodes_.front()->ep.options.on_lock_lost;
        const hold_terms terms{lease, watched ? renewal::watched : renewal::leased, start};
        const clock::time_point taken = nodes_.front()->events.stamp();  // its listener is told
        // Nodes that did not accept count as lost from the start (before any part is
        // registered: the watchdog may count a part lost at once).
        group->lost_parts = static_cast<int>(n - got.size());
        lost_at_unlock_.forget(owner);
        for (std::size_t i : got) {
            registry::hold_ptr h =
                nodes_[i]->add_hold(red_lock_info, name_, token, owner, terms, 0, group);
            h->taken = taken;  // read by the owner's release only
            if (!out.held) out.held = std::move(h);
        }
        // A node sent the SET but not waited for (the round was decided first) or out of time
        // may set the key after the round: recorded unconfirmed, it is renewed by its watchdog
        // like the others (a watched hold) and counts for the hold from the first renewal that
        // finds it; a leased hold's is only released with it. Otherwise a round decided a
        // moment before the last replies (a loaded machine) would leave keys nobody renews, and
        // a hold tolerating fewer node losses than its nodes promise.
        // Their connections are kept with the hold: the release is written after the SET
        // there (release()), so that a node paused through the unlock runs both, in order,
        // when it resumes. Sent on a new connection, the release could not reach it (or ran
        // first), and the SET it ran on resuming kept a key nobody held for the whole lease.
        hold_terms maybe = terms;
        maybe.confirmed = false;
        for (std::size_t i = 0; i < n; ++i) {
            if (!results[i].unanswered) continue;
            nodes_[i]->add_hold(red_lock_info, name_, token, owner, maybe, 0, group)->taken = taken;
            if (results[i].kept) group->late.emplace_back(i, std::move(results[i].kept));
        }
        return out;
    }
    // A failed round: released where our key may be and no undo follows it already — the
    // nodes that accepted, and those that did not answer and whose undo could not be written
    // after the SET — within the round's per-node timeout, so that a node that hangs costs
    // the round its timeout once (a try_lock stays within it), not a release's timeout more.
    std::vector<char> needed(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        needed[i] = static_cast<char>(accepted(results[i]) || (results[i].unanswered && !results[i].undone));
    }
    release_on(token, needed, node_timeout(lease));
    // Keys of another type (a list at the name) refuse every round on their nodes: where too
    // few nodes are left for a majority, no round can ever win, and a wait would never end.
    std::string foreign;
    std::size_t foreign_nodes = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if ((results[i].reply && reply_is_error(results[i].reply.get(), "WRONGTYPE")) ||
            (results[i].failure && results[i].failure->value() == errc::wrong_type)) {
            foreign += (foreign.empty() ? "" : ", ") + nodes_[i]->ep.name;
            ++foreign_nodes;
        }
    }
    if (n - foreign_nodes < need) {
        throw error(errc::wrong_type, name_, foreign,
                    "the key holds another type than a lock's string on " + std::to_string(foreign_nodes) +
                        " of " + std::to_string(n) + " nodes, which leaves no majority; nothing was changed");
    }
    out.unreachable = n - failed < need;
    if (out.unreachable) {
        out.detail = "fewer than " + std::to_string(need) + " of " + std::to_string(n) +
                     " nodes could be asked: " + describe(results);
    }
    return out;
}

RLOCK_DECL std::chrono::milliseconds red_site::retry_pause() const {
    return std::chrono::milliseconds(
        random_between(1, std::max<long long>(1, options_.retry_delay.count())));
}

RLOCK_DECL bool red_site::gives_up(const round& r, clock::time_point deadline) const {
    const bool bounded = deadline != clock::time_point::max();
    const bool over = bounded && clock::now() >= deadline;
    if (r.unreachable && (!bounded || over))
        throw error(errc::quorum_not_reached, name_, servers_, r.detail);
    return over;
}

RLOCK_DECL auto red_site::release(std::uint64_t owner, bool keep_verdict) const -> released {
    const bool was_lost = lost(owner);  // read before the holds leave the registries
    std::string token;
    std::shared_ptr<hold_group> group;
    bool watched = false;
    clock::time_point taken;
    for (client_core* n : nodes_) {
        if (auto h = n->reg.find(&red_lock_info, name_, owner)) {
            token = h->value;
            group = h->group;
            watched = h->watched;
            taken = h->taken;
            n->reg.remove(h, false);  // a hung node's renewal must not hold the unlock up
        }
    }
    if (token.empty()) {
        throw error(errc::not_owner, name_, servers_,
                    "unlock by a thread that does not hold the red_lock");
    }
    // Told when it returns, after any loss it finds (the listener is the first node's client's).
    struct tell_released {
        const red_site& site;
        std::uint64_t id = 0;
        clock::time_point taken{};
        ~tell_released() {
            site.nodes_.front()->events.released(red_lock_info.name, site.name_, id, taken);
        }
    } told{*this, group ? group->id : 0, taken};
    released out;
    std::size_t may_hold = 0;         // unanswered, or refused: may still hold our key
    std::optional<error> refused;     // the first node that answered with an error
    std::optional<error> unanswered;  // the first node that could not be asked or answer
    const std::vector<node_result> results = release_all(token);
    // Then after the acquire on the late nodes' own connections: a node that runs it (paused
    // until now) releases there what it takes late; one that ran the acquire long ago was
    // counted above, and finds nothing here.
    if (group) release_after_late(*group, token);
    for (std::size_t i = 0; i < results.size(); ++i) {
        const node_result& r = results[i];
        long long left = -1, woken = 0;
        if (read_release(r.reply.get(), left, woken) && left == 0) {
            ++out.nodes;
        } else if (r.reply && r.reply->type == REDIS_REPLY_ERROR) {
            // Refused (an ACL, OOM, a script error): not "not held", and our key is still
            // there as far as we know; the owner hears the error itself.
            ++may_hold;
            if (!refused) refused = make_error(nullptr, r.reply.get(), name_, nodes_[i]->ep.name);
        }
        if (r.failure) {  // paused, slow or unreachable: may still hold our key
            ++may_hold;
            if (!unanswered) unanswered = r.failure;
        }
    }
    // Reported here, once, as basic_lock's unlock reports a lost hold: a watched hold whose
    // validity ran out before any watchdog tick said so (the process was paused, say), and
    // any hold still in its validity that fewer than a majority of nodes still had at
    // unlock: its key was deleted or a node lost its data (a holder with a bare majority
    // loses it to one FLUSHALL or restart), and another client may have held the lock
    // meanwhile. A node that did not answer in time is not evidence of that (it may be
    // paused with our key, which then expires with its lease): only nodes that answered
    // "not held" count against the hold. Only a leased hold past its validity is expected
    // to be gone.
    const bool expected = was_lost && !watched;
    const bool short_of_quorum = out.nodes + may_hold < quorum() && !expected;
    // Nodes that released our key or answered "not held" are free for the next holder; the
    // lock stays closed to everyone (until our lease ends) only when too few are for a
    // majority. A hold on a bare majority one of whose nodes hangs at unlock leaves its key
    // there, and that blocks nobody: the other nodes make a majority.
    const bool kept_closed = may_hold + quorum() > nodes_.size();
    // Told lost before (by a renewal, or a lease check): the verdict is final, whatever the
    // release found. Marked before anyone is told: an on_lock_lost handler that asks lost()
    // sees it.
    const bool told_before = group && group->told.load();
    auto lost_now = [&] {
        out.lost = true;
        if (keep_verdict) lost_at_unlock_.mark(owner);
    };
    if (told_before) lost_now();
    if (refused && kept_closed && !short_of_quorum && !expected && group) {
        // Kept closed because nodes refused: told as their error (the keys they kept end
        // with their lease), as a refused mutex unlock is.
        lost_now();
        registry::tell_group(*group, "its unlock was refused: " + error_access::brief(*refused),
                             refused->value());
    } else if (((was_lost && watched) || short_of_quorum) && group) {
        lost_now();
        registry::tell_group(
            *group, short_of_quorum ? "at unlock only " + std::to_string(out.nodes) + " of " +
                                          std::to_string(nodes_.size()) +
                                          " nodes still held it (a majority is " +
                                          std::to_string(quorum()) + ")"
                                    : std::string("its validity ran out before it was unlocked"));
    } else if (unanswered && kept_closed && !expected && group) {
        // Not released because nodes did not answer (paused, partitioned): our key may stay
        // there until its lease ends, keeping everyone out. The owner is
        // told, with the cause, as a mutex unlock that cannot reach Redis is; unlock()
        // itself does not throw (it runs in guards' destructors).
        lost_now();
        registry::tell_group(
            *group,
            "its unlock released it on only " + std::to_string(out.nodes) + " of " +
                std::to_string(nodes_.size()) + " nodes (a majority is " +
                std::to_string(quorum()) +
                "); the others may keep it until its lease ends: " + unanswered_nodes(results),
            unanswered->value());
    }
    return out;
}

RLOCK_DECL auto red_site::validity_end(std::uint64_t owner) const
    -> std::optional<clock::time_point> {
    std::vector<clock::time_point> alive;
    bool any = false;
    std::chrono::milliseconds lease{0};
    for (client_core* n : nodes_) {
        auto h = n->reg.find(&red_lock_info, name_, owner);
        if (!h) continue;
        any = true;
        lease = h->lease;
        if (n->reg.is_lost(*h)) continue;
        const auto confirmed = n->reg.with([&] {
            return h->unconfirmed ? std::optional<clock::time_point>() : h->expires;
        });
        if (confirmed) alive.push_back(*confirmed);
    }
    if (!any) return std::nullopt;
    if (alive.size() < quorum()) return clock::time_point{};
    std::sort(alive.begin(), alive.end(), std::greater<>());
    return alive[quorum() - 1] - drift(lease);
}

RLOCK_DECL std::uint64_t red_site::hold_id(std::uint64_t owner) const {
    for (client_core* n : nodes_) {
        if (auto h = n->reg.find(&red_lock_info, name_, owner)) {
            if (auto group = n->reg.with([&] { return h->group; })) return group->id;
        }
    }
    throw error(errc::not_owner, name_, servers_, "this thread holds no such red_lock");
}

RLOCK_DECL std::chrono::milliseconds red_site::drift(std::chrono::milliseconds lease) const {
    return std::chrono::milliseconds(static_cast<long long>(static_cast<double>(lease.count()) *
                                                            options_.clock_drift_factor)) +
           std::chrono::milliseconds(2);
}

RLOCK_DECL std::chrono::milliseconds red_site::node_timeout(std::chrono::milliseconds lease) const {
    return std::max(std::chrono::milliseconds(10),
                    std::chrono::milliseconds(static_cast<long long>(
                        static_cast<double>(lease.count()) * options_.node_timeout_fraction)));
}

RLOCK_DECL std::vector<node_result> red_site::release_all(const std::string& token) const {
    return fan_out(
        nodes_, name_, [&](std::size_t, script_call& call) { call = release_call(token); },
        node_timeout(std::chrono::milliseconds(
            std::max<long long>(1000, nodes_.front()->ep.options.command_timeout.count()))));
}

RLOCK_DECL void red_site::release_after_late(hold_group& group, const std::string& token) const {
    std::vector<std::pair<std::size_t, context_ptr>> late;
    {
        std::lock_guard<std::mutex> g(group.late_mu);
        late.swap(group.late);
    }
    for (auto& [i, ctx] : late) {
        script_call call = release_call(token);
        (void)write_after(connection{ctx.get(), false, nodes_[i]->ep.sharded_pubsub}, call);
        // Replies the node sent meanwhile are read and dropped, so that the close is an
        // orderly one (a socket closed with unread data resets the connection).
        char sink[4096];
        while (::recv(ctx->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
    }
}

RLOCK_DECL void red_site::release_on(const std::string& token, const std::vector<char>& needed,
                                     std::chrono::milliseconds per_node) const {
    std::vector<client_core*> some;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
        if (needed[i]) some.push_back(nodes_[i]);
    }
    if (some.empty()) return;
    (void)fan_out(some, name_, [&](std::size_t, script_call& call) { call = release_call(token); }, per_node);
}

RLOCK_DECL std::string red_site::unanswered_nodes(const std::vector<node_result>& results) const {
    std::string m;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (!results[i].failure) continue;
        if (!m.empty()) m += "; ";
        m += nodes_[i]->ep.name + " " + results[i].failure->cause();
    }
    return m;
}

RLOCK_DECL bool red_site::took(const redisReply* r) noexcept {
    // {1, token} from the acquire script: set.
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == 1;
}

RLOCK_DECL std::string red_site::describe(const std::vector<node_result>& results) const {
    std::string m;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (!m.empty()) m += "; ";
        m += nodes_[i]->ep.name + " ";
        const auto& r = results[i];
        if (r.abandoned) {
            m += "not waited for (the round was decided without it)";
        } else if (r.failure) {
            m += "failed: ";
            m += r.failure->cause();
        } else if (took(r.reply.get())) {
            m += "accepted";
        } else if (r.reply && r.reply->type == REDIS_REPLY_ERROR) {
            m += "failed: ";
            m += reply_text(r.reply.get());
        } else {
            m += "refused (held by another)";
        }
    }
    return m;
}

RLOCK_DECL try_result red_acquisition::attempt(try_phase) {
    ++tries_;
    // A round ends by the wait's deadline (try_lock_for(100ms) with a node paused and the
    // per-node timeout at 1.5 s took 1.5 s): its nodes are waited for until then, at least
    // 10 ms (node_timeout's floor). A round with no time left (try_lock(), a last round at
    // the deadline) waits the whole per-node timeout: one round is always made.
    std::chrono::milliseconds at_most = std::chrono::milliseconds::max();
    const clock::time_point now = clock::now();
    if (deadline_ > now) {
        at_most = std::max(std::chrono::milliseconds(10),
                           std::chrono::ceil<std::chrono::milliseconds>(deadline_ - now));
    }
    red_site::round r = site_.try_once(owner_, lease_, watched_, at_most);
    if (r.held) {
        held_ = std::move(r.held);
        return {true, {}};
    }
    (void)site_.gives_up(r, deadline_);
    last_ = std::move(r);
    try_result t;
    t.hint.ttl = -3;  // no holder to wait out: the unlock message, or the next round
    t.hint.again = clock::now() + site_.retry_pause();
    return t;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
