// rlock::semaphore — a counting semaphore in Redis, in Redisson's RSemaphore layout.
//
//     rlock::client redis("redis://127.0.0.1:6380");
//     rlock::semaphore backend(redis, "backend-slots");
//     backend.try_set_permits(3);        // once, by whoever sets it up (no-op when set)
//     backend.acquire();                 // blocks until a permit is free
//     ...                                // at most 3 of these at once, across all clients
//     backend.release();
//
// In Redis: key `name` is a string holding the number of free permits (missing: 0). Taking n
// permits is a script that decrements it only when at least n are free; releasing (and
// add_permits, try_set_permits) increments it and publishes the new count on
// `redisson_sc:{name}`. The same layout and messages as Redisson's RSemaphore, so the two
// share one semaphore and wake each other's waiters.
//
// Permits are not owned: any client may release them, and a holder that dies keeps its permits
// taken for ever (as with Redisson's RSemaphore). A lease on each permit, returned when its
// holder dies, is what a permit-expirable semaphore is for.
//
// A count the server lost (a restart without persistence, a flush, a DEL) leaves Redisson's
// waiters waiting for ever. Here an acquire that finds it gone after its client saw it set
// throws lock_lost; with semaphore_options::capacity the count is set back instead (the
// acquire's script does it), releases never raise it above the capacity, and the holders of
// permits of the lost count are told (docs/api.md states the bound).
//
// Waiting: a waiter subscribes to the channel (the client's one subscriber connection), tries
// again, and sleeps until a message changes the count. A release message carries the new count,
// and wakes this client's blocking waiters only as far as it goes (in arrival order, each whose
// permits fit in what is left): a release of one permit makes one waiter try, not all of them,
// and a waiter for n permits is served once n are free, not left for its deadline.
// It never polls; only while the subscriber is reconnecting (no message can be counted on) does
// it also try again after 10 ms, doubling to 1 s.
//
// Failures: a command whose connection broke or timed out may or may not have run. An acquire
// attempt whose connection broke is made once more on a new connection, so that a waiter
// outlives a restart or a killed connection, and then throws (a timeout throws at once: the
// server is not answering); if the first had run on a server
// that kept its data, its permits stay taken for good (there are no leases) — fewer holders
// than permits, never more. So it is not repeated further: a permit-expirable semaphore, whose
// repeats find their own ids, rides out longer failures. A release (and
// add_permits, drain_permits, try_set_permits) is not repeated, since a repeated release could
// free a permit nobody took: the call throws `error` (connection_failed / timeout). Bad counts
// throw invalid_argument with nothing sent; a key of another type, or a string that is not a
// count, throws wrong_type with Redis unchanged.
//
// Thread-safety: one object may be used by many threads at once.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/detail/waiting/synchronizer.hpp"
#include "rlock/errors.hpp"

namespace rlock {

class semaphore : public detail::synchronizer {
    using clock = std::chrono::steady_clock;

public:
    /// Names a semaphore on `c`; sends nothing. Throws `error` (invalid_argument) for an empty
    /// name, or (Redis Cluster) a name whose key and channel would land in different slots.
    /// `options.capacity` (when > 0) lets a count the server lost be set back (options.hpp);
    /// a negative one throws invalid_argument.
    semaphore(client& c, const std::string& name, semaphore_options options = {})
        : synchronizer(detail::client_access::core(c), name, detail::prefixed_key("redisson_sc", name),
                       "semaphore"),
          capacity_(options.capacity) {
        if (capacity_ < 0) bad_count(capacity_, "capacity must not be negative");
    }

    /// Blocks until `permits` (at least 1) are free and takes them.
    void acquire(long long permits = 1) { (void)acquire_until(detail::call_forever(), permits); }

    /// One attempt, no waiting: true when `permits` were free and are now taken.
    [[nodiscard]] bool try_acquire(long long permits = 1) {
        return acquire_until(detail::call_no_wait(), permits);
    }

    /// Waits up to `wait` (measured on steady_clock) for `permits`; true when taken.
    template <class Rep, class Period>
    [[nodiscard]] bool try_acquire_for(const std::chrono::duration<Rep, Period>& wait,
                                       long long permits = 1) {
        return acquire_until(detail::call_for(wait), permits);
    }

    /// Waits until `deadline` (any clock; measured on steady_clock from now) for `permits`.
    template <class Clock, class Duration>
    [[nodiscard]] bool try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                         long long permits = 1) {
        return acquire_until(detail::call_until(deadline), permits);
    }

    /// Returns `permits` (at least 1) and wakes the waiters. Any client may release: permits
    /// are not owned. Throws `error` (server_error) when the count would overflow, with nothing
    /// written.
    ///
    /// With a capacity (semaphore_options), the count never goes above it: permits that do not
    /// fit were taken before the server lost the count and it was set back, or are released
    /// twice; on_lock_lost hears of them, unless their holders were told already.
    void release(long long permits = 1);

    /// Sets the number of permits when the semaphore has none set yet (its key is absent);
    /// true when this call set it. `permits` must not be negative.
    bool try_set_permits(long long permits);

