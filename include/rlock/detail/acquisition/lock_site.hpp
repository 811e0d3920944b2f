// lock_site<Kind>: what a lock on one Redis key is apart from any thread — its client, keys
// and options, with one acquire attempt, one release, a re-entry and the undoing of a wait.
// basic_lock (the blocking front) is one; an asynchronous acquire (async_lock.hpp) shares a
// copy, and an rlock::hold releases through it (held_site).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/detail/acquisition/lease_request.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/limits.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/held_site.hpp"
#include "rlock/detail/runtime/local_gate.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

/// What a lock is apart from any thread: its client, its keys and its options, with one
/// acquire attempt, one release and the undoing of a wait. basic_lock is one; an asynchronous
/// acquire (async_lock.hpp) shares a copy, so that it outlives the lock object that started it.
/// Immutable once made: every member is const.
template <class Kind>
class lock_site : public held_site {
public:
    using clock = std::chrono::steady_clock;

    /// Throws `error` (invalid_argument) for an empty name, a bad fair_lock_wait_timeout, or
    /// (Redis Cluster) a name whose keys land in different slots.
    lock_site(client_core& core, std::string name, lock_options options)
        : core_(core.shared_from_this()),
          keys_(lock_keys_for(Kind::channel_prefix, std::move(name), core_->ep.slots != nullptr,
                              core_->ep.name)),
          options_(options) {
        static_assert(check_kind<Kind>());
        if (options_.fair_lock_wait_timeout.count() <= 0) {
            throw error(errc::invalid_argument, keys_.name, core_->ep.name,
                        "lock_options::fair_lock_wait_timeout must be positive");
        }
        if (options_.fair_lock_wait_timeout > max_lease) {
            throw error(errc::invalid_argument, keys_.name, core_->ep.name,
                        "lock_options::fair_lock_wait_timeout must be at most 100 years");
        }
    }

    const std::string& name() const noexcept { return keys_.name; }
    const std::string& server() const noexcept { return core_->ep.name; }

    // held_site: what an rlock::hold needs.
    void unlock_one(const std::shared_ptr<hold>& h, bool& lost_at_last) const override {
        unlock_hold(h, [&] { lost_at_last = true; });
    }
    registry& holds() const override { return core_->reg; }
    const std::string& lock_name() const override { return keys_.name; }
    const std::string& server_name() const override { return core_->ep.name; }
    bool fenced() const override { return options_.fencing; }
    bool post(unique_callback<> task) const override { return core_->eng.post(std::move(task)); }

    /// Releases one level of `h`, whose owner has just asked (basic_lock::unlock, hold::unlock):
    /// the last level takes it out of the registry first. A hold found lost, or a Redis that
    /// cannot be reached, is told to the owner (once) rather than thrown; `lost_last()` is
    /// called first when that happens at the last level.
    ///
    /// A last level taken through this client's gate (local hand-off) passes to the next
    /// local waiter when there is one, the bound allows and the hold is not known lost:
    /// nothing is sent. Otherwise it is released here and the gate's next waiter then waits at
    /// Redis.
    template <class F>
    void unlock_hold(const registry::hold_ptr& h, F&& lost_last) const {
        registry& reg = core_->reg;
        const bool last = h->count == 1;
        if (last) reg.remove(h);
        if (last && h->gate && h->gate.gate().can_hand_over() && !reg.is_lost(*h)) {
            passed_hold pass = reg.with([&] {
                h->handed_at = clock::now();
                return passed_hold{h->value, h->lease, h->expires - h->lease, h};
            });
            if (h->gate.gate().hand_over(pass)) {
                h->gate.handed();
                core_->events.released(Kind::info.name, name(), h->id, h->taken, /*handed_on=*/true);
                return;
            }
        }
        const bool passed = release_level(h, last, std::forward<F>(lost_last));
        // The gate's next waiter leads (had the release thrown, the record's going would free it).
        if (last) {
            h->gate.release();
            core_->events.released(Kind::info.name, name(), h->id, h->taken, /*handed_on=*/passed);
        }
    }

