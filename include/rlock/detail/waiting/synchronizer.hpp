// What the synchronizers (rlock::semaphore, rlock::count_down_latch) share: one count key and
// its channel on a client (synchronizer), and waiting for a condition that changes with a
// message on that channel, with no hold and no TTL to bound the wait (wait_on_channel): try,
// then sleep until a message on the channel or a reconnect of the subscriber, and try again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/detail/runtime/subscriber.hpp"
#include "rlock/detail/waiting/async_lock.hpp"
#include "rlock/detail/waiting/wait_blocking.hpp"
#include "rlock/detail/waiting/wait_policy.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

/// What one attempt of wait_on_channel found: done, or not yet, and then when to try again
/// even if no message comes (`again`: a permit's lease that runs out frees it without one).
struct attempt_result {
    using clock = std::chrono::steady_clock;
    attempt_result(bool done) : done(done) {}  // NOLINT(google-explicit-constructor): a bool is an answer
    attempt_result(bool done, clock::time_point again) : done(done), again(again) {}
    bool done = false;
    clock::time_point again = clock::time_point::max();

    /// As the drivers (blocking and asynchronous) read it: no holder (-3), so messages, the
    /// fallback while no message can be counted on, and the attempt's own `again`.
    try_result read() const {
        try_result t;
        t.done = done;
        t.hint.ttl = -3;
        t.hint.again = again;
        return t;
    }
};

/// The acquisition operation of a synchronizer's wait, as the blocking driver runs it
/// (wait_blocking): a condition that a message on `channel` may have changed, with no holder
/// and no TTL to bound the wait. `attempt()` returns an attempt_result (or a bool); it leaves
/// nothing to undo (a repeat::safe one finds its own earlier work).
template <class F>
class channel_acquisition {
public:
    /// `turns` (with `need` > 0): this client's waiters of that class are woken by a message
    /// only as far as its count goes (subscriber::channel_state::turn); null: every waiter
    /// tries at every message.
    /// `subscribe_first`: its first try comes after it subscribed (a caller that was refused
    /// just before, or whose turn follows another waiter's success: one try, not two).
    /// `races`: where this client's waiters race other clients' for what a message announces
    /// (a semaphore's permits), with `core` to count them: the driver then paces them by age
    /// (race_pacing) as it does a mutex's; null: they do not race.
    channel_acquisition(F& attempt, std::string_view name, const std::string& channel,
                        const void* turns = nullptr, long long need = 0, bool subscribe_first = false,
                        race_record* races = nullptr, client_core* core = nullptr)
        : attempt_(attempt), name_(name), channel_(channel), turns_(turns), need_(need),
          subscribe_first_(subscribe_first), races_(core ? races : nullptr), core_(core) {}

    std::string_view name() const noexcept { return name_; }
    std::string channel() const { return channel_; }
    const void* turns() const noexcept { return turns_; }
    long long turn_need() const noexcept { return need_; }
    bool shared() const noexcept { return true; }
    std::chrono::milliseconds heartbeat() const noexcept { return std::chrono::milliseconds(0); }
    race_record* races() const noexcept { return races_; }
    bool subscribes_first() const noexcept { return subscribe_first_; }
    // A semaphore's newcomer tries at once: held back (400 µs while the client loses races),
    // it cost the flash sale 8-12 % of its requests per second for no shorter tail; its
    // waiters' tries are paced by age (race_pacing::before_try), which cut the tail
    // (docs/benchmarks.md).
    bool paces_newcomer() const noexcept { return false; }
    long long subscribers(const std::string& channel) const noexcept {
        return core_ ? channel_subscribers(*core_, name_, channel) : -1;
    }
    try_result attempt(try_phase /*phase*/) { return attempt_result(attempt_()).read(); }
    void undo() noexcept {}
    void give_up() noexcept {}

private:
    F& attempt_;
    std::string_view name_;
    const std::string& channel_;
    const void* turns_;
    long long need_;
    bool subscribe_first_;
    race_record* races_;
    client_core* core_;
};

