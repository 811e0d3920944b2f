// The connection pool: hiredis contexts are not thread-safe, so each command checks one out.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/detail/hiredis.hpp"

namespace rlock::detail {

class pool {
public:
    explicit pool(const endpoint& ep) : ep_(ep) {}
    pool(const pool&) = delete;
    pool& operator=(const pool&) = delete;

    /// A checked-out connection; goes back to the pool on destruction unless it broke or a
    /// master switch (Sentinel) made it stale.
    class handle {
    public:
        handle(pool* p, context_ptr c, std::uint64_t epoch)
            : pool_(p), ctx_(std::move(c)), epoch_(epoch) {}
        handle(handle&& o) noexcept : pool_(o.pool_), ctx_(std::move(o.ctx_)), epoch_(o.epoch_) {}
        handle& operator=(handle&&) = delete;
        ~handle() {
            if (ctx_) pool_->give_back(std::move(ctx_), epoch_);
        }
        redisContext* get() const noexcept { return ctx_.get(); }
        /// Closes the connection instead of pooling it: a reply may still be on its way.
        void discard() noexcept {
            if (!ctx_) return;
            ctx_.reset();
            pool_->forget();
        }

    private:
        pool* pool_;
        context_ptr ctx_;
        std::uint64_t epoch_;
    };

    /// Waits up to command_timeout for an idle connection or room to open one.
    handle checkout(std::string_view lock) {
        std::unique_lock<std::mutex> g(mu_);
        const auto deadline = std::chrono::steady_clock::now() + ep_.options.command_timeout;
        const std::size_t cap = ep_.options.pool_size == 0 ? 1 : ep_.options.pool_size;
        const std::uint64_t epoch = ep_.epoch.load();
        while (!idle_.empty() && idle_.back().epoch != epoch) {  // from before a master switch
            idle_.pop_back();
            --open_;
        }
        while (idle_.empty() && open_ >= cap) {
            if (cv_.wait_until(g, deadline) == std::cv_status::timeout && idle_.empty() &&
                open_ >= cap) {
                throw error(errc::timeout, lock, ep_.name,
                            "no pooled connection free within command_timeout (pool_size " +
                                std::to_string(cap) + ")");
            }
        }
        if (!idle_.empty()) {
            pooled p = std::move(idle_.back());
            idle_.pop_back();
            return handle(this, std::move(p.ctx), p.epoch);
        }
        ++open_;
        g.unlock();
        try {
            return handle(this, connect(ep_), epoch);
        } catch (...) {
            g.lock();
            --open_;
            cv_.notify_one();
            throw;
        }
    }

    /// Runs f(redisContext*) on a pooled connection. When the connection breaks (I/O error,
    /// timeout) the other idle connections are dropped too: after a restart they are all dead.
    /// With `retry_safe` (the command is idempotent) it is tried once more on a new connection.
    template <class F>
    auto run(std::string_view lock, bool retry_safe, F&& f) -> decltype(f(std::declval<redisContext*>())) {
        for (int attempt = 0;; ++attempt) {
            handle h = checkout(lock);
            try {
                return f(h.get());
            } catch (const error& e) {
                // An error reply leaves the connection fine, unless it says the server is a
                // replica now (READONLY, reported as connection_failed): then all are stale.
                if (h.get()->err == 0 && e.value() != errc::connection_failed) throw;
                h.discard();
                drop_idle();
                if (!retry_safe || attempt > 0) throw;
            }
        }
    }

    void drop_idle() {
        std::vector<pooled> dead;
        {
            std::lock_guard<std::mutex> g(mu_);
            dead.swap(idle_);
            open_ -= dead.size();
        }
        cv_.notify_all();
    }

    const endpoint& ep() const noexcept { return ep_; }

private:
    void forget() noexcept {
        {
            std::lock_guard<std::mutex> g(mu_);
            --open_;
        }
        cv_.notify_one();
    }

    void give_back(context_ptr c, std::uint64_t epoch) {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (c->err || epoch != ep_.epoch.load()) {
                --open_;
            } else {
                idle_.push_back({std::move(c), epoch});
            }
        }
        cv_.notify_one();
    }

    struct pooled {
        context_ptr ctx;
        std::uint64_t epoch;
    };

    const endpoint& ep_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<pooled> idle_;
    std::size_t open_ = 0;
};

}  // namespace rlock::detail
