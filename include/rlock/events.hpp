// rlock — what a client's locks do, told as it happens to a listener the program sets
// (client_options::listener): for metrics, tracing and logs, without a dependency.
//
//     struct counts : rlock::lock_listener {
//         void acquired(const rlock::acquired_event& e) override { waits.observe(e.wait); }
//         void lost(const rlock::lost_event& e) override { ++losses; }
//         ...
//     };
//     rlock::client_options o;
//     o.listener = std::make_shared<counts>();
//
// examples/12_prometheus_events.cpp turns them into Prometheus' text format. docs/api.md,
// "Events", has the whole model.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rlock/errors.hpp"

namespace rlock {

/// The kind of lock an event is about, as its `kind` names it: "mutex", "reentrant_lock",
/// "fair_lock", "read_write_lock.read", "read_write_lock.write", "red_lock", "semaphore",
/// "permit" (a permit_expirable_semaphore's).
///
/// A hold was taken: by this call at Redis (`tries` > 0), or handed on by another thread of
/// this client (local hand-off: `handed_locally`, no try). Not told for a re-entry of a
/// reentrant hold (one more level of a hold already told). A multi_lock's parts are told one
/// by one, as the locks they are.
struct acquired_event {
    std::string_view lock;            ///< the lock's name
    std::string_view kind;
    std::uint64_t hold_id = 0;        ///< as on_lock_lost and released_event tell it; 0 for
                                      ///< a semaphore's permits (not owned) and a permit
    std::chrono::nanoseconds wait{};  ///< from the call (or the asynchronous start) to the hold
    unsigned tries = 0;               ///< acquire scripts or rounds sent for it
    bool handed_locally = false;
};

/// A hold ended by its owner's unlock (or release): the last level of a reentrant hold, a
/// hold handed on within the client (`handed_on`: the key stays), a semaphore's permits.
/// Told even when the unlock found the hold lost (a lost_event says so first).
struct released_event {
    std::string_view lock;
    std::string_view kind;
    std::uint64_t hold_id = 0;        ///< 0 for a semaphore's permits and a permit
    std::chrono::nanoseconds held{};  ///< since its acquired_event; 0 for a semaphore's
                                      ///< permits (not owned: any client releases them)
    bool handed_on = false;
};

/// One watchdog tick renewed the leases of watched holds on one server.
struct renewed_event {
    std::string_view server;
    std::size_t holds = 0;            ///< holds sent for renewal (renewed or found gone)
    std::chrono::nanoseconds took{};  ///< the tick's round trips, first send to last reply
};

/// A renewal of a watched hold was refused with an error (an ACL's NOPERM, OOM, a script
/// error): the hold is not lost yet; the watchdog keeps trying while its lease lasts. Told
/// once until a renewal works again; on_lock_lost hears it too (lost_hold::refused).
struct renewal_refused_event {
    std::string_view lock;
    std::uint64_t hold_id = 0;
    const error& reason;
};

/// A hold was lost: whatever on_lock_lost is told, except a refused renewal (above) — its
/// lease ran out, its key was deleted or taken over, its unlock could not reach Redis, its
/// thread exited holding it, a semaphore's count the server lost took its permits.
struct lost_event {
    std::string_view lock;
    std::uint64_t hold_id = 0;        ///< 0 for a semaphore's permits
    const error& reason;              ///< lock_lost, or the error that made it lost
};

/// A wait ended without the lock: its deadline passed (a try form's `false`, an asynchronous
/// try's empty hold), or (`cancelled`) an asynchronous acquire was cancelled
/// (rlock::pending::cancel). A wait that ends with an error is not told: its caller is.
struct wait_ended_event {
    std::string_view lock;
    std::string_view kind;
    std::chrono::nanoseconds wait{};
    unsigned tries = 0;
    bool cancelled = false;
};

/// Something about the client's setup an operator should know, told once per client: the
/// server's maxmemory-policy can evict lock keys (a lock that can be evicted is not a lock),
/// or the server refused the key-change notifications that tell a lost hold at once (CLIENT
/// TRACKING: an ACL, an old server), so losses are found by the watchdog's renewals as before.
struct notice_event {
    std::string_view server;
    std::string_view message;
};

/// Receives a client's events. Override what you need; the rest do nothing.
///
/// Each runs on the thread the event happens on, under no rlock-internal lock, while that
/// thread waits: acquired_event and wait_ended_event on the acquiring thread (for an
/// asynchronous acquire, the client's engine thread, before its completion); released_event
/// on the unlocking thread (the engine's for async_unlock); renewed_event,
/// renewal_refused_event and lost_event on the watchdog thread (a loss found at unlock: on the
/// unlocking thread); notice_event on the thread constructing the client, or the watchdog's
/// or the subscriber's. So a listener must not block, and must be thread-safe; what it throws
/// is dropped. The views in an event are valid during the call only.
///
/// Without a listener nothing is measured: no clock is read and no event is made.
class lock_listener {
public:
    virtual ~lock_listener() = default;
    virtual void acquired(const acquired_event& /*e*/) {}
    virtual void released(const released_event& /*e*/) {}
    virtual void renewed(const renewed_event& /*e*/) {}
    virtual void renewal_refused(const renewal_refused_event& /*e*/) {}
    virtual void lost(const lost_event& /*e*/) {}
    virtual void wait_ended(const wait_ended_event& /*e*/) {}
    virtual void notice(const notice_event& /*e*/) {}
};

}  // namespace rlock