    /// Whether an acquisition with `lease` waits at this client's gate (local hand-off): a
    /// kind whose value names no owner, a watched hold, no fencing (each pass would need its
    /// token), and hand-off on for the client and the lock.
    bool through_gate(lease_request lease) const noexcept {
        return Kind::hands_off && lease.is_watched() && !options_.fencing && options_.local_handoff &&
               core_->gates.enabled();
    }

private:
    // Releases one level of `h`; true when the last one passed the hold to a queued waiter of
    // this client (fair_lock, pass_in_queue) instead.
    template <class F>
    bool release_level(const registry::hold_ptr& h, bool last, F&& lost_last) const {
        registry& reg = core_->reg;
        long long left = 0;
        long long woken = 0;  // subscribers the final release's message reached
        bool passed = false;
        try {
            left = last ? release_last(*h, &woken, passed) : release(h->value, on_break::fail, &woken);
            // Redis still counts levels after this thread's last one: a re-entry whose reply was
            // lost (the connection broke after the script ran) added a level this thread never
            // counted. It is this thread's, so the final unlock drains it; left alone, the lock
            // would outlive the unlock until its lease ran out, and the thread's next lock()
            // would re-enter the leftover hash with a count its unlocks never bring to zero.
            for (int extra = 0; last && left > 0 && extra < 64; ++extra) {
                left = release(h->value, on_break::retry, &woken);
            }
        } catch (const error& e) {
            if (!last) --h->count;
            if (last) lost_last();
            reg.report(*h, e);  // unreachable: the hold is lost to its owner either way
            return false;
        }
        if (!last) --h->count;
        if (last && left == 0 && woken > 0) core_->note_woken(name());
        if (left < 0 && !reg.ended_by_lease(*h)) {
            // Not ours any more. Marked first: an on_lock_lost handler that asks lost() sees it.
            if (last) lost_last();
            const error gone(errc::lock_lost, name(), server(),
                             "at unlock the lock was no longer held by this thread (expired, "
                             "deleted or taken over)");
            reg.report(*h, gone);
            reg.tell_handed_from(*h, gone);
        } else if (last && reg.claim_untold_loss(*h)) {
            // Still in Redis (its key outlives this client's count of the lease by the
            // renewal's transit, or a late renewal went through), but lost() has said lost:
            // the verdict stands, and the owner is told it once.
            lost_last();
            reg.tell_hold(*h, error(errc::lock_lost, name(), server(),
                                    "the lease ran out before the watchdog could renew it"));
        } else if (last && reg.told_lost(*h)) {
            // Told lost before (an inner unlock or a renewal failed): the verdict is final,
            // whatever the release found (the key still there, a retry's "not held").
            lost_last();
        }
        return passed;
    }

    // The last level's release. A fair_lock's may pass the hold to the queue's next waiter
    // when that is a thread of this client (queue_pass.hpp): one script, nothing published,
    // the waiter told here; `passed` says it did. The bound of the mutex's hand-off does not
    // apply: the queue's order decides, and the pass goes where the release's message would
    // have. An ambiguous failure of that script (its reply lost) leaves the candidates to look
    // again at Redis (their acquire finds the hold theirs if it passed) and releases as usual,
    // where finding the hold gone then means the pass ran.
    long long release_last(hold& h, long long* woken, bool& passed) const {
        if constexpr (Kind::passes_in_queue) {
            if (core_->fair_passes.any() && options_.local_handoff && core_->gates.enabled() &&
                !core_->reg.is_lost(h)) {
                const std::vector<queue_passes::offered> offered = core_->fair_passes.offer(name());
                if (!offered.empty()) return release_or_pass(h, offered, woken, passed);
            }
        }
        (void)passed;
        return release(h.value, on_break::retry, woken);
    }

