// rlock::red_lock — the Redlock algorithm over N independent Redis masters.
//
//     rlock::client a("redis://10.0.0.1"), b("redis://10.0.0.2"), c("redis://10.0.0.3");
//     rlock::red_lock lock({&a, &b, &c}, "reports");
//     std::lock_guard<rlock::red_lock> guard(lock);
//
// The same random token is SET NX PX on every node (the rlock::mutex layout, so a red_lock and
// a mutex on one of the nodes exclude each other there). The lock is held when a majority
// (N/2 + 1) accepted and the validity left — lease - elapsed - drift, drift = lease *
// clock_drift_factor + 2 ms, measured on steady_clock — is still positive. remaining_lease()
// reports that validity.
//
// Acquisition is parallel: the request is written to every node first and the replies are read
// together (poll), so a round costs about the slowest node, not the sum; each node has its own
// timeout (node_timeout_fraction of the lease, at least 10 ms), so a dead node costs that once,
// and a round ends as soon as a majority for or against is certain. A node without an open
// connection is dialled on a thread of its own meanwhile: one that hangs (paused, or behind a
// port that drops packets) costs the round its per-node timeout, never the others their turn. A failed round releases on
// every node, including those that refused or did not answer (a reply may have been lost), then
// waits a random delay up to retry_delay (cut short by an unlock message from the first node)
// while the wait allows.
//
// A watched red_lock is renewed by each node's own client watchdog (batched with that client's
// other holds); it stays held while more than half of the nodes keep it, and its owner is told
// once (the first client's on_lock_lost) when too few do.
//
// Errors: a round in which fewer than a majority of nodes could even be asked or answered ends
// lock() with `errc::quorum_not_reached`, and try_lock_for / try_lock_until with the same error
// when their wait runs out that way; the message lists each node: accepted, refused, or failed
// and why. A lock simply held by someone else makes try_* return false.
//
// What Redlock does not promise — process pauses, clock jumps, restarts without fsync — is in
// docs/guarantees.md; use fencing tokens (on a single node) where correctness depends on it.
#pragma once

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/acquisition/red_site.hpp"
#include "rlock/detail/front/async_lockable.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/waiting/multi_parts.hpp"
#include "rlock/detail/waiting/red_wait.hpp"
#include "rlock/detail/waiting/wait_blocking.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"
#include "rlock/options.hpp"

namespace rlock {


/// lock() blocks until held (watched); with a lease, the hold's validity is the lease minus the
/// time the round took minus the drift, never renewed. try_lock() is one round on every node:
/// true when a majority accepted in time, false otherwise (the partial holds are released on
/// every node first); it blocks for at most one round (the per-node timeout). try_lock_for()
/// and try_lock_until() run rounds with a random pause between them until held or the deadline
/// (steady_clock; a deadline on another clock is converted once, so later wall-clock jumps do
/// not move it). All of them (timed_lockable) throw would_deadlock (this thread holds it),
/// invalid_argument for a lease not positive, over 100 years or no longer than the clock drift
/// allowed for it (no round could leave it validity; nothing sent), and
/// quorum_not_reached with each node's answer when too many nodes failed (not merely refused):
/// lock() at once, the others when their deadline passes.
///
/// The asynchronous forms (async_lockable: async_lock, async_try_lock, async_try_lock_for,
/// async_try_lock_until, with a lease and an rlock::owner) run the same rounds on the first
/// node's engine thread and complete with an rlock::hold; unlocking it releases on every node
/// as unlock() does, and its lost() is this class's. A red_lock is not reentrant: an owner's
/// second acquire completes with would_deadlock.
class red_lock : public detail::timed_lockable<red_lock>, public detail::async_lockable<red_lock> {
    using clock = std::chrono::steady_clock;

public:
    /// Names a lock over `nodes` (each a client of an independent master; any N >= 1, odd
    /// recommended). Sends nothing. Throws `error` (invalid_argument) for no nodes, a null
    /// client, the same client twice, an empty name or nonsense options.
    red_lock(const std::vector<client*>& nodes, std::string name, red_lock_options options = {})
        : site_(std::make_shared<const detail::red_site>(cores_of(nodes), std::move(name), options)) {}
    red_lock(const red_lock&) = delete;
    red_lock& operator=(const red_lock&) = delete;

    /// Nodes that must accept for a hold: N/2 + 1. Never blocks or throws.
    std::size_t quorum() const noexcept { return site_->quorum(); }
    /// Number of nodes N. Never blocks or throws.
    std::size_t size() const noexcept { return site_->size(); }
    /// The lock's name (the key on every node). Never blocks or throws.
    const std::string& name() const noexcept { return site_->name(); }

    /// Releases on every node in parallel (the renewals stop first); returns on how many nodes
    /// our key was deleted. Throws not_owner only to a thread that does not hold it; never
    /// throws for unreachable nodes. A majority of nodes answering "not held" (a node lost its
    /// data, a key was deleted) means the hold was lost: on_lock_lost hears of it, once. A
    /// release that leaves our key (on nodes that did not answer in time, until its lease ends)
    /// where it keeps everyone from a majority is told too, with the cause (timeout,
    /// connection_failed); a key left on a minority keeps nobody out and is not told.
    std::size_t unlock() { return site_->release(detail::current_thread_number()).nodes; }

