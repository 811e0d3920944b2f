// Parallel fan-out of one command to several independent Redis servers (red_lock's nodes): the
// request is written to every node's connection first (connections that must be opened are
// opened on threads of their own meanwhile), then all replies are read together with poll(),
// so a round costs about the slowest node's round trip, not the sum, and a node that hangs
// costs the round's deadline once.
#pragma once

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/detail/redis/pool.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/redis/wake_pipe.hpp"
#include "rlock/detail/runtime/client_core.hpp"

namespace rlock::detail {

/// What one node said.
struct node_result {
    reply_ptr reply;              // set when the node answered (possibly with an error reply)
    std::optional<error> failure; // set when it could not be asked or did not answer in time
    bool abandoned = false;       // no answer yet when `decided` ended the round: not a failure
                                  // of the node, just not waited for
    bool unanswered = false;      // sent but not answered (abandoned, or out of time): the
                                  // node may still run the command
    bool undone = false;          // unanswered, and fan_out_undo's undo was written after the
                                  // command on its connection, whole
    context_ptr kept;             // unanswered, the round keeping its effect, and
                                  // fan_out_undo::keep: its connection, out of the pool, open
};

/// What fan_out sends, after the command, on the connection of each node that was asked and did
/// not answer, before it gives that connection up — when `needed(results)` says so. A node that
/// is only slow (paused) then runs both in order once it runs again; an undo sent on another
/// connection may run before the command, or not reach the node at all, and the command's write
/// would outlive it. `make` builds a script call, sent with its body (EVAL: the node may not
/// have it cached, and nobody reads the reply).
struct fan_out_undo {
    std::function<bool(const std::vector<node_result>&)> needed;
    std::function<void(std::size_t, script_call&)> make;
    /// When the undo is not needed: the connections of the nodes left unanswered are handed
    /// out (node_result::kept) instead of closed, so that what must follow the command later
    /// can be written after it there.
    bool keep = false;
};

/// Sends `make(node index)` (argv of one command) to every node, reads the replies until each
/// answered or `per_node` ran out. The call must be one that may run twice on a node: a node
/// left unanswered after a script's EVALSHA is sent the call again with its body on the same
/// connection (unless the undo is sent instead), since a node without the script cached
/// (fresh, restarted, flushed) would answer NOSCRIPT to nobody and never run it.
/// `decided(results so far)` may end the round early: the nodes still pending then get
/// `grace` more, and are abandoned (their connections closed, since a reply may still arrive)
/// after that.
///
/// One deadline for the whole round, whatever a node costs: a node with an idle connection is
/// asked at once; one without gets its connection opened on a thread of its own (pool::
/// open_ahead), and is asked when that is done, within the round. A node that hangs (paused,
/// or a port that drops packets) therefore costs the round its deadline once, never the
/// others their replies.
RLOCK_DECL std::vector<node_result> fan_out(
    const std::vector<client_core*>& nodes, std::string_view lock,
    const std::function<void(std::size_t, script_call&)>& make, std::chrono::milliseconds per_node,
    const std::function<bool(const std::vector<node_result>&)>& decided = {},
    std::chrono::milliseconds grace = std::chrono::milliseconds(2), const fan_out_undo* undo = nullptr);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::vector<node_result> fan_out(
    const std::vector<client_core*>& nodes, std::string_view lock,
    const std::function<void(std::size_t, script_call&)>& make, std::chrono::milliseconds per_node,
    const std::function<bool(const std::vector<node_result>&)>& decided,
    std::chrono::milliseconds grace, const fan_out_undo* undo) {
    using clock = std::chrono::steady_clock;
    const std::size_t n = nodes.size();
    std::vector<node_result> out(n);
    std::vector<std::optional<pool::handle>> conns(n);
    std::vector<script_call> calls(n);
    // Where each node is: a connection being opened, the command sent, or done (answered or
    // failed).
    enum class stage : unsigned char { opening, asked, done };
    std::vector<stage> at(n, stage::done);
    std::vector<char> resent(n, 0);  // a NOSCRIPT answered: sent again with the script's body
    std::vector<std::shared_ptr<pool::opening>> openings(n);
    std::shared_ptr<wake_pipe> wake;  // poked when an opening is done
    auto deadline = clock::now() + per_node;

    auto fail = [&](std::size_t i, const error& e) {
        out[i].failure = e;
        at[i] = stage::done;
        if (conns[i]) conns[i]->discard();
    };
    // Writes calls[i] in `form` (a script's: EVALSHA, or EVAL with its body) on node i's
    // connection; the node is then asked.
    auto send = [&](std::size_t i, script_form form) {
        try {
            const connection conn{conns[i]->get(), false, nodes[i]->ep.sharded_pubsub};
            if (calls[i].s) calls[i].use(form, conn);  // re-arm: assigned, not built here
            redisContext* c = conn.ctx;
            if (append_command(c, calls[i].argc(), calls[i].argv(), calls[i].lens()) != REDIS_OK) {
                throw make_error(c, nullptr, lock, nodes[i]->ep.name);
            }
            int done = 0;
            while (!done) {
                if (redisBufferWrite(c, &done) != REDIS_OK)
                    throw make_error(c, nullptr, lock, nodes[i]->ep.name);
            }
            at[i] = stage::asked;
        } catch (const error& e) {
            fail(i, e);
        }
    };
    auto ask = [&](std::size_t i) {
        try {
            make(i, calls[i]);
        } catch (const error& e) {
            fail(i, e);
            return;
        }
        send(i, script_form::sha);
    };
    auto open = [&](std::size_t i) {
        try {
            if (!wake) wake = std::make_shared<wake_pipe>(nodes[i]->ep.name);
            openings[i] = nodes[i]->pool.open_ahead(lock, wake, nodes[i]->shared_from_this());
            at[i] = stage::opening;
        } catch (const error& e) {
            fail(i, e);
        }
    };
    // An opening is done: ask with its connection, or fail with its failure; when another
    // round took the connection first, open another.
    auto opened = [&](std::size_t i) {
        std::optional<pool::handle> h;
        std::optional<error> failure;
        {
            pool::opening& op = *openings[i];
            std::lock_guard<std::mutex> g(op.mu);
            if (!op.done) return;
            if (op.conn) {
                h.emplace(std::move(*op.conn));
                op.conn.reset();
            } else if (op.failure) {
                failure = op.failure;
            }
        }
        openings[i].reset();
        if (h) {
            conns[i].emplace(std::move(*h));
            ask(i);
        } else if (failure) {
            fail(i, *failure);  // the pool named the lock
        } else {
            open(i);
        }
    };

    for (std::size_t i = 0; i < n; ++i) {
        if (std::optional<pool::handle> h = nodes[i]->pool.try_checkout(lock)) {
            conns[i].emplace(std::move(*h));
            ask(i);
        } else {
            open(i);
        }
    }

    auto count_waiting = [&] {
        std::size_t k = 0;
        for (stage s : at) k += s != stage::done;
        return k;
    };
    bool early = false;
    while (count_waiting() > 0) {
        if (!early && decided && decided(out)) {
            early = true;
            deadline = std::min(deadline, clock::now() + grace);
        }
        const auto now = clock::now();
        if (now >= deadline) break;
        std::vector<pollfd> fds;
        std::vector<std::size_t> who;
        for (std::size_t i = 0; i < n; ++i) {
            if (at[i] != stage::asked) continue;
            fds.push_back({conns[i]->get()->fd, POLLIN, 0});
            who.push_back(i);
        }
        if (wake) fds.push_back({wake->fd(), POLLIN, 0});
        const auto wait_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
        const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
        if (ready < 0 && errno != EINTR) break;
        if (wake && fds.back().revents) {
            wake->drain();
            for (std::size_t i = 0; i < n; ++i) {
                if (at[i] == stage::opening) opened(i);
            }
        }
        for (std::size_t k = 0; k < who.size(); ++k) {
            if (!fds[k].revents) continue;
            const std::size_t i = who[k];
            redisContext* c = conns[i]->get();
            void* raw = nullptr;
            if (redisBufferRead(c) != REDIS_OK || redisGetReplyFromReader(c, &raw) != REDIS_OK) {
                fail(i, make_error(c, nullptr, lock, nodes[i]->ep.name));
                continue;
            }
            if (!raw) continue;  // partial reply: wait for the rest
            out[i].reply.reset(static_cast<redisReply*>(raw));
            if (calls[i].s && !resent[i] && reply_is_error(out[i].reply.get(), "NOSCRIPT")) {
                // A script the node had not cached (its first use there, SCRIPT FLUSH, a
                // restart): sent again with its body on the same connection, within the round,
                // so that the round's verdict counts the node's real answer.
                out[i].reply.reset();
                resent[i] = true;
                send(i, script_form::body);
                continue;
            }
            at[i] = stage::done;
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        if (at[i] == stage::done) continue;
        out[i].abandoned = early;
        out[i].unanswered = at[i] == stage::asked;
        const std::string waited = std::to_string(per_node.count()) + " ms";
        out[i].failure = error(
            errc::timeout, lock, nodes[i]->ep.name,
            early ? std::string("not waited for: the round was decided without it")
            : at[i] == stage::opening ? "no connection within the per-node timeout (" + waited + ")"
                                      : "no reply within the per-node timeout (" + waited + ")");
    }
    // Writes `call` with its script's body (or a plain command) after what node i was sent, on
    // its connection: a few kilobytes into the socket's buffer, one write, no wait.
    auto write_after = [&](std::size_t i, script_call& call) {
        const connection conn{conns[i]->get(), false, nodes[i]->ep.sharded_pubsub};
        return detail::write_after(conn, call);
    };
    const bool undoing = undo && undo->needed(out);
    for (std::size_t i = 0; i < n; ++i) {
        if (!out[i].unanswered || !conns[i] || !conns[i]->get()) continue;
        if (undoing) {
            script_call call;
            undo->make(i, call);
            out[i].undone = write_after(i, call);
        } else {
            if (calls[i].s && !resent[i]) (void)write_after(i, calls[i]);
            if (undo && undo->keep) out[i].kept = conns[i]->detach();
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        if (at[i] != stage::done && conns[i]) conns[i]->discard();
    }
    return out;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