    /// Adds `permits` (negative: removes them; the count may go below 0, as in Redisson) and
    /// wakes the waiters. Returns the new count. 0 changes nothing and publishes nothing: it
    /// returns available_permits().
    long long add_permits(long long permits) {
        if (permits == 0) return available_permits();
        return add_to_count(permits).now;
    }

    /// The number of free permits now (0 when none were ever set; negative after
    /// add_permits took more than there were). With a capacity, an absent count is the
    /// capacity, which the next acquire sets back.
    [[nodiscard]] long long available_permits() const;

    /// Takes every free permit (the count becomes 0) and returns how many there were. With a
    /// capacity, an absent count is the capacity: the count is set to 0 and that is returned
    /// (otherwise the next acquire would set it back, and the drain would not hold).
    long long drain_permits();

    // --- asynchronous forms (docs/api.md, "Asynchronous acquisition") ---------------------
    // Each completes `void(std::exception_ptr, bool)` — true when the permits were taken, false
    // when the wait ran out (nothing taken) — for a callback (the call returns an
    // rlock::pending), rlock::use_future (std::future<bool>) or, with <rlock/asio.hpp>, an Asio
    // token. Woken by release messages, as acquire() is; never inside the call; cancellable
    // (then nothing is taken). Throws `error` (invalid_argument) for permits below 1.

    /// Completes once `permits` (default 1) are taken.
    template <class Token>
    auto async_acquire(Token&& token) {
        return async_acquire_steady(detail::call_forever(), 1, std::forward<Token>(token));
    }
    template <class Token>
    auto async_acquire(long long permits, Token&& token) {
        return async_acquire_steady(detail::call_forever(), permits, std::forward<Token>(token));
    }
    /// Completes once the permits are taken (true) or after `wait` (false).
    template <class Rep, class Period, class Token>
    auto async_try_acquire_for(const std::chrono::duration<Rep, Period>& wait, Token&& token) {
        return async_acquire_steady(detail::call_for(wait), 1, std::forward<Token>(token));
    }
    template <class Rep, class Period, class Token>
    auto async_try_acquire_for(const std::chrono::duration<Rep, Period>& wait, long long permits,
                               Token&& token) {
        return async_acquire_steady(detail::call_for(wait), permits, std::forward<Token>(token));
    }
    /// Completes once the permits are taken (true) or at `deadline` (false).
    template <class Clock, class Duration, class Token>
    auto async_try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline, Token&& token) {
        return async_acquire_steady(detail::call_until(deadline), 1, std::forward<Token>(token));
    }
    template <class Clock, class Duration, class Token>
    auto async_try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline, long long permits,
                                 Token&& token) {
        return async_acquire_steady(detail::call_until(deadline), permits, std::forward<Token>(token));
    }

private:
    template <class Token>
    auto async_acquire_steady(detail::wait_call call, long long permits, Token&& token) {
        check_positive(permits, "acquire");
        // As take(): one repeat after a broken connection (pool::run), none after a timeout
        // (which on_engine notes), never more.
        auto take = [core = core_, name = name_, channel = channel_, n = permits,
                     cap = capacity_]() -> detail::attempt_result {
            return core->pool.run(name, detail::on_break::retry_broken,
                                  [&](const detail::connection& c) {
                                      return detail::take_permits(*core, c, name, channel, n, cap);
                                  });
        };
        // Its result owns the permits until the handler is told (detail::owned_result).
        detail::told_permits_op<decltype(take)> op{
            {std::move(take), core_, name_, kind_name, core_->events.begin(call.began)}, channel_, permits, capacity_};
        // Paced by age against other clients' waiters, as a blocking acquire's are.
        return synchronizer::async_wait_until<detail::owned_result>(
            call, detail::repeat::unsafe, std::move(op), std::forward<Token>(token),
            &core_->races(name_));
    }

    void check_positive(long long permits, std::string_view op) const;

    // One attempt. One whose connection broke (so the script may have run) is made once more
    // on a new connection: a waiter outlives a restart or a killed connection. If the first
    // had run on a server that kept its data, its permits stay taken: fewer holders than
    // permits, never more. One that timed out is not repeated (the server is not answering).
    bool take(long long permits);

    bool acquire_until(detail::wait_call call, long long permits);

    // What the client's listener is told (events.hpp).
    static constexpr const char* kind_name = "semaphore";

    long long capacity_;
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL void semaphore::release(long long permits) {
    check_positive(permits, "release");
    detail::release_permits(*core_, name_, channel_, capacity_, permits, kind_name);
}

RLOCK_DECL bool semaphore::try_set_permits(long long permits) {
    if (permits < 0) bad_count(permits, "try_set_permits: permits must not be negative");
    const bool set = set_count_if_absent(permits, {});
    core_->counts.saw(name_);
    return set;
}

