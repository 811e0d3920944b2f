// What one try of an acquisition found, in the words both drivers read (wait_blocking,
// async_waits): done, or refused with a hint of when to try again. The acquisition operations
// (lock_acquisition, channel_acquisition) return it; the wait policy reads it.
#pragma once

#include <chrono>
#include <string>

namespace rlock::detail {

/// What a refused try said about when to try again.
struct wait_hint {
    long long ttl = -2;  // the holder's remaining ms, -1 no expiry, -2 freed meanwhile, -3 no
                         // holder (a synchronizer: messages only, and the fallback)
    bool holder_publishes = true;
    std::string holder;
    /// When the attempt itself asked to be made again (a synchronizer's ambiguous failure, a
    /// permit's earliest lease end); max: it did not.
    std::chrono::steady_clock::time_point again = std::chrono::steady_clock::time_point::max();
};

/// Which try of a wait an acquisition's attempt is.
enum class try_phase : unsigned char {
    only,     // try_lock(), or a deadline already past: nothing waits after it
    first,    // the first try of a wait: may join a queue (fair_lock)
    waiting,  // a try inside the wait: may queue, and reports when to try again
};

/// What one try of a wait found: done, or refused, and then what it said about when to try
/// again (wait_policy::next_try).
struct try_result {
    bool done = false;
    wait_hint hint;
};

}  // namespace rlock::detail
