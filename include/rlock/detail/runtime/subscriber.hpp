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
//
// Redis Cluster with sharded pub/sub (endpoint::sharded_pubsub, Redis 7+): the same thread owns
// one connection per master that serves a channel somebody waits on, and SSUBSCRIBEs each
// channel on the master of its slot (the slot map's; a MOVED reply corrects it). When a slot
// moves away, its old master tells with an `sunsubscribe` message of its own; the channel is
// then subscribed again where a fresh slot map says, and its waiters retry once (a message may
// have gone by meanwhile). A broken shard connection does the same for all its channels.
#pragma once

#include <poll.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/wake_pipe.hpp"
#include "rlock/detail/runtime/event_sink.hpp"
#include "rlock/detail/runtime/loss_watch.hpp"

namespace rlock::detail {

class subscriber {
    using clock = std::chrono::steady_clock;

    struct channel_state {
        std::size_t waiters = 0;
        std::uint64_t generation = 0;
        bool active = false;  // the server confirmed SUBSCRIBE, with no UNSUBSCRIBE in flight
        // The server's refusal of the last SUBSCRIBE (an ACL that does not grant the channel):
        // the waiters cannot hear a release, and fail with it (subscription::throw_if_refused).
        std::string refused;
        std::condition_variable cv;
        // The asynchronous waiters' subscriptions (subscription::on_change), called at each
        // bump under mu_.
        std::vector<const std::function<void()>*> listeners;
        // The blocking waiters that take turns (subscription::take_turns), in arrival order,
        // each with its class (a lock kind: a read_write_lock's readers and writers share the
        // channel but not their turns): a message wakes only the first of each class.
        // `consumed`, per class: the generation a waiter that took the lock had seen when it
        // left, so that the next one waits for news after it.
        //
        // A class whose waiters each need a share of what a message announces (a semaphore's
        // waiters, each for its permits: `need` > 0) wakes, at a message that carries a count
        // (`budget`: the free permits), the waiters in arrival order whose needs fit in it,
        // first fit, not only the first: a release of n permits wakes at most n waiters, not
        // all of them. A reconnect, a confirmed subscription or a message without a count
        // wakes them all (budget -1).
        struct turn {
            const void* waiter;
            const void* turn_class;
            long long need;  // 0: the first of its class only (a lock's waiters)
        };
        std::deque<turn> turns;
        long long budget = -1;
        std::vector<std::pair<const void*, std::uint64_t>> consumed;
    };

    // A message or a reconnect: the channel's waiters retry. `budget`: the count a message
    // carried (-1: none; every budgeted waiter may try).
    static void bump_locked(channel_state& ch, long long budget = -1);

public:
    /// Called with the keys of one invalidation, or with none and `flushed` (FLUSHALL,
    /// FLUSHDB: every key), on the subscriber's thread.
    using invalidated = std::function<void(const std::vector<std::string>& keys, bool flushed)>;

    /// `on_reconnect` is called on the subscriber's thread each time its connection is made,
    /// the first time included (the server may have restarted and lost data meanwhile).
    /// With `route` (not in a Redis Cluster), the connection also listens for the server's
    /// invalidations (loss_watch.hpp): `route` says where they go, `on_invalidated` hears them.
    explicit subscriber(const endpoint& ep, std::function<void()> on_reconnect = {},
                        tracking_route* route = nullptr, invalidated on_invalidated = {});
    subscriber(const subscriber&) = delete;
    subscriber& operator=(const subscriber&) = delete;

    ~subscriber() { stop(); }

    void stop();

    /// After a master switch (endpoint::epoch moved on): drop the connection and make a new
    /// one, to the new master, subscribed to every channel again.
    void master_switched() noexcept { poke(); }

    /// Wakes `channel`'s waiters as a message without a count would, with nothing received:
    /// news told within the process (a fair_lock hold passed to a waiter, queue_pass.hpp). A
    /// channel nobody waits on is left alone (a waiter looks before it waits).
    void notify_local(const std::string& channel);

