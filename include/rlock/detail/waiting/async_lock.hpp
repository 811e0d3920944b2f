// The asynchronous driver (async_waits: a client's wait groups) and the asynchronous acquire of
// every lock on one key (async_acquire, running lock_acquisition), on the client's engine
// thread (engine.hpp). The public forms are async_lockable's (async_lockable.hpp).
//
// - A mutex's watched, unfenced acquire first meets the client's other acquires of the lock at
//   its gate (local hand-off, local_gate.hpp): behind one that holds it or waits at Redis it
//   queues there, to be handed the hold or to lead; only the leader goes on below.
// - An acquire is a task on the engine: a first attempt (one round trip through the pool), then,
//   when refused and allowed to wait, a place at the end of the wait group of its kind and
//   channel (one per client; a fair_lock waiter's channel is its own).
// - A wait group holds one subscription and a FIFO of waiters. A message on the channel, a
//   subscriber reconnect or the group's timer (the holder's TTL, a silent holder's next look, a
//   fair waiter's heartbeat: what bounds a blocking waiter's sleep) makes its head attempt. After
//   a success the next waiter attempts only in a shared group (the read side); otherwise it
//   waits for the next message. So 10 000 waiters behind one unlock cost one attempt, not 10 000.
// - A try form's deadline is a timer; it and a cancellation each take the waiter out of its
//   group and undo what it left in Redis (fair_lock's queue entry) before completing it.
// - A completion runs on the engine thread after the state it reports is in place (the hold is
//   registered with the watchdog), exactly once, never inside the initiating call. When the
//   client is destroyed, every pending one completes with connection_failed before its
//   destructor returns.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/lease_request.hpp"
#include "rlock/detail/acquisition/lock_site.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/engine.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/detail/runtime/local_gate.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/runtime/subscriber.hpp"
#include "rlock/detail/waiting/wait_pacing.hpp"
#include "rlock/detail/waiting/wait_policy.hpp"
#include "rlock/errors.hpp"
#include "rlock/detail/runtime/held_site.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// An acquire's signature and completion handler.
using acquire_signature = void(std::exception_ptr, rlock::hold);
using completion = completion_t<acquire_signature>;

/// How a wait group's head fared at one attempt.
enum class attempt_outcome : unsigned char { acquired, refused, failed };

// What a refused attempt (or a winner's lease) says about when the head should try again:
// wait_hint (wait_policy.hpp).

class async_waits;
struct wait_group;

/// The waiter's own exception object for `e` when it is an rlock::error: a copy with its own
/// parts and message, which async_waiter::deliver hands on. The error it copies may have been
/// given to several waiters (a refused subscription fails a whole group) or still be held on
/// the engine thread (a catch block), and libstdc++ counts an exception object's owners, and
/// its message's, where TSan cannot see: a release there after the waiter's thread read it was
/// reported as a race. Another exception is handed on as it is.
RLOCK_DECL std::exception_ptr own_copy(std::exception_ptr e) noexcept;

/// Runs `f`, a try (or an undo) of an asynchronous wait, on the client's engine thread, which
/// every asynchronous wait of the client shares and each round trip blocks. While the server
/// has left a command of the client unanswered, or could not be reached, for a whole
/// command_timeout within the last command_timeout (client_core::unanswered) nothing is sent:
/// it fails at once with a timeout that ran nothing (unanswered_error), which the wait rides as
/// an outage (outage_step) or ends with at its deadline. So k waits on a paused server, or on a
/// master that refuses connections, end one command_timeout past their deadlines, not k of
/// them. A failure of `f` of either kind marks the server so. With Redis Cluster, the lock's
/// slot: the waits for other masters go on.
template <class F>
decltype(auto) on_engine(client_core& core, std::string_view lock, F&& f) {
    if (core.unanswered(lock)) throw core.unanswered_error(lock);
    const auto began = std::chrono::steady_clock::now();
    try {
        return f();
    } catch (const error& e) {
        core.note_if_unanswered(e, lock, began);
        throw;
    }
}

/// One pending asynchronous acquire; its state is the engine thread's.
class async_waiter : public cancellable, public std::enable_shared_from_this<async_waiter> {
public:
    using clock = std::chrono::steady_clock;

    /// Its deadline is `call`'s; its story (for the client's listener, events.hpp, when there is
    /// one) begins at the call.
    async_waiter(async_waits& waits, wait_call call) noexcept;