    // release_last's pass: the script with the offered waiters as candidates, then each of them
    // settled (queue_passes), the one passed to told at once.
    long long release_or_pass(const hold& h, const std::vector<queue_passes::offered>& offered,
                              long long* woken, bool& passed) const {
        // Settled however this ends: a waiter leaving waits for its offers to be.
        struct settling {
            queue_passes& table;
            const std::string& lock;
            const std::vector<queue_passes::offered>& offered;
            bool done = false;
            void operator()(const std::string& passed_to, const queued_pass& p,
                            bool ambiguous = false) {
                done = true;
                table.settle(lock, offered, passed_to, p, ambiguous);
            }
            ~settling() {
                if (!done) table.settle(lock, offered, {}, {});
            }
        } settle{core_->fair_passes, name(), offered};
        std::vector<std::string> candidates;
        candidates.reserve(offered.size());
        for (const queue_passes::offered& o : offered) candidates.push_back(o.value);
        const std::string lease = std::to_string(core_->ep.options.lock_watchdog_timeout.count());
        const std::string wait = std::to_string(options_.fair_lock_wait_timeout.count());
        const queued_pass pass{clock::now(), core_->ep.options.lock_watchdog_timeout};
        typename Kind::pass_result r;
        try {
            r = core_->pool.run(name(), on_break::fail, [&](const connection& c) {
                return Kind::release_or_pass(c, keys_, h.value, candidates, lease, wait, server());
            }, Kind::follows_ask);
        } catch (const error& e) {
            // Ambiguous: the script may have passed the hold to any candidate; the head finds it
            // at its next try at Redis, and one that leaves before trying releases it.
            settle({}, pass, is_ambiguous(e));
            if (!is_ambiguous(e)) throw;
            for (const std::string& id : candidates) {
                core_->sub->notify_local(Kind::wait_channel(keys_, id));
            }
            const long long left = release(h.value, on_break::retry, woken);
            return left < 0 ? 0 : left;
        }
        settle(r.passed_to, pass);
        if (!r.passed_to.empty()) {
            passed = true;
            core_->sub->notify_local(Kind::wait_channel(keys_, r.passed_to));
        }
        return r.left;
    }

public:

    /// Throws what a fresh (not re-entrant) acquisition by `owner` must: would_deadlock while
    /// it holds the kind that refuses it (Kind::refused_while_holding: a reader asking for the
    /// write side).
    void check_acquire(std::uint64_t owner) const {
        if (const kind_info* refusing = Kind::refused_while_holding()) {
            if (core_->reg.find(refusing, name(), owner)) {
                throw error(errc::would_deadlock, name(), server(),
                            owner_name(owner) + " " + Kind::refused_while_holding_why);
            }
        }
    }

    // Why a re-entry of a lost hold is refused, naming its owner (this thread, rlock::owner N).
    static std::string lost_reentry_why(std::uint64_t owner) {
        return "the hold of " + owner_name(owner) + " was lost; unlock it before locking again";
    }

    /// `again`: a re-entry made after one that failed in an outage (it may have run). It first
    /// takes back the level that one added if it did (undo_reentry), so that exactly one is
    /// added.
    bool reenter(hold& h, lease_request lease, bool again = false) const {
        registry& reg = core_->reg;
        if constexpr (!Kind::reentrant) {
            (void)lease;
            (void)h;
            (void)again;
            throw error(errc::would_deadlock, name(), server(),
                        owner_name(h.thread) + " already holds the lock, and a mutex is not reentrant");
        } else {
            if (reg.is_lost(h)) {
                throw error(errc::lock_lost, name(), server(), lost_reentry_why(h.thread));
            }
            // A re-entry keeps the hold watched if it was, or makes it watched if asked to;
            // otherwise the new lease applies from now.
            const bool watched = reg.with([&] { return h.watched; }) || lease.is_watched();
            const std::chrono::milliseconds duration =
                watched ? core_->ep.options.lock_watchdog_timeout : lease.fixed_duration();
            if (again) undo_reentry(h);
            const auto sent = clock::now();
            acquire_result r = attempt(h.value, duration, try_kind::reentry);
            if (!r.acquired) {
                reg.report(h, error(errc::lock_lost, name(), server(),
                                    "found the hold gone on re-entry"));
                throw error(errc::lock_lost, name(), server(), lost_reentry_why(h.thread));
            }
            reg.with([&] {
                h.count = static_cast<std::size_t>(r.count);
                h.watched = watched;
                h.lease = duration;
                h.expires = sent + duration;
                if (options_.fencing) h.fencing = r.fencing;
            });
            return true;
        }
    }