/// Calls `attempt()` until it is done (then true) or `deadline` has passed (then false):
/// channel_acquisition under the blocking driver (wait_blocking). After a first refusal it
/// subscribes to `channel` through the client's subscriber and makes each next attempt when a
/// message arrives there or the subscriber reconnects (a message may have gone by), never in
/// between — except while the subscription is not confirmed, when no message can be counted
/// on: then it also tries after 10 ms, doubling to 1 s — and at the `again` an attempt asked
/// for. `attempt` returns an attempt_result (or a bool).
///
/// An attempt that fails with connection_failed or timeout (a restart, a killed connection) is
/// made again after a backoff until the deadline (failure_ride, wait_policy.hpp), when
/// `repeatable` (it may have run, and is safe to make again: it reads, or it finds its own
/// earlier work) or when nothing was sent; then the last failure is thrown. Any other error of
/// `attempt` is thrown at once, and connection_failed (naming `name`) once the client is
/// destroyed.
///
/// `turns`, `need`, `subscribe_first` and `races`: as channel_acquisition's (a semaphore's
/// waiters, each for `need` permits, woken as far as a release message's count goes, paced by
/// age against other clients' waiters).
template <class F>
bool wait_on_channel(client_core& core, const std::string& channel, std::string_view name,
                     std::chrono::steady_clock::time_point deadline, repeat repeatable, F&& attempt,
                     const void* turns = nullptr, long long need = 0, bool subscribe_first = false,
                     race_record* races = nullptr) {
    channel_acquisition<F> op(attempt, name, channel, turns, need, subscribe_first, races, &core);
    return wait_blocking(core, op, deadline, repeatable);
}

/// What an asynchronous synchronizer wait completes with: true when done, false when its wait
/// ran out (leaving nothing behind).
using wait_signature = void(std::exception_ptr, bool);

/// An async_channel_wait's operation when done is all it says: `attempt` returns an
/// attempt_result (or a bool).
template <class F>
struct bool_op {
    F f;
    attempt_result attempt() { return f(); }
    bool finish() { return true; }
    void undo() noexcept {}
};

/// A semaphore's asynchronous acquisition: bool_op that tells the client's listener (events.hpp)
/// what it is, how many tries it made, and, once done, that it acquired.
template <class F>
struct told_bool_op {
    F f;
    std::shared_ptr<client_core> core;
    std::string name;
    const char* kind = nullptr;
    wait_story story{};
    attempt_result attempt() {
        ++story.tries;
        return f();
    }
    bool finish() {
        core->events.acquired(kind, name, 0, story);
        return true;
    }
    void undo() noexcept {}
    const char* event_kind() const noexcept { return kind; }
    unsigned tries() const noexcept { return story.tries; }
};

/// Whether an async_channel_wait's operation is told to the listener (has event_kind()).
template <class Op, class = void>
struct is_told_op : std::false_type {};
template <class Op>
struct is_told_op<Op, std::void_t<decltype(std::declval<const Op&>().event_kind())>> : std::true_type {};

/// wait_on_channel on the engine (async_lock.hpp), completing `void(std::exception_ptr,
/// Result)`. `op.attempt()` (an attempt_result) is made on the engine thread first, then by the
/// client's waiters on `channel`, in arrival order, each time a message arrives (all of them
/// while they succeed: a release of several permits, a latch at 0), at the `again` an attempt
/// asked for, and as wait_on_channel retries a `repeat::safe` attempt. Once an attempt is done,
/// `op.finish()` makes the result; a wait that ends otherwise (an error, its deadline, a
/// cancellation, the client's destruction) calls `op.undo()` first (undo what an attempt that
/// may have run took) and completes with Result{}.
///
/// `races`: where this client's waiters race other clients' for what a message announces (a
/// semaphore's permits): each try of the wait is then paced by age as a blocking waiter's
/// (race_pacing, on a timer: async_waiter::pause_before_try); null: they do not race.
template <class Op, class Result>
class async_channel_wait final : public async_waiter {
public:
    using signature = void(std::exception_ptr, Result);

    async_channel_wait(async_waits& waits, wait_call call, std::string name, std::string channel,
                       repeat repeatable, Op op, completion_t<signature> done,
                       race_record* races = nullptr)
        : async_waiter(waits, call), name_(std::move(name)), channel_(std::move(channel)),
          step_(repeatable, waits.core.ep.follows_failovers()), op_(std::move(op)),
          done_(std::move(done)) {
        if (races) race_.emplace(*races);
    }

    /// The initiating task, on the engine thread.
    void start() noexcept {
        bool failed = false;
        try {
            if (waits.core.eng.stopping()) {
                throw error(errc::connection_failed, name_, server(),
                            "the client was destroyed before this asynchronous wait started");
            }
            const attempt_result r = try_once();
            if (r.done) {
                result_ = op_.finish();
                settled = true;
                deliver();
                return;
            }
            if (clock::now() >= deadline) {
                give_up();
                settle(nullptr);
                deliver();
                return;
            }
            const wait_hint hint = r.read().hint;
            std::string key("synchronizer");
            key += '\0';
            key += channel_;
            // Before joining (and subscribing): the clients already waiting are its rivals.
            if (race_) race_->count_rivals([&] { return channel_subscribers(waits.core, name_, channel_); });
            waits.join(shared_from_this(), key, channel_, true, std::chrono::milliseconds(0), &hint);
        } catch (...) {
            give_up();
            settle(std::current_exception());
            failed = true;
        }
        // Delivered outside the handler: the thrown object's own reference is gone by then, so
        // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
        if (failed) deliver();
    }

