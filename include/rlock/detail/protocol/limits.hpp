// The longest lease, and the longest duration option, rlock accepts: what a lease's and the
// client's clock arithmetic can hold (timed_lockable's lease checks, client_options and
// lock_options validation).
#pragma once

#include <chrono>

namespace rlock::detail {

/// 100 years. Longer ones would overflow the client's steady_clock arithmetic (and Redis
/// refuses expiries near 2^63 ms).
inline constexpr std::chrono::hours max_lease{24 * 365 * 100};

}  // namespace rlock::detail