    /// Redis counting one level more for this holder than the client does means that a
    /// re-entry whose reply never came ran: that level is released (an inner one: nothing is
    /// published). A re-entry cannot be undone by a plain release as an acquire is, which
    /// would take one of the levels the thread holds when the try had not run.
    void undo_reentry(const hold& h) const {
        const std::string expected = std::to_string(h.count + 1);
        core_->pool.run(name(), on_break::fail, [&](const connection& c) {
            const reply_ptr r = run_command(c, {"HGET", keys_.name, h.value}, name(), server());
            if (r->type == REDIS_REPLY_STRING && reply_text(r.get()) == expected) {
                (void)Kind::release(c, keys_, h.value, server());
            }
            return 0;
        }, Kind::follows_ask);
    }

    /// Which attempt at the lock this is.
    enum class try_kind : unsigned char {
        only,     // try_lock(), or a deadline already past: nothing waits after it
        first,    // the first try of a wait: may join a queue (fair_lock)
        waiting,  // a try inside the wait: may queue, and reports the holder's TTL
        reentry,  // this thread holds the lock already
    };

    // One acquire attempt. When an acquisition that is not a re-entry fails ambiguously (the
    // connection broke or timed out, so the command may have run), a release with the same
    // value undoes it and the attempt is made once more on a new connection: nothing of ours
    // outlives a failure. When the server did not answer in time (paused, stalled: a release
    // on another connection would only wait as long, or run before the acquire), the undo is
    // written after the acquire on its own connection instead, and the timeout thrown at once:
    // the server runs both, in order, when it runs again.
    acquire_result attempt(const std::string& value, std::chrono::milliseconds lease,
                           try_kind kind) const {
        const std::string lease_text = std::to_string(lease.count());
        const std::string wait_text = std::to_string(options_.fair_lock_wait_timeout.count());
        attempt_spec spec;
        spec.value = value;
        spec.lease = lease_text;
        spec.fencing = options_.fencing;
        spec.want_ttl = kind == try_kind::waiting;
        spec.reentry = kind == try_kind::reentry;
        spec.may_queue = kind == try_kind::first || kind == try_kind::waiting;
        spec.scripts_allowed = core_->scripts_allowed.load(std::memory_order_relaxed);
        spec.wait_timeout = wait_text;
        // A leave kept for this value (give_up with the server out of reach) would take the
        // place this wait is about to queue for; the wait leaves by itself.
        if constexpr (Kind::abandons) {
            if (kind == try_kind::first) core_->forget_undo(undo_key(value));
        }
        for (int round = 0;; ++round) {
            bool undone_after = false;  // the undo was written after the acquire (see above)
            const auto began = std::chrono::steady_clock::now();
            try {
                acquire_result r = core_->pool.run(name(), on_break::fail, [&](const connection& c) {
                    acquire_result got;
                    try {
                        got = Kind::acquire(c, keys_, spec, server());
                    } catch (const error& e) {
                        if (e.value() == errc::timeout && kind != try_kind::reentry)
                            undone_after = write_undo_after(c, value);
                        throw;
                    }
                    if (got.acquired) sync_or_undo(c, value);
                    return got;
                }, Kind::follows_ask);
                core_->scripts_allowed.store(true, std::memory_order_relaxed);
                return r;
            } catch (const error& e) {
                // The server is taken as not answering for a while (give_up defers to the
                // watchdog); a connection to a paused server times out while it is opened too,
                // and one to a master that refuses connections fails for command_timeout.
                core_->note_if_unanswered(e, name(), began);
                // Nothing to undo for an acquire never sent (no connection could be had).
                if (!is_ambiguous(e) || kind == try_kind::reentry ||
                    error_access::origin(e).unsent) {
                    throw;
                }
                // Undone already, or now: the caller owes no undo (outage_step), and does not
                // wait for a paused server a second time to send one.
                if (undone_after) throw error_access::undone(e);
                try {
                    undo(value);
                } catch (const error&) {
                    throw e;
                }
                if (round > 0) throw error_access::undone(e);
            }
        }
    }

