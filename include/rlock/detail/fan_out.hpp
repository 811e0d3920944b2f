// Parallel fan-out of one command to several independent Redis servers (red_lock's nodes): the
// request is written to every node's connection first, then all replies are read together with
// poll(), so a round costs about the slowest node's round trip, not the sum, and a dead node
// costs its per-node timeout once.
#pragma once

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rlock/detail/client_core.hpp"
#include "rlock/detail/hiredis.hpp"
#include "rlock/detail/script.hpp"
#include "rlock/detail/pool.hpp"

namespace rlock::detail {

/// What one node said.
struct node_result {
    reply_ptr reply;              // set when the node answered (possibly with an error reply)
    std::optional<error> failure; // set when it could not be asked or did not answer in time
    bool abandoned = false;       // no answer yet when `decided` ended the round: not a failure
                                  // of the node, just not waited for
};

/// Sends `make(node index)` (argv of one command) to every node, reads the replies until each
/// answered or `per_node` ran out. `decided(results so far)` may end the round early: the
/// nodes still pending then get `grace` more, and are abandoned (their connections closed,
/// since a reply may still arrive) after that.
inline std::vector<node_result> fan_out(
    const std::vector<client_core*>& nodes, std::string_view lock,
    const std::function<void(std::size_t, script_call&)>& make, std::chrono::milliseconds per_node,
    const std::function<bool(const std::vector<node_result>&)>& decided = {},
    std::chrono::milliseconds grace = std::chrono::milliseconds(2)) {
    using clock = std::chrono::steady_clock;
    const std::size_t n = nodes.size();
    std::vector<node_result> out(n);
    std::vector<std::optional<pool::handle>> conns(n);
    std::vector<script_call> calls(n);
    std::vector<char> pending(n, 0);
    auto deadline = clock::now() + per_node;

    for (std::size_t i = 0; i < n; ++i) {
        try {
            conns[i].emplace(nodes[i]->pool.checkout(lock));
            make(i, calls[i]);
            const connection conn{conns[i]->get(), false, nodes[i]->ep.sharded_pubsub};
            if (calls[i].s) calls[i].use(script_form::sha, conn);  // re-arm: assigned, not built here
            redisContext* c = conn.ctx;
            if (append_command(c, calls[i].argc(), calls[i].argv(), calls[i].lens()) !=
                REDIS_OK) {
                throw make_error(c, nullptr, lock, nodes[i]->ep.name);
            }
            int done = 0;
            while (!done) {
                if (redisBufferWrite(c, &done) != REDIS_OK) throw make_error(c, nullptr, lock, nodes[i]->ep.name);
            }
            pending[i] = 1;
        } catch (const error& e) {
            out[i].failure = e;
            if (conns[i]) conns[i]->discard();
        }
    }

    auto count_pending = [&] {
        std::size_t k = 0;
        for (char p : pending) k += p;
        return k;
    };
    bool early = false;
    while (count_pending() > 0) {
        if (!early && decided && decided(out)) {
            early = true;
            deadline = std::min(deadline, clock::now() + grace);
        }
        const auto now = clock::now();
        if (now >= deadline) break;
        std::vector<pollfd> fds;
        std::vector<std::size_t> who;
        for (std::size_t i = 0; i < n; ++i) {
            if (!pending[i]) continue;
            fds.push_back({conns[i]->get()->fd, POLLIN, 0});
            who.push_back(i);
        }
        const auto wait_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
        const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
        if (ready < 0 && errno != EINTR) break;
        for (std::size_t k = 0; k < fds.size(); ++k) {
            if (!fds[k].revents) continue;
            const std::size_t i = who[k];
            redisContext* c = conns[i]->get();
            void* raw = nullptr;
            if (redisBufferRead(c) != REDIS_OK || redisGetReplyFromReader(c, &raw) != REDIS_OK) {
                out[i].failure = make_error(c, nullptr, lock, nodes[i]->ep.name);
                pending[i] = 0;
                conns[i]->discard();
                continue;
            }
            if (!raw) continue;  // partial reply: wait for the rest
            out[i].reply.reset(static_cast<redisReply*>(raw));
            pending[i] = 0;
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        if (!pending[i]) continue;
        out[i].abandoned = early;
        out[i].failure = error(errc::timeout, lock, nodes[i]->ep.name,
                               early ? std::string("not waited for: the round was decided without it")
                                     : "no reply within the per-node timeout (" +
                                           std::to_string(per_node.count()) + " ms)");
        conns[i]->discard();
    }
    // A script the node had forgotten (SCRIPT FLUSH, restart): send it with its body, once.
    for (std::size_t i = 0; i < n; ++i) {
        if (!reply_is_error(out[i].reply.get(), "NOSCRIPT") || !calls[i].s || !conns[i] ||
            !conns[i]->get()) {
            continue;
        }
        try {
            const connection conn{conns[i]->get(), false, nodes[i]->ep.sharded_pubsub};
            out[i].reply = run_script(conn, calls[i], lock, nodes[i]->ep.name);
        } catch (const error& e) {
            out[i].reply.reset();
            out[i].failure = e;
        }
    }
    return out;
}

}  // namespace rlock::detail
