// What a client remembers of the semaphore counts it has used: whether it saw each set on its
// server (an absent count after that means the server lost it: a restart without persistence,
// a flush, a DEL), and how many permits its threads took and have not released (the holders
// to tell when a lost count is set back to its capacity). Bounded: past `limit` names, new
// ones are not remembered, and their loss looks like a count never set (Redisson's reading).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "rlock/config.hpp"

namespace rlock::detail {

class count_memory {
public:
    static constexpr std::size_t limit = 65536;

    /// `name`'s count was found set (or was just written).
    void saw(std::string_view name) {
        std::lock_guard<std::mutex> g(mu_);
        (void)at_locked(name);
    }

    /// True when `name`'s count was seen set by this client.
    bool seen(std::string_view name) const;

    /// This client took `n` permits of `name` (so its count was set).
    void took(std::string_view name, long long n);
    /// The permits of `name` this client took and has not released (0 when not remembered).
    long long held(std::string_view name) const;

    /// This client released `n` permits of `name` (a plain semaphore's permits are not owned:
    /// what one thread took another may release; never below 0), of which `over` did not fit
    /// under its capacity. Returns how many of those were not already told gone
    /// (forget_taken): permits taken before the count was lost, or released twice.
    long long released(std::string_view name, long long n, long long over);

    /// The permits of `name` this client took and has not released, counted as gone (and
    /// returned): they were taken from a count the server has lost since.
    long long forget_taken(std::string_view name);

private:
    struct entry {
        long long held = 0;  // permits taken by this client, not released
        long long gone = 0;  // permits its holders were told are gone, not released yet
    };
    entry* at_locked(std::string_view name);

    mutable std::mutex mu_;
    std::map<std::string, entry, std::less<>> counts_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL bool count_memory::seen(std::string_view name) const {
    std::lock_guard<std::mutex> g(mu_);
    return counts_.find(name) != counts_.end();
}

RLOCK_DECL void count_memory::took(std::string_view name, long long n) {
    std::lock_guard<std::mutex> g(mu_);
    if (entry* e = at_locked(name)) e->held += n;
}

RLOCK_DECL long long count_memory::held(std::string_view name) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = counts_.find(name);
    return it == counts_.end() ? 0 : it->second.held;
}

RLOCK_DECL long long count_memory::released(std::string_view name, long long n, long long over) {
    std::lock_guard<std::mutex> g(mu_);
    entry* e = at_locked(name);
    if (!e) return over;
    const long long told = std::min(over, e->gone);
    e->gone -= told;
    const long long back = n - told;
    e->held = e->held > back ? e->held - back : 0;
    return over - told;
}

RLOCK_DECL long long count_memory::forget_taken(std::string_view name) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = counts_.find(name);
    if (it == counts_.end()) return 0;
    const long long held = it->second.held;
    it->second.gone += held;
    it->second.held = 0;
    return held;
}

RLOCK_DECL auto count_memory::at_locked(std::string_view name) -> entry* {
    auto it = counts_.find(name);
    if (it != counts_.end()) return &it->second;
    if (counts_.size() >= limit) return nullptr;
    return &counts_.emplace(std::string(name), entry{}).first->second;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
