// When a waiter tries again without a message, and what it does after a try that failed in a way
// that may have run: the rules every wait follows, blocking or asynchronous, lock or
// synchronizer, written once. The two drivers (wait_blocking, async_waits, and the asynchronous
// waiters it runs) ask wait_policy::next_try after each refused try, and wait until then or
// for a message, whichever comes first; they ask failure_ride what to do with a try that threw
// (an outage is waited through until the deadline).
#pragma once

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/waiting/wait_pacing.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// The rules of when a waiter tries again when no message comes. A message (an unlock, the
/// subscription confirmed after a reconnect) ends every wait earlier; these bound it:
///   - the holder's TTL: its lease ends then, whether or not anyone publishes;
///   - at once: the lock was freed between the try's write and its TTL read;
///   - while no message can be counted on (the subscription not confirmed, a holder whose key
///     has no expiry): 10 ms, doubling to 1 s;
///   - behind a holder that does not publish its release: silent_holder_looks;
///   - a queued waiter's heartbeat (fair_lock renews its place with each try);
///   - the time the attempt asked for (wait_hint::again).
/// One per wait: the fallback and the looks grow over its tries.
class wait_policy {
public:
    using clock = std::chrono::steady_clock;

    explicit wait_policy(std::chrono::milliseconds heartbeat = std::chrono::milliseconds(0)) noexcept
        : heartbeat_(heartbeat) {}

    /// When to try again after a refused try that said `hint`, `listening` whether the
    /// subscription is confirmed; clock::time_point::max() when only a message should wake it.
    clock::time_point next_try(clock::time_point now, const wait_hint& hint, bool listening);

private:
    static constexpr std::chrono::milliseconds first_fallback{10};
    static constexpr std::chrono::milliseconds longest_fallback{1000};
    std::chrono::milliseconds fallback_ = first_fallback;
    silent_holder_looks looks_;
    std::chrono::milliseconds heartbeat_;
};

/// Whether a wait's attempt is safe to make again after a failure that may have run: it reads,
/// it finds its own earlier work, or its caller undoes what it may have left first (a lock's
/// release with the same value).
enum class repeat { safe, unsafe };

/// A wait whose tries fail because the server cannot be reached or does not answer (it is
/// restarting, a connection was killed, a failover is under way: connection_failed, timeout;
/// a replica's READONLY too, where the client follows failovers: Sentinel, Cluster; and, for a
/// client in cluster mode, a cluster that could not serve the slot for a whole command_timeout:
/// CLUSTERDOWN, TRYAGAIN, redirections without end, which say that the command did not run)
/// goes on waiting: each next try after a backoff (25 ms, doubling to 1 s; a message, such as
/// the subscriber's confirmation after it reconnected, ends the backoff sooner) until the
/// wait's deadline, and then the last failure is the wait's error. A wait without a deadline
/// (lock(), acquire()) rides an outage for as long as it lasts. An attempt that may have run
/// is made again only when that is safe (repeat::safe); a repeat::unsafe one (a semaphore's
/// DECRBY) only when its failure says that it did not run (error_origin::unsent), else
/// that failure is the wait's at once, as is any other error.
class failure_ride {
public:
    using clock = std::chrono::steady_clock;

    /// `follows_failovers`: endpoint::follows_failovers(). Without, a replica's refusal
    /// (READONLY, reported as connection_failed) is the client's settings: thrown at once.
    failure_ride(repeat repeatable, bool follows_failovers) noexcept
        : repeatable_(repeatable), follows_failovers_(follows_failovers) {}

    /// An attempt reached the server: the outage, if any, is over.
    void reached() noexcept { backoff_ = first_backoff; }

    /// Called in the handler of `e`, thrown by an attempt: rethrows it, or returns when to make
    /// the attempt again (at most `deadline`'s worth of backoff away).
    clock::time_point again_after(const error& e, clock::time_point deadline);

private:
    static constexpr std::chrono::milliseconds first_backoff{25};
    static constexpr std::chrono::milliseconds longest_backoff{1000};
    repeat repeatable_;
    bool follows_failovers_;
    std::chrono::milliseconds backoff_ = first_backoff;
};

/// One try of a wait under the outage rule, for both drivers (wait_blocking, async_waits):
/// when the try before failed in an outage (it may have run), `op.undo()` comes first; then
/// the try; a failure goes to failure_ride, which rethrows it or says when to try again.
class outage_step {
public:
    using clock = std::chrono::steady_clock;

    outage_step(repeat repeatable, bool follows_failovers) noexcept : ride_(repeatable, follows_failovers) {}

    /// Returns what `attempt()` returned; or nothing when it failed in an outage the wait
    /// rides, and then `again` is when to try next. Rethrows any other failure (and an
    /// outage's at `deadline`).
    template <class Op, class Attempt>
    auto run(Op& op, Attempt&& attempt, clock::time_point deadline, clock::time_point& again)
        -> std::optional<decltype(attempt())> {
        try {
            if (undo_first_) {
                op.undo();
                undo_first_ = false;
            }
            auto r = attempt();
            ride_.reached();
            last_ = nullptr;
            return r;
        } catch (const error& e) {
            again = ride_.again_after(e, deadline);
            // A failure met before anything was sent ran nothing, and one whose undo was sent
            // already (lock_site writes it after a try left unanswered) owes none: an undo
            // still owed (one that failed so itself) stays owed, and none is added.
            const error_origin& o = error_access::origin(e);
            if (!o.unsent && !o.undone) undo_first_ = true;
            last_ = std::current_exception();
            return std::nullopt;
        }
    }

    /// The last try's failure while the wait rides an outage; null once a try reached the
    /// server.
    const std::exception_ptr& last_failure() const noexcept { return last_; }

private:
    failure_ride ride_;
    bool undo_first_ = false;  // a try failed in an outage after it was sent: it may have run
    std::exception_ptr last_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL auto wait_policy::next_try(clock::time_point now, const wait_hint& hint, bool listening)
    -> clock::time_point {
    auto until = hint.again;
    if (hint.ttl == -2) until = now;
    if (hint.ttl >= 0) until = std::min(until, now + std::chrono::milliseconds(hint.ttl));
    if (!listening || hint.ttl == -1) {
        until = std::min(until, now + fallback_);
        fallback_ = std::min(fallback_ * 2, longest_fallback);
    }
    if (!hint.holder_publishes) until = std::min(until, now + looks_.next(hint.holder));
    if (heartbeat_.count() > 0) until = std::min(until, now + heartbeat_);
    return until;
}

RLOCK_DECL auto failure_ride::again_after(const error& e, clock::time_point deadline)
    -> clock::time_point {
    // An outage: the server was not reached or did not answer, or (Redis Cluster) the cluster
    // could not serve the slot for a whole command_timeout (CLUSTERDOWN while a failover is
    // under way, TRYAGAIN while a slot migrates). A redirection met by a client that does not
    // follow a cluster (a cluster node given as a plain server) is its settings, as a
    // replica's READONLY is: thrown at once.
    const error_origin& o = error_access::origin(e);
    if (!is_ambiguous(e) && !(o.to.kind != redirect::none && follows_failovers_)) throw;
    if (o.readonly && !follows_failovers_) throw;
    if (repeatable_ == repeat::unsafe && !o.unsent) throw;
    const auto now = clock::now();
    if (now >= deadline) throw;
    const auto at = now + backoff_;
    backoff_ = std::min(backoff_ * 2, longest_backoff);
    return at;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
