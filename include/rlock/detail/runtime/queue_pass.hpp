// detail::queue_passes: the fair_lock's local hand-off. A fair lock keeps one queue for every
// client (Redisson's layout), so a hold may pass within a client only when the queue's next
// waiter is one of its own threads: then the final unlock gives the hold to that waiter in the
// release's own script (fair_kind::pass_script: the hash field renamed, the waiter taken off the
// queue as its acquisition would) and tells it here, in the process, instead of publishing the
// unlock message for the waiter to run its acquire script. The queue's order is kept: the pass
// goes to the head, as the release's message would have.
//
// This table is what the two threads share: the blocking waiters that may be passed a hold
// (enrolled), the releaser's candidates (the script passes only to one of them, and only when
// it is the head), and the pass itself, delivered to the waiter, which a waiter leaving
// without it releases.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rlock/config.hpp"

namespace rlock::detail {

/// A hold passed at Redis to a queued waiter: its expiry counts from `sent` (when the pass
/// script was sent) for `lease`. `maybe`: the unlock's script may or may not have passed it (its
/// reply was lost); only a waiter leaving sees such a one, and releases what it may hold.
struct queued_pass {
    std::chrono::steady_clock::time_point sent;
    std::chrono::milliseconds lease{0};
    bool maybe = false;
};

/// A client's blocking fair_lock waiters that may be passed a hold, by lock name.
///
/// A waiter's holder id is its thread's, the same for each of its acquisitions, so a pass must
/// reach the acquisition it was meant for, not a later one of the same thread: an unlock
/// `offer`s its candidates before its script runs (each entry then counts the offer in flight)
/// and `settle`s after, and a waiter that leaves (`withdraw`) first waits for the offers in
/// flight to it to settle (a script's round trip at most): it then knows whether it was passed
/// the hold, and no pass can arrive after it left.
class queue_passes {
public:
    /// A waiter, stored in the queue under `value`, may be passed a hold of `lock` from now on.
    void enroll(const std::string& lock, const std::string& value);

    /// Whether any waiter is enrolled (for any lock): one load, no lock.
    bool any() const noexcept { return entries_.load(std::memory_order_relaxed) != 0; }

    /// One candidate of an offer: a waiter's value and its acquisition's serial.
    struct offered {
        std::string value;
        std::uint64_t serial = 0;
    };
    /// The enrolled waiters for `lock` that have not been passed anything: those a final unlock
    /// may pass to (empty: the unlock releases as usual). Each counts the offer until settle().
    std::vector<offered> offer(const std::string& lock);

    /// The unlock's script ran (or failed): each of `candidates` is no longer offered, and the
    /// one whose value is `passed_to` (if any) holds the lock by `pass` (it finds it at its next
    /// look, take()). `ambiguous`: the script's reply was lost, so it may have passed the hold to
    /// any of them (the head then finds it at its next try at Redis; one that leaves first
    /// releases it: withdraw()). Wakes a waiter waiting in withdraw().
    void settle(const std::string& lock, const std::vector<offered>& candidates,
                const std::string& passed_to, const queued_pass& pass, bool ambiguous = false);

    /// The waiter looks: the pass delivered to it, if any (it then leaves the table).
    std::optional<queued_pass> take(const std::string& lock, const std::string& value);

    /// The waiter leaves: once no offer to it is in flight, returns the pass delivered to it, if
    /// any (it holds the lock then, and must release it when it does not keep it), or one marked
    /// `maybe` when an offer to it was settled ambiguous (it may hold the lock: it releases).
    std::optional<queued_pass> withdraw(const std::string& lock, const std::string& value);

    /// As withdraw(), staying enrolled (an acquire undone after an outage: it tries again).
    std::optional<queued_pass> clear(const std::string& lock, const std::string& value);

private:
    struct entry {
        std::string value;
        std::uint64_t serial = 0;
        unsigned offers = 0;  // offers in flight to it
        std::optional<queued_pass> pass;
        bool maybe = false;  // an offer to it was settled ambiguous
    };
    using list = std::vector<entry>;
    // withdraw() (`stay` false) and clear() (true).
    std::optional<queued_pass> leave(const std::string& lock, const std::string& value, bool stay);
    entry* find_locked(const std::string& lock, const std::string& value);
    void erase_locked(const std::string& lock, const std::string& value);

