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
#include <optional>
#include <string>
#include <vector>

#include "rlock/client.hpp"
#include "rlock/detail/async_lock.hpp"
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

/// What a red_lock is apart from any thread: its nodes, name and options, with one round, one
/// release and the validity of a hold, each for an owner (a thread's number, or an
/// rlock::owner's). The red_lock shares it with its asynchronous acquires and their holds
/// (held_site), which therefore outlive the red_lock object.
class red_site final : public held_site {
public:
    using clock = std::chrono::steady_clock;

    red_site(const std::vector<client*>& nodes, std::string name, red_lock_options options)
        : name_(std::move(name)), options_(options) {
        auto bad = [&](const std::string& why) { throw error(errc::invalid_argument, name_, "", why); };
        if (name_.empty()) bad("lock name is empty");
        if (nodes.empty()) bad("a red_lock needs at least one node");
        if (!(options_.clock_drift_factor >= 0 && options_.clock_drift_factor < 1)) bad("clock_drift_factor must be in [0, 1)");
        if (!(options_.node_timeout_fraction > 0 && options_.node_timeout_fraction < 1)) bad("node_timeout_fraction must be in (0, 1)");
        for (client* c : nodes) {
            if (!c) bad("a node is null");
            client_core* core = &client_access::core(*c);
            if (std::find(nodes_.begin(), nodes_.end(), core) != nodes_.end()) bad("the same client is given twice");
            nodes_.push_back(core);
            owners_.push_back(core->shared_from_this());
        }
        keys_.name = name_;
        keys_.channel = prefixed_key(mutex_kind::channel_prefix, name_);
    }

    std::size_t quorum() const noexcept { return nodes_.size() / 2 + 1; }
    std::size_t size() const noexcept { return nodes_.size(); }
    const std::string& name() const noexcept { return name_; }
    const std::vector<client_core*>& nodes() const noexcept { return nodes_; }
    const red_lock_options& options() const noexcept { return options_; }
    const std::string& channel() const noexcept { return keys_.channel; }

    /// What one round came to.
    struct round {
        registry::hold_ptr held;  // the first node hold, when a majority accepted in time
        bool unreachable = false;  // fewer than a majority could even be asked or answered
        std::string detail;        // each node's answer, for quorum_not_reached
    };