    /// True once stop() has begun: waiters must not wait for messages any more.
    bool stopped() const {
        std::lock_guard<std::mutex> g(mu_);
        return stopping_;
    }

    /// Interest in one channel, held by a waiter for as long as it waits.
    class subscription {
    public:
        subscription(subscriber& s, std::string channel) : subscription(s, std::move(channel), {}) {}
        /// An asynchronous waiter's: `on_change` is called (on the subscriber's thread, under
        /// its lock, so it must only hand the news on) each time the generation changes, until
        /// the subscription is destroyed.
        subscription(subscriber& s, std::string channel, std::function<void()> on_change);
        subscription(const subscription&) = delete;
        subscription& operator=(const subscription&) = delete;
        ~subscription();

        /// Waits until the server has confirmed the subscription (or refused it), or `deadline`.
        bool wait_active(clock::time_point deadline);
        /// Throws auth_failed, naming `lock` and `server`, when the server refused to subscribe
        /// this client to the channel (an ACL that does not grant it): a waiter would not hear
        /// the lock's release, and could only poll. The client's other channels are unaffected,
        /// and a later waiter subscribes afresh (an ACL fixed meanwhile is seen).
        void throw_if_refused(std::string_view lock, std::string_view server) const;
        bool active() const {
            std::lock_guard<std::mutex> g(s_.mu_);
            return ch_->active;
        }
        std::uint64_t generation() const {
            std::lock_guard<std::mutex> g(s_.mu_);
            return ch_->generation;
        }
        /// Makes this a waiter that takes turns with the client's other blocking waiters on
        /// the channel: wait_turn() returns for news only to the first of them, so one message
        /// makes one of this client's waiters try, not all of them.
        /// `need` > 0: a budgeted waiter (channel_state::turn) that needs that much of a
        /// message's count.
        void take_turns(const void* turn_class, long long need = 0);
        /// As wait(), for a waiter that takes turns: news wakes it only while it is the first,
        /// and only news after the last waiter that left with the lock (a message it was
        /// handed by its predecessor's success is not one for it).
        bool wait_turn(std::uint64_t seen, clock::time_point deadline);
        /// Leaves the turns (the destructor does too). `took`: it leaves with the lock, so the
        /// news so far was its, and the next waiter waits for more; a shared kind's waiter (a
        /// reader) passes false, so that the next reader tries at once.
        ///
        /// A budgeted waiter (take_turns with a need) leaving here has succeeded: its need
        /// comes off the message's count, so that the next is woken only for what is left.
        void leave_turns(bool took);

        /// Waits until a message (or a reconnect) changed the generation from `seen`, or
        /// `deadline`. Returns whether it changed.
        bool wait(std::uint64_t seen, clock::time_point deadline);

    private:
        subscriber& s_;
        std::string channel_;
        // First of its class, with news after the last of its class that left with the lock.
        bool my_turn_locked() const;
        void leave_turns_locked(bool took);

        std::function<void()> on_change_;
        channel_state* ch_;
        bool queued_ = false;
        const void* class_ = nullptr;
        long long need_ = 0;
    };

private:
    void poke() noexcept { wake_.poke(); }

    // Commands sent on a pub/sub connection and not answered yet, oldest first: each a channel
    // and whether it subscribes (SUBSCRIBE / SSUBSCRIBE) or not (the UNSUBSCRIBE forms).
    using sent_list = std::deque<std::pair<std::string, bool>>;

    // Takes the command an answer confirms out of `sent`; false when none was sent (a
    // server's own unsubscribe, say).
    static bool take_sent(sent_list& sent, const std::string& name, bool sub);
    // The count a message carries (a semaphore's free permits), or -1 when it is not a
    // positive whole number.
    static long long message_count(std::string_view text);

    // Whether a command on `name` still waits for its answer.
    static bool awaiting(const sent_list& sent, const std::string& name);

    // Bumps every channel's generation so that its waiters retry now: used when the connection
    // was lost or re-made, since messages may have gone by unseen.
    void wake_all_locked();

    void run();

