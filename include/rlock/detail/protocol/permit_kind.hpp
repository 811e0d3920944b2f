// The permit-expirable semaphore's permits as the rest of rlock sees them: their kind (the
// watchdog's batch renewal), Redisson's permit ids as bytes, and the semaphore's key names.
// rlock::permit_expirable_semaphore (permit_expirable_semaphore.hpp) is the public face.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"

namespace rlock::detail {

/// What the watchdog knows of a permit: its batch renewal.
struct permit_kind {
    static inline const kind_info info{"permit", &permit_scripts::renew, true,
                                       "the watchdog found the permit gone: its lease ended, or it "
                                       "was released or reclaimed by another client"};
};

/// A permit id as Redisson writes one (lowercase hex, even length) to its bytes; false for
/// anything else.
RLOCK_DECL bool permit_id_bytes(std::string_view hex, std::string& out);

/// The names a permit-expirable semaphore and its permits use.
struct permit_keys {
    std::string name, timeouts, channel;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL bool permit_id_bytes(std::string_view hex, std::string& out) {
    auto digit = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    };
    if (hex.empty() || hex.size() % 2 != 0) return false;
    out.clear();
    for (std::size_t i = 0; i < hex.size(); i += 2) {
        const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
        if (hi < 0 || lo < 0) return false;
        out += static_cast<char>(hi * 16 + lo);
    }
    return true;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