    std::mutex mu_;
    // How many entries there are, read without the lock by offer(): an unlock with nobody
    // enrolled (most of them) costs one load. A waiter enrolling just then is not offered this
    // pass; the release wakes it as before.
    std::atomic<std::size_t> entries_{0};
    std::condition_variable settled_;
    std::uint64_t next_serial_ = 0;
    std::unordered_map<std::string, list> by_lock_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void queue_passes::enroll(const std::string& lock, const std::string& value) {
    std::lock_guard<std::mutex> g(mu_);
    if (find_locked(lock, value)) return;
    by_lock_[lock].push_back(entry{value, ++next_serial_, 0, std::nullopt, false});
    entries_.fetch_add(1, std::memory_order_relaxed);
}

RLOCK_DECL std::vector<queue_passes::offered> queue_passes::offer(const std::string& lock) {
    std::vector<offered> out;
    if (entries_.load(std::memory_order_relaxed) == 0) return out;
    std::lock_guard<std::mutex> g(mu_);
    auto it = by_lock_.find(lock);
    if (it == by_lock_.end()) return out;
    for (entry& e : it->second) {
        if (e.pass) continue;
        ++e.offers;
        out.push_back(offered{e.value, e.serial});
    }
    return out;
}

RLOCK_DECL void queue_passes::settle(const std::string& lock, const std::vector<offered>& candidates,
                                     const std::string& passed_to, const queued_pass& pass,
                                     bool ambiguous) {
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = by_lock_.find(lock);
        if (it == by_lock_.end()) return;  // (each offered entry stays until settled)
        for (const offered& o : candidates) {
            for (entry& e : it->second) {
                if (e.serial != o.serial) continue;
                --e.offers;
                if (e.value == passed_to) e.pass = pass;
                if (ambiguous) e.maybe = true;
                break;
            }
        }
    }
    settled_.notify_all();
}

RLOCK_DECL std::optional<queued_pass> queue_passes::take(const std::string& lock,
                                                         const std::string& value) {
    std::lock_guard<std::mutex> g(mu_);
    const entry* e = find_locked(lock, value);
    if (!e || !e->pass) return std::nullopt;
    std::optional<queued_pass> got = e->pass;
    erase_locked(lock, value);
    return got;
}

RLOCK_DECL std::optional<queued_pass> queue_passes::withdraw(const std::string& lock,
                                                             const std::string& value) {
    return leave(lock, value, /*stay=*/false);
}

RLOCK_DECL std::optional<queued_pass> queue_passes::clear(const std::string& lock,
                                                          const std::string& value) {
    return leave(lock, value, /*stay=*/true);
}

RLOCK_DECL std::optional<queued_pass> queue_passes::leave(const std::string& lock,
                                                          const std::string& value, bool stay) {
    std::unique_lock<std::mutex> g(mu_);
    // Offers in flight end with their script (bounded by command_timeout, one retry at most).
    settled_.wait(g, [&] {
        const entry* e = find_locked(lock, value);
        return !e || e->offers == 0;
    });
    entry* e = find_locked(lock, value);
    if (!e) return std::nullopt;
    std::optional<queued_pass> got = e->pass;
    if (!got && e->maybe) got = queued_pass{{}, {}, true};
    if (stay) {
        e->pass.reset();
        e->maybe = false;
    } else {
        erase_locked(lock, value);
    }
    return got;
}

RLOCK_DECL queue_passes::entry* queue_passes::find_locked(const std::string& lock,
                                                          const std::string& value) {
    auto it = by_lock_.find(lock);
    if (it == by_lock_.end()) return nullptr;
    for (entry& e : it->second) {
        if (e.value == value) return &e;
    }
    return nullptr;
}

RLOCK_DECL void queue_passes::erase_locked(const std::string& lock, const std::string& value) {
    auto it = by_lock_.find(lock);
    if (it == by_lock_.end()) return;
    list& l = it->second;
    const auto gone = std::remove_if(l.begin(), l.end(), [&](const entry& e) { return e.value == value; });
    entries_.fetch_sub(static_cast<std::size_t>(l.end() - gone), std::memory_order_relaxed);
    l.erase(gone, l.end());
    if (l.empty()) by_lock_.erase(it);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
