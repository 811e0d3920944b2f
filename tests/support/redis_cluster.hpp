// Test support: a real Redis Cluster on loopback, made of redis_server processes and created with
// `redis-cli --cluster create`. It waits until the cluster is usable before handing it out, and
// offers the operations cluster tests need: slot ownership, step-by-step slot migration (so a
// test can act between the steps), and manual failover. Every wait is bounded and every failure
// throws std::runtime_error naming what was waited for, with what the nodes said.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlock/detail/redis/cluster.hpp"
#include "support/redis_server.hpp"

namespace rlock_test {

inline std::string redis_cli_binary() {
    if (const char* p = std::getenv("RLOCK_REDIS_CLI")) return p;
    return "redis-cli";
}

class redis_cluster {
public:
    static constexpr int slot_count = 16384;

    /// Starts masters * (1 + replicas_per_master) nodes, creates the cluster and waits until
    /// every node agrees on the slots, says cluster_state:ok, and every replica is in sync.
    explicit redis_cluster(int masters = 3, int replicas_per_master = 1,
                           std::vector<std::string> extra = {}) {
        // redis-cli --cluster create refuses fewer than 3 masters: say so before starting anything.
        if (masters < 3 || replicas_per_master < 0) {
            throw std::invalid_argument("redis_cluster: needs >= 3 masters and >= 0 replicas");
        }
        // Each redis_server has its own --dir, so a relative nodes.conf is unique per node (and
        // survives restart(): a restarted node comes back with its identity, as after a crash).
        // Redis 7 also waits 5 s before a diskless full sync by default: no delay here.
        std::vector<std::string> args = {"--cluster-enabled", "yes",
                                         "--cluster-config-file", "nodes.conf",
                                         "--cluster-node-timeout", "2000",
                                         "--repl-diskless-sync-delay", "0"};
        args.insert(args.end(), extra.begin(), extra.end());
        const int total = masters * (1 + replicas_per_master);
        for (int i = 0; i < total; ++i) nodes_.push_back(std::make_unique<redis_server>(args));

        std::vector<std::string> create = {redis_cli_binary(), "--cluster", "create"};
        for (auto& n : nodes_) create.push_back("127.0.0.1:" + std::to_string(n->port()));
        create.insert(create.end(), {"--cluster-replicas", std::to_string(replicas_per_master),
                                     "--cluster-yes"});
        run_tool(create, std::chrono::seconds(60));

        // redis-cli picks which nodes become replicas of which master: learn it from the nodes.
        wait_for("the new cluster to be usable", std::chrono::seconds(30), [&]() -> std::string {
            if (std::string why = health(); !why.empty()) return why;
            std::vector<int> owners = distinct_owners(slot_map(*nodes_.front()));
            if (static_cast<int>(owners.size()) != masters) {
                return std::to_string(owners.size()) + " masters own slots, not " +
                       std::to_string(masters);
            }
            for (int port : owners) {
                const int n = static_cast<int>(replicas_of_port(port).size());
                if (n != replicas_per_master) {
                    return "master " + std::to_string(port) + " has " + std::to_string(n) +
                           " replicas in sync";
                }
            }
            return "";
        });
    }
    redis_cluster(const redis_cluster&) = delete;
    redis_cluster& operator=(const redis_cluster&) = delete;
    // The servers are killed by their own destructors.
    ~redis_cluster() = default;

    std::vector<std::unique_ptr<redis_server>>& nodes() { return nodes_; }

    redis_server& node_on_port(int port) {
        for (auto& n : nodes_) {
            if (n->port() == port) return *n;
        }
        throw std::runtime_error("redis_cluster: no node on port " + std::to_string(port));
    }

    /// Seeds for the library: the first two nodes, whatever their role is now.
    std::string uri() const {
        return "redis-cluster://127.0.0.1:" + std::to_string(nodes_.at(0)->port()) +
               ",127.0.0.1:" + std::to_string(nodes_.at(1)->port());
    }

    /// The Redis hash slot of `key` (the library's; `cluster.key_slot_matches_the_servers`
    /// checks it against CLUSTER KEYSLOT).
    static int key_slot(std::string_view key) { return rlock::detail::key_slot(key); }