    /// Undoes an acquire attempt that may have run (its reply was lost, its connection broke):
    /// leaves the queue (fair_lock) and releases with the same value, which frees only what
    /// that attempt may have taken (the caller holds nothing under `value`), so it is safe to
    /// repeat. Throws what the release throws.
    void undo(const std::string& value) const {
        give_up(value);
        if constexpr (Kind::passes_in_queue) {
            // A hold passed to this waiter before it left the queue is undone too, whole.
            if (core_->fair_passes.clear(name(), value)) {
                release_all(value);
                return;
            }
        }
        release(value, on_break::retry);
    }

    /// Writes the kind's undo of an acquire under `value` after it on `c` (write_after), when
    /// the kind has one; true when all of it was written.
    bool write_undo_after(const connection& c, const std::string& value) const noexcept {
        try {
            std::vector<script_call> calls = Kind::undo_calls(keys_, value);
            if (calls.empty()) return false;
            for (script_call& call : calls) {
                if (!write_after(c, call)) return false;
            }
            return true;
        } catch (...) {
            return false;
        }
    }

    /// Releases every level `value` holds (a hold passed to a waiter that did not keep it, with
    /// the level its own acquire may have added after the pass). Best effort: its lease ends it.
    void release_all(const std::string& value) const noexcept {
        try {
            long long left = release(value, on_break::retry);
            for (int extra = 0; left > 0 && extra < 64; ++extra) left = release(value, on_break::retry);
        } catch (const error&) {
        }
    }

    /// Replica sync after an acquire on `c`: too few acknowledgements undo it (one level, so a
    /// re-entry keeps the levels it had) and throw replica_sync_failed.
    void sync_or_undo(const connection& c, const std::string& value) const {
        const int wanted = core_->ep.options.sync_replicas;
        if (wanted <= 0) return;
        const long long acked = core_->wait_for_replicas(c, name());
        if (acked >= wanted) return;
        try {
            Kind::release(c, keys_, value, server());
        } catch (const error& e) {
            // Not a redirection for the pool to follow: that would run the acquire again.
            throw error_access::unredirected(e);
        }
        throw error(errc::replica_sync_failed, name(), server(),
                    std::to_string(acked) + " of the " + std::to_string(wanted) +
                        " replicas asked for acknowledged the acquire within " +
                        std::to_string(core_->ep.options.sync_timeout.count()) +
                        " ms; it was undone");
    }

    // How many clients listen on `channel` (channel_subscribers, following ASK as the kind does).
    long long subscribers(const std::string& channel) const noexcept {
        return channel_subscribers(*core_, name(), channel, Kind::follows_ask);
    }