    /// One attempt as the head of its group; `woken`: an unlock message (not a timer) led to
    /// it. On `acquired` the hold is registered and `hint` carries its lease; on `failed` the
    /// waiter has given up and is settled with the error.
    virtual attempt_outcome attempt_waiting(wait_hint& hint, bool woken) = 0;
    /// How long to hold back the next attempt (race_pacing, wait_pacing.hpp): waited on a
    /// timer, never on the engine thread.
    virtual std::chrono::microseconds pause_before_try() const = 0;
    /// Undoes what a refused attempt left behind (fair_lock's queue entry). Best effort.
    virtual void give_up() noexcept = 0;
    /// The lock's name and server, for errors.
    virtual const std::string& lock_name() const noexcept = 0;
    virtual const std::string& server() const noexcept = 0;
    /// The kind the listener is told (acquired_event::kind); null: this wait is not told.
    virtual const char* event_kind() const noexcept = 0;
    /// The tries made so far (acquired_event::tries).
    virtual unsigned tries() const noexcept = 0;
    /// Settles the operation (once): `e`, or, with none, "the wait ran out" (an empty hold) —
    /// or, when its last attempt failed in an outage it was riding out, that failure.
    void settle(std::exception_ptr e) noexcept;
    /// Tells the listener that this wait ended without the lock (cancelled, or it ran out).
    void tell_wait_ended(bool cancelled) const noexcept;
    /// Calls the handler with what was settled (once), handing the error on rather than
    /// keeping a copy: the receiver's thread is then the only one that releases it (libstdc++'s
    /// exception_ptr count is not seen by TSan, so a release here raced its reader there).
    /// What the handler throws is dropped.
    virtual void deliver() noexcept = 0;
    RLOCK_DECL void cancel() noexcept override;

    async_waits& waits;
    const clock::time_point deadline;
    /// Set while the waiter rides out an outage (failure_ride): the last attempt's failure.
    std::exception_ptr outage;
    engine::timer_id deadline_timer = 0;
    wait_group* group = nullptr;
    std::list<std::shared_ptr<async_waiter>>::iterator place;
    bool settled = false;
    std::exception_ptr failure;
    /// When it began (stamped with a listener only).
    wait_story story;
};

/// The waiters of one kind on one channel of a client, in arrival order.
struct wait_group {
    std::string key;  // kind and channel
    std::uint64_t serial = 0;
    bool shared = false;  // a success lets the next waiter try too (read side)
    std::list<std::shared_ptr<async_waiter>> queue;
    std::unique_ptr<subscriber::subscription> sub;
    engine::timer_id retry = 0;
    std::atomic<bool> posted{false};  // a pump is queued on the engine (set by the subscriber)
    bool paused = false;     // the head's race pause has been waited: its pump attempts now
    engine::timer_id pause_timer = 0;  // the head is waiting out its race pause
    bool woken_in_pause = false;       // news came before or during that pause
    bool confirmed = false;  // a pump has followed the subscription's first bump
    wait_policy policy;  // when the head tries again without a message
};

/// A client's wait groups (one per client, made with its engine: waits_of).
class async_waits {
    using clock = std::chrono::steady_clock;

public:
    explicit async_waits(client_core& core) : core(core) {}
    async_waits(const async_waits&) = delete;
    async_waits& operator=(const async_waits&) = delete;

    /// The group for `key`, or null.
    wait_group* find(const std::string& key);

    /// Puts `w` at the end of the group for `key` (made, with its subscription to `channel`,
    /// when there is none), and arms its deadline. `hint`: from its own refused attempt, which
    /// then sets the group's timer; null when it joined behind others without trying.
    void join(const std::shared_ptr<async_waiter>& w, const std::string& key, const std::string& channel,
              bool shared, std::chrono::milliseconds heartbeat, const wait_hint* hint);

    /// Ends a waiter that is still pending: out of its group, its leftovers undone, settled with
    /// `e` (none: its wait ran out), its handler called.
    void end(const std::shared_ptr<async_waiter>& w, std::exception_ptr e);

    /// A waiter's deadline has come: one last try, as a blocking wait makes (wait_blocking),
    /// so that it ends with the lock if it is free now, empty if it is held, or with the
    /// try's failure when the server does not answer — never "held" for a server that was
    /// not asked (paused, nothing broke to tell the group).
    void expire(const std::shared_ptr<async_waiter>& w);

    /// Keeps `w` while it waits at its client's gate for a lock (local hand-off, local_gate.hpp),
    /// where nothing else owns it: until its turn comes or it ends (left_gate).
    void wait_at_gate(const std::shared_ptr<async_waiter>& w) { at_gate_.emplace(w.get(), w); }
    void left_gate(const async_waiter& w) { at_gate_.erase(&w); }

    /// The client is being destroyed: every pending waiter completes with connection_failed.
    void fail_all() noexcept;

    client_core& core;

private:
    // The group for `key` if it is still the one numbered `serial` (a task or timer may
    // outlive the group it was set for), else null.
    std::shared_ptr<wait_group> current(const std::string& key, std::uint64_t serial) const;

    // The server refused the group's subscription (subscriber::subscription::throw_if_refused):
    // every waiter of the group fails with that refusal. True when it did.
    bool fail_if_refused(wait_group& g);