    // Asks the connection's CLIENT ID, turns on its own tracking of flushes (flush_watch_prefix)
    // and queues its SUBSCRIBE to the invalidations' channel (route_ names the id once the
    // server confirms it). False when the connection broke; a server that refuses (an ACL, a
    // server before Redis 6) leaves detection off, told once.
    bool listen_for_invalidations(redisContext* c);

    // The broadcast prefix of the connection's own tracking (listen_for_invalidations): no key
    // starts with it, so the server tells the connection of flushes alone.
    static constexpr const char* flush_watch_prefix = "\x01rlock:flush-watch\x01";

    // Tells the client's listener, once, that losses are found by the watchdog alone.
    void detection_off(const std::string& why) { route_->tell_off(events_, ep_.name, why); }

    // An invalidation (loss_watch.hpp): the keys a message names, or a flush (a null array).
    void on_invalidation(const redisReply* payload);

    // The queued channels, each with whether it is wanted (subscribe) or not any more
    // (unsubscribe; its state is dropped).
    std::vector<std::pair<std::string, bool>> take_pending();

    // Sends the queued SUBSCRIBE / UNSUBSCRIBE commands. False on an I/O error.
    bool send_pending(redisContext* c);

    /// The server confirmed a subscription to `name`: listening from now on. A message
    /// published before this point (while the connection was being re-made) is lost, so the
    /// waiters retry once now.
    void listening(const std::string& name);

    /// The server refused a SUBSCRIBE to `name` with `why`: its waiters are told.
    void refused(const std::string& name, std::string_view why);

    void on_reply(const redisReply* r);

    // Serves one connection until it breaks, its master is replaced (Sentinel) or stop() is
    // called.
    void serve(redisContext* c, std::uint64_t epoch);

    // ---- Redis Cluster with sharded pub/sub ----

    // One master's connection; all of it the thread's own.
    struct shard {
        server_address at;
        context_ptr c;
        sent_list sent;  // SSUBSCRIBE (true) / SUNSUBSCRIBE due
        bool unwritten = false;
    };

    struct sharded_state {
        std::vector<std::unique_ptr<shard>> shards;
        std::unordered_map<std::string, shard*> where;  // channel -> the shard it is subscribed on
        std::vector<std::string> retry;                 // to subscribe again at retry_at
        clock::time_point retry_at{};
        std::chrono::milliseconds backoff{0};
        clock::time_point last_load{};
    };

    static bool append(shard& s, const char* cmd, const std::string& name);

    // `names` lost their subscription (slot moved, connection broke): subscribe them again (per
    // the slot map, loaded again first) and let their waiters retry once now.
    void resubscribe_locked(const std::vector<std::string>& names);

    void try_later(sharded_state& st, std::string name);

    // The connection broke (its master may have restarted or failed over).
    void drop_shard(sharded_state& st, shard* s);

    // SSUBSCRIBE `name` on its slot's master. False: not now (no master known, or it cannot be
    // reached), to be tried again later.
    bool subscribe_sharded(sharded_state& st, const std::string& name);

    void on_sharded_reply(sharded_state& st, shard* s, const redisReply* r);

    void run_sharded();