    // A waiter that gives up leaves nothing behind (fair_lock: its queue entry). When the
    // server cannot be reached (paused, restarting), the client's watchdog thread leaves for
    // it once the server answers (client_core::defer_undo), or until the entry would have
    // been evicted anyway (fair_lock_wait_timeout); so it does when the server could not run
    // the leave yet (Redis Cluster: its slot migrating, the cluster down).
    //
    // A server that has just left a command unanswered (this wait's last try, another waiter's
    // leave: client_core::unanswered) gets the leave through the watchdog at once: the caller
    // does not wait out another command_timeout for it, nor does ~client one per waiter it
    // ends. The leave is sent once (a broken connection defers it too).
    void give_up(const std::string& value) const noexcept {
        if constexpr (Kind::abandons) {
            client_core* core = core_.get();  // the watchdog thread keeps it alive
            auto defer = [&] {
                try {
                    core->defer_undo(undo_key(value), [core, keys = keys_, value] { leave(*core, keys, value); },
                                     std::chrono::steady_clock::now() + options_.fair_lock_wait_timeout);
                } catch (...) {
                }
            };
            if (core->unanswered(name())) {
                defer();
                return;
            }
            const auto began = std::chrono::steady_clock::now();
            try {
                leave(*core, keys_, value);
            } catch (const error& e) {
                // Also a leave the server could not run yet: a slot migrating (TRYAGAIN, an
                // ASK left to wait out), a cluster down, a replica that was the master.
                if (!may_run_later(e)) return;
                core->note_if_unanswered(e, name(), began);
                defer();
            } catch (...) {
            }
        } else {
            (void)value;
        }
    }
    static void leave(client_core& core, const lock_keys& keys, const std::string& value) {
        core.pool.run(keys.name, on_break::fail, [&](const connection& c) {
            Kind::abandon(c, keys, value, core.ep.name);
            return 0;
        }, Kind::follows_ask);
    }
    std::string undo_key(const std::string& value) const { return name() + '\n' + value; }

    // Runs the release script: the count left (0: released), or -1 when `value` does not hold
    // the lock. With on_break::retry a broken connection gets one more try (run_release): a
    // "not held" answer to it counts as released when the first try most likely did it. A
    // connection the server had closed before the first try is never used for it (pool:
    // closed_while_idle), so a restart between the hold and its unlock does not even need the
    // retry to be noticed.
    // `woken`, when given: how many subscribers the release's unlock message reached (0 when
    // it published none).
    long long release(const std::string& value, on_break broken_then, long long* woken = nullptr) const {
        const auto [left, first_did_it] = run_release(core_->pool, name(), broken_then, [&](const connection& c) {
            const long long l = Kind::release(c, keys_, value, server(), woken);
            // Replica sync: a shortfall is not an error here (see client_options).
            if (l >= 0 && core_->ep.options.sync_replicas > 0) core_->wait_for_replicas(c, name());
            return l;
        }, Kind::follows_ask);
        return left < 0 && first_did_it ? 0 : left;
    }

    // Shared, not borrowed: a thread blocked in lock() when the client is destroyed still
    // reaches the subscriber and the pool to learn that and throw (the core is stopped but
    // alive until the last lock object made from it is gone).
    std::shared_ptr<client_core> core_;
    lock_keys keys_;
    lock_options options_;
};

/// The acquisition operation of a lock on one key, as both drivers run it (wait_blocking,
/// async_waits): one try is lock_site::attempt with this waiter's value and lease; undo
/// releases what a try that failed in an outage may have taken; give_up leaves the queue
/// (fair_lock). The drivers pace the tries of a kind whose waiters race (races()).
template <class Kind>
class lock_acquisition {
public:
    using clock = std::chrono::steady_clock;
    using site_type = lock_site<Kind>;

    /// `value`: what the hold is stored under; `lease`: what each try asks for (never 0).
    lock_acquisition(const site_type& site, std::string value, std::chrono::milliseconds lease)
        : site_(&site), value_(std::move(value)), lease_(lease) {}
    lock_acquisition(const lock_acquisition&) = delete;
    lock_acquisition& operator=(const lock_acquisition&) = delete;
    ~lock_acquisition() {
        if (enrolled_) (void)site_->core_->fair_passes.withdraw(name(), value_);
    }