    void post_pump(const std::string& key, std::uint64_t serial) noexcept;

    // The group's head attempts (and, in a shared group, the waiters after it while they win);
    // `woken`: a message (or a reconnect) rather than a timer asked for it.
    // `g` by value: leave() may erase the map's reference to it while this runs.
    void pump(std::shared_ptr<wait_group> g, bool woken);

    // When the group's head tries again without a message: wait_policy's rules, as for a
    // blocking waiter.
    void schedule(wait_group& g, const wait_hint& hint);

    // Takes `w` out of its group (dropping the group, and its subscription, when it was the
    // last) and forgets its deadline.
    void leave(async_waiter& w);

    std::unordered_map<std::string, std::shared_ptr<wait_group>> groups_;
    std::unordered_map<const async_waiter*, std::shared_ptr<async_waiter>> at_gate_;
    std::uint64_t serial_ = 0;
};

inline async_waiter::async_waiter(async_waits& waits, wait_call call) noexcept
    : waits(waits), deadline(call.deadline), story(waits.core.events.begin(call.began)) {}



/// The client's wait groups, made (with the engine's stop hook) on first use.
RLOCK_DECL async_waits& waits_of(client_core& core);

/// One asynchronous acquire of a Kind's lock.
template <class Kind>
class async_acquire final : public async_waiter {
public:
    async_acquire(std::shared_ptr<const lock_site<Kind>> site, async_waits& waits,
                  wait_call call, lease_request lease, std::uint64_t owner, completion handler)
        : async_waiter(waits, call), site_(std::move(site)), lease_(lease), owner_(owner),
          race_(site_->core_->races(site_->name())),
          step_(repeat::safe, site_->core_->ep.follows_failovers()) {
        done = std::move(handler);
    }

    /// The initiating task, on the engine thread.
    void start() noexcept {
        client_core& core = *site_->core_;
        bool failed = false;
        try {
            throw_if_stopping();
            registry& reg = core.reg;
            if (registry::hold_ptr h = reg.find(&Kind::info, site_->name(), owner_)) {
                reenter(std::move(h), false);
                return;
            }
            site_->check_acquire(owner_);
            op_.emplace(*site_, Kind::value_for(core.id, owner_, Kind::reentrant),
                        lease_.duration(core.ep.options.lock_watchdog_timeout));
            const bool may_wait = clock::now() < deadline;
            if (site_->through_gate(lease_)) {
                // Local hand-off, as a blocking acquire (basic_lock::acquire): behind another
                // thread or acquire of this client that holds the lock or waits for it at
                // Redis, this one waits at the gate, to be handed the hold or to lead.
                gate_ = core.gates.get(Kind::info, site_->name());
                switch (gate_->join(ticket_, may_wait)) {
                    case local_gate::entry::lead: leading_ = true; break;
                    case local_gate::entry::queued: wait_at_gate(); return;
                    case local_gate::entry::timed_out:
                        settle(nullptr);
                        deliver();
                        return;
                    case local_gate::entry::stopped:
                    case local_gate::entry::granted:  // only enter() grants at once
                        throw error(errc::connection_failed, site_->name(), site_->server(),
                                    "the client was destroyed before this asynchronous acquire started");
                }
            }
            lead(may_wait);
        } catch (...) {
            settle(std::current_exception());
            failed = true;
        }
        // Delivered outside the handler: the thrown object's own reference is gone by then, so
        // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
        if (failed) deliver();
    }

    /// Throws connection_failed once the client's engine is stopping (the client is being
    /// destroyed): each step that starts work checks it first.
    void throw_if_stopping() const {
        if (site_->core_->eng.stopping()) {
            throw error(errc::connection_failed, site_->name(), site_->server(),
                        "the client was destroyed before this asynchronous acquire started");
        }
    }

    /// Waits at Redis (the first try, then a place in its wait group): the gate's leader, or an
    /// acquire that does not go through the gate.
    void lead(bool may_wait) noexcept {
        bool failed = false;
        try {
            client_core& core = *site_->core_;
            throw_if_stopping();
            const std::string channel = op_->channel();
            std::string key(Kind::info.name);
            key += '\0';
            key += channel;
            if (may_wait) {
                // Behind waiters already queued on this client: their turn comes first, and a
                // try now would only be refused.
                wait_group* g = waits.find(key);
                if (g && !g->queue.empty()) {
                    waits.join(shared_from_this(), key, channel, Kind::shared, op_->heartbeat(), nullptr);
                    return;
                }
            }
            if constexpr (Kind::races) {
                // As a blocking newcomer does (wait_blocking), the first try lets the
                // waiters a release has just woken go first: while this client loses races for
                // the lock (race_pacing::newcomer_pause), and after this client's own release
                // that woke waiters (note_woken). Waited on a timer, not on the engine thread.
                const std::chrono::microseconds pause =
                    may_wait ? race_.newcomer_pause(core.courtesy_left(site_->name()))
                             : std::chrono::microseconds(0);
                if (pause.count() > 0) {
                    // The timer owns the operation until then (nothing else does).
                    std::shared_ptr<async_waiter> self = shared_from_this();
                    (void)core.eng.at(clock::now() + pause, [self, key, channel] {
                        static_cast<async_acquire&>(*self).first_try(key, channel, true);
                    });
                    return;
                }
            }
            first_try(key, channel, may_wait);
        } catch (...) {
            settle(std::current_exception());
            failed = true;
        }
        // Delivered outside the handler: the thrown object's own reference is gone by then, so
        // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
        if (failed) deliver();
    }

