// The client's record of the holds its threads have: what the watchdog renews, what lost()
// reports, and how a thread that already holds a lock is recognised (reentry, would_deadlock).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/detail/hiredis.hpp"

namespace rlock::detail {

/// What the watchdog needs to know about a kind of lock.
struct kind_info {
    const char* name = nullptr;            // "mutex", "reentrant_lock": for messages
    const script& (*renew)() = nullptr;    // batch renewal; KEYS = lock keys, ARGV = lease, values...
    bool follows_ask = true;               // Redis Cluster: see kind_defaults::follows_ask
};

/// A hold id: unique in the process, never 0.
inline std::uint64_t next_hold_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

/// Holds that stand or fall together (the nodes of a red_lock): the owner is told once, when
/// more than `tolerance` of them are lost. Set on each member hold.
struct hold_group {
    std::string name;
    std::uint64_t id = next_hold_id();  // the hold id of the whole (red_lock::hold_id())
    int tolerance = 0;
    std::atomic<int> lost_parts{0};
    std::atomic<bool> told{false};
    lock_lost_handler tell;  // the owner's on_lock_lost (may be empty)

    /// Counts one member lost; true when this loss is the one that loses the group.
    bool part_lost() noexcept {
        return lost_parts.fetch_add(1) + 1 > tolerance && !told.exchange(true);
    }
};

/// One thread's hold on one lock.
struct hold {
    using clock = std::chrono::steady_clock;

    const kind_info* kind = nullptr;
    std::string name;   // the lock's name (its key)
    std::string value;  // mutex token, or holder id "<clientId>:<threadId>"
    std::uint64_t thread = 0;
    std::chrono::milliseconds lease{0};
    bool watched = false;
    std::uint64_t fencing = 0;
    std::uint64_t id = next_hold_id();  // what hold_id() returns and on_lock_lost is told
    std::shared_ptr<hold_group> group;  // set for the parts of a red_lock

    // Guarded by registry::mu_.
    std::size_t count = 1;      // reentry depth
    clock::time_point expires;  // send time of the last acquire or renewal that worked + lease
    bool lost = false;          // known to be gone from Redis
    bool told = false;          // on_lock_lost already called
    bool in_flight = false;     // inside a watchdog renewal batch right now
    bool released = false;      // unlocked: no renewal, no report
    bool refused = false;       // a renewal was refused with an error; the owner was told
};

class registry {
public:
    using clock = std::chrono::steady_clock;
    using hold_ptr = std::shared_ptr<hold>;

    hold_ptr find(const kind_info* kind, std::string_view name, std::uint64_t thread) const {
        std::lock_guard<std::mutex> g(mu_);
        auto it = holds_.find(key_of(kind, name, thread));
        return it == holds_.end() ? nullptr : it->second;
    }

    void add(hold_ptr h) {
        std::lock_guard<std::mutex> g(mu_);
        std::string k = key_of(h->kind, h->name, h->thread);
        holds_[std::move(k)] = std::move(h);
    }

    /// Takes a hold out of the registry for its final unlock, and waits for a renewal batch that
    /// carries it to finish, so that no renewal of it reaches Redis after unlock returns.
    void remove(const hold_ptr& h) {
        std::unique_lock<std::mutex> g(mu_);
        holds_.erase(key_of(h->kind, h->name, h->thread));
        h->released = true;
        quiet_.wait(g, [&] { return !h->in_flight; });
    }

    /// True when the hold is known lost, or its lease has run out by this client's clock. The
    /// verdict is final: it is latched, so a renewal answered later does not take it back (the
    /// owner may already have acted on it), and the watchdog tells on_lock_lost at its next
    /// tick if no one has yet.
    bool is_lost(hold& h) const {
        std::lock_guard<std::mutex> g(mu_);
        if (!h.lost && clock::now() >= h.expires) h.lost = true;
        return h.lost;
    }

    template <class F>
    decltype(auto) with(F&& f) const {
        std::lock_guard<std::mutex> g(mu_);
        return f();
    }

