// detail::deferred_undos: what a waiter that gave up could not undo itself because the server
// did not answer — a fair_lock queue entry left while the server was paused, restarting or
// out of reach. The watchdog thread tries each one again until the server takes it, so that a
// cancelled or timed-out acquire leaves nothing behind once the server answers (left alone,
// the entry would keep every other client out of a free lock until it was evicted).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

class deferred_undos {
public:
    using clock = std::chrono::steady_clock;
    /// One try of an undo: returns when it is done; throws rlock::error when it is not.
    using step = std::function<void()>;

    /// Keeps `undo`, under `key` (the lock and the waiter's value), to be tried again until
    /// `until`, when what it undoes is gone anyway. A second undo under the same key replaces
    /// the first.
    void add(std::string key, step undo, clock::time_point until);

    /// Forgets the undo under `key`: its waiter is about to queue again under the same value
    /// and will leave the queue itself (the old undo would take its new place away). Waits
    /// for that undo when it is being tried now.
    void forget(const std::string& key);

    /// Nothing kept, and nothing being tried.
    bool empty() const noexcept { return count_.load(std::memory_order_relaxed) == 0; }

    /// Tries each undo once, on the calling thread (the watchdog's). One that fails with the
    /// server out of reach (connection_failed, timeout) or not able to run it yet (Redis
    /// Cluster: a slot migrating, the cluster down; may_run_later) is kept for the next call
    /// until its `until`; any other failure (an ACL, a key of another type) would only repeat:
    /// dropped. After a timeout, or a refusal the pool waited out (TRYAGAIN for
    /// command_timeout), the rest are kept untried: one command_timeout a call, not one each.
    void try_all() noexcept;

private:
    struct entry {
        std::string key;
        step undo;
        clock::time_point until;
    };
    static void erase_key(std::vector<entry>& list, const std::string& key) noexcept;
    bool forgotten_locked(const std::string& key) const noexcept;

    std::mutex mu_;
    std::vector<entry> list_;
    // Keys forgotten or added while try_all ran without the lock: what it tried under them is
    // not put back.
    std::vector<std::string> forgotten_;
    std::size_t running_ = 0;  // taken out by try_all, not put back yet
    std::string current_;      // the key of the undo try_all runs now (empty: none)
    std::condition_variable done_;  // current_ changed
    std::atomic<std::size_t> count_{0};
};

}  // namespace rlock::detail

#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void deferred_undos::erase_key(std::vector<entry>& list, const std::string& key) noexcept {
    for (auto it = list.begin(); it != list.end();) {
        it = it->key == key ? list.erase(it) : it + 1;
    }
}

RLOCK_DECL void deferred_undos::add(std::string key, step undo, clock::time_point until) {
    std::lock_guard<std::mutex> g(mu_);
    erase_key(list_, key);
    forgotten_.push_back(key);
    list_.push_back(entry{std::move(key), std::move(undo), until});
    count_.store(list_.size() + running_, std::memory_order_relaxed);
}

RLOCK_DECL void deferred_undos::forget(const std::string& key) {
    if (empty()) return;
    std::unique_lock<std::mutex> g(mu_);
    erase_key(list_, key);
    forgotten_.push_back(key);
    count_.store(list_.size() + running_, std::memory_order_relaxed);
    // One being tried now finishes first: run after the caller's next step, it would undo that.
    done_.wait(g, [&] { return current_ != key; });
}

RLOCK_DECL bool deferred_undos::forgotten_locked(const std::string& key) const noexcept {
    return std::find(forgotten_.begin(), forgotten_.end(), key) != forgotten_.end();
}

RLOCK_DECL void deferred_undos::try_all() noexcept {
    std::unique_lock<std::mutex> g(mu_);
    std::vector<entry> taken;
    taken.swap(list_);
    forgotten_.clear();
    running_ = taken.size();  // still counted (empty()) while they run
    std::vector<entry> kept;
    // An undo that timed out: the server does not answer, and the rest would each wait out a
    // command_timeout too. They are kept for the next call untried.
    bool unanswered = false;
    for (entry& e : taken) {
        if (unanswered) {
            if (!forgotten_locked(e.key) && clock::now() < e.until) kept.push_back(std::move(e));
        } else if (!forgotten_locked(e.key)) {
            current_ = e.key;
            g.unlock();
            bool keep = false;
            try {
                e.undo();
            } catch (const error& x) {
                keep = may_run_later(x) && clock::now() < e.until;
                unanswered = x.value() == errc::timeout ||
                             error_access::origin(x).to.kind != redirect::none;
            } catch (...) {
            }
            g.lock();
            current_.clear();
            done_.notify_all();
            if (keep && !forgotten_locked(e.key)) kept.push_back(std::move(e));
        }
        --running_;
    }
    for (entry& e : kept) list_.push_back(std::move(e));
    forgotten_.clear();
    count_.store(list_.size(), std::memory_order_relaxed);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