    const endpoint& ep_;
    const std::function<void()> on_reconnect_;
    tracking_route* const route_;  // null: no invalidations (a cluster, or not asked for)
    const invalidated on_invalidated_;
    const event_sink events_;
    long long id_asked_ = 0;  // the thread's own: this connection's CLIENT ID
    mutable std::mutex mu_;
    std::unordered_map<std::string, std::unique_ptr<channel_state>> channels_;
    std::vector<std::string> pending_;
    // The thread's own: the SUBSCRIBE (true) and UNSUBSCRIBE commands sent and not answered
    // yet, oldest first (an error reply answers the oldest).
    sent_list sent_;
    bool stopping_ = false;
    wake_pipe wake_;
    std::thread thread_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void subscriber::bump_locked(channel_state& ch, long long budget) {
    ++ch.generation;
    ch.budget = budget;
    ch.cv.notify_all();
    for (const std::function<void()>* f : ch.listeners) (*f)();
}

RLOCK_DECL subscriber::subscriber(const endpoint& ep, std::function<void()> on_reconnect,
                                  tracking_route* route, invalidated on_invalidated)
    : ep_(ep),
      on_reconnect_(std::move(on_reconnect)),
      route_(ep.slots ? nullptr : route),
      on_invalidated_(std::move(on_invalidated)),
      events_(ep.options.listener),
      wake_(ep.name) {
    thread_ = std::thread([this] {
        if (ep_.slots && ep_.sharded_pubsub) {
            run_sharded();
        } else {
            run();
        }
    });
}

RLOCK_DECL void subscriber::notify_local(const std::string& channel) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = channels_.find(channel);
    if (it != channels_.end()) bump_locked(*it->second);
}

RLOCK_DECL void subscriber::stop() {
    stop_polling_thread(mu_, stopping_, wake_, thread_, [&] {
        for (auto& [name, ch] : channels_) ch->cv.notify_all();
    });
}

RLOCK_DECL subscriber::subscription::subscription(subscriber& s, std::string channel,
                                                  std::function<void()> on_change)
    : s_(s), channel_(std::move(channel)), on_change_(std::move(on_change)) {
    std::lock_guard<std::mutex> g(s_.mu_);
    auto& slot = s_.channels_[channel_];
    if (!slot) slot = std::make_unique<channel_state>();
    ch_ = slot.get();
    if (on_change_) ch_->listeners.push_back(&on_change_);
    if (ch_->waiters++ == 0) {
        ch_->active = false;
        ch_->refused.clear();
        s_.pending_.push_back(channel_);
        s_.poke();
    }
}

RLOCK_DECL subscriber::subscription::~subscription() {
    std::lock_guard<std::mutex> g(s_.mu_);
    leave_turns_locked(false);
    if (on_change_) {
        auto& l = ch_->listeners;
        l.erase(std::find(l.begin(), l.end(), &on_change_));
    }
    if (--ch_->waiters == 0) {
        ch_->active = false;
        s_.pending_.push_back(channel_);
        s_.poke();
    }
}

RLOCK_DECL bool subscriber::subscription::wait_active(clock::time_point deadline) {
    std::unique_lock<std::mutex> g(s_.mu_);
    ch_->cv.wait_until(g, deadline,
                       [&] { return ch_->active || !ch_->refused.empty() || s_.stopping_; });
    return ch_->active;
}

RLOCK_DECL void subscriber::subscription::throw_if_refused(std::string_view lock,
                                                           std::string_view server) const {
    std::unique_lock<std::mutex> g(s_.mu_);
    if (ch_->refused.empty()) return;
    std::string why =
        "the server refused to subscribe this client to " + channel_ +
        ", where the lock's release is announced, so it cannot wait for the lock: " + ch_->refused;
    g.unlock();
    throw error(errc::auth_failed, lock, server, why);
}

RLOCK_DECL void subscriber::subscription::take_turns(const void* turn_class, long long need) {
    std::lock_guard<std::mutex> g(s_.mu_);
    if (queued_) return;
    ch_->turns.push_back(channel_state::turn{this, turn_class, need});
    class_ = turn_class;
    need_ = need;
    queued_ = true;
}

RLOCK_DECL bool subscriber::subscription::wait_turn(std::uint64_t seen,
                                                    clock::time_point deadline) {
    std::unique_lock<std::mutex> g(s_.mu_);
    return ch_->cv.wait_until(g, deadline, [&] {
        return s_.stopping_ || !ch_->refused.empty() ||
               (ch_->generation != seen && (!queued_ || my_turn_locked()));
    });
}

RLOCK_DECL void subscriber::subscription::leave_turns(bool took) {
    std::lock_guard<std::mutex> g(s_.mu_);
    if (queued_ && need_ > 0 && ch_->budget > 0) ch_->budget = std::max(0LL, ch_->budget - need_);
    leave_turns_locked(took);
}

RLOCK_DECL bool subscriber::subscription::wait(std::uint64_t seen, clock::time_point deadline) {
    std::unique_lock<std::mutex> g(s_.mu_);
    return ch_->cv.wait_until(g, deadline, [&] {
        return ch_->generation != seen || !ch_->refused.empty() || s_.stopping_;
    });
}

RLOCK_DECL bool subscriber::subscription::my_turn_locked() const {
    for (const auto& [turn_class, generation] : ch_->consumed) {
        if (turn_class == class_ && ch_->generation <= generation) return false;
    }
    long long left = ch_->budget;
    for (const channel_state::turn& t : ch_->turns) {
        if (t.turn_class != class_) continue;
        if (t.need == 0) return t.waiter == this;
        const bool fits = left < 0 || t.need <= left;
        if (t.waiter == this) return fits;
        if (fits && left >= 0) left -= t.need;
    }
    return false;
}

RLOCK_DECL void subscriber::subscription::leave_turns_locked(bool took) {
    if (!queued_) return;
    queued_ = false;
    auto& t = ch_->turns;
    t.erase(std::find_if(t.begin(), t.end(),
                         [&](const channel_state::turn& e) { return e.waiter == this; }));
    if (took) {
        auto& c = ch_->consumed;
        auto it =
            std::find_if(c.begin(), c.end(), [&](const auto& e) { return e.first == class_; });
        if (it == c.end()) {
            c.emplace_back(class_, ch_->generation);
        } else {
            it->second = ch_->generation;
        }
    }
    ch_->cv.notify_all();  // the next one may be first now
}

RLOCK_DECL bool subscriber::take_sent(sent_list& sent, const std::string& name, bool sub) {
    auto it = std::find(sent.begin(), sent.end(), std::make_pair(name, sub));
    if (it == sent.end()) return false;
    sent.erase(it);
    return true;
}

RLOCK_DECL long long subscriber::message_count(std::string_view text) {
    long long n = 0;
    const auto [end, failed] = std::from_chars(text.data(), text.data() + text.size(), n);
    return failed == std::errc() && end == text.data() + text.size() && n > 0 ? n : -1;
}

RLOCK_DECL bool subscriber::awaiting(const sent_list& sent, const std::string& name) {
    return std::any_of(sent.begin(), sent.end(), [&](const auto& c) { return c.first == name; });
}

RLOCK_DECL void subscriber::wake_all_locked() {
    for (auto& [name, ch] : channels_) {
        ch->active = false;
        bump_locked(*ch);
    }
}

RLOCK_DECL void subscriber::run() {
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
        // Every connection, the first included: the server may have restarted, losing the
        // holds taken since the client started, before this thread first connected (it
        // starts with the client, and a busy machine may run it late).
        if (on_reconnect_) on_reconnect_();
        sent_.clear();
        if (route_ && !listen_for_invalidations(c.get())) continue;  // broken: again
        {
            std::lock_guard<std::mutex> g(mu_);
            pending_.clear();
            for (auto& [name, ch] : channels_) pending_.push_back(name);
            wake_all_locked();
        }
        serve(c.get(), epoch);
        if (route_ && route_->client_id.exchange(0) != 0) ++route_->epoch;
        std::lock_guard<std::mutex> g(mu_);
        wake_all_locked();
    }
}

