// The blocking driver: runs any acquisition operation of one client — a lock on one key
// (lock_acquisition, lock_site.hpp), a synchronizer's condition (channel_acquisition,
// synchronizer.hpp) — on the calling thread, under the wait policy (wait_policy.hpp). The
// asynchronous driver is async_waits (async_lock.hpp); both run the same operations.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/subscriber.hpp"
#include "rlock/detail/waiting/wait_pacing.hpp"
#include "rlock/detail/waiting/wait_policy.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// Runs `op` until one of its tries is done (true) or `deadline` has passed (false). An
/// operation supplies:
///   const std::string& name() const;             the lock or synchronizer, in errors
///   std::string channel() const;                 where the news of a change comes
///   const void* turns() const;                   this client's waiters of that class take
///                                                turns (subscription::take_turns); nullptr:
///                                                every waiter tries on every message
///   long long turn_need() const;                 > 0: what each waiter needs of a message's
///                                                count (a semaphore's permits): a message
///                                                wakes those whose needs fit, not just the first
///   bool shared() const;                         a winner leaves the news to the next (a reader)
///   std::chrono::milliseconds heartbeat() const; a queued waiter's heartbeat (0: none)
///   bool subscribes_first() const;               its first try comes after it subscribed
///                                                (a racing one's newcomer may ask too)
///   bool paces_newcomer() const;                 a racing one's newcomer pauses before its
///                                                first try (race_pacing::newcomer_pause)
///   race_record* races() const;                  where its waiters race other clients' (else
///                                                null), and then
///   long long subscribers(channel) const;        how many clients wait on the channel
///   try_result attempt(try_phase);               one try
///   void undo();                                 what a try that failed in an outage may have
///                                                left, before the next try
///   void give_up() noexcept;                     the wait ends without success
///
/// A racing operation's newcomer (where it paces_newcomer) first lets the waiters a release has
/// just woken go first (race_pacing::newcomer_pause), and may subscribe before its first try
/// (race_pacing::subscribes_first); each try in the wait is paced by race_pacing. After a
/// refusal the driver subscribes to the channel and makes each next try when a message arrives
/// or at wait_policy::next_try; a try that fails in an outage is made again after
/// failure_ride's backoff (outage_step), `repeatable` saying whether it may be. An error that
/// is not an outage is thrown at once, and connection_failed (naming the operation) once the
/// client is destroyed. Whatever ends the wait without success calls op.give_up().
template <class Op>
bool wait_blocking(client_core& core, Op& op, std::chrono::steady_clock::time_point deadline,
                   repeat repeatable) {
    using clock = std::chrono::steady_clock;
    std::optional<race_pacing> race;  // against waiters of other clients
    if (race_record* record = op.races()) race.emplace(*record);
    // Whether this newcomer subscribes before its first try (race_pacing::subscribes_first).
    bool subscribe_first = false;
    if (race && op.paces_newcomer() && clock::now() < deadline) {
        // A newcomer lets the waiters a release has just woken go first: those of this
        // client's own release (note_woken), and, while this client loses races for the lock,
        // whoever is woken as it arrives (race_pacing::newcomer_pause). A sleep, not a wait for
        // news: nothing is published when a woken waiter takes the lock. Bounded (at most 1 ms,
        // the courtesy; 400 µs otherwise), once per call, and none at all when the lock is not
        // contended; it is not a poll: the wait below still ends on the unlock message or the
        // holder's TTL. Behind three rivals or more it subscribes before it tries at all: its
        // first try is then the wait loop's, held back by its youth.
        const std::chrono::microseconds pause = race->newcomer_pause(core.courtesy_left(op.name()));
        if (pause.count() > 0) std::this_thread::sleep_until(std::min(deadline, clock::now() + pause));
        subscribe_first = race->subscribes_first();
    }
    subscribe_first = subscribe_first || op.subscribes_first();
    const bool may_wait = clock::now() < deadline;
    outage_step step(repeatable, core.ep.follows_failovers());
    auto again = clock::time_point::max();  // when a refusal or an outage asked to try again
    // (Its deadline past after a newcomer's pause, it tries now: every call tries once.)
    if (!subscribe_first || !may_wait) {
        const std::optional<try_result> r = step.run(
            op, [&] { return op.attempt(may_wait ? try_phase::first : try_phase::only); }, deadline, again);
        if (r && r->done) return true;
        if (r) again = r->hint.again;
        if (!r) core.throw_if_destroyed(op.name(), "the client was destroyed while this thread waited");
    }
    if (clock::now() >= deadline) {
        if (may_wait) op.give_up();  // it may have queued
        return false;
    }
    // Whatever ends this wait without success (its deadline, an error) leaves no trace.
    struct leaver {
        Op& op;
        bool armed = true;
        ~leaver() {
            if (armed) op.give_up();
        }
    } leave{op};
    const std::string channel = op.channel();
    // Before subscribing: the clients already waiting are this waiter's rivals.
    if (race) race->count_rivals([&] { return op.subscribers(channel); });
    subscriber::subscription sub(*core.sub, channel);
    if (const void* turns = op.turns()) sub.take_turns(turns, op.turn_need());
    sub.wait_active(std::min({deadline, again, clock::now() + core.ep.options.command_timeout}));
    wait_policy policy(op.heartbeat());
    bool woken = false;  // the last wait ended with a message (an unlock, mostly)
    for (;;) {
        core.throw_if_destroyed(op.name(), "the client was destroyed while this thread waited");
        sub.throw_if_refused(op.name(), core.ep.name);
        if (race) race->before_try(deadline);
        const std::uint64_t seen = sub.generation();
        const std::optional<try_result> r =
            step.run(op, [&] { return op.attempt(try_phase::waiting); }, deadline, again);
        if (!r) {  // an outage: tried again after the backoff, or sooner on a message
            woken = sub.wait_turn(seen, std::min(deadline, again));
            continue;
        }
        if (race) race->after_try(*r, woken);
        if (r->done) break;
        const auto now = clock::now();
        if (now >= deadline) return false;
        core.throw_if_destroyed(op.name(), "the client was destroyed while this thread waited");
        if (r->hint.ttl == -2) continue;  // freed between the try's write and its read: at once
        // Re-read each time: a subscriber that reconnected is not listening until its
        // SUBSCRIBE is confirmed (the confirmation then wakes this waiter to retry).
        woken = sub.wait_turn(seen, std::min(deadline, policy.next_try(now, r->hint, sub.active())));
    }
    leave.armed = false;
    sub.leave_turns(!op.shared());
    return true;
}

}  // namespace rlock::detail
