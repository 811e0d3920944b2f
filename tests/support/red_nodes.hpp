// The base of a red_lock test: N real redis-servers of its own (faults and keys stay in the
// test), and clients of them with short timeouts and a loss log.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

namespace rlock_test {

template <int N>
class red_nodes : public ::testing::Test {
protected:
    void SetUp() override {
        for (int i = 0; i < N; ++i) servers.push_back(std::make_unique<redis_server>());
    }
    /// A client of each server (command and connect timeouts `timeouts`, on_lock_lost: `lost`;
    /// the first node's listener: `first_listener`; client_options::loss_tracking as given).
    std::vector<std::unique_ptr<rlock::client>> make_clients(
        std::chrono::milliseconds watchdog = std::chrono::seconds(30),
        std::chrono::milliseconds timeouts = std::chrono::milliseconds(300),
        const std::shared_ptr<rlock::lock_listener>& first_listener = nullptr,
        bool loss_tracking = true) {
        std::vector<std::unique_ptr<rlock::client>> out;
        for (auto& s : servers) {
            rlock::client_options o = s->options();
            if (out.empty()) o.listener = first_listener;
            o.lock_watchdog_timeout = watchdog;
            o.command_timeout = timeouts;
            o.connect_timeout = timeouts;
            o.on_lock_lost = lost.hold_handler();
            o.loss_tracking = loss_tracking;
            out.push_back(std::make_unique<rlock::client>(o));
        }
        return out;
    }
    static std::vector<rlock::client*> raw(const std::vector<std::unique_ptr<rlock::client>>& cs) {
        std::vector<rlock::client*> out;
        for (auto& c : cs) out.push_back(c.get());
        return out;
    }
    /// On how many servers (from index `from`) the key `n` exists.
    long long keys_named(const std::string& n, std::size_t from = 0) {
        long long k = 0;
        for (std::size_t i = from; i < servers.size(); ++i) k += servers[i]->integer({"EXISTS", n});
        return k;
    }
    /// The value every server holds under `n`, once they all hold the same one ("" when they do
    /// not within the limit). A round returns once a majority took the lock: the last node's
    /// SET, sent in the same round, may land a moment after it.
    std::string value_on_every_node(const std::string& n) {
        std::string v;
        const bool same = eventually([&] {
            v = servers.front()->text({"GET", n});
            for (auto& s : servers) {
                if (s->text({"GET", n}) != v) return false;
            }
            return !v.empty();
        });
        return same ? v : std::string();
    }
    std::string name() const { return test_lock_name(); }

    std::vector<std::unique_ptr<redis_server>> servers;
    lost_log lost;
};

}  // namespace rlock_test
