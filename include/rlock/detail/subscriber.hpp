// The subscriber: one pub/sub connection and one thread per client, shared by every waiter of
// every lock on that client.
//
// A waiter holds a `subscription` to its lock's channel while it waits. Each channel has a
// generation counter, bumped by every message on it and by every reconnect (messages may have
// been missed meanwhile). A waiter reads the generation *before* its acquire attempt and waits
// for it to change: an unlock that lands between the refused attempt and the wait has already
// bumped it, so no wake-up is lost.
//
// The thread owns the hiredis context. It poll()s the socket and a self-pipe; other threads ask
// for SUBSCRIBE / UNSUBSCRIBE by queueing the channel name and writing to the pipe.
#pragma once

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/wake_pipe.hpp"

namespace rlock::detail {

class subscriber {
    using clock = std::chrono::steady_clock;

    struct channel_state {
        std::size_t waiters = 0;
        std::uint64_t generation = 0;
        bool active = false;  // the server confirmed SUBSCRIBE, with no UNSUBSCRIBE in flight
        std::condition_variable cv;
    };

public:
    /// `on_reconnect` is called on the subscriber's thread each time its connection is made
    /// again after it broke (the server may have restarted and lost data meanwhile).
    explicit subscriber(const endpoint& ep, std::function<void()> on_reconnect = {})
        : ep_(ep), on_reconnect_(std::move(on_reconnect)), wake_(ep.name) {
        thread_ = std::thread([this] { run(); });
    }
    subscriber(const subscriber&) = delete;
    subscriber& operator=(const subscriber&) = delete;

    ~subscriber() { stop(); }

    void stop() {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (stopping_) return;
            stopping_ = true;
            for (auto& [name, ch] : channels_) ch->cv.notify_all();
        }
        poke();
        if (thread_.joinable()) thread_.join();
    }

    /// After a master switch (endpoint::epoch moved on): drop the connection and make a new
    /// one, to the new master, subscribed to every channel again.
    void master_switched() noexcept { poke(); }

    /// True once stop() has begun: waiters must not wait for messages any more.
    bool stopped() const {
        std::lock_guard<std::mutex> g(mu_);
        return stopping_;
    }

    /// Interest in one channel, held by a waiter for as long as it waits.
    class subscription {
    public:
        subscription(subscriber& s, std::string channel) : s_(s), channel_(std::move(channel)) {
            std::lock_guard<std::mutex> g(s_.mu_);
            auto& slot = s_.channels_[channel_];
            if (!slot) slot = std::make_unique<channel_state>();
            ch_ = slot.get();
            if (ch_->waiters++ == 0) {
                ch_->active = false;
                s_.pending_.push_back(channel_);
                s_.poke();
            }
        }
        subscription(const subscription&) = delete;
        subscription& operator=(const subscription&) = delete;
        ~subscription() {
            std::lock_guard<std::mutex> g(s_.mu_);
            if (--ch_->waiters == 0) {
                ch_->active = false;
                s_.pending_.push_back(channel_);
                s_.poke();
            }
        }

        /// Waits until the server has confirmed the subscription, or `deadline`.
        bool wait_active(clock::time_point deadline) {
            std::unique_lock<std::mutex> g(s_.mu_);
            ch_->cv.wait_until(g, deadline, [&] { return ch_->active || s_.stopping_; });
            return ch_->active;
        }
        bool active() const {
            std::lock_guard<std::mutex> g(s_.mu_);
            return ch_->active;
        }
        std::uint64_t generation() const {
            std::lock_guard<std::mutex> g(s_.mu_);
            return ch_->generation;
        }
        /// Waits until a message (or a reconnect) changed the generation from `seen`, or
        /// `deadline`. Returns whether it changed.
        bool wait(std::uint64_t seen, clock::time_point deadline) {
            std::unique_lock<std::mutex> g(s_.mu_);
            return ch_->cv.wait_until(g, deadline,
                                      [&] { return ch_->generation != seen || s_.stopping_; });
        }

    private:
        subscriber& s_;
        std::string channel_;
        channel_state* ch_;
    };

private:
    void poke() noexcept { wake_.poke(); }

    // Bumps every channel's generation so that its waiters retry now: used when the connection
    // was lost or re-made, since messages may have gone by unseen.
    void wake_all_locked() {
        for (auto& [name, ch] : channels_) {
            ch->active = false;
            ++ch->generation;
            ch->cv.notify_all();
        }
    }

