// basic_lock<Kind>: what every lock on one Redis key shares. Kind supplies the key layout and
// the Lua scripts (kind.hpp states the contract); this template supplies the wait loop, leases,
// watchdog registration, fencing, lost holds and error mapping. Users see it as rlock::mutex,
// rlock::reentrant_lock and rlock::fair_lock, and as the two sides of rlock::read_write_lock.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "rlock/detail/acquisition/lock_site.hpp"
#include "rlock/detail/front/async_lockable.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/local_gate.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/runtime/subscriber.hpp"
#include "rlock/detail/waiting/multi_parts.hpp"
#include "rlock/detail/waiting/wait_blocking.hpp"
#include "rlock/detail/waiting/wait_pacing.hpp"
#include "rlock/detail/waiting/wait_policy.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"
#include "rlock/options.hpp"

namespace rlock {
class read_write_lock;
}  // namespace rlock

namespace rlock::detail {

struct rw_read_kind;   // read_write_kind.hpp: a read_write_lock's sides
struct rw_write_kind;

/// lock(), try_lock(), try_lock_for() and try_lock_until() (timed_lockable) throw `error`:
/// would_deadlock (a mutex this thread holds already; a reader asking for the write side),
/// lock_lost (re-entry of a reentrant hold that was lost), connection_failed (the client was
/// destroyed), timeout, wrong_type, ... naming the lock and the server.
template <class Kind>
class basic_lock : public timed_lockable<basic_lock<Kind>>,
                   public async_lockable<basic_lock<Kind>>,
                   protected lock_site<Kind> {
    using site = lock_site<Kind>;

public:
    using clock = std::chrono::steady_clock;

    /// Names a lock on `c`; sends nothing. Throws `error` (invalid_argument) for an empty name.
    basic_lock(client& c, std::string name, lock_options options = {})
        : site(client_access::core(c), std::move(name), options) {
        static_assert(check_kind<Kind>());
    }
    basic_lock(const basic_lock&) = delete;
    basic_lock& operator=(const basic_lock&) = delete;

    /// Releases one level of this thread's hold (the last level deletes the key and publishes
    /// the unlock message). Before it returns the hold is out of the watchdog: no renewal of it
    /// reaches Redis afterwards.
    ///
    /// Throws `error` with not_owner only when this thread holds no such lock. A hold that was
    /// lost, or a Redis that cannot be reached, does not throw: the owner is told through
    /// on_lock_lost (once per hold) and the key is left to expire. So unlock in a guard's
    /// destructor never throws.
    void unlock() {
        registry::hold_ptr h = core_->reg.find(&Kind::info, name(), current_thread_number());
        if (!h) {
            throw error(errc::not_owner, name(), server(),
                        "unlock by a thread that does not hold the lock");
        }
        site::unlock_hold(h, [&] { lost_at_unlock_.mark(h->thread); });
    }

    /// True when anyone holds the lock (EXISTS). Throws on connection errors.
    [[nodiscard]] bool is_locked() const {
        return core_->pool.run(name(), on_break::retry, [&](const connection& c) {
            return reply_integer(run_command(c, {"EXISTS", name()}, name(), server()).get(), name(),
                                 server()) == 1;
        }, Kind::follows_ask);
    }

    /// True when the calling thread holds the lock: it has a hold that is not lost by this
    /// client's clock, and Redis confirms it. Throws on connection errors.
    [[nodiscard]] bool is_held_by_current_thread() const {
        registry::hold_ptr h = core_->reg.find(&Kind::info, name(), current_thread_number());
        if (!h || core_->reg.is_lost(*h)) return false;
        return core_->pool.run(name(), on_break::retry,
                               [&](const connection& c) { return Kind::held(c, keys_, h->value, server()); },
                               Kind::follows_ask);
    }

    /// The lock key's remaining time to live: zero when the lock is free,
    /// milliseconds::max() for a key without expiry (rlock never makes one).
    [[nodiscard]] std::chrono::milliseconds remaining_lease() const {
        const long long ttl = core_->pool.run(name(), on_break::retry, [&](const connection& c) {
            return reply_integer(run_command(c, {"PTTL", name()}, name(), server()).get(), name(),
                                 server());
        }, Kind::follows_ask);
        if (ttl == -1) return std::chrono::milliseconds::max();
        return std::chrono::milliseconds(std::max(0LL, ttl));
    }

    /// True when the calling thread has a hold on this lock and that hold is lost: the
    /// watchdog found it gone, or its lease ran out by this client's clock (measured from when
    /// the acquire or the last renewal was sent, so it never claims a hold Redis has dropped).
    /// Also true after this thread's final unlock found its hold lost (it was told through
    /// on_lock_lost), until this thread takes the lock again. Otherwise false when the thread
    /// holds nothing. Sends nothing.
    [[nodiscard]] bool lost() const {
        const std::uint64_t thread = current_thread_number();
        registry::hold_ptr h = core_->reg.find(&Kind::info, name(), thread);
        if (h) return core_->reg.is_lost(*h);
        return lost_at_unlock_.marked(thread);
    }

    /// Deletes the lock whoever holds it and wakes its waiters. Holders on this client find
    /// their holds lost at the next renewal. True when the lock was held.
    bool force_unlock() {
        return core_->pool.run(name(), on_break::retry,
                               [&](const connection& c) { return Kind::force_unlock(c, keys_, server()); },
                               Kind::follows_ask);
    }

    /// The fencing token of the calling thread's current hold: the value of
    /// `redisson_lock_token:{name}` that its latest acquisition INCRed. Throws `error`:
    /// invalid_argument when fencing is off for this lock, not_owner when the thread holds none.
    [[nodiscard]] std::uint64_t fencing_token() const {
        if (!options_.fencing) {
            throw error(errc::invalid_argument, name(), server(),
                        "fencing is off for this lock (lock_options::fencing)");
        }
        registry::hold_ptr h = core_->reg.find(&Kind::info, name(), current_thread_number());
        if (!h) throw error(errc::not_owner, name(), server(), "this thread holds no such lock");
        return core_->reg.with([&] { return h->fencing; });
    }

    /// The calling thread's hold's id: unique in the process, kept across re-entries, and the
    /// `hold_id` on_lock_lost is told for this hold (lost_hold). Throws `error` (not_owner)
    /// when this thread holds no such lock. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const {
        registry::hold_ptr h = core_->reg.find(&Kind::info, name(), current_thread_number());
        if (!h) throw error(errc::not_owner, name(), server(), "this thread holds no such lock");
        return h->id;
    }