    /// The node that owns `slot` as a master, as the first live node that answers sees it.
    redis_server& master_for_slot(int slot) {
        if (slot < 0 || slot >= slot_count) throw std::invalid_argument("redis_cluster: bad slot");
        for (auto& n : nodes_) {
            if (!alive(*n)) continue;
            const std::vector<int> map = slot_map(*n);
            if (map.empty()) continue;
            if (map[slot] == 0) break;
            return node_on_port(map[slot]);
        }
        throw std::runtime_error("redis_cluster: no node knows the owner of slot " +
                                 std::to_string(slot) + "\n" + describe());
    }

    /// A live replica of `master` (by what the replicas themselves say in INFO replication).
    redis_server& replica_of(const redis_server& master) {
        for (auto& n : nodes_) {
            if (!alive(*n)) continue;
            const std::string info = reply_string(ask(*n, {"INFO", "replication"}));
            if (field(info, "role") == "slave" &&
                field(info, "master_port") == std::to_string(master.port())) {
                return *n;
            }
        }
        throw std::runtime_error("redis_cluster: no replica of the node on port " +
                                 std::to_string(master.port()) + "\n" + describe());
    }

    /// The live nodes that say they are masters (ROLE), in nodes() order.
    std::vector<redis_server*> masters() {
        std::vector<redis_server*> out;
        for (auto& n : nodes_) {
            if (alive(*n) && role(*n) == "master") out.push_back(n.get());
        }
        return out;
    }

    std::string node_id(const redis_server& node) {
        return expect(node, {"CLUSTER", "MYID"}, REDIS_REPLY_STRING, "CLUSTER MYID");
    }

