// Test support: replication and Sentinel on loopback, made of redis_server processes: a master
// with one replica (`replicated`), and the two watched by one Redis Sentinel
// (`sentinel_deployment`), for the replica-sync and Sentinel tests. Each waits until it is usable
// (the replica linked and acknowledging writes; with `failover_ready`, the sentinel knowing the
// replica) before handing it out, and throws std::runtime_error naming what it waited for.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/options.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

namespace rlock_test {

/// A master and one replica of it, linked before the test goes on.
struct replicated {
    redis_server master;
    redis_server replica;
    // No diskless-sync delay (5 s by default): the replica links at once.
    replicated()
        : master({"--repl-diskless-sync-delay", "0"}),
          replica({"--replicaof", "127.0.0.1", std::to_string(master.port())}) {
        const bool linked = eventually(
            [&] {
                return replica.text({"INFO", "replication"}).find("master_link_status:up") !=
                           std::string::npos &&
                       acknowledges();
            },
            std::chrono::seconds(10));
        if (!linked) throw std::runtime_error("test: the replica did not link to its master");
    }
    /// A write, and WAIT on the same connection: the replica has it. (A replica fed by a
    /// diskless sync gets the command stream only after its first ACK, up to a second after
    /// the link is up; a WAIT that follows no write counts it before that.)
    bool acknowledges() const {
        auto c = raw_connection(master.port());
        auto set = rlock::detail::command(c.get(), {"SET", "test:replica-probe", "1"});
        auto wait = rlock::detail::command(c.get(), {"WAIT", "1", "100"});
        return set && wait && wait->type == REDIS_REPLY_INTEGER && wait->integer == 1;
    }
    rlock::client_options options(int sync_replicas) const {
        rlock::client_options o = master.options();
        o.sync_replicas = sync_replicas;
        o.sync_timeout = std::chrono::milliseconds(300);
        return o;
    }
    long long waits() const {
        const std::string stats = master.text({"INFO", "commandstats"});
        const auto at = stats.find("cmdstat_wait:calls=");
        return at == std::string::npos ? 0 : std::atoll(stats.c_str() + at + 19);
    }
};


/// A master, its replica and one sentinel watching them as "m". With `failover_ready` the
/// sentinel knows the replica before the test goes on (it can fail over to it).
struct sentinel_deployment {
    replicated r;
    std::unique_ptr<redis_server> sentinel;
    explicit sentinel_deployment(bool failover_ready, const std::string& more_conf = "") {
        sentinel = redis_server::sentinel("sentinel monitor m 127.0.0.1 " +
                                          std::to_string(r.master.port()) +
                                          " 1\nsentinel down-after-milliseconds m 2000\n"
                                          "sentinel failover-timeout m 10000\n" +
                                          more_conf);
        if (!failover_ready) return;
        const bool ready =
            eventually([&] { return known_replicas() == 1; }, std::chrono::seconds(20));
        if (!ready) throw std::runtime_error("test: the sentinel did not find the replica");
    }
    int known_replicas() const {
        auto rep = sentinel->cmd({"SENTINEL", "replicas", "m"});
        int good = 0;
        for (std::size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; ++i) {
            const redisReply* fields = rep->element[i];
            for (std::size_t f = 0; f + 1 < fields->elements; f += 2) {
                if (rlock::detail::reply_text(fields->element[f]) == "flags" &&
                    rlock::detail::reply_text(fields->element[f + 1]) == "slave") {
                    ++good;
                }
            }
        }
        return good;
    }
    int master_port() const {
        auto rep = sentinel->cmd({"SENTINEL", "get-master-addr-by-name", "m"});
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) return 0;
        return std::atoi(rep->element[1]->str);
    }
    std::string uri() const {
        // A sentinel that is down comes first: the client must go on to the next.
        return "redis-sentinel://127.0.0.1:" + std::to_string(free_port()) +
               ",127.0.0.1:" + std::to_string(sentinel->port()) + "/m";
    }
    /// SENTINEL FAILOVER, and back once the sentinel names the replica as the master.
    void fail_over() {
        auto rep = sentinel->cmd({"SENTINEL", "FAILOVER", "m"});
        if (rep->type == REDIS_REPLY_ERROR) {
            throw std::runtime_error("test: SENTINEL FAILOVER: " + std::string(rep->str));
        }
        if (!eventually([&] { return master_port() == r.replica.port(); },
                         std::chrono::seconds(30))) {
            throw std::runtime_error("test: the sentinel did not switch to the replica");
        }
    }
    long long subscribers(const redis_server& s, const std::string& channel) const {
        auto rep = s.cmd({"PUBSUB", "NUMSUB", channel});
        return rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 ? rep->element[1]->integer : -1;
    }
};

}  // namespace rlock_test