    /// Throws what an acquire by `owner` must: connection_failed for a destroyed client,
    /// would_deadlock when `owner` holds the red_lock already.
    void check_acquire(std::uint64_t owner) const {
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

    /// One Redlock round for `owner`: a new token SET NX PX on every node in parallel. Held
    /// when a majority accepted and validity is left: the node holds are registered (one group,
    /// told once). Otherwise every node is released (a reply may have been lost).
    round try_once(std::uint64_t owner, std::chrono::milliseconds lease, bool watched) const {
        const std::string lease_text = std::to_string(lease.count());
        const std::size_t need = quorum(), n = nodes_.size();
        const std::string token = random_token();
        const auto start = clock::now();
        auto accepted = [](const node_result& r) { return r.reply && r.reply->type == REDIS_REPLY_STATUS; };
        auto results = fan_out(
            nodes_, name_,
            [&](std::size_t, script_call& call) { call = mutex_kind::set_command(name_, token, lease_text); },
            node_timeout(lease), [&](const std::vector<node_result>& so_far) {
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
        round out;
        const auto validity = lease - std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start) - drift(lease);
        if (got.size() >= need && validity.count() > 0) {
            auto group = std::make_shared<hold_group>();
            group->name = name_;
            group->tolerance = static_cast<int>(n - need);
            group->tell = nodes_.front()->ep.options.on_lock_lost;
            const hold_terms terms{lease, watched ? renewal::watched : renewal::leased, start};
            for (std::size_t i : got) {
                registry::hold_ptr h = nodes_[i]->add_hold(red_lock_info, name_, token, owner, terms, 0, group);
                if (!out.held) out.held = std::move(h);
            }
            // Nodes that did not accept count as lost from the start.
            group->lost_parts = static_cast<int>(n - got.size());
            return out;
        }
        release_all(token);  // a failed round: undo on every node, answered or not
        out.unreachable = n - failed < need;
        if (out.unreachable) {
            out.detail = "fewer than " + std::to_string(need) + " of " + std::to_string(n) +
                         " nodes could be asked: " + describe(results);
        }
        return out;
    }

    /// Redlock's random delay before the next round (so competing clients do not retry in
    /// lockstep).
    std::chrono::milliseconds retry_pause() const {
        return std::chrono::milliseconds(random_between(1, std::max<long long>(1, options_.retry_delay.count())));
    }

    /// After a round that did not hold: whether the acquire ends now, empty (its deadline has
    /// passed; `deadline` max: no deadline). Throws quorum_not_reached when too few nodes could
    /// be asked: at once without a deadline, at the deadline with one.
    bool gives_up(const round& r, clock::time_point deadline) const {
        const bool bounded = deadline != clock::time_point::max();
        const bool over = bounded && clock::now() >= deadline;
        if (r.unreachable && (!bounded || over)) throw error(errc::quorum_not_reached, name_, "", r.detail);
        return over;
    }

    /// What releasing `owner`'s hold came to.
    struct released {
        std::size_t nodes = 0;  // on how many nodes our key was deleted
        bool lost = false;      // the hold was found lost (its owner was told)
    };

    /// Releases `owner`'s hold on every node in parallel (the renewals stop first). Throws
    /// not_owner when `owner` holds none; never throws for unreachable nodes. A majority of
    /// nodes answering "not held" (a node lost its data, a key was deleted) means the hold was
    /// lost: on_lock_lost hears of it, once. A node that does not answer in time may keep our
    /// key until its lease ends: when fewer than a majority released it, the owner is told.
    released release(std::uint64_t owner) const {
        const bool was_lost = lost(owner);  // read before the holds leave the registries
        std::string token;
        std::shared_ptr<hold_group> group;
        bool watched = false;
        for (client_core* n : nodes_) {
            if (auto h = n->reg.find(&red_lock_info, name_, owner)) {
                token = h->value;
                group = h->group;
                watched = h->watched;
                n->reg.remove(h);
            }
        }
        if (token.empty()) {
            throw error(errc::not_owner, name_, "", "unlock by a thread that does not hold the red_lock");
        }
        released out;
        std::size_t may_hold = 0;  // unanswered, or refused: may still hold our key
        std::optional<error> refused;  // the first node that answered with an error
        std::optional<error> unanswered;  // the first node that could not be asked or answer
        const std::vector<node_result> results = release_all(token);
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
        if (refused && out.nodes < quorum() && !short_of_quorum && !expected && group) {
            // Not released on a majority because nodes refused: told as their error (the
            // keys they kept end with their lease), as a refused mutex unlock is.
            out.lost = true;
            registry::tell_group(*group, "its unlock was refused: " + error_access::brief(*refused),
                                 refused->value());
        } else if (((was_lost && watched) || short_of_quorum) && group) {
            out.lost = true;
            registry::tell_group(
                *group, short_of_quorum ? "at unlock only " + std::to_string(out.nodes) + " of " +
                                              std::to_string(nodes_.size()) +
                                              " nodes still held it (a majority is " +
                                              std::to_string(quorum()) + ")"
                                        : std::string("its validity ran out before it was unlocked"));
        } else if (unanswered && out.nodes < quorum() && !expected && group) {
            // Not released on a majority because nodes did not answer (paused, partitioned):
            // our key may stay there until its lease ends, keeping everyone out. The owner is
            // told, with the cause, as a mutex unlock that cannot reach Redis is; unlock()
            // itself does not throw (it runs in guards' destructors).
            out.lost = true;
            registry::tell_group(*group,
                                 "its unlock released it on only " + std::to_string(out.nodes) + " of " +
                                     std::to_string(nodes_.size()) + " nodes (a majority is " +
                                     std::to_string(quorum()) +
                                     "); the others may keep it until its lease ends: " + unanswered_nodes(results),
                                 unanswered->value());
        }
        return out;
    }

    /// The end of `owner`'s validity: the quorum-th latest node expiry minus drift, over the
    /// node holds not lost. Empty when it holds nothing; the epoch when too few remain.
    std::optional<clock::time_point> validity_end(std::uint64_t owner) const {
        std::vector<clock::time_point> alive;
        bool any = false;
        std::chrono::milliseconds lease{0};
        for (client_core* n : nodes_) {
            auto h = n->reg.find(&red_lock_info, name_, owner);
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
    bool lost(std::uint64_t owner) const {
        const auto valid = validity_end(owner);
        return valid && clock::now() >= *valid;
    }

    /// The id of `owner`'s hold (its group's); not_owner when it holds none.
    std::uint64_t hold_id(std::uint64_t owner) const {
        for (client_core* n : nodes_) {
            if (auto h = n->reg.find(&red_lock_info, name_, owner)) {
                if (auto group = n->reg.with([&] { return h->group; })) return group->id;
            }
        }
        throw error(errc::not_owner, name_, "", "this thread holds no such red_lock");
    }

    // held_site: an rlock::hold of a red_lock (its record is the first node hold; its owner
    // is the record's `thread`).
    void unlock_one(const std::shared_ptr<hold>& h, bool& lost_at_last) const override {
        lost_at_last = release(h->thread).lost;
    }
    registry& holds() const override { return nodes_.front()->reg; }
    bool is_lost(hold& h) const override { return lost(h.thread); }
    const std::string& lock_name() const override { return name_; }
    const std::string& server_name() const override { return nodes_.front()->ep.name; }
    bool fenced() const override { return false; }
    bool post(unique_callback<> task) const override { return nodes_.front()->eng.post(std::move(task)); }

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

    std::vector<node_result> release_all(const std::string& token) const {
        return fan_out(
            nodes_, name_,
            [&](std::size_t, script_call& call) {
                call = script_call(mutex_kind::release_script(), {keys_.name}, {token, keys_.channel});
            },
            node_timeout(std::chrono::milliseconds(
                std::max<long long>(1000, nodes_.front()->ep.options.command_timeout.count()))));
    }

    /// The nodes of a release that could not be asked or did not answer, with why.
    std::string unanswered_nodes(const std::vector<node_result>& results) const {
        std::string m;
        for (std::size_t i = 0; i < results.size(); ++i) {
            if (!results[i].failure) continue;
            if (!m.empty()) m += "; ";
            m += nodes_[i]->ep.name + " " + results[i].failure->cause();
        }
        return m;
    }

    std::string describe(const std::vector<node_result>& results) const {
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
                m += reply_text(r.reply.get());
            } else {
                m += "refused (held by another)";
            }
        }
        return m;
    }

    std::vector<client_core*> nodes_;
    // Keep each node's core alive as basic_lock does: a client destroyed before this red_lock
    // leaves a core whose threads have stopped, which an acquire refuses to use.
    std::vector<std::shared_ptr<client_core>> owners_;
    std::string name_;
    red_lock_options options_;
    lock_keys keys_;
};

/// One asynchronous red_lock acquire: rounds on the first node's engine thread, with Redlock's
/// random pause between them waited on a timer and cut short by an unlock message from the
/// first node (as a blocking round's pause is).
class red_acquire final : public cancellable, public std::enable_shared_from_this<red_acquire> {
    using clock = std::chrono::steady_clock;

public:
    red_acquire(std::shared_ptr<const red_site> site, clock::time_point deadline,
                std::chrono::milliseconds lease, std::uint64_t owner, completion_t<void(std::exception_ptr, rlock::hold)> done)
        : site_(std::move(site)), deadline_(deadline), lease_(lease), owner_(owner), done_(std::move(done)) {}

    /// The initiating task, and each round after it, on the first node's engine thread.
    void run_round() noexcept {
        if (settled_) return;
        engine& eng = site_->nodes().front()->eng;
        eng.cancel(timer_);
        timer_ = 0;
        try {
            if (eng.stopping()) {
                throw error(errc::connection_failed, site_->name(), "",
                            "the client of the red_lock's first node was destroyed while this "
                            "asynchronous acquire waited");
            }
            if (!started_) {
                site_->check_acquire(owner_);
                watched_ = lease_.count() == 0;
                if (watched_) lease_ = site_->nodes().front()->ep.options.lock_watchdog_timeout;
                started_ = true;
            } else {
                for (client_core* n : site_->nodes()) {
                    n->throw_if_destroyed(site_->name(), "the client of this node has been destroyed");
                }
            }
            if (sub_) sub_->throw_if_refused(site_->name(), site_->nodes().front()->ep.name);
            red_site::round r = site_->try_once(owner_, lease_, watched_);
            if (r.held) {
                registry::hold_ptr record = make_hold(red_lock_info, site_->name(), r.held->value, owner_,
                                                     {lease_, r.held->watched ? renewal::watched : renewal::leased, clock::now()});
                record->id = r.held->group->id;
                finish(nullptr, rlock::hold(site_, std::move(record)));
                return;
            }
            if (site_->gives_up(r, deadline_)) {
                finish(nullptr, rlock::hold());
                return;
            }
            const auto now = clock::now();
            if (!sub_) {
                std::weak_ptr<red_acquire> weak = weak_from_this();
                sub_ = std::make_unique<subscriber::subscription>(
                    *site_->nodes().front()->sub, site_->channel(), [this, weak, first = &eng] {
                        // On the subscriber's thread: only hand the news on. `this` and the
                        // engine outlive the subscription (the op owns it; the site, the core).
                        if (posted_.exchange(true)) return;
                        (void)first->post([weak] {
                            if (auto self = weak.lock()) {
                                self->posted_.store(false);
                                self->run_round();
                            }
                        });
                    });
            }
            std::shared_ptr<red_acquire> self = shared_from_this();  // the timer owns it until then
            timer_ = eng.at(std::min(now + site_->retry_pause(), deadline_), [self] { self->run_round(); });
        } catch (...) {
            finish(std::current_exception(), rlock::hold());
        }
    }

    void cancel() noexcept override {
        try {
            std::weak_ptr<red_acquire> weak = weak_from_this();
            (void)site_->nodes().front()->eng.post([weak] {
                auto self = weak.lock();
                if (!self || self->settled_) return;
                self->site_->nodes().front()->eng.cancel(self->timer_);
                try {
                    throw error(errc::operation_aborted, self->site_->name(), "",
                                "the asynchronous acquire was cancelled");
                } catch (...) {
                    self->finish(std::current_exception(), rlock::hold());
                }
            });
        } catch (...) {
        }
    }

private:
    // Completes the operation, once: no subscription is left behind.
    void finish(std::exception_ptr e, rlock::hold h) noexcept {
        if (settled_) return;
        settled_ = true;
        sub_.reset();
        try {
            done_(std::move(e), std::move(h));
        } catch (...) {
        }
    }

    std::shared_ptr<const red_site> site_;
    clock::time_point deadline_;
    std::chrono::milliseconds lease_;
    std::uint64_t owner_;
    completion_t<void(std::exception_ptr, rlock::hold)> done_;
    bool started_ = false, watched_ = false, settled_ = false;
    engine::timer_id timer_ = 0;
    std::atomic<bool> posted_{false};  // a round is posted by the subscription's news
    std::unique_ptr<subscriber::subscription> sub_;
};

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
        : site_(std::make_shared<const detail::red_site>(nodes, std::move(name), options)) {}
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
    /// release that reached fewer than a majority (nodes that did not answer in time keep our
    /// key until its lease ends) is told too, with the cause (timeout, connection_failed).
    std::size_t unlock() { return site_->release(detail::current_thread_number()).nodes; }

    /// This thread's hold is lost: more than N - quorum of its node holds are gone, or the
    /// validity left on a majority has run out by this client's clock. No round trip.
    [[nodiscard]] bool lost() const { return site_->lost(detail::current_thread_number()); }

    /// The validity this thread's hold has left (zero when lost or not held).
    [[nodiscard]] std::chrono::milliseconds remaining_lease() const {
        const auto valid = site_->validity_end(detail::current_thread_number());
        if (!valid) return std::chrono::milliseconds(0);
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*valid - clock::now());
        return std::max(left, std::chrono::milliseconds(0));
    }