    void run() {
        std::chrono::milliseconds backoff{0};
        while (!stopped()) {
            context_ptr c;
            const std::uint64_t epoch = ep_.epoch.load();
            try {
                c = connect(ep_);
            } catch (const error&) {
                // Reconnect backoff, 10 ms doubling to 1 s, cut short by stop(). Waiters do not
                // depend on it: they also wake on their holder's TTL.
                backoff = std::clamp(backoff * 2, std::chrono::milliseconds(10),
                                     std::chrono::milliseconds(1000));
                pollfd p{wake_.fd(), POLLIN, 0};
                ::poll(&p, 1, static_cast<int>(backoff.count()));
                wake_.drain();
                continue;
            }
            backoff = std::chrono::milliseconds(0);
            if (served_ && on_reconnect_) on_reconnect_();
            served_ = true;
            inflight_.clear();
            {
                std::lock_guard<std::mutex> g(mu_);
                pending_.clear();
                for (auto& [name, ch] : channels_) pending_.push_back(name);
                wake_all_locked();
            }
            serve(c.get(), epoch);
            std::lock_guard<std::mutex> g(mu_);
            wake_all_locked();
        }
    }

    // Sends the queued SUBSCRIBE / UNSUBSCRIBE commands. False on an I/O error.
    bool send_pending(redisContext* c) {
        std::vector<std::pair<std::string, bool>> ops;  // channel, subscribe?
        {
            std::lock_guard<std::mutex> g(mu_);
            std::sort(pending_.begin(), pending_.end());
            pending_.erase(std::unique(pending_.begin(), pending_.end()), pending_.end());
            for (std::string& name : pending_) {
                auto it = channels_.find(name);
                if (it == channels_.end()) continue;
                const bool want = it->second->waiters > 0;
                if (!want) channels_.erase(it);
                ops.emplace_back(std::move(name), want);
            }
            pending_.clear();
        }
        for (auto& [name, sub] : ops) {
            const char* argv[2] = {sub ? "SUBSCRIBE" : "UNSUBSCRIBE", name.c_str()};
            const std::size_t lens[2] = {sub ? 9u : 11u, name.size()};
            if (redisAppendCommandArgv(c, 2, argv, lens) != REDIS_OK) return false;
            ++inflight_[name];
        }
        int done = 0;
        while (!done) {
            if (redisBufferWrite(c, &done) != REDIS_OK) return false;
        }
        return true;
    }

    void on_reply(const redisReply* r) {
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
        const std::string_view kind = reply_text(r->element[0]);
        const std::string name(reply_text(r->element[1]));
        if (kind == "subscribe" || kind == "unsubscribe") {
            auto in = inflight_.find(name);
            if (in != inflight_.end() && --in->second == 0) inflight_.erase(in);
            if (kind != "subscribe" || inflight_.count(name)) return;
            std::lock_guard<std::mutex> g(mu_);
            auto it = channels_.find(name);
            if (it != channels_.end() && it->second->waiters > 0) {
                // Listening from now on. A message published before this point (while the
                // connection was being re-made) is lost, so the waiters retry once now.
                it->second->active = true;
                ++it->second->generation;
                it->second->cv.notify_all();
            }
        } else if (kind == "message") {
            std::lock_guard<std::mutex> g(mu_);
            auto it = channels_.find(name);
            if (it != channels_.end()) {
                ++it->second->generation;
                it->second->cv.notify_all();
            }
        }
    }

    // Serves one connection until it breaks, its master is replaced (Sentinel) or stop() is
    // called.
    void serve(redisContext* c, std::uint64_t epoch) {
        for (;;) {
            if (stopped() || ep_.epoch.load() != epoch) return;
            if (!send_pending(c)) return;
            pollfd p[2] = {{c->fd, POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
            if (::poll(p, 2, -1) < 0) {
                if (errno == EINTR) continue;
                return;
            }
            if (p[1].revents) wake_.drain();
            if (p[0].revents) {
                if (redisBufferRead(c) != REDIS_OK) return;
                for (;;) {
                    void* raw = nullptr;
                    if (redisGetReplyFromReader(c, &raw) != REDIS_OK) return;
                    if (!raw) break;
                    reply_ptr r(static_cast<redisReply*>(raw));
                    on_reply(r.get());
                }
            }
        }
    }

    const endpoint& ep_;
    const std::function<void()> on_reconnect_;
    bool served_ = false;  // the thread's own: a connection was made before
    mutable std::mutex mu_;
    std::unordered_map<std::string, std::unique_ptr<channel_state>> channels_;
    std::vector<std::string> pending_;
    std::unordered_map<std::string, int> inflight_;  // the thread's own: replies still due
    bool stopping_ = false;
    wake_pipe wake_;
    std::thread thread_;
};

}  // namespace rlock::detail
