// How a waiter paces its tries where an unlock message alone would pace it badly: against
// waiters of other processes racing for the same release (race_pacing), and behind a holder
// that never publishes its release (silent_holder_looks). basic_lock's wait loop asks both;
// neither is a poll for a lock whose holder publishes (docs/design.md, basic_lock step 4).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "rlock/detail/kind.hpp"
#include "rlock/detail/random.hpp"

namespace rlock::detail {

/// Waiters of different processes race for a released lock: each is woken by the unlock
/// message and tries again, and the first try to reach Redis wins. Left alone the race
/// favours the newest waiter (Redis writes a message to a channel's newest subscriber first,
/// and a newcomer's tries are often in flight as the lock frees), a loser keeps losing, and the
/// wait's tail grows geometrically (docs/benchmarks.md, "Contention"). So, while this client
/// has been losing such races for the lock (`lost_races` > 0, shared by the client's waiters
/// of that name), a waiter's tries are held back by its youth: its first try in the loop by
/// 2 * yield_step, its second by yield_step, later ones not at all. The oldest waiter, woken
/// with the others, is then first to Redis. A waiter that has no rival never loses a race, and
/// pays nothing. This is a short pause before a try, never a poll. Only for kinds whose waiters
/// race (kind_defaults::races): a queued kind's names would bump counters shared by hash.
class race_pacing {
public:
    explicit race_pacing(std::atomic<int>& lost_races) noexcept : lost_races_(lost_races) {}

    /// Before each try of the wait loop. Not a poll: the one bounded pause pause() describes
    /// (at most 200 µs, only for a wait's first two tries while this client loses races for
    /// the lock); the wait itself still ends on the unlock message or the holder's TTL.
    void before_try() const {
        const std::chrono::microseconds p = pause();
        if (p.count() > 0) std::this_thread::sleep_for(p);
    }

    /// The pause before_try() makes: an asynchronous waiter waits it on a timer instead.
    /// A fixed pause, and a defensible one: at most 200 µs, before the first two tries of a
    /// wait only, and only while this client is losing races for the lock. It orders woken
    /// waiters; the wait itself still ends on the unlock message or the holder's TTL.
    std::chrono::microseconds pause() const {
        if (round_ >= yield_rounds || lost_races_.load(std::memory_order_relaxed) == 0) {
            return std::chrono::microseconds(0);
        }
        return yield_step * (yield_rounds - round_);
    }

    /// The pause before a newcomer's first attempt (before it waits at all): twice the loop's
    /// first pause (400 µs), and likewise only while this client loses races for the lock.
    /// A newcomer that tries at once lands, as often as not, just after a release and beats
    /// the waiters that release woke; held back this long, it comes after the oldest of them
    /// has taken the lock. Measured (W=4, H=1 ms, A=1 ms; docs/benchmarks.md): asynchronous
    /// mutex, with the loop's 200 µs the newest waiter won 19-20 % of hand-overs and the worst
    /// p99 wait was 8.3-8.9 ms, with 400 µs 1 % and 3.2-6.2 ms, with 800 µs the second oldest
    /// won a third and the p99 was 10 ms; blocking mutex (no pause before), p99 6.7-7.5 ms
    /// against 4.9-5.6 ms with it.
    /// `courtesy`: what is left of this client's courtesy after its own release woke waiters
    /// (client_core::courtesy_left); the pause is the larger of the two.
    std::chrono::microseconds newcomer_pause(std::chrono::microseconds courtesy) const {
        return std::max(courtesy, round_ == 0 ? 2 * pause() : pause());
    }

    /// After each try: `woken` when the wait before it ended with a message. Keeps lost_races:
    /// -1 for an acquisition; +2 (up to max_lost_races) when a try an unlock message woke was
    /// beaten by another waiter, i.e. the lock is raced for.
    void after_try(const acquire_result& r, bool woken) {
        ++round_;
        const int now = lost_races_.load(std::memory_order_relaxed);
        if (r.acquired) {
            if (now > 0) lost_races_.fetch_sub(1, std::memory_order_relaxed);
        } else if (woken && r.ttl != -2 && now < max_lost_races) {
            lost_races_.fetch_add(2, std::memory_order_relaxed);
        }
    }

private:
    static constexpr int max_lost_races = 8;
    static constexpr std::chrono::microseconds yield_step{100};
    // Two rounds suit a handful of waiters (more rounds would hold back the oldest of three,
    // measured: busy 0.80 instead of 0.90 at W=4; docs/benchmarks.md).
    static constexpr int yield_rounds = 2;

    std::atomic<int>& lost_races_;
    int round_ = 0;  // tries made in this wait loop
};

/// A holder of another library on a mutex's key (redis-py's Lock, node-redlock, go-redsync)
/// deletes it without a message, and would leave a waiter asleep for the holder's whole TTL.
/// So behind a holder whose value lacks rlock's mark (detail::token_prefix) the waiter looks
/// again by itself: after `look`, which starts at first_look, doubles up to longest_look while
/// the same holder stays, and starts again when another value holds the key (the lock is
/// changing hands, so its free moments are frequent and short). Each look waits a random 1/2 to
/// 1 of it, so waiters do not look in step. A message still ends the wait at once; behind
/// rlock's and Redisson's holders (which publish) nothing of this applies.
class silent_holder_looks {
public:
    /// How long to wait before looking again behind `holder` (the value holding the key).
    std::chrono::microseconds next(std::string holder) {
        if (holder != holder_) look_ = first_look;
        holder_ = std::move(holder);
        const auto full = std::chrono::duration_cast<std::chrono::microseconds>(look_).count();
        look_ = std::min(look_ * 2, longest_look);
        return std::chrono::microseconds(random_between(full / 2, full));
    }

private:
    static constexpr std::chrono::milliseconds first_look{1};
    // As often as redis-py's own waiters try (its Lock's default sleep, 0.1 s), and well
    // within the 250 ms a waiter may take to notice a release (issue 17).
    static constexpr std::chrono::milliseconds longest_look{100};

    std::chrono::milliseconds look_ = first_look;
    std::string holder_;  // whom the current look was measured against
};

}  // namespace rlock::detail