RLOCK_DECL bool subscriber::listen_for_invalidations(redisContext* c) {
    reply_ptr id = command(c, {"CLIENT", "ID"});
    if (!id) return false;
    if (id->type != REDIS_REPLY_INTEGER) {
        detection_off(std::string("CLIENT ID was refused: ") + std::string(reply_text(id.get())));
        return true;
    }
    id_asked_ = id->integer;
    // Flushes: tracking of its own, in broadcast mode for a prefix no key has, makes the server
    // tell this connection of every FLUSHALL and FLUSHDB (it tells every tracking client of a
    // flush) and of nothing else. A flush publishes nothing, and waiters behind a flushed
    // holder, count or latch would otherwise sleep to their deadline (on_invalidation wakes
    // them). A server that refuses it (an ACL, before Redis 6) goes without.
    reply_ptr own = command(c, {"CLIENT", "TRACKING", "on", "REDIRECT", std::to_string(id_asked_),
                                "BCAST", "PREFIX", flush_watch_prefix});
    if (!own) return false;
    const char* argv[2] = {"SUBSCRIBE", tracking_route::channel};
    const std::size_t lens[2] = {9, std::char_traits<char>::length(tracking_route::channel)};
    if (append_command(c, 2, argv, lens) != REDIS_OK) return false;
    sent_.emplace_back(tracking_route::channel, true);
    return true;
}

