// What the client runtime (the registry, the watchdog) needs to know about a kind of hold: its
// name in messages, its batch renewal script and how Redis Cluster routes it. Each kind's
// protocol header defines one (`Kind::info`); the runtime only reads it.
#pragma once

#include "rlock/detail/redis/script.hpp"

namespace rlock::detail {

/// What the watchdog needs to know about a kind of lock.
struct kind_info {
    const char* name = nullptr;            // "mutex", "reentrant_lock": for messages
    const script& (*renew)() = nullptr;    // batch renewal; KEYS = lock keys, ARGV = lease, values...
    bool follows_ask = true;               // Redis Cluster: see kind_defaults::follows_ask
    const char* gone = nullptr;            // why a renewal found a hold gone, when not a lock's
    bool token_value = false;              // the key is a string holding the hold's value (mutex,
                                           // red_lock): arming reads and compares it
};

}  // namespace rlock::detail
