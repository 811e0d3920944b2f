// red_lock's asynchronous acquire: its acquisition operation (red_acquisition, red_site.hpp)
// as a waiter of the first node's wait groups (async_waits, the asynchronous driver).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "rlock/config.hpp"
#include "rlock/detail/acquisition/red_site.hpp"
#include "rlock/detail/acquisition/try_result.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/waiting/async_lock.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// One asynchronous red_lock acquire: red_acquisition's rounds on the first node's engine
/// thread, driven by that client's async_waits (the asynchronous driver) as a blocking acquire
/// is by wait_blocking: the next round after Redlock's random delay or an unlock message from
/// the first node, the deadline, cancellation and the client's destruction as for every
/// asynchronous acquire. A wait whose deadline comes while its last round could not ask a
/// majority ends with quorum_not_reached (async_waiter::outage).
class red_acquire final : public async_waiter {
public:
    red_acquire(std::shared_ptr<const red_site> site, async_waits& waits, wait_call call,
                lease_request lease, std::uint64_t owner, completion done)
        : async_waiter(waits, call), site_(std::move(site)), lease_(lease), owner_(owner), done_(std::move(done)) {}

    /// The initiating task, on the first node's engine thread.
    void start() noexcept;

    RLOCK_DECL attempt_outcome attempt_waiting(wait_hint& hint, bool /*woken*/) override;
    std::chrono::microseconds pause_before_try() const override { return std::chrono::microseconds(0); }
    void give_up() noexcept override {}  // a round undoes itself
    const std::string& lock_name() const noexcept override { return site_->name(); }
    const std::string& server() const noexcept override { return site_->servers(); }
    const char* event_kind() const noexcept override { return red_lock_info.name; }
    unsigned tries() const noexcept override { return op_ ? op_->tries() : 0; }
    RLOCK_DECL void deliver() noexcept override;

private:
    // One round; on `acquired` the result is set and `hint` carries the lease.
    attempt_outcome round(wait_hint& hint) noexcept;

    std::shared_ptr<const red_site> site_;
    lease_request lease_;
    std::uint64_t owner_;
    completion done_;
    std::optional<red_acquisition> op_;  // made once the lease is known (start)
    rlock::hold result_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void red_acquire::start() noexcept {
    bool failed = false;
    try {
        if (waits.core.eng.stopping()) {
            throw error(errc::connection_failed, site_->name(), site_->servers(),
                        "the client of the red_lock's first node was destroyed before this "
                        "asynchronous acquire started");
        }
        site_->check_acquire(owner_);
        op_.emplace(*site_, owner_, lease_, deadline);
        wait_hint hint;
        if (round(hint) != attempt_outcome::refused) {
            deliver();
            return;
        }
        if (clock::now() >= deadline) {
            settle(nullptr);
            deliver();
            return;
        }
        std::string key(red_lock_info.name);
        key += '\0';
        key += site_->channel();
        // Behind waiters already queued on this client, the group's own timer leads.
        wait_group* g = waits.find(key);
        waits.join(shared_from_this(), key, site_->channel(), false, std::chrono::milliseconds(0),
                   g && !g->queue.empty() ? nullptr : &hint);
    } catch (...) {
        settle(std::current_exception());
        failed = true;
    }
    // Delivered outside the handler: the thrown object's own reference is gone by then, so
    // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
    if (failed) deliver();
}

RLOCK_DECL attempt_outcome red_acquire::attempt_waiting(wait_hint& hint, bool) {
    try {
        for (client_core* n : site_->nodes()) {
            n->throw_if_destroyed(site_->name(), "the client of this node has been destroyed");
        }
    } catch (...) {
        settle(std::current_exception());
        return attempt_outcome::failed;
    }
    return round(hint);
}

RLOCK_DECL void red_acquire::deliver() noexcept {
    try {
        done_(std::move(failure), std::move(result_));
    } catch (...) {
    }
}

RLOCK_DECL attempt_outcome red_acquire::round(wait_hint& hint) noexcept {
    try {
        const try_result r = op_->attempt(try_phase::waiting);
        if (r.done) {
            const registry::hold_ptr& held = op_->held();
            registry::hold_ptr record = make_hold(
                red_lock_info, site_->name(), held->value, owner_,
                {op_->lease(), held->watched ? renewal::watched : renewal::leased, clock::now()});
            record->id = held->group->id;
            wait_story s = story;
            s.tries = op_->tries();
            waits.core.events.acquired(red_lock_info.name, site_->name(), record->id, s);
            result_ = rlock::hold(site_, std::move(record));
            settled = true;
            // The waiters behind this hold make their next round after Redlock's random delay,
            // as a blocking waiter does, or at the unlock message: not at the end of its lease.
            // The message comes through the first node alone, which may be paused or down
            // while a majority holds the lock (they waited for the lease, or their deadline).
            hint.ttl = -3;
            hint.again = clock::now() + site_->retry_pause();
            return attempt_outcome::acquired;
        }
        hint = r.hint;
        // What the wait ends with if its deadline comes now (settle).
        outage = op_->last().unreachable
                     ? std::make_exception_ptr(
                           error(errc::quorum_not_reached, site_->name(), site_->servers(), op_->last().detail))
                     : nullptr;
        return attempt_outcome::refused;
    } catch (...) {
        settle(std::current_exception());
        return attempt_outcome::failed;
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