    /// The calling thread's hold's id: unique in the process, kept across re-entries, and the
    /// `hold_id` on_lock_lost is told when this hold is lost (lost_hold; once for the whole
    /// red_lock, whichever nodes lost it). Throws `error` (not_owner) when this thread holds no
    /// such red_lock. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const { return site_->hold_id(detail::current_thread_number()); }

    /// The calling thread holds it and its validity has not run out (no round trip).
    [[nodiscard]] bool is_held_by_current_thread() const {
        const auto valid = site_->validity_end(detail::current_thread_number());
        return valid && clock::now() < *valid;
    }

private:
    friend class detail::timed_lockable<red_lock>;
    friend class detail::async_lockable<red_lock>;
    friend class multi_lock;
    std::string_view server() const noexcept { return ""; }  // one per node: named in messages

    // timed_lockable's entry point (see there). lock() (deadline max) gives up at once when
    // too few nodes can be asked; a bounded wait keeps trying until its deadline.
    bool acquire(clock::time_point deadline, std::chrono::milliseconds lease) {
        const bool bounded = deadline != clock::time_point::max();
        const std::uint64_t thread = detail::current_thread_number();
        site_->check_acquire(thread);
        const bool watched = lease.count() == 0;
        if (watched) lease = site_->nodes().front()->ep.options.lock_watchdog_timeout;
        std::optional<detail::subscriber::subscription> sub;
        for (;;) {
            const detail::red_site::round r = site_->try_once(thread, lease, watched);
            if (r.held) return true;
            if (site_->gives_up(r, deadline)) return false;
            const auto now = clock::now();
            // Redlock's random delay between rounds, cut short by an unlock message from the
            // first node.
            if (!sub) sub.emplace(*site_->nodes().front()->sub, site_->channel());
            // A channel the first node's ACL refuses: the wait fails with that refusal (as
            // every kind's does) rather than waking at once each round.
            sub->throw_if_refused(site_->name(), site_->nodes().front()->ep.name);
            const auto seen = sub->generation();
            auto until = now + site_->retry_pause();
            if (bounded) until = std::min(until, deadline);
            sub->wait(seen, until);
        }
    }

    // async_lockable's entry point (async_lock.hpp).
    template <class Token>
    auto start_async(clock::time_point deadline, std::chrono::milliseconds lease, std::uint64_t owner,
                     Token&& token) {
        return detail::start_with(async_starter(), deadline, lease, owner, std::forward<Token>(token));
    }

    // What starts an asynchronous acquire of this red_lock, sharing its site (multi_lock keeps
    // one per part).
    detail::async_start async_starter() const {
        return [s = site_](clock::time_point deadline, std::chrono::milliseconds lease, std::uint64_t owner,
                           detail::completion done) {
            detail::client_core& first = *s->nodes().front();
            first.throw_if_destroyed(s->name(), "the client of the red_lock's first node has been destroyed");
            (void)detail::waits_of(first);  // the engine's owner and stop hook
            auto op = std::make_shared<detail::red_acquire>(
                s, deadline, lease, owner != 0 ? owner : detail::next_owner_number(), std::move(done));
            if (!first.eng.post([op] { op->run_round(); })) {
                throw error(errc::connection_failed, s->name(), first.ep.name,
                            "the client of the red_lock's first node has been destroyed");
            }
            return rlock::pending(op);
        };
    }

    std::shared_ptr<const detail::red_site> site_;
};

}  // namespace rlock
