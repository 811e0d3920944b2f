// How a waiter paces its tries where an unlock message alone would pace it badly: against
// waiters of other processes racing for the same release (race_pacing), and behind a holder
// that never publishes its release (silent_holder_looks). the drivers (wait_blocking, async_waits) ask both;
// neither is a poll for a lock whose holder publishes (docs/design.md, basic_lock step 4).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/runtime/client_core.hpp"

namespace rlock::detail {

/// Waiters of different processes race for a released lock: each is woken by the unlock
/// message and tries again, and the first try to reach Redis wins. Left alone the race
/// favours the newest waiter (Redis writes a message to a channel's newest subscriber first,
/// and a newcomer's tries are often in flight as the lock frees), a loser keeps losing, and the
/// wait's tail grows geometrically (docs/benchmarks.md, "Contention"). So, while this client
/// has been losing such races for the lock, a waiter's tries are held back by its youth: try i
/// of its wait (counted from 0) by yield_step * (R - i), where R is the number of other clients
/// waiting for the lock as the server last counted them (race_record::rivals; at least 2, at
/// most 8). A waiter that has lost a race to each rival ahead of it pays nothing; woken
/// together with younger ones, it is first to Redis. R is counted by the server, not learnt
/// from this client's own waits: a client whose waiters wait long must not yield longer for it.
/// A waiter that has no rival never loses a race, and pays nothing. This is a short pause
/// before a try, never a poll. Only for kinds whose waiters race (kind_defaults::races): a
/// queued kind's names would bump records shared by hash.
class race_pacing {
public:
    explicit race_pacing(race_record& record) noexcept : record_(record) {}

    /// Before each try of the wait loop. Not a poll: the one bounded pause pause() describes,
    /// cut at `deadline` (the try then is the wait's last); the wait itself still ends on the
    /// unlock message or the holder's TTL.
    void before_try(std::chrono::steady_clock::time_point deadline) const;

    /// The pause before_try() makes: an asynchronous waiter waits it on a timer instead.
    /// At most 800 µs, only before a wait's first R tries, and only while this client is
    /// losing races for the lock. It orders woken waiters by age; the wait itself still ends
    /// on the unlock message or the holder's TTL.
    std::chrono::microseconds pause() const;

    /// Before a waiter subscribes: while this client loses races for the lock, and at most
    /// every 20 ms per record (shared by the client's waiters of a name), counts the rivals
    /// with `subscribers()` — the subscribers of the lock's channel, or -1 when the server does
    /// not say (R then stays as it was).
    template <class Count>
    void count_rivals(Count&& subscribers) {
        if (record_.lost.load(std::memory_order_relaxed) == 0) return;
        const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        if (now - record_.rivals_at.load(std::memory_order_relaxed) <
            std::chrono::steady_clock::duration(rivals_every).count()) {
            return;
        }
        record_.rivals_at.store(now, std::memory_order_relaxed);
        const long long n = subscribers();
        if (n >= 0) {
            record_.rivals.store(static_cast<int>(std::min<long long>(n, max_yield_rounds)),
                                 std::memory_order_relaxed);
        }
    }

    /// Whether a newcomer subscribes before its first try: while this client loses races for
    /// the lock and at least three other clients wait for it. A newcomer that tried at once
    /// landed, now and then, in the moment between a release and the oldest woken waiter's
    /// try, and took the lock from it; so did its first try after subscribing, which no
    /// message times either. Subscribed first, it has one such try, the wait loop's first,
    /// held back the longest (pause()). Measured (W=8, H=1 ms, A=1 ms; docs/benchmarks.md):
    /// the oldest of seven waiters won 98-99 % of hand-overs instead of 43-50 %, the worst p99
    /// wait 10-15 ms instead of 18-23.
    bool subscribes_first() const noexcept;

    /// The pause before a newcomer's first attempt when it does not subscribe first: 400 µs
    /// while this client loses races for the lock. A newcomer that tries at once lands, as
    /// often as not, just after a release and beats the waiters that release woke; held back
    /// this long, it comes after the oldest of them has taken the lock. Measured (W=4, H=1 ms,
    /// A=1 ms; docs/benchmarks.md): asynchronous mutex, with 200 µs the newest waiter won
    /// 19-20 % of hand-overs and the worst p99 wait was 8.3-8.9 ms, with 400 µs 1 % and
    /// 3.2-6.2 ms, with 800 µs the second oldest won a third and the p99 was 10 ms.
    /// `courtesy`: what is left of this client's courtesy after its own release woke waiters
    /// (client_core::courtesy_left); the pause is the larger of the two.
    std::chrono::microseconds newcomer_pause(std::chrono::microseconds courtesy) const;