    /// The first attempt, and what follows from it.
    void first_try(const std::string& key, const std::string& channel, bool may_wait) noexcept {
        if (settled) return;  // cancelled while its first try was held back
        bool failed = false;
        try {
            throw_if_stopping();
            // Behind waiters already queued, it waits its turn; else its own try's hint leads.
            auto join = [&](const wait_hint& hint) {
                wait_group* g = waits.find(key);
                waits.join(shared_from_this(), key, channel, Kind::shared, op_->heartbeat(),
                           g && !g->queue.empty() ? nullptr : &hint);
            };
            if constexpr (Kind::races) {
                // While this client loses races for the lock, it subscribes (joins) before it
                // tries at all (race_pacing::subscribes_first): its first try is the group's,
                // held back by its youth. Nothing is known of the holder yet (-3): the group
                // waits for its subscription's confirmation, bounded by the fallback (10 ms)
                // as for any waiter.
                if (may_wait && race_.subscribes_first() && clock::now() < deadline) {
                    race_.count_rivals([&] { return site_->subscribers(channel); });
                    join(wait_hint{-3, true, {}});
                    return;
                }
            }
            wait_hint hint;
            hint.ttl = -3;
            // An outage: the wait rides it out, as a blocking one does (outage_step).
            const try_phase phase = may_wait ? try_phase::first : try_phase::only;
            engine_op eop{*this};
            auto attempt = [&] { return op_->attempt(phase); };
            const std::optional<try_result> r = step_.run(
                eop, [&] { return on_engine(*site_->core_, lock_name(), attempt); }, deadline,
                hint.again);
            outage = step_.last_failure();
            if (!r) {
                join(hint);
                return;
            }
            if (r->done) {
                won();
                deliver();
                return;
            }
            if (!may_wait || clock::now() >= deadline) {
                if (may_wait) op_->give_up();
                settle(nullptr);
                deliver();
                return;
            }
            // Before joining (and subscribing): the clients already waiting are its rivals.
            if constexpr (Kind::races) race_.count_rivals([&] { return site_->subscribers(channel); });
            join(r->hint);
        } catch (...) {
            settle(std::current_exception());
            failed = true;
        }
        // Delivered outside the handler: the thrown object's own reference is gone by then, so
        // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
        if (failed) deliver();
    }

    attempt_outcome attempt_waiting(wait_hint& hint, bool woken) override {
        try {
            hint = wait_hint{};
            hint.ttl = -3;
            // An outage is ridden out until the deadline (outage_step): the next try undoes
            // what this one may have taken first; its last failure is what the wait ends with
            // then (settle).
            engine_op eop{*this};
            auto attempt = [&] { return op_->attempt(try_phase::waiting); };
            std::optional<try_result> r = step_.run(
                eop, [&] { return on_engine(*site_->core_, lock_name(), attempt); }, deadline,
                hint.again);
            outage = step_.last_failure();
            if (!r) return attempt_outcome::refused;
            if constexpr (Kind::races) race_.after_try(*r, woken);
            if (r->done) {
                won();
                hint.ttl = lease_.duration(site_->core_->ep.options.lock_watchdog_timeout).count();
                return attempt_outcome::acquired;
            }
            hint = std::move(r->hint);
            return attempt_outcome::refused;
        } catch (...) {
            give_up();
            settle(std::current_exception());
            return attempt_outcome::failed;
        }
    }

    void give_up() noexcept override {
        if (op_) op_->give_up();
        // Still queued at the gate: out of it (a turn already told is taken back by gate_turn).
        if (gate_ && !leading_ && gate_->withdraw(ticket_)) waits.left_gate(*this);
        if (reentering_) {  // a re-entry riding an outage: its next try is off
            site_->core_->eng.cancel(reentry_timer_);
            stop_reentering();
        }
    }
    std::chrono::microseconds pause_before_try() const override {
        if constexpr (Kind::races) return race_.pause();
        return std::chrono::microseconds(0);
    }
    const std::string& lock_name() const noexcept override { return site_->name(); }
    const std::string& server() const noexcept override { return site_->server(); }
    const char* event_kind() const noexcept override { return Kind::info.name; }
    unsigned tries() const noexcept override { return op_ ? op_->tries() : 0; }

private:
    // op_ as outage_step runs it here: its undo, like its tries, is not sent while the server
    // leaves this client unanswered (on_engine).
    struct engine_op {
        async_acquire& self;
        void undo() { on_engine(*self.site_->core_, self.lock_name(), [&] { self.op_->undo(); }); }
    };