RLOCK_DECL long long semaphore::available_permits() const {
    return run(detail::on_break::retry, [&](const detail::connection& c) {
        const detail::reply_ptr r = detail::run_command(c, {"GET", name_}, name_, server());
        // With a capacity, an absent count is the capacity: the next acquire sets it back.
        if (capacity_ > 0 && r->type == REDIS_REPLY_NIL) return capacity_;
        return detail::count_from(r.get(), name_, server());
    });
}

RLOCK_DECL long long semaphore::drain_permits() {
    return run(detail::on_break::fail, [&](const detail::connection& c) {
        const std::string capacity = std::to_string(capacity_);
        detail::script_call call(detail::semaphore_scripts::drain(), {name_}, {capacity});
        return detail::count_from(detail::run_script(c, call, name_, server()).get(), name_,
                                  server());
    });
}

RLOCK_DECL void semaphore::check_positive(long long permits, std::string_view op) const {
    if (permits < 1) bad_count(permits, std::string(op) + ": permits must be at least 1");
    if (capacity_ > 0 && permits > capacity_ && op == "acquire") {
        bad_count(permits, "acquire: more permits than the semaphore's capacity " +
                               std::to_string(capacity_));
    }
}

RLOCK_DECL bool semaphore::take(long long permits) {
    const auto began = clock::now();
    try {
        // A broken connection (a restart, a killed connection) gets the one repeat. A timeout
        // does not: the server is not answering (paused, stalled), a new connection would wait
        // as long, and each attempt may keep its permits.
        return run(detail::on_break::retry_broken, [&](const detail::connection& c) {
            return detail::take_permits(*core_, c, name_, channel_, permits, capacity_);
        });
    } catch (const error& e) {
        // The engine's other tries hold back for a command_timeout (on_engine).
        core_->note_if_unanswered(e, name_, began);
        throw;
    }
}

RLOCK_DECL bool semaphore::acquire_until(detail::wait_call call, long long permits) {
    const clock::time_point deadline = call.deadline;
    check_positive(permits, "acquire");
    // Not repeated past take()'s own one repeat: each ambiguous attempt may take permits that
    // never come back (a plain semaphore has no leases).
    // This client's waiters are woken by a release message only as far as the count it
    // announces goes (first fit, in arrival order), not all of them.
    detail::wait_story story = core_->events.begin(call.began);
    const auto acquired_here = [&](bool handed_locally) {
        core_->events.acquired(kind_name, name_, 0, story, handed_locally);
        return true;
    };
    const auto ended = [&] {
        core_->events.wait_ended(kind_name, name_, story, /*cancelled=*/false);
        return false;
    };
    // Local hand-off (permit_gate): behind another thread of this client that waits for
    // permits of this semaphore, this one waits in the process, to be handed permits by a
    // release of the client or to wait at Redis for it when its turn comes.
    std::shared_ptr<detail::permit_gate> gate;
    bool leading = false;
    bool refused = false;  // its own try was refused just now: it subscribes before the next
    const auto last_try = [&] {
        // A wait that ran out in the process: one try at Redis, so that it ends with the
        // permits if they are free now, false, or the outage's error.
        ++story.tries;
        return take(permits) ? acquired_here(false) : ended();
    };
    if (clock::now() < deadline && core_->permit_gates.enabled()) {
        gate = core_->permit_gates.get(detail::semaphore_gate_kind, name_);
        detail::permit_gate::entry e = gate->arrive(deadline, permits);
        if (e == detail::permit_gate::entry::free) {
            ++story.tries;
            try {
                if (take(permits)) return acquired_here(false);
            } catch (const error& failure) {
                // Nothing was sent (no connection could be had: the server is down or
                // restarting): not ambiguous, so the wait below rides it out to the deadline,
                // as it does every later try's. Anything else is the caller's.
                if (!detail::error_access::origin(failure).unsent) throw;
            }
            refused = true;
            e = gate->refused(deadline, permits);
        }
        switch (e) {
            case detail::permit_gate::entry::lead:
                leading = true;
                break;
            case detail::permit_gate::entry::free:
                break;  // waits at Redis on its own
            case detail::permit_gate::entry::granted:
                return acquired_here(true);
            case detail::permit_gate::entry::timed_out:
                return last_try();
            case detail::permit_gate::entry::stopped:
                throw error(errc::connection_failed, name_, server(),
                            "the client was destroyed while this thread waited");
        }
    }
    // The leader's wait ends, with permits or without: the next thread of the client leads.
    struct leader {
        detail::permit_gate* gate;
        ~leader() {
            if (gate) gate->led();
        }
    } lead{leading ? gate.get() : nullptr};
    const bool got = synchronizer::wait_until(
        deadline, detail::repeat::unsafe,
        [&] {
            if (leading) gate->courtesy(deadline);
            ++story.tries;
            return take(permits);
        },
        &detail::semaphore_turns, permits, /*subscribe_first=*/leading || refused,
        // Other clients' waiters race this one's for the permits a release announces: while
        // this client loses those races, its waiters' tries are held back by their youth
        // (race_pacing), as a mutex's are.
        &core_->races(name_));
    return got ? acquired_here(false) : ended();
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
