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
// and a round ends as soon as a majority for or against is certain. A failed round releases on
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
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rlock/client.hpp"
#include "rlock/detail/basic_lock.hpp"
#include "rlock/detail/fan_out.hpp"
#include "rlock/detail/mutex_kind.hpp"
#include "rlock/detail/random.hpp"
#include "rlock/detail/timed_lockable.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock {

/// Options of a red_lock.
struct red_lock_options {
    double clock_drift_factor = 0.01;     ///< drift = lease * factor + 2 ms
    double node_timeout_fraction = 0.05;  ///< per-node timeout, as a fraction of the lease
    std::chrono::milliseconds retry_delay{50};  ///< longest random delay between rounds
};

namespace detail {
inline const kind_info red_lock_info{"red_lock", &mutex_kind::renew_script};
}  // namespace detail

/// lock() blocks until held (watched); with a lease, the hold's validity is the lease minus the
/// time the round took minus the drift, never renewed. try_lock() is one round on every node:
/// true when a majority accepted in time, false otherwise (the partial holds are released on
/// every node first); it blocks for at most one round (the per-node timeout). try_lock_for()
/// and try_lock_until() run rounds with a random pause between them until held or the deadline
/// (steady_clock; a deadline on another clock is converted once, so later wall-clock jumps do
/// not move it). All of them (timed_lockable) throw would_deadlock (this thread holds it),
/// invalid_argument for a lease not positive or over 100 years (nothing sent), and
/// quorum_not_reached with each node's answer when too many nodes failed (not merely refused):
/// lock() at once, the others when their deadline passes.
class red_lock : public detail::timed_lockable<red_lock> {
    using clock = std::chrono::steady_clock;

public:
    /// Names a lock over `nodes` (each a client of an independent master; any N >= 1, odd
    /// recommended). Sends nothing. Throws `error` (invalid_argument) for no nodes, a null
    /// client, the same client twice, an empty name or nonsense options.
    red_lock(const std::vector<client*>& nodes, std::string name, red_lock_options options = {})
        : name_(std::move(name)), options_(options) {
        auto bad = [&](const std::string& why) { throw error(errc::invalid_argument, name_, "", why); };
        if (name_.empty()) bad("lock name is empty");
        if (nodes.empty()) bad("a red_lock needs at least one node");
        if (!(options_.clock_drift_factor >= 0 && options_.clock_drift_factor < 1)) bad("clock_drift_factor must be in [0, 1)");
        if (!(options_.node_timeout_fraction > 0 && options_.node_timeout_fraction < 1)) bad("node_timeout_fraction must be in (0, 1)");
        for (client* c : nodes) {
            if (!c) bad("a node is null");
            detail::client_core* core = &detail::client_access::core(*c);
            if (std::find(nodes_.begin(), nodes_.end(), core) != nodes_.end()) bad("the same client is given twice");
            nodes_.push_back(core);
            owners_.push_back(core->shared_from_this());
        }
        keys_.name = name_;
        keys_.channel = detail::prefixed_key(detail::mutex_kind::channel_prefix, name_);
    }
    red_lock(const red_lock&) = delete;
    red_lock& operator=(const red_lock&) = delete;

    /// Nodes that must accept for a hold: N/2 + 1. Never blocks or throws.
    std::size_t quorum() const noexcept { return nodes_.size() / 2 + 1; }
    /// Number of nodes N. Never blocks or throws.
    std::size_t size() const noexcept { return nodes_.size(); }
    /// The lock's name (the key on every node). Never blocks or throws.
    const std::string& name() const noexcept { return name_; }