    // A re-entry (this owner holds the lock) rides an outage as a blocking one does
    // (basic_lock::reenter_riding): each next try on a timer, the acquire kept meanwhile by
    // async_waits as a waiter at the gate is (nothing else owns it), so that a cancel and the
    // client's destruction end it. `again`: the try before failed (lock_site::reenter).
    void reenter(registry::hold_ptr h, bool again) noexcept {
        try {
            try {
                (void)site_->reenter(*h, lease_, again);  // throws would_deadlock, lock_lost
            } catch (const error& e) {
                const clock::time_point at = reentry_ride_.again_after(e, deadline);  // or rethrows
                if (!reentering_) {
                    reentering_ = true;
                    waits.wait_at_gate(shared_from_this());
                }
                std::weak_ptr<async_waiter> weak = weak_from_this();
                reentry_timer_ = site_->core_->eng.at(at, [weak, h] {
                    std::shared_ptr<async_waiter> p = weak.lock();
                    if (p && !p->settled) static_cast<async_acquire&>(*p).reenter(h, true);
                });
                return;
            }
            stop_reentering();
            result = rlock::hold(site_, std::move(h));
            settled = true;
        } catch (...) {
            stop_reentering();
            settle(std::current_exception());
        }
        // Delivered outside the handler, as start() does.
        deliver();
    }
    void stop_reentering() noexcept {
        if (!reentering_) return;
        reentering_ = false;
        waits.left_gate(*this);  // the caller (the timer, start's task) keeps it alive
    }

    // This acquire's place in its client's gate for the lock (local hand-off): told its turn on
    // whatever thread hands the hold over or releases it, it posts gate_turn to the engine.
    class gate_ticket final : public gate_waiter {
    public:
        explicit gate_ticket(async_acquire& op) noexcept : op_(op) {}
        bool notify() noexcept override {
            try {
                // Owned meanwhile by async_waits::wait_at_gate.
                std::shared_ptr<async_acquire> self =
                    std::static_pointer_cast<async_acquire>(op_.shared_from_this());
                return op_.site_->core_->eng.post([self] { self->gate_turn(); });
            } catch (...) {
                return false;
            }
        }

    private:
        async_acquire& op_;
    };

    // Queued at the gate: kept by the client's waits, and ended by its deadline unless its
    // turn comes first.
    void wait_at_gate() {
        client_core& core = *site_->core_;
        waits.wait_at_gate(shared_from_this());
        if (deadline == clock::time_point::max()) return;
        std::weak_ptr<async_waiter> weak = weak_from_this();
        deadline_timer = core.eng.at(deadline, [weak] {
            if (std::shared_ptr<async_waiter> p = weak.lock()) static_cast<async_acquire&>(*p).gate_deadline();
        });
    }

    // Its wait ran out at the gate: one last try at Redis (not as the gate's leader), so that it
    // ends with the lock if it is free now, an empty hold if it is held, or the outage's error
    // when the server cannot be reached — as a blocking waiter's does.
    void gate_deadline() noexcept {
        deadline_timer = 0;
        if (settled || !gate_->withdraw(ticket_)) return;  // its turn is on its way
        waits.left_gate(*this);  // the timer's caller keeps this alive
        lead(false);
    }

    // Its turn at the gate, on the engine thread: handed the hold, or to lead. After the
    // acquire ended (cancelled, timed out, the client destroyed) a hold is handed on or
    // released, and leading passes to the next.
    void gate_turn() noexcept {
        waits.left_gate(*this);  // the task keeps this alive
        site_->core_->eng.cancel(deadline_timer);
        deadline_timer = 0;
        switch (ticket_.turn) {
            case gate_waiter::turn_state::granted: {
                passed_hold pass = std::move(ticket_.pass);
                if (settled) {
                    give_back(pass);
                    return;
                }
                try {
                    take(pass);
                } catch (...) {
                    give_back(pass);
                    settle(std::current_exception());
                }
                deliver();
                return;
            }
            case gate_waiter::turn_state::promoted:
            case gate_waiter::turn_state::freed:  // never told here
                if (settled) {
                    gate_->led(false);
                    return;
                }
                leading_ = true;
                lead(clock::now() < deadline);
                return;
            case gate_waiter::turn_state::stopped:
            case gate_waiter::turn_state::waiting:
                if (settled) return;
                try {
                    throw error(errc::connection_failed, site_->name(), site_->server(),
                                "the client was destroyed while this asynchronous acquire waited");
                } catch (...) {
                    settle(std::current_exception());
                }
                deliver();
                return;
        }
    }