    /// Step 1 of moving `slot`: `to` imports it, `from` migrates it. Keys stay on `from`.
    void begin_migration(int slot, const redis_server& from, const redis_server& to) {
        const std::string s = std::to_string(slot);
        const std::string from_id = node_id(from);
        const std::string to_id = node_id(to);
        // Importing first, as redis-cli does: a client sent on by ASK always finds `to` ready.
        expect(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}, REDIS_REPLY_STATUS,
               "CLUSTER SETSLOT " + s + " IMPORTING");
        expect(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}, REDIS_REPLY_STATUS,
               "CLUSTER SETSLOT " + s + " MIGRATING");
    }

    /// Step 2: MIGRATE every key of `slot` from `from` to `to`, 100 at a time.
    void move_keys(int slot, const redis_server& from, const redis_server& to) {
        const std::string s = std::to_string(slot);
        const std::string port = std::to_string(to.port());
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        for (;;) {
            rlock::detail::reply_ptr keys = ask(from, {"CLUSTER", "GETKEYSINSLOT", s, "100"});
            if (!keys || keys->type != REDIS_REPLY_ARRAY) {
                throw std::runtime_error("redis_cluster: CLUSTER GETKEYSINSLOT " + s + " on " +
                                         std::to_string(from.port()) + " failed: " +
                                         reply_string(keys));
            }
            if (keys->elements == 0) return;
            std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", port, "", "0", "5000",
                                                "KEYS"};
            for (std::size_t i = 0; i < keys->elements; ++i) {
                migrate.emplace_back(rlock::detail::reply_text(keys->element[i]));
            }
            rlock::detail::reply_ptr r = ask(from, migrate, std::chrono::seconds(10));
            // NOKEY: a key expired between GETKEYSINSLOT and MIGRATE; the loop looks again.
            if (!r || (r->type != REDIS_REPLY_STATUS) ||
                (reply_string(r) != "OK" && reply_string(r) != "NOKEY")) {
                throw std::runtime_error("redis_cluster: MIGRATE of slot " + s + " from " +
                                         std::to_string(from.port()) + " to " + port +
                                         " failed: " + reply_string(r));
            }
            if (std::chrono::steady_clock::now() > deadline) {
                throw std::runtime_error("redis_cluster: slot " + s + " still has keys on " +
                                         std::to_string(from.port()) + " after 30 s of MIGRATE");
            }
        }
    }

    /// Step 3: `to` owns `slot`. Told to `to`, then to the old owner, then to every other master
    /// (so they agree at once instead of by gossip); returns when every live node says so.
    void end_migration(int slot, const redis_server& to) {
        const std::string s = std::to_string(slot);
        const std::string to_id = node_id(to);
        // The old owner, as `to` still sees it: the SETSLOT below changes that.
        const std::vector<int> before = slot_map(to);
        const int from_port = before.empty() ? 0 : before[slot];
        const std::string what = "CLUSTER SETSLOT " + s + " NODE";
        expect(to, {"CLUSTER", "SETSLOT", s, "NODE", to_id}, REDIS_REPLY_STATUS, what);
        if (from_port != 0 && from_port != to.port()) {
            expect(node_on_port(from_port), {"CLUSTER", "SETSLOT", s, "NODE", to_id},
                   REDIS_REPLY_STATUS, what);
        }
        for (redis_server* m : masters()) {
            if (m->port() == to.port() || m->port() == from_port) continue;
            expect(*m, {"CLUSTER", "SETSLOT", s, "NODE", to_id}, REDIS_REPLY_STATUS, what);
        }
        wait_for("every node to see slot " + s + " owned by " + std::to_string(to.port()),
                 std::chrono::seconds(30), [&]() -> std::string {
                     for (auto& n : nodes_) {
                         if (!alive(*n)) continue;
                         const std::vector<int> map = slot_map(*n);
                         const int owner = map.empty() ? -1 : map[slot];
                         if (owner != to.port()) {
                             return std::to_string(n->port()) + " says " + std::to_string(owner);
                         }
                     }
                     return "";
                 });
    }

    /// A manual failover of `master`: CLUSTER FAILOVER on one of its replicas (FORCE when the
    /// master was killed or does not answer). Returns the new master once it says so, the old
    /// one (if it answers) is its replica, every node maps the old master's slots to it, and the
    /// cluster is healthy() again.
    redis_server& fail_over(redis_server& master) {
        redis_server& replica = replica_of(master);
        const bool master_up = alive(master) && !role(master).empty();
        std::vector<int> slots;
        {
            const std::vector<int> map = slot_map(master_up ? master : replica);
            for (int i = 0; i < static_cast<int>(map.size()); ++i) {
                if (map[i] == master.port()) slots.push_back(i);
            }
        }
        const std::string mp = std::to_string(master.port());
        const std::string rp = std::to_string(replica.port());
        if (slots.empty()) {
            throw std::runtime_error("redis_cluster: fail_over: " + mp + " owns no slots (as " +
                                     (master_up ? mp : rp) + " sees it)\n" + describe());
        }
        std::vector<std::string> failover = {"CLUSTER", "FAILOVER"};
        if (!master_up) failover.emplace_back("FORCE");
        {
            rlock::detail::reply_ptr r = ask(replica, failover);
            if (!r || r->type != REDIS_REPLY_STATUS) {
                throw std::runtime_error("redis_cluster: CLUSTER FAILOVER" +
                                         std::string(master_up ? "" : " FORCE") + " on " + rp +
                                         " failed: " + reply_string(r));
            }
        }
        // A manual failover the replica gave up on (the master did not pause and hand over its
        // offset within Redis's 5 s, e.g. under load) is asked for again. The reply is not
        // checked: the replica may have become master in between, and then it refuses.
        auto resend = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        wait_for("the failover of " + mp + " to " + rp, std::chrono::seconds(30),
                 [&]() -> std::string {
                     if (role(replica) != "master") {
                         if (std::chrono::steady_clock::now() > resend) {
                             ask(replica, failover);
                             resend += std::chrono::seconds(10);
                         }
                         return rp + " is not master yet";
                     }
                     if (master_up && role(master) != "slave") {
                         return "old master " + mp + " is not a replica yet";
                     }
                     for (auto& n : nodes_) {
                         if (!alive(*n)) continue;
                         const std::vector<int> map = slot_map(*n);
                         if (map.empty()) return std::to_string(n->port()) + ": no CLUSTER SLOTS";
                         for (int slot : slots) {
                             if (map[slot] != replica.port()) {
                                 return std::to_string(n->port()) + " maps slot " +
                                        std::to_string(slot) + " to " + std::to_string(map[slot]);
                             }
                         }
                     }
                     return health();
                 });
        return replica;
    }

    /// Waits (30 s) until the cluster is healthy() again, e.g. after a test restarted a node.
    void wait_healthy() {
        wait_for("the cluster to be healthy", std::chrono::seconds(30), [&] { return health(); });
    }

    /// Empty when every live node says cluster_state:ok and knows every node, all live nodes map
    /// every slot to the same live owner, all live nodes see every live node with the role and
    /// master it says it has (and not failing), and every live replica's link to its master is
    /// up; otherwise the first thing found wrong. Slot agreement alone is not enough: a master
    /// that still sees a demoted master as a master refuses to vote for it in a later failover.
    std::string health() {
        std::vector<int> agreed;
        std::map<std::string, node_view> truth;  // by node id, from each node's own "myself" line
        std::vector<std::pair<int, std::map<std::string, node_view>>> views;
        for (auto& n : nodes_) {
            if (!alive(*n)) continue;
            const std::string p = std::to_string(n->port());
            rlock::detail::reply_ptr info_reply = ask(*n, {"CLUSTER", "INFO"});
            if (!info_reply) return p + ": does not answer";
            const std::string info = reply_string(info_reply);
            if (field(info, "cluster_state") != "ok") return p + ": cluster_state is not ok";
            if (field(info, "cluster_known_nodes") != std::to_string(nodes_.size())) {
                return p + ": knows " + field(info, "cluster_known_nodes") + " nodes";
            }
            const std::vector<int> map = slot_map(*n);
            if (map.empty()) return p + ": no CLUSTER SLOTS";
            for (int slot = 0; slot < slot_count; ++slot) {
                if (map[slot] == 0) return p + ": slot " + std::to_string(slot) + " unassigned";
            }
            if (agreed.empty()) {
                agreed = map;
            } else if (map != agreed) {
                return p + ": CLUSTER SLOTS differs from the first live node's";
            }
            const std::string repl = reply_string(ask(*n, {"INFO", "replication"}));
            if (field(repl, "role") == "slave" && field(repl, "master_link_status") != "up") {
                return p + ": replica link to " + field(repl, "master_port") + " is not up";
            }
            std::string self;
            auto view = cluster_nodes(*n, &self);
            if (self.empty()) return p + ": no myself line in CLUSTER NODES";
            truth[self] = view[self];
            views.emplace_back(n->port(), std::move(view));
        }
        if (agreed.empty()) return "no live node";
        for (int port : distinct_owners(agreed)) {
            if (!alive(node_on_port(port))) {
                return "slot owner " + std::to_string(port) + " is down";
            }
        }
        for (const auto& [port, view] : views) {
            for (const auto& [id, self] : truth) {
                const auto it = view.find(id);
                const std::string who = std::to_string(port) + " sees " + std::to_string(self.port);
                if (it == view.end()) return who + ": not at all";
                if (it->second.failing) return who + " failing";
                if (it->second.role != self.role || it->second.master_id != self.master_id) {
                    return who + " as " + it->second.role + " " + it->second.master_id +
                           ", it says " + self.role + " " + self.master_id;
                }
            }
        }
        return "";
    }

    /// What every node says, for failure messages: its ROLE and CLUSTER NODES.
    std::string describe() {
        std::string out;
        for (auto& n : nodes_) {
            out += "--- node " + std::to_string(n->port()) + " (pid " + std::to_string(n->pid()) +
                   ")";
            if (!alive(*n)) {
                out += ": down\n";
                continue;
            }
            // One try only for a node that does not answer (paused): each try takes 2 s.
            rlock::detail::reply_ptr info = ask(*n, {"CLUSTER", "INFO"});
            if (!info) {
                out += ": does not answer\n";
                continue;
            }
            out += " role " + role(*n) + ", cluster_state " +
                   field(reply_string(info), "cluster_state") + "\n";
            out += reply_string(ask(*n, {"CLUSTER", "NODES"}));
        }
        return out;
    }