    /// This thread's hold is lost: more than N - quorum of its node holds are gone, or the
    /// validity left on a majority has run out by this client's clock. Also true after this
    /// thread's unlock found its hold lost (it was told through on_lock_lost), until this
    /// thread takes the red_lock again. No round trip.
    [[nodiscard]] bool lost() const { return site_->lost(detail::current_thread_number()); }

    /// The validity this thread's hold has left (zero when lost or not held).
    [[nodiscard]] std::chrono::milliseconds remaining_lease() const;

    /// The calling thread's hold's id: unique in the process, kept across re-entries, and the
    /// `hold_id` on_lock_lost is told when this hold is lost (lost_hold; once for the whole
    /// red_lock, whichever nodes lost it). Throws `error` (not_owner) when this thread holds no
    /// such red_lock. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const { return site_->hold_id(detail::current_thread_number()); }

    /// The calling thread holds it and its validity has not run out (no round trip).
    [[nodiscard]] bool is_held_by_current_thread() const;

private:
    friend class detail::timed_lockable<red_lock>;
    friend class detail::async_lockable<red_lock>;
    friend struct detail::part_access;  // a multi_lock part (as_part)
    std::string_view server() const noexcept { return site_->servers(); }  // every node

    static std::vector<detail::client_core*> cores_of(const std::vector<client*>& nodes);

    // timed_lockable's entry point (see there). lock() (deadline max) gives up at once when
    // too few nodes can be asked; a bounded wait keeps trying until its deadline, and then
    // throws quorum_not_reached if its last round could not ask a majority.
    bool acquire(detail::wait_call call, detail::lease_request lease);

    // async_lockable's entry point (async_lockable.hpp).
    template <class Token>
    auto start_async(detail::wait_call call, detail::lease_request lease, std::uint64_t owner, Token&& token) {
        return detail::start_with(async_starter(), call, lease, owner, std::forward<Token>(token));
    }

    // This red_lock as a multi_lock part: ordered by name; its node holds are a group of their
    // own (it is told as its own red_lock).
    detail::part_view as_part() const;

    // What starts an asynchronous acquire of this red_lock, sharing its site (multi_lock keeps
    // one per part).
    detail::async_start async_starter() const;

    std::shared_ptr<const detail::red_site> site_;
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL std::chrono::milliseconds red_lock::remaining_lease() const {
    const auto valid = site_->validity_end(detail::current_thread_number());
    if (!valid) return std::chrono::milliseconds(0);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*valid - clock::now());
    return std::max(left, std::chrono::milliseconds(0));
}

RLOCK_DECL bool red_lock::is_held_by_current_thread() const {
    const auto valid = site_->validity_end(detail::current_thread_number());
    return valid && clock::now() < *valid;
}

RLOCK_DECL std::vector<detail::client_core*> red_lock::cores_of(const std::vector<client*>& nodes) {
    std::vector<detail::client_core*> cores;
    cores.reserve(nodes.size());
    for (client* c : nodes) cores.push_back(c ? &detail::client_access::core(*c) : nullptr);
    return cores;
}

RLOCK_DECL bool red_lock::acquire(detail::wait_call call, detail::lease_request lease) {
    const clock::time_point deadline = call.deadline;
    const std::uint64_t thread = detail::current_thread_number();
    site_->check_acquire(thread);
    site_->check_lease(lease);
    // Rounds until one holds, each after Redlock's random delay or an unlock message from
    // the first node, whichever comes first (wait_blocking).
    detail::client_core& first = *site_->nodes().front();  // its listener is told
    detail::wait_story story = first.events.begin(call.began);
    detail::red_acquisition op(*site_, thread, lease, deadline);
    const bool won = detail::wait_blocking(first, op, deadline, detail::repeat::safe);
    story.tries = op.tries();
    if (won) {
        first.events.acquired(detail::red_lock_info.name, name(), op.held()->group->id, story);
        return true;
    }
    (void)site_->gives_up(op.last(), deadline);  // throws when the quorum was out of reach
    first.events.wait_ended(detail::red_lock_info.name, name(), story, /*cancelled=*/false);
    return false;
}

RLOCK_DECL detail::part_view red_lock::as_part() const {
    detail::part_view v;
    for (const detail::client_core* n : site_->nodes()) v.where.push_back(n->ep.name);
    v.clients = site_->nodes();
    v.starter = [this] { return async_starter(); };
    return v;
}

RLOCK_DECL detail::async_start red_lock::async_starter() const {
    return [s = site_](detail::wait_call call, detail::lease_request lease, std::uint64_t owner,
                       detail::completion done) {
        detail::client_core& first = *s->nodes().front();
        first.throw_if_destroyed(s->name(),
                                 "the client of the red_lock's first node has been destroyed");
        s->check_lease(lease);
        auto op = std::make_shared<detail::red_acquire>(
            s, detail::waits_of(first), call, lease,
            owner != 0 ? owner : detail::next_owner_number(), std::move(done));
        if (!first.eng.post([op] { op->start(); })) {
            throw error(errc::connection_failed, s->name(), first.ep.name,
                        "the client of the red_lock's first node has been destroyed");
        }
        return rlock::pending(op);
    };
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