    /// Releases on every node in parallel (the renewals stop first); returns on how many nodes
    /// our key was deleted. Throws not_owner only to a thread that does not hold it; never
    /// throws for unreachable nodes. A majority of nodes answering "not held" (a node lost its
    /// data, a key was deleted) means the hold was lost: on_lock_lost hears of it, once. A node
    /// that does not answer in time is left to expire our key with its lease, not reported.
    std::size_t unlock() {
        const std::uint64_t thread = detail::current_thread_number();
        const bool was_lost = lost();  // read before the holds leave the registries
        std::string token;
        std::shared_ptr<detail::hold_group> group;
        bool watched = false;
        for (detail::client_core* n : nodes_) {
            if (auto h = n->reg.find(&detail::red_lock_info, name_, thread)) {
                token = h->value;
                group = h->group;
                watched = h->watched;
                n->reg.remove(h);
            }
        }
        if (token.empty()) {
            throw error(errc::not_owner, name_, "", "unlock by a thread that does not hold the red_lock");
        }
        std::size_t released = 0, unanswered = 0;
        for (const auto& r : release_all(token)) {
            if (r.reply && r.reply->type == REDIS_REPLY_INTEGER && r.reply->integer == 0) ++released;
            if (r.failure) ++unanswered;  // paused, slow or unreachable: may still hold our key
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
        const bool short_of_quorum = released + unanswered < quorum() && !expected;
        if (((was_lost && watched) || short_of_quorum) && group) {
            detail::registry::tell_group(
                *group, short_of_quorum ? "at unlock only " + std::to_string(released) + " of " +
                                              std::to_string(nodes_.size()) +
                                              " nodes still held it (a majority is " +
                                              std::to_string(quorum()) + ")"
                                        : std::string("its validity ran out before it was unlocked"));
        }
        return released;
    }

    /// This thread's hold is lost: more than N - quorum of its node holds are gone, or the
    /// validity left on a majority has run out by this client's clock. No round trip.
    [[nodiscard]] bool lost() const {
        const auto valid = validity_end();
        return valid && clock::now() >= *valid;
    }

    /// The validity this thread's hold has left (zero when lost or not held).
    [[nodiscard]] std::chrono::milliseconds remaining_lease() const {
        const auto valid = validity_end();
        if (!valid) return std::chrono::milliseconds(0);
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*valid - clock::now());
        return std::max(left, std::chrono::milliseconds(0));
    }

    /// The calling thread's hold's id: unique in the process, kept across re-entries, and the
    /// `hold_id` on_lock_lost is told when this hold is lost (lost_hold; once for the whole
    /// red_lock, whichever nodes lost it). Throws `error` (not_owner) when this thread holds no
    /// such red_lock. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const {
        const std::uint64_t thread = detail::current_thread_number();
        for (detail::client_core* n : nodes_) {
            if (auto h = n->reg.find(&detail::red_lock_info, name_, thread)) {
                if (auto group = n->reg.with([&] { return h->group; })) return group->id;
            }
        }
        throw error(errc::not_owner, name_, "", "this thread holds no such red_lock");
    }

    /// The calling thread holds it and its validity has not run out (no round trip).
    [[nodiscard]] bool is_held_by_current_thread() const {
        const auto valid = validity_end();
        return valid && clock::now() < *valid;
    }