RLOCK_DECL void subscriber::on_invalidation(const redisReply* payload) {
    if (payload->type != REDIS_REPLY_ARRAY) {
        // Every key is gone (FLUSHALL, FLUSHDB) and nothing was published: every waiter tries
        // again now (a lock is free, a latch open, a semaphore's count gone).
        std::lock_guard<std::mutex> g(mu_);
        wake_all_locked();
    }
    if (!on_invalidated_) return;
    std::vector<std::string> keys;
    if (payload->type == REDIS_REPLY_ARRAY) {
        keys.reserve(payload->elements);
        for (std::size_t i = 0; i < payload->elements; ++i)
            keys.emplace_back(reply_text(payload->element[i]));
    }
    on_invalidated_(keys, payload->type != REDIS_REPLY_ARRAY);
}

RLOCK_DECL std::vector<std::pair<std::string, bool>> subscriber::take_pending() {
    std::vector<std::pair<std::string, bool>> ops;  // channel, subscribe?
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
    return ops;
}

RLOCK_DECL bool subscriber::send_pending(redisContext* c) {
    std::vector<std::pair<std::string, bool>> ops = take_pending();
    for (auto& [name, sub] : ops) {
        const char* argv[2] = {sub ? "SUBSCRIBE" : "UNSUBSCRIBE", name.c_str()};
        const std::size_t lens[2] = {sub ? 9u : 11u, name.size()};
        if (append_command(c, 2, argv, lens) != REDIS_OK) return false;
        sent_.emplace_back(name, sub);
    }
    int done = 0;
    while (!done) {
        if (redisBufferWrite(c, &done) != REDIS_OK) return false;
    }
    return true;
}

RLOCK_DECL void subscriber::listening(const std::string& name) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = channels_.find(name);
    if (it != channels_.end() && it->second->waiters > 0) {
        it->second->active = true;
        it->second->refused.clear();
        bump_locked(*it->second);
    }
}

RLOCK_DECL void subscriber::refused(const std::string& name, std::string_view why) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = channels_.find(name);
    if (it == channels_.end() || it->second->waiters == 0) return;
    it->second->active = false;
    it->second->refused = std::string(why);
    bump_locked(*it->second);
}

