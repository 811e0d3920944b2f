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
#include <vector>

#include "rlock/detail/client_core.hpp"
#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/script.hpp"
#include "rlock/detail/kind.hpp"
#include "rlock/detail/random.hpp"
#include "rlock/detail/registry.hpp"
#include "rlock/detail/subscriber.hpp"
#include "rlock/detail/timed_lockable.hpp"
#include "rlock/detail/wait_pacing.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock {
class multi_lock;
class read_write_lock;
}  // namespace rlock

namespace rlock::detail {

/// lock(), try_lock(), try_lock_for() and try_lock_until() (timed_lockable) throw `error`:
/// would_deadlock (a mutex this thread holds already; a reader asking for the write side),
/// lock_lost (re-entry of a reentrant hold that was lost), connection_failed (the client was
/// destroyed), timeout, wrong_type, ... naming the lock and the server.
template <class Kind>
class basic_lock : public timed_lockable<basic_lock<Kind>> {
public:
    using clock = std::chrono::steady_clock;

    /// Names a lock on `c`; sends nothing. Throws `error` (invalid_argument) for an empty name.
    basic_lock(client& c, std::string name, lock_options options = {})
        : core_(client_access::core(c).shared_from_this()), options_(options) {
        static_assert(check_kind<Kind>());
        if (name.empty()) {
            throw error(errc::invalid_argument, "", core_->ep.name, "lock name is empty");
        }
        if (options_.fair_lock_wait_timeout.count() <= 0) {
            throw error(errc::invalid_argument, name, core_->ep.name,
                        "lock_options::fair_lock_wait_timeout must be positive");
        }
        keys_.channel = prefixed_key(Kind::channel_prefix, name);
        keys_.fencing = prefixed_key("redisson_lock_token", name);
        keys_.queue = prefixed_key("redisson_lock_queue", name);
        keys_.timeouts = prefixed_key("redisson_lock_timeout", name);
        if (core_->ep.slots && key_slot(name) != key_slot(keys_.channel)) {
            // "a{b" or "a{}b": no hash tag, so `prefix:name` hashes apart from `name`.
            throw error(errc::invalid_argument, name, core_->ep.name,
                        "in a cluster a lock name with '{' needs a hash tag ({tag} with a non-empty "
                        "tag), or its keys land in different slots");
        }
        keys_.name = std::move(name);
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
        registry& reg = core_->reg;
        registry::hold_ptr h = reg.find(&Kind::info, name(), current_thread_number());
        if (!h) {
            throw error(errc::not_owner, name(), server(),
                        "unlock by a thread that does not hold the lock");
        }
        const bool last = h->count == 1;
        if (last) reg.remove(h);
        long long left = 0;
        try {
            left = release(h->value, last ? on_break::retry : on_break::fail);
            // Redis still counts levels after this thread's last one: a re-entry whose reply was
            // lost (the connection broke after the script ran) added a level this thread never
            // counted. It is this thread's, so the final unlock drains it; left alone, the lock
            // would outlive the unlock until its lease ran out, and the thread's next lock()
            // would re-enter the leftover hash with a count its unlocks never bring to zero.
            for (int extra = 0; last && left > 0 && extra < 64; ++extra) {
                left = release(h->value, on_break::retry);
            }
        } catch (const error& e) {
            if (!last) --h->count;
            if (last) mark_lost_at_unlock(h->thread);
            reg.report(*h, e);  // unreachable: the hold is lost to its owner either way
            return;
        }
        if (!last) --h->count;
        if (left < 0 && !reg.ended_by_lease(*h)) {
            // Not ours any more. Marked first: an on_lock_lost handler that asks lost() sees it.
            if (last) mark_lost_at_unlock(h->thread);
            reg.report(*h, error(errc::lock_lost, name(), server(),
                                 "at unlock the lock was no longer held by this thread (expired, "
                                 "deleted or taken over)"));
        }
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
        return was_lost_at_unlock(thread);
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

    const std::string& name() const noexcept { return keys_.name; }
    const lock_options& options() const noexcept { return options_; }

protected:
    const std::string& server() const noexcept { return core_->ep.name; }

private:
    friend class rlock::multi_lock;  // takes several locks of one node in one script
    friend class timed_lockable<basic_lock>;
    friend class rlock::read_write_lock;  // its two sides

    // timed_lockable's entry point. deadline: time_point::max() waits for ever. lease == 0:
    // watched.
    bool acquire(clock::time_point deadline, std::chrono::milliseconds lease) {
        registry& reg = core_->reg;
        const std::uint64_t thread = current_thread_number();
        const std::chrono::milliseconds watchdog = core_->ep.options.lock_watchdog_timeout;
        // Nothing would renew or release a hold taken now.
        core_->throw_if_destroyed(name(), "the client this lock was made from has been destroyed");
        if (registry::hold_ptr h = reg.find(&Kind::info, name(), thread)) {
            return reenter(*h, lease);
        }
        Kind::check_acquire(reg, name(), thread, server());
        const bool watched = lease.count() == 0;
        if (watched) lease = watchdog;
        std::string value = Kind::value_for(*core_, thread, Kind::reentrant);
        const bool may_wait = clock::now() < deadline;

        auto sent = clock::now();
        acquire_result r = attempt(value, lease, may_wait ? try_kind::first : try_kind::only);
        if (!r.acquired) {
            if (clock::now() >= deadline) {
                if (may_wait) give_up(value);  // it may have queued
                return false;
            }
            // Whatever ends this wait without the lock (timeout, error) leaves no trace behind.
            struct leaver {
                basic_lock* self;
                const std::string& value;
                bool armed = true;
                ~leaver() {
                    if (armed) self->give_up(value);
                }
            } leave{this, value};
            subscriber::subscription sub(*core_->sub, Kind::wait_channel(keys_, value));
            sub.wait_active(std::min(deadline,
                                     clock::now() + core_->ep.options.command_timeout));
            // Used only when no message can be relied on: the subscription is not confirmed
            // (subscriber reconnecting) or the key has no TTL (a foreign holder without
            // expiry). Then waits grow from 10 ms to 1 s; with a subscription and a TTL the wait
            // is exactly "until the message or the TTL".
            std::chrono::milliseconds fallback(10);
            silent_holder_looks looks;  // behind a holder that will not publish its release
            race_pacing race(core_->lost_races(name()));
            const std::chrono::milliseconds heartbeat = Kind::heartbeat(options_);
            bool woken = false;  // the last wait ended with a message (an unlock, mostly)
            for (;;) {
                core_->throw_if_destroyed(name(), "the client was destroyed while this thread waited");
                if constexpr (Kind::races) race.before_try();
                const std::uint64_t seen = sub.generation();
                sent = clock::now();
                r = attempt(value, lease, try_kind::waiting);
                if constexpr (Kind::races) race.after_try(r, woken);
                if (r.acquired) break;
                const auto now = clock::now();
                if (now >= deadline) return false;
                core_->throw_if_destroyed(name(), "the client was destroyed while this thread waited");
                if (r.ttl == -2) continue;  // freed between SET and PTTL: try again now
                auto until = deadline;
                // Re-read each time: a subscriber that reconnected is not listening until its
                // SUBSCRIBE is confirmed (the confirmation then wakes this waiter to retry).
                const bool active = sub.active();
                if (r.ttl >= 0) until = std::min(until, now + std::chrono::milliseconds(r.ttl));
                if (!active || r.ttl == -1) {
                    until = std::min(until, now + fallback);
                    fallback = std::min(fallback * 2, std::chrono::milliseconds(1000));
                }
                if (!r.holder_publishes) until = std::min(until, now + looks.next(std::move(r.holder)));
                // A queued fair waiter renews its place in the queue with each attempt: this
                // bound is its heartbeat, not a poll for the lock.
                if (heartbeat.count() > 0) until = std::min(until, now + heartbeat);
                woken = sub.wait(seen, until);
            }
            leave.armed = false;
        }
        core_->add_hold(Kind::info, name(), std::move(value), thread,
                        {lease, watched ? renewal::watched : renewal::leased, sent}, r.fencing);
        forget_lost_at_unlock(thread);
        return true;
    }

    bool reenter(hold& h, std::chrono::milliseconds lease) {
        registry& reg = core_->reg;
        if constexpr (!Kind::reentrant) {
            (void)lease;
            (void)h;
            throw error(errc::would_deadlock, name(), server(),
                        "this thread already holds the lock, and a mutex is not reentrant");
        } else {
            if (reg.is_lost(h)) {
                throw error(errc::lock_lost, name(), server(),
                            "this thread's hold was lost; unlock it before locking again");
            }
            // A re-entry keeps the hold watched if it was, or makes it watched if asked to;
            // otherwise the new lease applies from now.
            const bool watched = reg.with([&] { return h.watched; }) || lease.count() == 0;
            if (watched) lease = core_->ep.options.lock_watchdog_timeout;
            const auto sent = clock::now();
            acquire_result r = attempt(h.value, lease, try_kind::reentry);
            if (!r.acquired) {
                reg.report(h, error(errc::lock_lost, name(), server(),
                                    "found the hold gone on re-entry"));
                throw error(errc::lock_lost, name(), server(),
                            "this thread's hold was lost; unlock it before locking again");
            }
            reg.with([&] {
                h.count = static_cast<std::size_t>(r.count);
                h.watched = watched;
                h.lease = lease;
                h.expires = sent + lease;
                if (options_.fencing) h.fencing = r.fencing;
            });
            return true;
        }
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
    // outlives a failure.
    acquire_result attempt(const std::string& value, std::chrono::milliseconds lease,
                           try_kind kind) {
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
        for (int round = 0;; ++round) {
            try {
                acquire_result r = core_->pool.run(name(), on_break::fail, [&](const connection& c) {
                    acquire_result got = Kind::acquire(c, keys_, spec, server());
                    if (got.acquired) sync_or_undo(c, value);
                    return got;
                }, Kind::follows_ask);
                core_->scripts_allowed.store(true, std::memory_order_relaxed);
                return r;
            } catch (const error& e) {
                if (!is_ambiguous(e) || kind == try_kind::reentry) throw;
                give_up(value);  // fair_lock: the attempt may have queued
                try {
                    release(value, on_break::retry);
                } catch (const error&) {
                    throw e;
                }
                if (round > 0) throw;
            }
        }
    }

    /// Replica sync after an acquire on `c`: too few acknowledgements undo it (one level, so a
    /// re-entry keeps the levels it had) and throw replica_sync_failed.
    void sync_or_undo(const connection& c, const std::string& value) {
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

    // A waiter that gives up leaves nothing behind (fair_lock: its queue entry). Best effort:
    // what it cannot reach is evicted after fair_lock_wait_timeout.
    void give_up(const std::string& value) noexcept {
        if constexpr (Kind::abandons) {
            try {
                core_->pool.run(name(), on_break::retry, [&](const connection& c) {
                    Kind::abandon(c, keys_, value, server());
                    return 0;
                }, Kind::follows_ask);
            } catch (...) {
            }
        } else {
            (void)value;
        }
    }

    // Runs the release script: the count left (0: released), or -1 when `value` does not hold
    // the lock. With on_break::retry a broken connection gets one more try (run_release): a
    // "not held" answer to it counts as released when the first try most likely did it. A
    // connection the server had closed before the first try is never used for it (pool:
    // closed_while_idle), so a restart between the hold and its unlock does not even need the
    // retry to be noticed.
    long long release(const std::string& value, on_break broken_then) {
        const auto [left, first_did_it] = run_release(core_->pool, name(), broken_then, [&](const connection& c) {
            const long long l = Kind::release(c, keys_, value, server());
            // Replica sync: a shortfall is not an error here (see client_options).
            if (l >= 0 && core_->ep.options.sync_replicas > 0) core_->wait_for_replicas(c, name());
            return l;
        }, Kind::follows_ask);
        return left < 0 && first_did_it ? 0 : left;
    }

    // The threads whose final unlock of this lock found their hold lost, until they lock it
    // again: lost() stays true for them. `lost_at_unlock_any_` spares the common path the mutex.
    void mark_lost_at_unlock(std::uint64_t thread) const {
        std::lock_guard<std::mutex> g(lost_at_unlock_mu_);
        if (std::find(lost_at_unlock_.begin(), lost_at_unlock_.end(), thread) == lost_at_unlock_.end()) {
            lost_at_unlock_.push_back(thread);
        }
        lost_at_unlock_any_.store(true, std::memory_order_relaxed);
    }
    bool was_lost_at_unlock(std::uint64_t thread) const {
        if (!lost_at_unlock_any_.load(std::memory_order_relaxed)) return false;
        std::lock_guard<std::mutex> g(lost_at_unlock_mu_);
        return std::find(lost_at_unlock_.begin(), lost_at_unlock_.end(), thread) != lost_at_unlock_.end();
    }
    void forget_lost_at_unlock(std::uint64_t thread) const {
        if (!lost_at_unlock_any_.load(std::memory_order_relaxed)) return;
        std::lock_guard<std::mutex> g(lost_at_unlock_mu_);
        auto it = std::find(lost_at_unlock_.begin(), lost_at_unlock_.end(), thread);
        if (it != lost_at_unlock_.end()) lost_at_unlock_.erase(it);
        lost_at_unlock_any_.store(!lost_at_unlock_.empty(), std::memory_order_relaxed);
    }
    mutable std::mutex lost_at_unlock_mu_;
    mutable std::vector<std::uint64_t> lost_at_unlock_;
    mutable std::atomic<bool> lost_at_unlock_any_{false};

    // Shared, not borrowed: a thread blocked in lock() when the client is destroyed still
    // reaches the subscriber and the pool to learn that and throw (the core is stopped but
    // alive until the last lock object made from it is gone).
    std::shared_ptr<client_core> core_;
    lock_keys keys_;
    lock_options options_;
};

}  // namespace rlock::detail
