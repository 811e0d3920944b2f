// Server-assisted loss detection (docs/design.md, "Losses told at once"): the server tells the
// client when a key it read changes (CLIENT TRACKING), so that a hold deleted, overwritten,
// flushed or expired is told within milliseconds rather than at the next watchdog tick.
//
// The watchdog's connection reads every watched hold's key after renewing it (tracking on,
// invalidations redirected to the subscriber's connection, its own writes not told: NOLOOP);
// the subscriber receives each invalidation as a `__redis__:invalidate` message and hands the
// keys to the watchdog, which renews those holds at once — a renewal that finds a hold gone
// tells its owner. tracking_route is what the two threads share.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/detail/runtime/event_sink.hpp"

namespace rlock::detail {

/// Where the server sends invalidations, as the subscriber sets it and the watchdog reads it.
struct tracking_route {
    /// The subscriber connection's CLIENT ID once it listens on `__redis__:invalidate`; 0 while
    /// it does not (reconnecting, a Redis Cluster, the server refused).
    std::atomic<long long> client_id{0};
    /// Bumped at each change of client_id: the watchdog's connection must be redirected again,
    /// and every hold read again (an invalidation may have gone by unseen).
    std::atomic<std::uint64_t> epoch{0};
    /// The client's listener has been told that detection is off (notice_event): once.
    std::atomic<bool> told_off{false};

    static constexpr const char* channel = "__redis__:invalidate";

    /// Tells `events`, once per client, that the server refused what detection needs (`why`):
    /// losses are found by the watchdog's ticks alone.
    void tell_off(const event_sink& events, std::string_view server, std::string_view why);
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void tracking_route::tell_off(const event_sink& events, std::string_view server,
                                         std::string_view why) {
    if (told_off.exchange(true)) return;
    events.notice(server,
                  "losses are found by the watchdog's renewals only (server-assisted "
                  "detection is off): " +
                      std::string(why));
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
