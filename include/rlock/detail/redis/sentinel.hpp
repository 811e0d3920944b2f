// Sentinel: one thread per client that listens to the sentinels' `+switch-master` and, when the
// master of this client's name moves, bumps the endpoint's epoch (so the pool and the watchdog
// drop their connections to the old master) and tells the client (so the subscriber moves too).
//
// New connections find the master by themselves (detail::connect: the address of the last
// switch first, then the sentinels); this thread makes the switch prompt for connections that
// already exist, and remembers where the master went (endpoint::master_switched) for sentinels
// that have not heard of it yet. A switch it missed while it had no sentinel is found on
// reconnecting: it compares the master named then with the last one it knew. A READONLY reply
// or a broken connection also replaces a connection, so a missed message delays the move but
// does not stop it.
#pragma once

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/wake_pipe.hpp"

namespace rlock::detail {

class sentinel_watch {
public:
    sentinel_watch(endpoint& ep, std::function<void()> switched)
        : ep_(ep), switched_(std::move(switched)), wake_(ep.name) {
        thread_ = std::thread([this] { run(); });
    }
    sentinel_watch(const sentinel_watch&) = delete;
    sentinel_watch& operator=(const sentinel_watch&) = delete;
    ~sentinel_watch() { stop(); }

    void stop() {
        stop_polling_thread(mu_, stopping_, wake_, thread_, [] {});
    }

private:
    bool stopped() const {
        std::lock_guard<std::mutex> g(mu_);
        return stopping_;
    }

    // A sentinel named `master` on (re)connecting. If it is not the one last known, every
    // connection is made again; they ask for the master themselves. The first time, that is
    // when a failover may have come between the client's first connections and now: when every
    // connection opened so far went to `master`, none is made again (each new one would ask a
    // sentinel, and with the sentinels gone a working client would lose its connections to a
    // working master). Not remembered as a switch: a sentinel that did not run the failover
    // may still name the old master.
    void named(const std::string& master) {
        if (master == known_) return;
        const bool first = known_.empty();
        known_ = master;
        if (first && ep_.opened_all_to() == master) return;
        ++ep_.epoch;
        switched_();
    }

    // A +switch-master of this client's master to host:port.
    void switched(const std::string& host, int port);

    // Waits on the wake-up pipe for `ms` (cut short by stop()).
    void pause(std::chrono::milliseconds ms);

    void run();

    // Reads `+switch-master` messages until the connection breaks or stop() is called. The
    // message is "<master name> <old ip> <old port> <new ip> <new port>".
    void serve(redisContext* c);

    endpoint& ep_;
    std::function<void()> switched_;
    std::string known_;  // the master address last named or switched to, "host:port"
    mutable std::mutex mu_;
    bool stopping_ = false;
    wake_pipe wake_;
    std::thread thread_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void sentinel_watch::switched(const std::string& host, int port) {
    known_ = address_name(host, port);
    ep_.master_switched({host, port});
    switched_();
}

RLOCK_DECL void sentinel_watch::pause(std::chrono::milliseconds ms) {
    pollfd p{wake_.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(ms.count()));
}

RLOCK_DECL void sentinel_watch::run() {
    const client_options& o = ep_.options;
    std::size_t at = 0;
    std::chrono::milliseconds backoff{0};
    while (!stopped()) {
        const server_address& s = o.sentinels[at % o.sentinels.size()];
        const std::string where = "sentinel " + address_name(s.host, s.port);
        context_ptr c;
        try {
            c = open_sentinel(o, s, where);
            reply_ptr r = command(c.get(), {"SUBSCRIBE", "+switch-master"});
            if (!r || r->type != REDIS_REPLY_ARRAY) throw make_error(c.get(), r.get(), "", where);
            // Subscribed first, then asked (on a second connection): no switch falls between.
            if (const auto master = ask_master(open_sentinel(o, s, where).get(), o, where)) {
                named(address_name(master->host, master->port));
            }
        } catch (const error&) {
            ++at;  // the next sentinel
            backoff = std::clamp(backoff * 2, std::chrono::milliseconds(50),
                                 std::chrono::milliseconds(1000));
            pause(backoff);
            continue;
        }
        backoff = std::chrono::milliseconds(0);
        serve(c.get());
        ++at;
    }
}

RLOCK_DECL void sentinel_watch::serve(redisContext* c) {
    const std::string& name = ep_.options.sentinel_master;
    for (;;) {
        if (stopped()) return;
        bool readable = false, poked = false;
        if (!wake_.wait_with(c->fd, readable, poked)) return;
        if (poked) return;  // stop()
        if (!readable) continue;
        const bool ok = read_replies(c, [&](const redisReply* r) {
            if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
                reply_text(r->element[0]) != "message") {
                return;
            }
            const std::string text(reply_text(r->element[2]));
            std::string parts[5];
            std::size_t n = 0, from = 0;
            while (n < 5 && from <= text.size()) {
                const std::size_t space = std::min(text.find(' ', from), text.size());
                parts[n++] = text.substr(from, space - from);
                from = space + 1;
            }
            if (n == 5 && parts[0] == name) switched(parts[3], std::atoi(parts[4].c_str()));
        });
        if (!ok) return;
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