RLOCK_DECL void subscriber::on_reply(const redisReply* r) {
    if (r && r->type == REDIS_REPLY_ERROR) {
        // The answer to the oldest command sent: a SUBSCRIBE refused (an ACL's NOPERM).
        if (sent_.empty()) return;
        auto [name, sub] = std::move(sent_.front());
        sent_.pop_front();
        if (route_ && name == tracking_route::channel) {
            detection_off("SUBSCRIBE " + name + " was refused: " + std::string(reply_text(r)));
            return;
        }
        if (sub && !awaiting(sent_, name)) refused(name, reply_text(r));
        return;
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
    const std::string_view kind = reply_text(r->element[0]);
    if (route_ && reply_text(r->element[1]) == tracking_route::channel) {
        if (kind == "message") {
            on_invalidation(r->element[2]);
        } else if (kind == "subscribe" && take_sent(sent_, tracking_route::channel, true)) {
            // Listening: the watchdog may redirect its connection's invalidations here (it
            // is woken to; after a break it renews every hold, whose keys may have changed
            // unseen).
            route_->client_id = id_asked_;
            ++route_->epoch;
            if (on_invalidated_) on_invalidated_({}, false);
        }
        return;
    }
    const std::string name(reply_text(r->element[1]));
    if (kind == "subscribe" || kind == "unsubscribe") {
        (void)take_sent(sent_, name, kind == "subscribe");
        if (kind != "subscribe" || awaiting(sent_, name)) return;
        listening(name);
    } else if (kind == "message") {
        std::lock_guard<std::mutex> g(mu_);
        auto it = channels_.find(name);
        if (it != channels_.end())
            bump_locked(*it->second, message_count(reply_text(r->element[2])));
    }
}

RLOCK_DECL void subscriber::serve(redisContext* c, std::uint64_t epoch) {
    for (;;) {
        if (stopped() || ep_.epoch.load() != epoch) return;
        if (!send_pending(c)) return;
        bool readable = false, poked = false;
        if (!wake_.wait_with(c->fd, readable, poked)) return;
        if (poked) wake_.drain();
        if (readable && !read_replies(c, [&](const redisReply* r) { on_reply(r); })) return;
    }
}

RLOCK_DECL bool subscriber::append(shard& s, const char* cmd, const std::string& name) {
    const char* argv[2] = {cmd, name.c_str()};
    const std::size_t lens[2] = {std::char_traits<char>::length(cmd), name.size()};
    if (append_command(s.c.get(), 2, argv, lens) != REDIS_OK) return false;
    s.sent.emplace_back(name, cmd[1] == 'S');  // SSUBSCRIBE, not SUNSUBSCRIBE
    s.unwritten = true;
    return true;
}

RLOCK_DECL void subscriber::resubscribe_locked(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
        auto it = channels_.find(name);
        if (it == channels_.end()) continue;
        it->second->active = false;
        bump_locked(*it->second);
        if (it->second->waiters > 0) pending_.push_back(name);
    }
}

RLOCK_DECL void subscriber::try_later(sharded_state& st, std::string name) {
    if (st.retry.empty()) {
        st.backoff = std::clamp(st.backoff * 2, std::chrono::milliseconds(10),
                                std::chrono::milliseconds(1000));
        st.retry_at = clock::now() + st.backoff;
    }
    st.retry.push_back(std::move(name));
}

RLOCK_DECL void subscriber::drop_shard(sharded_state& st, shard* s) {
    std::vector<std::string> lost;
    for (auto it = st.where.begin(); it != st.where.end();) {
        if (it->second == s) {
            lost.push_back(it->first);
            it = st.where.erase(it);
        } else {
            ++it;
        }
    }
    ep_.slots->mark_stale();
    {
        std::lock_guard<std::mutex> g(mu_);
        resubscribe_locked(lost);
    }
    st.shards.erase(std::find_if(st.shards.begin(), st.shards.end(),
                                 [&](const std::unique_ptr<shard>& p) { return p.get() == s; }));
    if (on_reconnect_) on_reconnect_();
}

RLOCK_DECL bool subscriber::subscribe_sharded(sharded_state& st, const std::string& name) {
    const int slot = key_slot(name);
    std::optional<server_address> m = ep_.slots->master_of(slot);
    if ((!m || ep_.slots->stale()) &&
        clock::now() - st.last_load >= std::chrono::milliseconds(25)) {
        st.last_load = clock::now();
        try {
            load_slots(ep_);
        } catch (const error&) {
        }
        m = ep_.slots->master_of(slot);
    }
    if (!m) return false;
    shard* to = nullptr;
    for (auto& p : st.shards) {
        if (p->at.port == m->port && p->at.host == m->host) to = p.get();
    }
    if (!to) {
        context_ptr c;
        try {
            c = connect_node(ep_, *m);
        } catch (const error&) {
            ep_.slots->mark_stale();
            return false;
        }
        auto p = std::make_unique<shard>();
        p->at = *m;
        p->c = std::move(c);
        to = st.shards.emplace_back(std::move(p)).get();
    }
    auto w = st.where.find(name);
    if (w != st.where.end() && w->second != to) (void)append(*w->second, "SUNSUBSCRIBE", name);
    if (!append(*to, "SSUBSCRIBE", name)) return false;
    st.where[name] = to;
    return true;
}

