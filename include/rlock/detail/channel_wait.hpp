// Waiting for a condition that changes with a message on a channel (the synchronizers: a free
// permit, a latch at zero), with no hold and no TTL to bound the wait: try, then sleep until a
// message on the channel or a reconnect of the subscriber, and try again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "rlock/detail/client_core.hpp"
#include "rlock/detail/subscriber.hpp"

namespace rlock::detail {

/// Calls `attempt()` until it returns true (then true) or `deadline` has passed (then false).
/// After a first refusal it subscribes to `channel` through the client's subscriber and makes
/// each next attempt when a message arrives there or the subscriber reconnects (a message may
/// have gone by), never in between — except while the subscription is not confirmed, when no
/// message can be counted on: then it also tries after 10 ms, doubling to 1 s. Throws what
/// `attempt` throws, and connection_failed (naming `name`) once the client is destroyed.
template <class F>
bool wait_on_channel(client_core& core, const std::string& channel, std::string_view name,
                     std::chrono::steady_clock::time_point deadline, F&& attempt) {
    using clock = std::chrono::steady_clock;
    if (attempt()) return true;
    if (clock::now() >= deadline) return false;
    subscriber::subscription sub(*core.sub, channel);
    sub.wait_active(std::min(deadline, clock::now() + core.ep.options.command_timeout));
    std::chrono::milliseconds fallback(10);
    for (;;) {
        core.throw_if_destroyed(name, "the client was destroyed while this thread waited");
        const std::uint64_t seen = sub.generation();
        if (attempt()) return true;
        const auto now = clock::now();
        if (now >= deadline) return false;
        auto until = deadline;
        if (!sub.active()) {
            until = std::min(until, now + fallback);
            fallback = std::min(fallback * 2, std::chrono::milliseconds(1000));
        }
        (void)sub.wait(seen, until);
    }
}

}  // namespace rlock::detail