private:
    /// One node as another sees it in CLUSTER NODES.
    struct node_view {
        int port = 0;
        std::string role;       // "master" or "slave"
        std::string master_id;  // "-" for a master
        bool failing = false;   // fail, fail?, handshake or noaddr
    };

    static bool alive(const redis_server& n) { return n.pid() > 0; }

    /// One command on a fresh connection with a time limit, so that a paused or dying node
    /// cannot hang a bounded wait. Null when the node cannot be reached or does not answer.
    static rlock::detail::reply_ptr ask(
        const redis_server& n, const std::vector<std::string>& parts,
        std::chrono::milliseconds limit = std::chrono::milliseconds(2000)) {
        timeval tv{};
        tv.tv_sec = static_cast<decltype(tv.tv_sec)>(limit.count() / 1000);
        tv.tv_usec = static_cast<decltype(tv.tv_usec)>((limit.count() % 1000) * 1000);
        rlock::detail::context_ptr c(redisConnectWithTimeout("127.0.0.1", n.port(), tv));
        if (!c || c->err) return nullptr;
        redisSetTimeout(c.get(), tv);
        std::vector<const char*> argv;
        std::vector<std::size_t> lens;
        for (const auto& p : parts) {
            argv.push_back(p.data());
            lens.push_back(p.size());
        }
        return rlock::detail::reply_ptr(static_cast<redisReply*>(
            redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    }

    /// The reply's text (status, string, error, integer), or a note that there was none.
    static std::string reply_string(const rlock::detail::reply_ptr& r) {
        if (!r) return "(no reply)";
        if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
        if (r->type == REDIS_REPLY_ARRAY) return "(array of " + std::to_string(r->elements) + ")";
        return std::string(rlock::detail::reply_text(r.get()));
    }

    /// Runs `parts` on `n`; throws unless the reply has type `type`. Returns its text.
    static std::string expect(const redis_server& n, const std::vector<std::string>& parts,
                              int type, const std::string& what) {
        rlock::detail::reply_ptr r = ask(n, parts);
        if (!r || r->type != type) {
            throw std::runtime_error("redis_cluster: " + what + " on " +
                                     std::to_string(n.port()) + " failed: " + reply_string(r));
        }
        return reply_string(r);
    }

    /// `name:value` from an INFO-style text ("" when absent).
    static std::string field(const std::string& info, const std::string& name) {
        const std::string key = name + ":";
        std::size_t at = 0;
        while ((at = info.find(key, at)) != std::string::npos) {
            if (at == 0 || info[at - 1] == '\n') {
                const std::size_t start = at + key.size();
                const std::size_t end = info.find_first_of("\r\n", start);
                return info.substr(start, end == std::string::npos ? end : end - start);
            }
            at += key.size();
        }
        return "";
    }

    /// First element of ROLE: "master", "slave", or "" when the node does not answer.
    static std::string role(const redis_server& n) {
        rlock::detail::reply_ptr r = ask(n, {"ROLE"});
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return "";
        return std::string(rlock::detail::reply_text(r->element[0]));
    }

    /// Slot -> port of its master, from `n`'s CLUSTER SLOTS (0: unassigned); empty on no answer.
    static std::vector<int> slot_map(const redis_server& n) {
        rlock::detail::reply_ptr r = ask(n, {"CLUSTER", "SLOTS"});
        if (!r || r->type != REDIS_REPLY_ARRAY) return {};
        std::vector<int> map(slot_count, 0);
        for (std::size_t i = 0; i < r->elements; ++i) {
            const redisReply* e = r->element[i];
            // [first, last, [ip, port, id, ...] of the master, replicas...]
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2) {
                return {};
            }
            const long long first = e->element[0]->integer;
            const long long last = e->element[1]->integer;
            const int port = static_cast<int>(e->element[2]->element[1]->integer);
            for (long long s = first; s <= last && s < slot_count; ++s) {
                map[static_cast<std::size_t>(s)] = port;
            }
        }
        return map;
    }

    /// `n`'s CLUSTER NODES by node id; `self` gets the id on its "myself" line.
    static std::map<std::string, node_view> cluster_nodes(const redis_server& n,
                                                          std::string* self) {
        std::map<std::string, node_view> out;
        const std::string text = reply_string(ask(n, {"CLUSTER", "NODES"}));
        std::size_t at = 0;
        while (at < text.size()) {
            std::size_t end = text.find('\n', at);
            if (end == std::string::npos) end = text.size();
            // <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> ...
            std::vector<std::string> f;
            std::size_t w = at;
            while (w < end && f.size() < 4) {
                const std::size_t sp = std::min(text.find(' ', w), end);
                f.push_back(text.substr(w, sp - w));
                w = sp + 1;
            }
            at = end + 1;
            if (f.size() < 4) continue;
            node_view v;
            const std::size_t colon = f[1].rfind(':', f[1].find('@'));
            v.port = colon == std::string::npos ? 0 : std::atoi(f[1].c_str() + colon + 1);
            const std::string flags = "," + f[2] + ",";
            v.role = flags.find(",master,") != std::string::npos ? "master" : "slave";
            v.master_id = f[3];
            for (const char* bad : {",fail,", ",fail?,", ",handshake,", ",noaddr,"}) {
                v.failing = v.failing || flags.find(bad) != std::string::npos;
            }
            if (flags.find(",myself,") != std::string::npos) *self = f[0];
            out[f[0]] = v;
        }
        return out;
    }

    static std::vector<int> distinct_owners(const std::vector<int>& map) {
        std::vector<int> out;
        for (int port : map) {
            bool seen = port == 0;
            for (int o : out) seen = seen || o == port;
            if (!seen) out.push_back(port);
        }
        return out;
    }

    /// Live replicas whose link to the master on `port` is up.
    std::vector<redis_server*> replicas_of_port(int port) {
        std::vector<redis_server*> out;
        for (auto& n : nodes_) {
            if (!alive(*n)) continue;
            const std::string info = reply_string(ask(*n, {"INFO", "replication"}));
            if (field(info, "role") == "slave" &&
                field(info, "master_port") == std::to_string(port) &&
                field(info, "master_link_status") == "up") {
                out.push_back(n.get());
            }
        }
        return out;
    }

    /// Polls `why_not` (empty: done) every 20 ms for up to `limit`; then throws with its last
    /// answer and what every node says.
    void wait_for(const std::string& what, std::chrono::milliseconds limit,
                  const std::function<std::string()>& why_not) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        std::string why;
        for (;;) {
            why = why_not();
            if (why.empty()) return;
            if (std::chrono::steady_clock::now() >= deadline) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        throw std::runtime_error("redis_cluster: timed out after " +
                                 std::to_string(limit.count()) + " ms waiting for " + what +
                                 " (last: " + why + ")\n" + describe());
    }

    /// Runs a tool (redis-cli) with stdout and stderr to a log in /tmp, killed after `limit`;
    /// throws with the log unless it exits 0. The log is removed on success.
    static void run_tool(const std::vector<std::string>& args, std::chrono::seconds limit) {
        // Everything the child needs is built before fork: it only redirects and execs.
        std::vector<std::string> copy = args;
        std::vector<char*> argv;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        char log_path[] = "/tmp/rlock-cluster-create-XXXXXX.log";
        const int log_fd = ::mkstemps(log_path, 4);
        if (log_fd < 0) throw std::runtime_error("redis_cluster: cannot create a log in /tmp");
        const int null_fd = ::open("/dev/null", O_RDONLY);
        const pid_t parent = ::getpid();
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(1);
            if (null_fd >= 0) ::dup2(null_fd, 0);
            ::dup2(log_fd, 1);
            ::dup2(log_fd, 2);
            ::execvp(argv[0], argv.data());
            ::_exit(127);
        }
        if (null_fd >= 0) ::close(null_fd);
        ::close(log_fd);
        std::string failure;
        if (pid < 0) {
            failure = "fork failed";
        } else {
            int status = 0;
            const auto deadline = std::chrono::steady_clock::now() + limit;
            while (::waitpid(pid, &status, WNOHANG) != pid) {
                if (std::chrono::steady_clock::now() > deadline) {
                    ::kill(pid, SIGKILL);
                    ::waitpid(pid, &status, 0);
                    failure = "killed after " + std::to_string(limit.count()) + " s";
                    break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                failure = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
            }
        }
        if (failure.empty()) {
            ::unlink(log_path);
            return;
        }
        std::string log;
        if (std::FILE* f = std::fopen(log_path, "r")) {
            char buf[512];
            std::size_t n;
            while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) log.append(buf, n);
            std::fclose(f);
        }
        std::string cmdline;
        for (const auto& a : args) cmdline += (cmdline.empty() ? "" : " ") + a;
        throw std::runtime_error("redis_cluster: `" + cmdline + "` failed (" + failure +
                                 "), log " + log_path + ":\n" + log);
    }

    std::vector<std::unique_ptr<redis_server>> nodes_;
};

}  // namespace rlock_test