    attempt_outcome attempt_waiting(wait_hint& hint, bool woken) override {
        try {
            const attempt_result r = try_once();
            if (race_) race_->after_try(r.read(), woken);
            if (r.done) {
                result_ = op_.finish();
                settled = true;
                hint.ttl = -3;
                return attempt_outcome::acquired;
            }
            hint = r.read().hint;
            return attempt_outcome::refused;
        } catch (...) {
            give_up();
            settle(std::current_exception());
            return attempt_outcome::failed;
        }
    }
    std::chrono::microseconds pause_before_try() const override {
        return race_ ? race_->pause() : std::chrono::microseconds(0);
    }
    void give_up() noexcept override { op_.undo(); }
    const std::string& lock_name() const noexcept override { return name_; }
    const std::string& server() const noexcept override { return waits.core.ep.name; }
    const char* event_kind() const noexcept override {
        if constexpr (is_told_op<Op>::value) return op_.event_kind();
        return nullptr;
    }
    unsigned tries() const noexcept override {
        if constexpr (is_told_op<Op>::value) return op_.tries();
        return 0;
    }
    void deliver() noexcept override {
        try {
            done_(std::move(failure), std::move(result_));
        } catch (...) {
        }
    }

private:
    // As the blocking driver's (outage_step): an attempt that fails in an outage is made again
    // after a backoff; a wait whose deadline comes while it rides one ends with its last error.
    // Not sent while the server leaves the client unanswered (on_engine).
    // Nothing is undone between tries: a repeat::safe attempt finds its own earlier work.
    attempt_result try_once() {
        struct nothing_to_undo {
            void undo() noexcept {}
        } keep;
        auto again = clock::time_point::max();
        auto attempt = [&] { return op_.attempt(); };
        const std::optional<attempt_result> r =
            step_.run(keep, [&] { return on_engine(waits.core, name_, attempt); }, deadline, again);
        outage = step_.last_failure();
        if (r) return *r;
        return {false, again};
    }

    std::string name_;
    std::string channel_;
    outage_step step_;
    Op op_;
    completion_t<signature> done_;
    Result result_{};
    std::optional<race_pacing> race_;  // against other clients' waiters (else empty)
};

/// What add_to_count did: the new count, and the permits that did not fit under the capacity
/// (0 without one).
struct count_change {
    long long now = 0;
    long long over = 0;
};

/// Adds `n` (may be negative) to the count `name` and publishes the new count on `channel`
/// when positive (semaphore_scripts::add), never above `capacity` when one is given (> 0).
/// Not repeated after a broken connection.
RLOCK_DECL count_change add_to_count(client_core& core, const std::string& name, const std::string& channel,
                                     long long n, long long capacity);

/// Releases `permits` of the semaphore `name` (semaphore::release): to this client's threads
/// waiting for it in the process first (local hand-off), the rest to Redis, never above
/// `capacity`; the listener is told (as `kind`), and the owners are told of permits that did
/// not fit (on_lock_lost).
/// `after_client`: sent after the client is destroyed too (permits taken for a handler that never
/// ran, its io_context destroyed last), as a lock hold's unlock is, and nobody of that client
/// is told; otherwise that throws connection_failed.
RLOCK_DECL void release_permits(client_core& core, const std::string& name, const std::string& channel,
                                long long capacity, long long permits, const char* kind,
                                bool after_client = false);

/// A semaphore's asynchronous acquisition: told_bool_op whose result owns the permits taken
/// until its handler is told (owned_result): a handler dropped unrun (its io_context destroyed,
/// before or after the client) cannot release them, so they are released for it
/// (release_permits, also after the client).
template <class F>
struct told_permits_op : told_bool_op<F> {
    std::string channel;
    long long permits = 0;
    long long capacity = 0;
    owned_result finish() {
        (void)told_bool_op<F>::finish();
        return owned_result(true, [core = this->core, name = this->name, channel = channel, n = permits,
                                   cap = capacity, kind = this->kind] {
            release_permits(*core, name, channel, cap, n, kind, /*after_client=*/true);
        });
    }
};

/// The base of a synchronizer: the client it was made from, its key (`name`) and its channel.
class synchronizer {
public:
    synchronizer(const synchronizer&) = delete;
    synchronizer& operator=(const synchronizer&) = delete;