    using site::name;
    const lock_options& options() const noexcept { return options_; }

protected:
    using site::server;

private:
    friend struct part_access;  // a multi_lock part (as_part)
    friend class timed_lockable<basic_lock>;
    friend class async_lockable<basic_lock>;
    friend class rlock::read_write_lock;  // its two sides

    // timed_lockable's entry point. call.deadline: time_point::max() waits for ever.
    bool acquire(wait_call call, lease_request lease) {
        const clock::time_point deadline = call.deadline;
        registry& reg = core_->reg;
        const std::uint64_t thread = current_thread_number();
        const std::chrono::milliseconds watchdog = core_->ep.options.lock_watchdog_timeout;
        // Nothing would renew or release a hold taken now.
        core_->throw_if_destroyed(name(), "the client this lock was made from has been destroyed");
        if (registry::hold_ptr h = reg.find(&Kind::info, name(), thread)) {
            return reenter_riding(*h, lease, deadline);
        }
        site::check_acquire(thread);
        const event_sink& events = core_->events;
        wait_story story = events.begin(call.began);
        std::shared_ptr<local_gate> gate;
        std::shared_ptr<local_gate> beside;  // inside a completion handler (local_gate::began_beside)
        if (site::through_gate(lease) && core_->eng.on_own_thread()) {
            beside = core_->gates.get(Kind::info, name());
        } else if (site::through_gate(lease)) {
            // Local hand-off: behind another thread of this client that holds the lock or waits
            // for it at Redis, this one waits here, to be handed the hold or to lead.
            gate = core_->gates.get(Kind::info, name());
            passed_hold pass;
            const bool may_wait = clock::now() < deadline;
            switch (gate->enter(deadline, pass)) {
                case local_gate::entry::lead: break;
                case local_gate::entry::granted: {
                    const registry::hold_ptr h =
                        core_->add_hold(Kind::info, name(), std::move(pass.value), thread,
                                        {pass.lease, renewal::watched, pass.sent}, 0, nullptr, std::move(gate),
                                        std::move(pass.from));
                    lost_at_unlock_.forget(thread);
                    events.acquired(Kind::info.name, name(), h->id, story, /*handed_locally=*/true);
                    return true;
                }
                case local_gate::entry::timed_out:
                    if (!may_wait) {  // try_lock(): no round trip behind a thread of the client
                        events.wait_ended(Kind::info.name, name(), story, /*cancelled=*/false);
                        return false;
                    }
                    // Its wait ran out in the process: one last try at Redis (not as the
                    // gate's leader), so that it ends with the lock if it is free now, false
                    // if it is held, or the outage's error when the server cannot be reached.
                    gate.reset();
                    break;
                case local_gate::entry::stopped:
                case local_gate::entry::queued:  // only join() queues
                    throw error(errc::connection_failed, name(), server(),
                                "the client was destroyed while this thread waited");
            }
        }
        // The leader's wait ends: with the lock (the gate is held until its unlock), or without
        // it (the next local waiter leads).
        struct leading {
            local_gate* gate = nullptr;
            local_gate* beside = nullptr;
            bool acquired = false;
            ~leading() {
                if (gate) gate->led(acquired);
                if (beside) beside->ended_beside();
            }
        } lead{gate.get(), beside.get()};
        if (beside) beside->began_beside();
        lock_acquisition<Kind> op(*this, Kind::value_for(core_->id, thread, Kind::reentrant), lease.duration(watchdog));
        op.enroll_for_passes(lease);  // fair_lock: a final unlock of this client may pass it the hold
        // The wait (wait_blocking): until the unlock message or the holder's TTL, paced against
        // other clients' waiters, riding out an outage (each try after one undoes what the one
        // before may have taken: a release with the same value, so that nothing sent twice
        // takes a second hold).
        const bool won = wait_blocking(*core_, op, deadline, repeat::safe);
        story.tries = op.tries();
        if (!won) {
            events.wait_ended(Kind::info.name, name(), story, /*cancelled=*/false);
            return false;
        }
        const registry::hold_ptr h =
            core_->add_hold(Kind::info, name(), std::move(op.value()), thread,
                            {lease.duration(watchdog), lease.is_watched() ? renewal::watched : renewal::leased, op.sent()},
                            op.fencing(), nullptr, gate);
        lead.acquired = true;
        lost_at_unlock_.forget(thread);
        events.acquired(Kind::info.name, name(), h->id, story, /*handed_locally=*/op.handed());
        return true;
    }