    /// A blocking fair_lock waiter with a watched, unfenced hold asked for may be passed the
    /// hold by a final unlock of this client when it is the queue's next (queue_pass.hpp): once
    /// a try has queued it, it enrolls, and each later try looks for such a pass first (an
    /// acquisition that finds the lock free costs nothing more). Nothing for the other kinds,
    /// or with hand-off off.
    void enroll_for_passes(lease_request asked) {
        if constexpr (Kind::passes_in_queue) {
            const lock_options& o = site_->options_;
            // Watched as asked, not by its duration: a lease equal to the watchdog's timeout
            // is still a lease, never passed to.
            may_enroll_ = site_->core_->gates.enabled() && o.local_handoff && !o.fencing &&
                          asked.is_watched();
        } else {
            (void)asked;
        }
    }
    /// Whether the hold came by a pass within the client (acquired_event::handed_locally).
    bool handed() const noexcept { return handed_; }

    const std::string& name() const noexcept { return site_->name(); }
    std::string channel() const { return Kind::wait_channel(site_->keys_, value_); }
    const void* turns() const noexcept { return &Kind::info; }
    long long turn_need() const noexcept { return 0; }
    bool shared() const noexcept { return Kind::shared; }
    bool subscribes_first() const noexcept { return false; }  // a racing newcomer may (race_pacing)
    bool paces_newcomer() const noexcept { return true; }
    std::chrono::milliseconds heartbeat() const noexcept { return Kind::heartbeat(site_->options_); }
    /// The client's record of races for this lock, where the kind's waiters race (else null).
    race_record* races() const {
        if constexpr (Kind::races) return &site_->core_->races(site_->name());
        return nullptr;
    }
    /// How many clients listen on `channel` (lock_site::subscribers): the rivals a racing
    /// waiter counts.
    long long subscribers(const std::string& channel) const noexcept { return site_->subscribers(channel); }

    try_result attempt(try_phase phase) {
        using try_kind = typename site_type::try_kind;
        const try_kind kind = phase == try_phase::only    ? try_kind::only
                              : phase == try_phase::first ? try_kind::first
                                                          : try_kind::waiting;
        if (enrolled_) {
            if (std::optional<queued_pass> pass = site_->core_->fair_passes.take(name(), value_)) {
                enrolled_ = false;
                handed_ = true;
                sent_ = pass->sent;
                fencing_ = 0;
                return {true, wait_hint{}};
            }
        }
        sent_ = clock::now();
        ++tries_;
        acquire_result r = site_->attempt(value_, lease_, kind);
        if (r.acquired && enrolled_) {
            // Out of the table now (value() may be moved from next). A pass that raced this
            // acquire is one more level of this holder's, which its final unlock drains
            // (lock_site::release_level).
            enrolled_ = false;
            (void)site_->core_->fair_passes.withdraw(name(), value_);
        } else if (!r.acquired && may_enroll_ && !enrolled_ && kind != try_kind::only) {
            // Queued (or its place renewed): from now on the head may be passed the hold.
            site_->core_->fair_passes.enroll(name(), value_);
            enrolled_ = true;
        }
        fencing_ = r.fencing;
        return {r.acquired, wait_hint{r.ttl, r.holder_publishes, std::move(r.holder)}};
    }
    void undo() { site_->undo(value_); }
    /// Leaves the queue (fair_lock). A waiter that was passed the hold just as it gave up
    /// releases it (which wakes the queue's next).
    void give_up() noexcept {
        if (enrolled_) {
            enrolled_ = false;
            if (site_->core_->fair_passes.withdraw(name(), value_)) site_->release_all(value_);
        }
        site_->give_up(value_);
    }

    /// What the winning try left: its value, when it was sent (a lease runs from then) and
    /// its fencing token.
    std::string& value() noexcept { return value_; }
    clock::time_point sent() const noexcept { return sent_; }
    std::uint64_t fencing() const noexcept { return fencing_; }
    /// The tries made (acquired_event::tries).
    unsigned tries() const noexcept { return tries_; }

private:
    const site_type* site_;
    std::string value_;
    std::chrono::milliseconds lease_;
    clock::time_point sent_{};
    std::uint64_t fencing_ = 0;
    unsigned tries_ = 0;
    bool may_enroll_ = false;  // enroll_for_passes() allowed it
    bool enrolled_ = false;    // in the client's fair_passes
    bool handed_ = false;
};

}  // namespace rlock::detail
