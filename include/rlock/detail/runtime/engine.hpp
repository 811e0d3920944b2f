// detail::engine: the one thread per client that drives its asynchronous operations
// (async_lock.hpp). It runs tasks posted from any thread, in order, and timers; it is started by
// the first asynchronous call, so a client that never makes one runs no extra thread.
//
// Everything an asynchronous acquire is (its place in a queue of waiters, its subscription,
// its timers) lives on this thread and is touched only by it, so no lock guards it: other
// threads — the caller, the subscriber that hears an unlock message, a cancellation — post a
// task here instead. An acquire attempt is one blocking round trip through the client's pool,
// made from this thread (docs/design.md, "Asynchronous acquisition").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/config.hpp"

namespace rlock::detail {

/// A move-only callable `void(Args...)`, called at most once: what a completion handler is
/// (Asio's handlers are move-only, so std::function cannot hold them).
template <class... Args>
class unique_callback {
    struct base {
        virtual ~base() = default;
        virtual void call(Args... args) = 0;
    };
    template <class F>
    struct impl final : base {
        explicit impl(F&& f) : f(std::move(f)) {}
        void call(Args... args) override { f(std::forward<Args>(args)...); }
        F f;
    };

public:
    unique_callback() = default;
    template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, unique_callback>>>
    unique_callback(F f)  // NOLINT(google-explicit-constructor): any callable is one
        : p_(std::make_unique<impl<F>>(std::move(f))) {}

    explicit operator bool() const noexcept { return p_ != nullptr; }
    /// Calls it and lets it go (a second call does nothing).
    void operator()(Args... args) {
        if (std::unique_ptr<base> p = std::move(p_)) p->call(std::forward<Args>(args)...);
    }

private:
    std::unique_ptr<base> p_;
};

class engine {
public:
    using clock = std::chrono::steady_clock;
    using task = unique_callback<>;
    using timer_id = std::uint64_t;

    engine() = default;
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;
    ~engine() { stop(); }

    /// What the thread keeps alive while it runs (the client's core), and what it runs once,
    /// on itself, when it stops: the owner completes every pending operation there.
    void set_owner(std::weak_ptr<const void> owner, std::function<void()> on_stop);

    /// Runs `t` on the engine's thread after every task posted before it, starting the thread
    /// if needed. False, with `t` not run, once stop() has begun.
    bool post(task t);

    /// True on the engine's own thread (inside a task or a completion handler it runs).
    bool on_own_thread() const noexcept { return running_ == this; }

    // ---- on the engine's thread only ----

    /// Runs `t` at `when` (on this thread); cancel(id) forgets it.
    timer_id at(clock::time_point when, task t);
    /// Forgets a timer that has not run (0, or one that ran, is ignored).
    void cancel(timer_id id);
    /// True once the client is being destroyed: a task must complete its operation with an
    /// error rather than start anything.
    bool stopping() const {
        std::lock_guard<std::mutex> g(mu_);
        return stopping_;
    }

    /// Stops the thread: the tasks already posted run, then on_stop (which completes what is
    /// still pending), then the timers still set, then the thread ends. Waits for that, except when called on the engine's
    /// own thread (a handler destroying the client): then it all runs here, now, and the thread
    /// ends when the task that called it returns.
    void stop();

private:
    std::function<void()> take_on_stop() {
        std::lock_guard<std::mutex> g(mu_);
        return std::move(on_stop_);
    }

    // The last work of the thread (or of stop() called on it): the tasks still posted (each
    // sees stopping() and completes with an error) — first what is left of the batch the
    // thread is running, when a task of it destroyed the client — then the owner's on_stop.
    void finish();

    static void run(task& t) noexcept {
        try {
            t();
        } catch (...) {  // a task completes its operation itself; nothing may end the thread
        }
    }

    void loop();

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<task> inbox_;
    bool stopping_ = false;
    std::weak_ptr<const void> owner_;
    std::function<void()> on_stop_;
    std::thread thread_;
    static inline thread_local const engine* running_ = nullptr;  // the engine of this thread
    // The thread's own.
    std::vector<task> batch_;  // the tasks it is running, taken from inbox_ at once
    std::size_t next_ = 0;     // the first of them not run yet
    bool finished_ = false;
    timer_id last_timer_ = 0;
    std::map<std::pair<clock::time_point, timer_id>, task> timers_;
    std::unordered_map<timer_id, clock::time_point> timer_at_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void engine::set_owner(std::weak_ptr<const void> owner, std::function<void()> on_stop) {
    std::lock_guard<std::mutex> g(mu_);
    owner_ = std::move(owner);
    on_stop_ = std::move(on_stop);
}

RLOCK_DECL bool engine::post(task t) {
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_) return false;
        if (!thread_.joinable()) {
            std::shared_ptr<const void> keep = owner_.lock();
            thread_ = std::thread([this, keep = std::move(keep)] { loop(); });
        }
        inbox_.push_back(std::move(t));
    }
    cv_.notify_one();
    return true;
}

RLOCK_DECL auto engine::at(clock::time_point when, task t) -> timer_id {
    const timer_id id = ++last_timer_;
    timers_.emplace(std::make_pair(when, id), std::move(t));
    timer_at_.emplace(id, when);
    return id;
}

RLOCK_DECL void engine::cancel(timer_id id) {
    auto it = timer_at_.find(id);
    if (it == timer_at_.end()) return;
    timers_.erase(std::make_pair(it->second, id));
    timer_at_.erase(it);
}

RLOCK_DECL void engine::stop() {
    {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_) return;
        stopping_ = true;
    }
    cv_.notify_all();
    if (!thread_.joinable()) {
        std::function<void()> on_stop = take_on_stop();
        if (on_stop) on_stop();
        return;
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
        finish();
        thread_.detach();
        return;
    }
    thread_.join();
}

RLOCK_DECL void engine::finish() {
    if (finished_) return;
    finished_ = true;
    while (next_ < batch_.size()) run(batch_[next_++]);
    std::vector<task> rest;
    {
        std::lock_guard<std::mutex> g(mu_);
        rest.swap(inbox_);
    }
    for (task& t : rest) run(t);
    std::function<void()> on_stop = take_on_stop();
    if (on_stop) on_stop();
    // The timers still set run now, in order: each sees stopping() (an operation waiting to
    // start completes with its error; the rest find theirs completed).
    auto timers = std::move(timers_);
    timers_.clear();
    timer_at_.clear();
    for (auto& [when, t] : timers) run(t);
}

RLOCK_DECL void engine::loop() {
    running_ = this;
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
        auto ready = [&] { return stopping_ || !inbox_.empty(); };
        if (timers_.empty()) {
            cv_.wait(g, ready);
        } else {
            cv_.wait_until(g, timers_.begin()->first.first, ready);
        }
        if (stopping_) break;
        batch_.swap(inbox_);
        g.unlock();
        // A task that destroys the client runs the rest of the batch in finish(), before
        // the client's destructor returns.
        for (next_ = 0; next_ < batch_.size();) run(batch_[next_++]);
        if (finished_) return;
        batch_.clear();
        // Each due timer once; one set while these run waits for the next turn.
        const auto now = clock::now();
        while (!timers_.empty() && timers_.begin()->first.first <= now) {
            auto it = timers_.begin();
            task t = std::move(it->second);
            timer_at_.erase(it->first.second);
            timers_.erase(it);
            run(t);
            if (finished_) return;  // a handler destroyed the client
        }
        if (finished_) return;
        g.lock();
    }
    g.unlock();
    finish();
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