    // A hold handed over at the gate becomes this acquire's: recorded with the same token and
    // expiry (the watchdog renews it from there), as a blocking waiter's (basic_lock::acquire).
    void take(const passed_hold& pass) {
        client_core& core = *site_->core_;
        registry::hold_ptr h =
            make_hold(Kind::info, site_->name(), pass.value, owner_, {pass.lease, renewal::watched, pass.sent});
        h->taken = core.events.stamp();
        h->handed_from = pass.from;
        h->gate = gate_place(gate_);
        core.reg.add(h);  // had it thrown, the record's going would have freed the gate
        wait_story s = story;
        s.tries = 0;
        core.events.acquired(Kind::info.name, site_->name(), h->id, s, /*handed_locally=*/true);
        result = rlock::hold(site_, std::move(h));
        settled = true;
    }

    // A hold handed to this acquire after it ended: on to the next local waiter, or released
    // through Redis (the gate's next waiter then leads). A release that finds the key gone
    // within the hold's lease tells the owners it was handed on from, as an unlock that finds
    // it gone does (lock_site::release_level): they may have held a lock that was gone. A
    // release that fails leaves the key to its lease.
    void give_back(passed_hold& pass) noexcept {
        const bool in_lease = clock::now() < pass.sent + pass.lease;
        if (in_lease && gate_->hand_over(pass)) return;
        try {
            if (site_->release(pass.value, on_break::retry) < 0 && in_lease) {
                site_->core_->reg.tell_handed_from(
                    pass.from, pass.sent, error(errc::lock_lost, site_->name(), site_->server(),
                                  "released unclaimed (its asynchronous acquire had ended), the "
                                  "lock was no longer held by this client"));
            }
        } catch (...) {
        }
        gate_->released();
    }

    // The attempt acquired: the hold is recorded (renewed from now when watched) before anyone
    // hears of it. The gate's leader holds the gate until the hold's unlock.
    void won() {
        client_core& core = *site_->core_;
        registry::hold_ptr h = make_hold(Kind::info, site_->name(), op_->value(), owner_,
                                         {lease_.duration(core.ep.options.lock_watchdog_timeout),
                                          lease_.is_watched() ? renewal::watched : renewal::leased, op_->sent()});
        h->fencing = op_->fencing();
        h->taken = core.events.stamp();
        if (leading_) {
            h->gate = gate_place(gate_);
            leading_ = false;
            gate_->led(true);
        }
        core.reg.add(h);
        wait_story s = story;
        s.tries = op_->tries();
        core.events.acquired(Kind::info.name, site_->name(), h->id, s);
        result = rlock::hold(site_, std::move(h));
        settled = true;
    }

public:
    void deliver() noexcept override {
        if (leading_) {  // its wait at Redis ended without the lock: the next local waiter leads
            leading_ = false;
            gate_->led(false);
        }
        try {
            done(std::move(failure), std::move(result));
        } catch (...) {
        }
    }

private:
    rlock::hold result;
    completion done;
    std::shared_ptr<const lock_site<Kind>> site_;
    lease_request lease_;
    std::uint64_t owner_;
    std::optional<lock_acquisition<Kind>> op_;  // made once the lease is known (start)
    race_pacing race_;  // against waiters of other processes racing for the same release
    outage_step step_;  // tries are undone before the next after an outage
    // Local hand-off (local_gate.hpp): the client's gate for the lock, when this acquire goes
    // through it; its place there; and whether it leads at Redis for it (owing it led()).
    std::shared_ptr<local_gate> gate_;
    gate_ticket ticket_{*this};
    bool leading_ = false;
    // A re-entry riding an outage (reenter): its backoff, its next try's timer, and whether it
    // is kept by async_waits meanwhile.
    failure_ride reentry_ride_{repeat::safe, site_->core_->ep.follows_failovers()};
    engine::timer_id reentry_timer_ = 0;
    bool reentering_ = false;
};

/// What starts an asynchronous acquire of one lock (its call, lease, owner, completion) and
/// returns its cancel handle; it shares the lock's site, so it outlives the lock object.
using async_start = std::function<rlock::pending(wait_call, lease_request, std::uint64_t, completion)>;

