// Test support: the lock kinds a typed suite runs on, their names in test output (and for the
// test worker), and the base fixture of such a suite: a redis-server of its own, client options
// that log lost holds, and a lock name unique to the running test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <type_traits>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

namespace rlock_test {

/// Every lock kind; read_write_lock stands for its exclusive (write) side, which keeps the same
/// contract as the other locks.
using lock_kinds =
    ::testing::Types<rlock::mutex, rlock::reentrant_lock, rlock::fair_lock, rlock::read_write_lock>;

/// The name the worker process and the test output use for each kind.
template <class T>
std::string kind_name() {
    if constexpr (std::is_same_v<T, rlock::mutex>) return "mutex";
    if constexpr (std::is_same_v<T, rlock::reentrant_lock>) return "reentrant";
    if constexpr (std::is_same_v<T, rlock::fair_lock>) return "fair";
    return "rw";  // read_write_lock: the write side
}

/// The name generator of TYPED_TEST_SUITE: suite/mutex, suite/reentrant, ...
struct kind_names {
    template <class T>
    static std::string GetName(int) {
        return kind_name<T>();
    }
};

/// The base of a typed suite over lock_kinds: `template <class Lock> class my_test : public
/// rlock_test::kind_fixture<my_test<Lock>> {};`. `Suite` keeps one server per suite and kind,
/// started at its first use, so that one suite's faults never reach another's server.
template <class Suite>
class kind_fixture : public ::testing::Test {
protected:
    static redis_server& server() {
        static redis_server s;
        return s;
    }
    rlock::client_options options(std::chrono::milliseconds watchdog = std::chrono::seconds(30)) {
        rlock::client_options o = server().options();
        o.lock_watchdog_timeout = watchdog;
        o.on_lock_lost = lost.handler();
        return o;
    }
    /// Each test starts on an empty server, as it does under ctest (a process a test): a run
    /// of the whole binary in one process must not see another test's keys (fencing counters
    /// outlive their locks by design).
    void SetUp() override { server().cmd({"FLUSHALL"}); }
    std::string name() const { return test_lock_name(); }
    std::string last_lost_message() {
        std::lock_guard<std::mutex> g(lost.mu);
        return lost.last_message;
    }

    lost_log lost;
};

}  // namespace rlock_test