    const std::string& name() const noexcept { return name_; }
    /// The server as messages name it.
    const std::string& server() const noexcept { return core_->ep.name; }

protected:
    /// `what` names the type in messages ("semaphore"). Throws `error` (invalid_argument) for
    /// an empty name, or (Redis Cluster) a name whose key and channel land in different slots.
    synchronizer(client_core& core, std::string name, std::string channel, std::string_view what);
    ~synchronizer() = default;

    /// Runs f(connection) on the object's server (its key's master in a cluster).
    template <class F>
    auto run(on_break broken, F&& f) const {
        core_->throw_if_destroyed(name_, "the client this object was made from has been destroyed");
        return core_->pool.run(name_, broken, f);
    }

    /// Throws invalid_argument naming the object: "<what> (was <count>)".
    [[noreturn]] void bad_count(long long count, std::string_view what) const;

    /// Sets the count to `count` when the key is absent and publishes `message` on the
    /// channel (count_scripts::try_set); true when this call set it.
    bool set_count_if_absent(long long count, std::string_view message) const;

    using count_change = detail::count_change;

    /// Adds `n` to the count (may be negative) and publishes the new count when positive
    /// (semaphore_scripts::add), never above `capacity` when one is given (> 0). Not repeated
    /// after a broken connection.
    count_change add_to_count(long long n, long long capacity = 0) const;

    /// async_channel_wait on this object's channel, for `token` (a callback, rlock::use_future,
    /// an Asio token), completing with a Result: `op` (attempt, finish, undo) must own what it
    /// uses, since the object may be destroyed first; `races` as async_channel_wait's. Throws
    /// `error` (connection_failed) once the client is destroyed.
    template <class Result, class Token, class Op>
    auto async_wait_until(wait_call call, repeat repeatable, Op op,
                          Token&& token, race_record* races = nullptr) const {
        core_->throw_if_destroyed(name_, "the client this object was made from has been destroyed");
        using wait = async_channel_wait<Op, Result>;
        return initiate<typename wait::signature>(
            std::forward<Token>(token),
            [core = core_, call, repeatable, name = name_, channel = channel_,
             op = std::move(op), races](completion_t<typename wait::signature> done) mutable {
                auto w = std::make_shared<wait>(waits_of(*core), call, name, channel, repeatable,
                                                std::move(op), std::move(done), races);
                if (!core->eng.post([w] { w->start(); })) {
                    throw error(errc::connection_failed, name, core->ep.name,
                                "the client this object was made from has been destroyed");
                }
                return rlock::pending(w);
            });
    }

    /// wait_on_channel on this object's channel (with `turns` and `need`: woken as far as a
    /// message's count goes).
    template <class F>
    bool wait_until(std::chrono::steady_clock::time_point deadline, repeat repeatable, F&& attempt,
                    const void* turns = nullptr, long long need = 0, bool subscribe_first = false,
                    race_record* races = nullptr) const {
        return wait_on_channel(*core_, channel_, name_, deadline, repeatable, std::forward<F>(attempt), turns,
                               need, subscribe_first, races);
    }

    std::shared_ptr<client_core> core_;
    std::string channel_;
    std::string name_;
};

/// One attempt to take `permits` of the semaphore `name` (semaphore_scripts::acquire) on `c`,
/// `capacity` 0 when not known: true when taken. An absent count is no permit, and throws
/// lock_lost when this client saw it set (the server lost it: nobody could ever be served);
/// one set back to its capacity tells this client's holders of permits taken before.
RLOCK_DECL bool take_permits(client_core& core, const connection& c, const std::string& name,
                         const std::string& channel, long long permits, long long capacity);

/// What a semaphore's local hand-off gates are filed under (client_core::permit_gates).
inline const kind_info semaphore_gate_kind{"semaphore"};

/// The turn class of semaphores' blocking waiters (subscriber::channel_state::turn).
inline constexpr char semaphore_turns = 0;

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL synchronizer::synchronizer(client_core& core, std::string name, std::string channel,
                                      std::string_view what)
    : core_(core.shared_from_this()), channel_(std::move(channel)) {
    if (name.empty()) {
        throw error(errc::invalid_argument, "", core_->ep.name,
                    std::string(what) + " name is empty");
    }
    if (core_->ep.slots && key_slot(name) != key_slot(channel_)) {
        throw error(errc::invalid_argument, name, core_->ep.name,
                    "in a cluster this " + std::string(what) +
                        " name puts its key and its channel " + channel_ +
                        " in different slots (a name with '{' needs a non-empty hash tag)");
    }
    name_ = std::move(name);
}