/// Starts an asynchronous acquire of `site`'s lock: posts it to the engine and returns its
/// cancel handle. Throws `error` (connection_failed) when the client is being destroyed.
template <class Kind>
rlock::pending start_acquire(const std::shared_ptr<const lock_site<Kind>>& site,
                             wait_call call, lease_request lease, std::uint64_t owner, completion done) {
    client_core& core = *site->core_;
    async_waits& waits = waits_of(core);
    auto op = std::make_shared<async_acquire<Kind>>(site, waits, call, lease,
                                                    owner != 0 ? owner : next_owner_number(),
                                                    std::move(done));
    if (!core.eng.post([op] { op->start(); })) {
        throw error(errc::connection_failed, site->name(), site->server(),
                    "the client this lock was made from has been destroyed");
    }
    return rlock::pending(op);
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::exception_ptr own_copy(std::exception_ptr e) noexcept {
    if (!e) return e;
    try {
        std::rethrow_exception(e);
    } catch (const error& err) {
        try {
            return std::make_exception_ptr(error_access::with_origin(
                err.value(), err.lock(), err.server(), err.cause(), error_access::origin(err)));
        } catch (...) {  // bad_alloc: the shared one, as before
            return e;
        }
    } catch (...) {
        return e;
    }
}

RLOCK_DECL void async_waiter::settle(std::exception_ptr e) noexcept {
    if (settled) return;
    settled = true;
    if (!e && !outage) tell_wait_ended(false);
    failure = own_copy(e ? std::move(e) : std::exchange(outage, nullptr));
}

RLOCK_DECL wait_group* async_waits::find(const std::string& key) {
    auto it = groups_.find(key);
    return it == groups_.end() ? nullptr : it->second.get();
}

RLOCK_DECL void async_waits::join(const std::shared_ptr<async_waiter>& w, const std::string& key,
                                  const std::string& channel, bool shared,
                                  std::chrono::milliseconds heartbeat, const wait_hint* hint) {
    std::shared_ptr<wait_group>& slot = groups_[key];
    if (!slot) {
        slot = std::make_shared<wait_group>();
        slot->key = key;
        slot->serial = ++serial_;
        slot->shared = shared;
        slot->policy = wait_policy(heartbeat);
        wait_group* raw = slot.get();
        // On the subscriber's thread, under its lock; the group outlives its subscription.
        slot->sub = std::make_unique<subscriber::subscription>(*core.sub, channel, [this, raw] {
            if (!raw->posted.exchange(true)) post_pump(raw->key, raw->serial);
        });
    }
    wait_group& g = *slot;
    w->group = &g;
    w->place = g.queue.insert(g.queue.end(), w);
    if (w->deadline != clock::time_point::max()) {
        std::weak_ptr<async_waiter> weak = w;
        w->deadline_timer = core.eng.at(w->deadline, [this, weak] {
            if (std::shared_ptr<async_waiter> p = weak.lock()) expire(p);
        });
    }
    if (hint) schedule(g, *hint);
}

RLOCK_DECL void async_waits::expire(const std::shared_ptr<async_waiter>& w) {
    if (w->settled) return;
    w->deadline_timer = 0;  // this is it
    wait_hint hint;
    if (core.eng.stopping() || w->attempt_waiting(hint, false) == attempt_outcome::refused) {
        end(w, nullptr);
        return;
    }
    // Acquired, or failed (given up and settled with the failure).
    leave(*w);
    w->deliver();
}

RLOCK_DECL void async_waits::end(const std::shared_ptr<async_waiter>& w, std::exception_ptr e) {
    if (w->settled) return;
    leave(*w);
    w->give_up();
    w->settle(std::move(e));
    w->deliver();
}

RLOCK_DECL void async_waits::fail_all() noexcept {
    std::vector<std::shared_ptr<async_waiter>> all;
    for (auto& [key, g] : groups_) {
        core.eng.cancel(g->retry);
        core.eng.cancel(g->pause_timer);
        for (auto& w : g->queue) all.push_back(w);
    }
    for (auto& [raw, w] : at_gate_) all.push_back(w);
    at_gate_.clear();
    for (auto& w : all) {
        core.eng.cancel(w->deadline_timer);
        w->group = nullptr;
        w->give_up();
        try {
            w->settle(std::make_exception_ptr(
                error(errc::connection_failed, w->lock_name(), w->server(),
                      "the client was destroyed while this asynchronous acquire waited")));
        } catch (...) {
            w->settle(std::current_exception());
        }
    }
    groups_.clear();
    for (auto& w : all) w->deliver();
}

RLOCK_DECL std::shared_ptr<wait_group> async_waits::current(const std::string& key,
                                                            std::uint64_t serial) const {
    auto it = groups_.find(key);
    return it != groups_.end() && it->second->serial == serial ? it->second : nullptr;
}

RLOCK_DECL bool async_waits::fail_if_refused(wait_group& g) {
    if (g.queue.empty()) return false;
    try {
        g.sub->throw_if_refused(g.queue.front()->lock_name(), g.queue.front()->server());
        return false;
    } catch (const error&) {
        const std::exception_ptr why = std::current_exception();
        std::vector<std::shared_ptr<async_waiter>> all(g.queue.begin(), g.queue.end());
        for (const auto& w : all) end(w, why);
        return true;
    }
}

RLOCK_DECL void async_waits::post_pump(const std::string& key, std::uint64_t serial) noexcept {
    try {
        (void)core.eng.post([this, key, serial] {
            // The first news is the subscription's confirmation, which a blocking waiter
            // takes before its loop (wait_active): not an unlock message.
            if (std::shared_ptr<wait_group> g = current(key, serial)) {
                pump(g, std::exchange(g->confirmed, true));
            }
        });
    } catch (...) {  // bad_alloc: the group's timer still bounds its wait
    }
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): `g` by value, as its declaration says
RLOCK_DECL void async_waits::pump(std::shared_ptr<wait_group> g, bool woken) {
    g->posted.store(false);
    if (g->pause_timer != 0) {
        // The head is waiting out its race pause: the try after it serves this news too (a
        // message must not cut the pause short, or the young would try with the old).
        g->woken_in_pause = g->woken_in_pause || woken;
        return;
    }
    core.eng.cancel(g->retry);
    g->retry = 0;
    if (core.eng.stopping()) return;
    if (fail_if_refused(*g)) return;
    if (!g->queue.empty() && !g->paused) {
        const std::chrono::microseconds pause = g->queue.front()->pause_before_try();
        if (pause.count() > 0) {
            g->paused = true;
            g->woken_in_pause = woken;
            g->pause_timer =
                core.eng.at(clock::now() + pause, [this, key = g->key, serial = g->serial] {
                    if (std::shared_ptr<wait_group> now = current(key, serial)) {
                        now->pause_timer = 0;
                        pump(now, now->woken_in_pause);
                    }
                });
            return;
        }
    }
    g->paused = false;
    std::vector<std::shared_ptr<async_waiter>> done;
    while (!g->queue.empty()) {
        std::shared_ptr<async_waiter> w = g->queue.front();
        wait_hint hint;
        const attempt_outcome o = w->attempt_waiting(hint, woken);
        if (o == attempt_outcome::refused) {
            schedule(*g, hint);
            break;
        }
        leave(*w);
        done.push_back(std::move(w));
        if (o == attempt_outcome::acquired && !g->shared && !g->queue.empty()) {
            // The rest wait behind this hold: for its unlock message, or its lease.
            schedule(*g, hint);
            break;
        }
    }
    for (auto& w : done) w->deliver();
}

RLOCK_DECL void async_waits::schedule(wait_group& g, const wait_hint& hint) {
    const clock::time_point until = g.policy.next_try(clock::now(), hint, g.sub->active());
    core.eng.cancel(g.retry);
    g.retry = 0;
    if (until == clock::time_point::max()) return;  // a synchronizer: messages only
    g.retry = core.eng.at(until, [this, key = g.key, serial = g.serial] {
        if (std::shared_ptr<wait_group> now = current(key, serial)) pump(now, false);
    });
}

RLOCK_DECL void async_waits::leave(async_waiter& w) {
    core.eng.cancel(w.deadline_timer);
    w.deadline_timer = 0;
    wait_group* g = w.group;
    if (!g) return;
    w.group = nullptr;
    g->queue.erase(w.place);
    if (!g->queue.empty()) return;
    core.eng.cancel(g->retry);
    g->retry = 0;
    core.eng.cancel(g->pause_timer);
    g->pause_timer = 0;
    auto it = groups_.find(g->key);
    if (it != groups_.end() && it->second.get() == g) groups_.erase(it);
}

RLOCK_DECL void async_waiter::tell_wait_ended(bool cancelled) const noexcept {
    const event_sink& events = waits.core.events;
    if (!events.on() || event_kind() == nullptr) return;
    wait_story s = story;
    s.tries = tries();
    events.wait_ended(event_kind(), lock_name(), s, cancelled);
}

RLOCK_DECL void async_waiter::cancel() noexcept {
    try {
        std::weak_ptr<async_waiter> weak = weak_from_this();
        (void)waits.core.eng.post([weak] {
            std::shared_ptr<async_waiter> w = weak.lock();
            if (!w) return;
            if (!w->settled) w->tell_wait_ended(true);
            w->waits.end(w, std::make_exception_ptr(
                                error(errc::operation_aborted, w->lock_name(), w->server(),
                                      "the asynchronous acquire was cancelled")));
        });
    } catch (...) {
    }
}

RLOCK_DECL async_waits& waits_of(client_core& core) {
    std::call_once(core.async_once, [&] {
        auto w = std::make_shared<async_waits>(core);
        async_waits* raw = w.get();
        core.eng.set_owner(core.weak_from_this(), [raw] { raw->fail_all(); });
        core.async_state = std::move(w);
    });
    return *static_cast<async_waits*>(core.async_state.get());
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