    /// After each try: `woken` when the wait before it ended with a message. Keeps `lost`:
    /// -1 for an acquisition; +2 (up to max_lost) when a try an unlock message woke was
    /// beaten by another waiter, i.e. the lock is raced for.
    void after_try(const try_result& r, bool woken);

private:
    static constexpr int max_lost = 8;
    static constexpr std::chrono::microseconds yield_step{100};
    static constexpr std::chrono::milliseconds rivals_every{20};
    static constexpr std::chrono::microseconds newcomer_step{400};  // newcomer_pause()
    // Subscribing first costs a newcomer a round trip before its first try, which a lone
    // waiter would have spent holding the lock: behind one or two rivals the newcomer's pause
    // alone keeps the order (the oldest of three won 97-99 % of hand-overs), so it tries first.
    static constexpr int subscribe_first_rivals = 3;
    // Behind one or two rivals, two rounds (measured at W=4: more fixed rounds held back the
    // oldest of three, busy 0.80 instead of 0.90; docs/benchmarks.md). Behind more, one round
    // per rival, so that the oldest of seven is still first; at most 800 µs for the newest.
    static constexpr int min_yield_rounds = 2;
    static constexpr int max_yield_rounds = 8;

    race_record& record_;
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
    std::chrono::microseconds next(std::string holder);

private:
    static constexpr std::chrono::milliseconds first_look{1};
    // As often as redis-py's own waiters try (its Lock's default sleep, 0.1 s), and well
    // within the 250 ms a waiter may take to notice a release (issue 17).
    static constexpr std::chrono::milliseconds longest_look{100};

    std::chrono::milliseconds look_ = first_look;
    std::string holder_;  // whom the current look was measured against
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void race_pacing::before_try(std::chrono::steady_clock::time_point deadline) const {
    const std::chrono::microseconds p = pause();
    if (p.count() > 0) {
        // A bounded pause (at most 800 µs, only before a wait's first tries and only while
        // this client loses races), not a poll interval: it lets older waiters woken by the
        // same unlock message try first; the wait for the lock itself is the message or TTL.
        std::this_thread::sleep_until(std::min(deadline, std::chrono::steady_clock::now() + p));
    }
}

RLOCK_DECL std::chrono::microseconds race_pacing::pause() const {
    if (record_.lost.load(std::memory_order_relaxed) == 0) return std::chrono::microseconds(0);
    const int rounds = std::clamp(record_.rivals.load(std::memory_order_relaxed), min_yield_rounds,
                                  max_yield_rounds);
    if (round_ >= rounds) return std::chrono::microseconds(0);
    // A newcomer that subscribed first: its first try, which no message times, waits at
    // least newcomer_step, so that a release just before it goes to the oldest it woke.
    if (round_ == 0 && subscribes_first()) return std::max(newcomer_step, yield_step * rounds);
    return yield_step * (rounds - round_);
}

RLOCK_DECL bool race_pacing::subscribes_first() const noexcept {
    return record_.lost.load(std::memory_order_relaxed) > 0 &&
           record_.rivals.load(std::memory_order_relaxed) >= subscribe_first_rivals;
}

RLOCK_DECL std::chrono::microseconds race_pacing::newcomer_pause(
    std::chrono::microseconds courtesy) const {
    if (record_.lost.load(std::memory_order_relaxed) == 0 || subscribes_first()) return courtesy;
    return std::max(courtesy, newcomer_step);
}

RLOCK_DECL void race_pacing::after_try(const try_result& r, bool woken) {
    ++round_;
    const int now = record_.lost.load(std::memory_order_relaxed);
    if (r.done) {
        if (now > 0) record_.lost.fetch_sub(1, std::memory_order_relaxed);
    } else if (woken && r.hint.ttl != -2 && now < max_lost) {
        record_.lost.fetch_add(2, std::memory_order_relaxed);
    }
}

RLOCK_DECL std::chrono::microseconds silent_holder_looks::next(std::string holder) {
    if (holder != holder_) look_ = first_look;
    holder_ = std::move(holder);
    const auto full = std::chrono::duration_cast<std::chrono::microseconds>(look_).count();
    look_ = std::min(look_ * 2, longest_look);
    return std::chrono::microseconds(random_between(full / 2, full));
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