RLOCK_DECL void synchronizer::bad_count(long long count, std::string_view what) const {
    throw error(errc::invalid_argument, name_, server(),
                std::string(what) + " (was " + std::to_string(count) + ")");
}

RLOCK_DECL bool synchronizer::set_count_if_absent(long long count, std::string_view message) const {
    const std::string n = std::to_string(count);
    return run(on_break::fail, [&](const connection& c) {
        return eval_integer(c, count_scripts::try_set(), {name_},
                            {n, channel_, message.empty() ? std::string_view(n) : message}, name_,
                            server()) == 1;
    });
}

RLOCK_DECL auto synchronizer::add_to_count(long long n, long long capacity) const -> count_change {
    core_->throw_if_destroyed(name_, "the client this object was made from has been destroyed");
    return detail::add_to_count(*core_, name_, channel_, n, capacity);
}

RLOCK_DECL count_change add_to_count(client_core& core, const std::string& name, const std::string& channel,
                                     long long n, long long capacity) {
    const std::string by = std::to_string(n), cap = std::to_string(capacity);
    return core.pool.run(name, on_break::fail, [&](const connection& c) {
        script_call call(semaphore_scripts::add(), {name}, {by, channel, cap});
        const reply_ptr r = run_script(c, call, name, core.ep.name);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            (void)count_from(r.get(), name, core.ep.name);  // an error reply, as itself
            throw error(errc::protocol_error, name, core.ep.name, "unexpected reply to a semaphore's add");
        }
        count_change out;
        out.now = count_from(r->element[0], name, core.ep.name);
        out.over = count_from(r->element[1], name, core.ep.name);
        core.counts.saw(name);
        return out;
    });
}

RLOCK_DECL void release_permits(client_core& core, const std::string& name, const std::string& channel,
                                long long capacity, long long permits, const char* kind,
                                bool after_client) {
    // Local hand-off: threads of this client waiting for permits take them first.
    const std::shared_ptr<permit_gate> gate = core.permit_gates.find(semaphore_gate_kind, name);
    const long long left = gate ? gate->hand_over(permits, core.counts.held(name)) : permits;
    if (left == 0) {
        core.events.released(kind, name, 0, {}, /*handed_on=*/true);
        return;
    }
    if (!after_client) {
        core.throw_if_destroyed(name, "the client this object was made from has been destroyed");
    }
    const count_change c = add_to_count(core, name, channel, left, capacity);
    // Its listener and on_lock_lost are not called after ~client (read after the send, which
    // may take a command_timeout while the client goes).
    if (core.sub->stopped()) return;
    core.events.released(kind, name, 0, {});
    const long long untold = core.counts.released(name, left, c.over);
    if (untold > 0) {
        registry::tell(core.ep.options.on_lock_lost, lost_hold{name, 0, 0},
                       error(errc::lock_lost, name, core.ep.name,
                             std::to_string(untold) + " of the " + std::to_string(permits) +
                                 " permits released did not fit under the semaphore's capacity " +
                                 std::to_string(capacity) +
                                 ": taken before the server lost its count (set back to the capacity since), "
                                 "released twice, or the count was set to the capacity or above"));
    }
}

RLOCK_DECL bool take_permits(client_core& core, const connection& c, const std::string& name,
                             const std::string& channel, long long permits, long long capacity) {
    const std::string n = std::to_string(permits), cap = std::to_string(capacity);
    const long long r = eval_integer(c, semaphore_scripts::acquire(), {name}, {n, cap, channel},
                                     name, core.ep.name);
    if (r < 0) {
        if (!core.counts.seen(name)) return false;  // never set, as far as this client knows
        throw error(
            errc::lock_lost, name, core.ep.name,
            "the semaphore's count is gone from the server (a restart without persistence, a "
            "flush, "
            "a DEL) after this client saw it set: no permit can be taken until it is set again "
            "(try_set_permits, or semaphore_options::capacity to set it back on its own)");
    }
    if (r >= 2) {  // set back to `capacity`: what this client held of the lost count is gone
        const long long gone = core.counts.forget_taken(name);
        if (gone > 0) {
            registry::tell(
                core.ep.options.on_lock_lost, lost_hold{name, 0, 0},
                error(errc::lock_lost, name, core.ep.name,
                      std::to_string(gone) +
                          " permits this client took were lost with the semaphore's count on "
                          "the server; it was set back to its capacity " +
                          cap));
        }
    }
    const bool taken = r == 1 || r == 3;
    if (taken) {
        core.counts.took(name, permits);
    } else {
        core.counts.saw(name);
    }
    return taken;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