private:
    std::chrono::milliseconds drift(std::chrono::milliseconds lease) const {
        return std::chrono::milliseconds(static_cast<long long>(
                   static_cast<double>(lease.count()) * options_.clock_drift_factor)) +
               std::chrono::milliseconds(2);
    }

    std::chrono::milliseconds node_timeout(std::chrono::milliseconds lease) const {
        return std::max(std::chrono::milliseconds(10),
                        std::chrono::milliseconds(static_cast<long long>(
                            static_cast<double>(lease.count()) * options_.node_timeout_fraction)));
    }

    // The end of this thread's validity: the quorum-th latest node expiry minus drift, over the
    // node holds not lost. Empty when the thread holds nothing; the epoch when too few remain.
    std::optional<clock::time_point> validity_end() const {
        const std::uint64_t thread = detail::current_thread_number();
        std::vector<clock::time_point> alive;
        bool any = false;
        std::chrono::milliseconds lease{0};
        for (detail::client_core* n : nodes_) {
            auto h = n->reg.find(&detail::red_lock_info, name_, thread);
            if (!h) continue;
            any = true;
            lease = h->lease;
            if (!n->reg.is_lost(*h)) alive.push_back(n->reg.with([&] { return h->expires; }));
        }
        if (!any) return std::nullopt;
        if (alive.size() < quorum()) return clock::time_point{};
        std::sort(alive.begin(), alive.end(), std::greater<>());
        return alive[quorum() - 1] - drift(lease);
    }

    std::vector<detail::node_result> release_all(const std::string& token) {
        return detail::fan_out(
            nodes_, name_,
            [&](std::size_t, detail::script_call& call) {
                call = detail::script_call(detail::mutex_kind::release_script(), {keys_.name},
                                           {token, keys_.channel});
            },
            node_timeout(std::chrono::milliseconds(
                std::max<long long>(1000, nodes_.front()->ep.options.command_timeout.count()))));
    }

    std::string describe(const std::vector<detail::node_result>& results) const {
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
            } else if (r.reply && r.reply->type == REDIS_REPLY_STATUS) {
                m += "accepted";
            } else if (r.reply && r.reply->type == REDIS_REPLY_ERROR) {
                m += "failed: ";
                m += detail::reply_text(r.reply.get());
            } else {
                m += "refused (held by another)";
            }
        }
        return m;
    }

    friend class detail::timed_lockable<red_lock>;
    std::string_view server() const noexcept { return ""; }  // one per node: named in messages

    // timed_lockable's entry point (see there). lock() (deadline max) gives up at once when
    // too few nodes can be asked; a bounded wait keeps trying until its deadline.
    bool acquire(clock::time_point deadline, std::chrono::milliseconds lease) {
        const bool bounded = deadline != clock::time_point::max();
        const std::uint64_t thread = detail::current_thread_number();
        for (detail::client_core* n : nodes_) {
            n->throw_if_destroyed(name_, "the client of this node has been destroyed");
        }
        for (detail::client_core* n : nodes_) {
            if (n->reg.find(&detail::red_lock_info, name_, thread)) {
                throw error(errc::would_deadlock, name_, n->ep.name,
                            "this thread already holds the red_lock, which is not reentrant");
            }
        }
        const bool watched = lease.count() == 0;
        if (watched) lease = nodes_.front()->ep.options.lock_watchdog_timeout;
        const std::string lease_text = std::to_string(lease.count());
        const std::size_t need = quorum(), n = nodes_.size();
        std::optional<detail::subscriber::subscription> sub;
        for (;;) {
            const std::string token = detail::random_token();
            const auto start = clock::now();
            auto accepted = [](const detail::node_result& r) {
                return r.reply && r.reply->type == REDIS_REPLY_STATUS;
            };
            auto results = detail::fan_out(
                nodes_, name_,
                [&](std::size_t, detail::script_call& call) {
                    call = detail::mutex_kind::set_command(name_, token, lease_text);
                },
                node_timeout(lease), [&](const std::vector<detail::node_result>& so_far) {
                    std::size_t yes = 0, no = 0;
                    for (const auto& r : so_far) {
                        if (accepted(r)) {
                            ++yes;
                        } else if (r.reply || r.failure) {
                            ++no;
                        }
                    }
                    return yes >= need || no > n - need;
                });
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
            const auto validity = lease - std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start) - drift(lease);
            if (got.size() >= need && validity.count() > 0) {
                auto group = std::make_shared<detail::hold_group>();
                group->name = name_;
                group->tolerance = static_cast<int>(n - need);
                group->tell = nodes_.front()->ep.options.on_lock_lost;
                const detail::hold_terms terms{
                    lease, watched ? detail::renewal::watched : detail::renewal::leased, start};
                for (std::size_t i : got) {
                    nodes_[i]->add_hold(detail::red_lock_info, name_, token, thread, terms, 0, group);
                }
                // Nodes that did not accept count as lost from the start.
                group->lost_parts = static_cast<int>(n - got.size());
                return true;
            }
            // Failed round: undo on every node, answered or not (a reply may have been lost).
            release_all(token);
            const std::string detail_text = describe(results);
            const bool unreachable = n - failed < need;
            if (unreachable && !bounded) {
                throw error(errc::quorum_not_reached, name_, "",
                            "fewer than " + std::to_string(need) + " of " + std::to_string(n) +
                                " nodes could be asked: " + detail_text);
            }
            const auto now = clock::now();
            if (bounded && now >= deadline) {
                if (unreachable) {
                    throw error(errc::quorum_not_reached, name_, "",
                                "fewer than " + std::to_string(need) + " of " + std::to_string(n) +
                                    " nodes could be asked: " + detail_text);
                }
                return false;
            }
            // Redlock's random delay between rounds (so competing clients do not retry in
            // lockstep), cut short by an unlock message from the first node.
            if (!sub) sub.emplace(*nodes_.front()->sub, keys_.channel);
            const auto seen = sub->generation();
            auto until = now + std::chrono::milliseconds(detail::random_between(
                                   1, std::max<long long>(1, options_.retry_delay.count())));
            if (bounded) until = std::min(until, deadline);
            sub->wait(seen, until);
        }
    }

    std::vector<detail::client_core*> nodes_;
    // Keep each node's core alive as basic_lock does: a client destroyed before this red_lock
    // leaves a core whose threads have stopped, which acquire() refuses to use.
    std::vector<std::shared_ptr<detail::client_core>> owners_;
    std::string name_;
    red_lock_options options_;
    detail::lock_keys keys_;
};

}  // namespace rlock