    /// The watched holds still in force, each flagged in_flight until renewed() is called.
    /// Holds whose lease has already run out by this client's clock are lost for good (lost()
    /// has been saying so): they are not renewed, even if Redis still has them, and go to
    /// `expired` when their owner has not been told yet.
    std::vector<hold_ptr> take_watched(std::vector<hold_ptr>& expired) {
        std::vector<hold_ptr> out;
        std::lock_guard<std::mutex> g(mu_);
        const auto now = clock::now();
        out.reserve(holds_.size());
        for (auto& [k, h] : holds_) {
            if (!h->watched || h->released || (h->lost && h->told)) continue;
            if (h->lost || now >= h->expires) {
                if (mark_lost_locked(*h)) expired.push_back(h);
                continue;
            }
            h->in_flight = true;
            out.push_back(h);
        }
        return out;
    }

    /// Ends a renewal batch: ok[i] says whether holds[i] was renewed; a hold that was not is
    /// lost when Redis said so (`gone`) or when its lease ran out. A renewal sent after the
    /// lease had run out does not bring a hold back (lost() stays true). Returns the indexes of the
    /// holds whose owner must be told now.
    std::vector<std::size_t> renewed(const std::vector<hold_ptr>& holds, const std::vector<char>& ok,
                                     const std::vector<char>& gone, clock::time_point sent) {
        std::vector<std::size_t> tell;
        {
            std::lock_guard<std::mutex> g(mu_);
            const auto now = clock::now();
            for (std::size_t i = 0; i < holds.size(); ++i) {
                hold& h = *holds[i];
                h.in_flight = false;
                if (h.released) continue;
                if (ok[i] && !h.lost && sent < h.expires) {
                    h.expires = sent + h.lease;
                    h.refused = false;
                } else if ((gone[i] || ok[i] || now >= h.expires) && mark_lost_locked(h)) {
                    tell.push_back(i);
                }
            }
        }
        quiet_.notify_all();
        return tell;
    }

    /// Marks a hold lost on behalf of its own thread (unlock found it gone); true when the owner
    /// has not been told yet.
    bool claim_report(hold& h) {
        std::lock_guard<std::mutex> g(mu_);
        h.lost = true;
        if (h.told || h.refused) {  // a refused renewal was the report
            h.told = true;
            return false;
        }
        h.told = true;
        return true;
    }

    /// Takes every hold of `thread` out of the registry (the thread has exited: nothing can
    /// unlock them), waiting for a renewal batch that carries one to finish. Returns the
    /// watched ones whose owner has not been told of a loss yet: the watchdog stops renewing
    /// them, so they end with their lease.
    std::vector<hold_ptr> take_thread(std::uint64_t thread) {
        std::vector<hold_ptr> mine;
        std::vector<hold_ptr> untold;
        std::unique_lock<std::mutex> g(mu_);
        for (auto it = holds_.begin(); it != holds_.end();) {
            if (it->second->thread != thread) {
                ++it;
                continue;
            }
            hold_ptr& h = it->second;
            h->released = true;
            if (h->watched && !h->told && !h->refused) {
                h->lost = true;
                h->told = true;
                untold.push_back(h);
            }
            mine.push_back(std::move(h));
            it = holds_.erase(it);
        }
        quiet_.wait(g, [&] {
            return std::none_of(mine.begin(), mine.end(), [](const hold_ptr& h) { return h->in_flight; });
        });
        return untold;
    }

    /// A renewal of `h` was refused with an error (not "gone"): true when the owner must be
    /// told now, which happens once until a renewal works again. The hold is not lost yet: the
    /// watchdog keeps trying while its lease lasts, and when the lease runs out lost() turns
    /// true without a second report.
    bool refused(hold& h) {
        std::lock_guard<std::mutex> g(mu_);
        if (h.released || h.told || h.refused) return false;
        h.refused = true;
        return true;
    }

private:
    bool mark_lost_locked(hold& h) {
        h.lost = true;
        if (h.told || h.released || h.refused) return false;
        h.told = true;
        return true;
    }

    static std::string key_of(const kind_info* kind, std::string_view name, std::uint64_t thread) {
        std::string k(kind->name);
        k += '\0';
        k += std::to_string(thread);
        k += '\0';
        k += name;
        return k;
    }

    mutable std::mutex mu_;
    std::condition_variable quiet_;
    std::unordered_map<std::string, hold_ptr> holds_;
};

}  // namespace rlock::detail