RLOCK_DECL void subscriber::on_sharded_reply(sharded_state& st, shard* s, const redisReply* r) {
    if (!r) return;
    if (r->type == REDIS_REPLY_ERROR) {
        // The oldest command's answer: MOVED (the map was wrong), TRYAGAIN, CLUSTERDOWN...
        if (s->sent.empty()) return;
        auto [name, sub] = std::move(s->sent.front());
        s->sent.pop_front();
        auto w = st.where.find(name);
        if (!sub || w == st.where.end() || w->second != s) return;
        st.where.erase(w);
        if (reply_text(r).substr(0, 6) == "NOPERM") {
            refused(name, reply_text(r));
            return;
        }
        const redirect d = parse_redirect(reply_text(r));
        if (d.kind == redirect::moved) {
            ep_.slots->moved(d.slot, server_address{d.host.empty() ? s->at.host : d.host, d.port});
        } else {
            ep_.slots->mark_stale();
        }
        try_later(st, std::move(name));
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
    const std::string_view kind = reply_text(r->element[0]);
    const std::string name(reply_text(r->element[1]));
    if (kind == "ssubscribe") {
        (void)take_sent(s->sent, name, true);
        auto w = st.where.find(name);
        if (w == st.where.end() || w->second != s) return;
        st.backoff = std::chrono::milliseconds(0);
        listening(name);
    } else if (kind == "sunsubscribe") {
        if (take_sent(s->sent, name, false)) return;  // the answer to ours
        // The server's own: the channel's slot is not this master's any more.
        auto w = st.where.find(name);
        if (w == st.where.end() || w->second != s) return;
        st.where.erase(w);
        ep_.slots->mark_stale();
        std::lock_guard<std::mutex> g(mu_);
        resubscribe_locked({name});
    } else if (kind == "smessage") {
        std::lock_guard<std::mutex> g(mu_);
        auto it = channels_.find(name);
        if (it != channels_.end())
            bump_locked(*it->second, message_count(reply_text(r->element[2])));
    }
}

RLOCK_DECL void subscriber::run_sharded() {
    sharded_state st;
    std::vector<pollfd> fds;
    std::vector<shard*> broken;
    while (!stopped()) {
        if (!st.retry.empty() && clock::now() >= st.retry_at) {
            std::lock_guard<std::mutex> g(mu_);
            for (std::string& name : st.retry) pending_.push_back(std::move(name));
            st.retry.clear();
        }
        for (auto& [name, want] : take_pending()) {
            if (want) {
                if (!subscribe_sharded(st, name)) try_later(st, name);
                continue;
            }
            auto w = st.where.find(name);
            if (w == st.where.end()) continue;
            (void)append(*w->second, "SUNSUBSCRIBE", name);
            st.where.erase(w);
        }
        broken.clear();
        for (auto& p : st.shards) {
            if (!p->unwritten) continue;
            p->unwritten = false;
            int done = 0;
            while (!done) {
                if (redisBufferWrite(p->c.get(), &done) != REDIS_OK) {
                    broken.push_back(p.get());
                    break;
                }
            }
        }
        for (shard* b : broken) drop_shard(st, b);
        if (!broken.empty()) continue;

        fds.assign(1, pollfd{wake_.fd(), POLLIN, 0});
        for (auto& p : st.shards) fds.push_back({p->c->fd, POLLIN, 0});
        int timeout = -1;
        if (!st.retry.empty()) {
            const auto left =
                std::chrono::ceil<std::chrono::milliseconds>(st.retry_at - clock::now());
            timeout = static_cast<int>(std::max<long long>(0, left.count()));
        }
        if (::poll(fds.data(), fds.size(), timeout) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if (fds[0].revents) wake_.drain();
        const std::vector<shard*> now = [&] {
            std::vector<shard*> v;
            for (auto& p : st.shards) v.push_back(p.get());
            return v;
        }();
        for (std::size_t i = 0; i < now.size(); ++i) {
            if (!fds[i + 1].revents) continue;
            shard* p = now[i];
            if (!read_replies(p->c.get(),
                              [&](const redisReply* r) { on_sharded_reply(st, p, r); })) {
                broken.push_back(p);
            }
        }
        for (shard* b : broken) drop_shard(st, b);
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