    // A re-entry rides an outage as a wait does (failure_ride): until the deadline, or for as
    // long as it lasts (lock()); try_lock() throws the failure at once. Each try after one that
    // failed takes back the level that one may have added (lock_site::reenter).
    bool reenter_riding(hold& h, lease_request lease, clock::time_point deadline) {
        failure_ride ride(repeat::safe, core_->ep.follows_failovers());
        for (bool again = false;; again = true) {
            try {
                return site::reenter(h, lease, again);
            } catch (const error& e) {
                // A bounded backoff (25 ms doubling to 1 s, never past the deadline), not a wait
                // for a holder: the thread holds the lock, and nothing announces that the
                // server is back, so no message could end it sooner.
                std::this_thread::sleep_until(ride.again_after(e, deadline));
                core_->throw_if_destroyed(name(), "the client was destroyed while this thread re-entered");
            }
        }
    }

    // async_lockable's entry point (async_lockable.hpp).
    template <class Token>
    auto start_async(wait_call call, lease_request lease, std::uint64_t owner, Token&& token) {
        return initiate<acquire_signature>(std::forward<Token>(token),
                        [s = shared_site(), call, lease, owner](completion done) {
                            return start_acquire<Kind>(s, call, lease, owner, std::move(done));
                        });
    }

    // What starts an asynchronous acquire of this lock, sharing its site: a multi_lock keeps
    // one per part, so that its operation outlives the part objects.
    async_start async_starter() {
        return [s = shared_site()](wait_call call, lease_request lease, std::uint64_t owner,
                                   completion done) {
            return start_acquire<Kind>(s, call, lease, owner, std::move(done));
        };
    }

    // This lock as a multi_lock part (multi_parts.hpp).
    part_view as_part() {
        part_view v;
        // A read_write_lock's sides are ordered by name alone.
        if constexpr (!std::is_same_v<Kind, rw_read_kind> && !std::is_same_v<Kind, rw_write_kind>) {
            v.server = core_->ep.name;
        }
        v.where = {core_->ep.name};
        v.core = core_.get();
        v.clients = {core_.get()};
        v.kind = &Kind::info;
        if constexpr (Kind::multi_code != 0) {
            v.code = Kind::multi_code;
            v.keys = &keys_;
            v.fencing = options_.fencing;
            v.lost_at_unlock = &lost_at_unlock_;
        }
        v.starter = [this] { return async_starter(); };
        return v;
    }

    // This lock as its asynchronous acquires share it (made on the first). Throws
    // connection_failed when the client is destroyed.
    const std::shared_ptr<const site>& shared_site() {
        core_->throw_if_destroyed(name(), "the client this lock was made from has been destroyed");
        std::call_once(async_once_, [&] { async_site_ = std::make_shared<const site>(static_cast<const site&>(*this)); });
        return async_site_;
    }

    using site::core_;
    using site::keys_;
    using site::options_;
    using site::attempt;
    using site::give_up;
    using site::reenter;
    using typename site::try_kind;


    mutable lost_at_unlock_owners lost_at_unlock_;  // lost() stays true for them

    // This lock as its asynchronous acquires and their holds share it (made on the first).
    std::once_flag async_once_;
    std::shared_ptr<const site> async_site_;
};

}  // namespace rlock::detail
