// Faults and bad input (issue 8), against real redis-servers that the tests start themselves:
// connections killed under load, SCRIPT FLUSH and FLUSHALL, a server that stalls past the
// command timeout while it still runs an acquire, odd and huge inputs, a port that is not
// Redis, ACL users without scripts or keys, and misuse of lock objects. Every lock kind runs
// each test where it makes sense (read_write_lock: its write side). Bounds on time are generous
// on purpose: the suite runs on small, noisy machines. The documented minimal ACL, replica sync
// and Sentinel are in deployment_test.cpp.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/kinds.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::command_vec;
using rlock_test::connection_error;
using rlock_test::eventually;
using rlock_test::keys_left;
using rlock_test::kind_name;
using rlock_test::millis;
using rlock_test::raw_connection;
using rlock_test::redis_server;
using rlock_test::set_acl_user;
using rlock_test::steady;

namespace {

/// The value of `field` in an INFO reply, or -1.
long long info_value(const std::string& info, const std::string& field) {
    const std::string key = "\n" + field + ":";
    const auto at = info.find(key);
    if (at == std::string::npos) return -1;
    return std::atoll(info.c_str() + at + key.size());
}

/// Calls per command since the last CONFIG RESETSTAT (INFO commandstats).
std::map<std::string, long long> command_calls(const redis_server& s) {
    std::map<std::string, long long> out;
    const std::string info = s.text({"INFO", "commandstats"});
    const std::string tag = "cmdstat_";
    for (auto pos = info.find(tag); pos != std::string::npos; pos = info.find(tag, pos + 1)) {
        const auto colon = info.find(':', pos);
        const auto calls = info.find("calls=", colon);
        if (colon == std::string::npos || calls == std::string::npos) break;
        out[info.substr(pos + tag.size(), colon - pos - tag.size())] =
            std::atoll(info.c_str() + calls + 6);
    }
    return out;
}

/// Every command the server ran since RESETSTAT, except the test's own CONFIG and INFO.
std::string commands_besides_bookkeeping(const redis_server& s) {
    std::string out;
    for (const auto& [name, calls] : command_calls(s)) {
        if (name == "config|resetstat" || name == "config" || name == "info") continue;
        out += name + "=" + std::to_string(calls) + " ";
    }
    return out;
}

template <class T>
constexpr bool is_hash_kind() {
    return !std::is_same_v<T, rlock::mutex>;
}

template <class T>
constexpr bool is_reentrant_kind() {
    return !std::is_same_v<T, rlock::mutex>;
}

template <class Lock>
class fault_test : public rlock_test::kind_fixture<fault_test<Lock>> {};

TYPED_TEST_SUITE(fault_test, rlock_test::lock_kinds, rlock_test::kind_names);

// ---------------------------------------------------------------------------------------------
// Load: threads that lock, do a non-atomic read-modify-write of a counter in Redis, and unlock.
// If two holders ever overlapped, an increment would be lost and the counter would fall short.

struct load_report {
    std::mutex mu;
    std::vector<std::string> unexpected;        // whatever the contract does not allow
    std::map<std::string, int> refused;         // lock() errors the contract allows, by message
    std::map<std::string, long long> sections;  // completed critical sections, per lock name
    long long attempts = 0;

    void add_unexpected(const std::string& what) {
        std::lock_guard<std::mutex> g(mu);
        if (unexpected.size() < 20) unexpected.push_back(what);
    }
    long long total_sections() {
        std::lock_guard<std::mutex> g(mu);
        long long n = 0;
        for (const auto& [name, count] : sections) n += count;
        return n;
    }
    std::string summary() {
        std::lock_guard<std::mutex> g(mu);
        std::string s = "attempts " + std::to_string(attempts) + "; refused:";
        for (const auto& [what, n] : refused) s += " [" + std::to_string(n) + "x " + what + "]";
        s += "; unexpected:";
        for (const auto& u : unexpected) s += " [" + u + "]";
        return s;
    }
};

struct load_spec {
    std::vector<std::string> names;
    int threads = 4;
    int iterations = 40;
    std::chrono::seconds limit{20};
    std::string counter_user;  // the counter connections AUTH as this user when set
    bool connection_errors_allowed = false;
    bool fence_even_threads = false;  // lock_options::fencing on every other thread
};

std::string counter_key(const std::string& name) { return name + ":counter"; }

template <class Lock>
void run_load(rlock::client& c, int port, const load_spec& spec, load_report& out) {
    const auto end = steady::now() + spec.limit;
    std::vector<std::thread> threads;
    for (int t = 0; t < spec.threads; ++t) {
        threads.emplace_back([&, t] {
            const std::string& name = spec.names[static_cast<std::size_t>(t) % spec.names.size()];
            const std::string counter = counter_key(name);
            rlock::lock_options lo;
            lo.fencing = spec.fence_even_threads && t % 2 == 0;
            Lock lock(c, name, lo);
            // Until it has AUTHed as the counter user, a kill may still hit this connection.
            rlock::detail::context_ptr redis;
            for (int tries = 0; !redis; ++tries) {
                try {
                    redis = raw_connection(port, spec.counter_user, "pw");
                } catch (const std::exception& e) {
                    if (tries == 50) {
                        out.add_unexpected(std::string("counter connection: ") + e.what());
                        return;
                    }
                }
            }
            for (int i = 0; i < spec.iterations && steady::now() < end; ++i) {
                {
                    std::lock_guard<std::mutex> g(out.mu);
                    ++out.attempts;
                }
                try {
                    lock.lock();
                } catch (const rlock::error& e) {
                    if (spec.connection_errors_allowed && connection_error(e.value())) {
                        std::lock_guard<std::mutex> g(out.mu);
                        ++out.refused[e.code().message()];
                    } else {
                        out.add_unexpected(std::string("lock() threw: ") + e.what());
                    }
                    continue;
                } catch (const std::exception& e) {
                    out.add_unexpected(std::string("lock() threw a non-rlock exception: ") +
                                       e.what());
                    continue;
                }
                auto got = rlock::detail::command(redis.get(), {"GET", counter});
                const long long value =
                    got && got->type == REDIS_REPLY_STRING ? std::atoll(got->str) : 0;
                std::this_thread::yield();  // widen the window a lost update would need
                const std::string next = std::to_string(value + 1);
                auto set = rlock::detail::command(redis.get(), {"SET", counter, next});
                if (!got || !set || set->type != REDIS_REPLY_STATUS) {
                    out.add_unexpected("the counter connection failed");
                }
                {
                    std::lock_guard<std::mutex> g(out.mu);
                    ++out.sections[name];
                }
                try {
                    lock.unlock();
                } catch (const std::exception& e) {
                    out.add_unexpected(std::string("unlock() threw: ") + e.what());
                }
            }
        });
    }
    for (auto& t : threads) t.join();
}

/// Checks the counters against the completed sections: equal, or mutual exclusion failed.
void expect_counters_match(const redis_server& s, load_report& r) {
    std::lock_guard<std::mutex> g(r.mu);
    for (const auto& [name, sections] : r.sections) {
        EXPECT_EQ(s.text({"GET", counter_key(name)}), std::to_string(sections))
            << "lost updates on " << name << ": two holders overlapped";
    }
}

/// Repeats `cmd` on one connection every `period` until stopped; counts what it returned.
class injector {
public:
    injector(const redis_server& s, std::vector<std::string> cmd, std::chrono::milliseconds period)
        : thread_([this, port = s.port(), cmd = std::move(cmd), period] {
              auto c = raw_connection(port);
              while (!stop_) {
                  auto r = command_vec(c.get(), cmd);
                  if (!r) {
                      c = raw_connection(port);
                      continue;
                  }
                  ++runs_;
                  if (r->type == REDIS_REPLY_INTEGER) hits_ += r->integer;
                  if (r->type == REDIS_REPLY_ERROR) errors_ += 1;
                  std::this_thread::sleep_for(period);
              }
          }) {}
    injector(const injector&) = delete;
    injector& operator=(const injector&) = delete;
    ~injector() { stop(); }
    void stop() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
    }
    long long runs() const { return runs_; }
    long long hits() const { return hits_; }
    long long errors() const { return errors_; }

private:
    std::atomic<bool> stop_{false};
    std::atomic<long long> runs_{0}, hits_{0}, errors_{0};
    std::thread thread_;
};

// The library's connections (user "default") of type normal; the killer's own and the counter
// connections (user rlock-counter) survive, so the counters themselves never see a fault.
const std::vector<std::string> kill_normal = {"CLIENT", "KILL",    "TYPE",   "normal",
                                              "USER",   "default", "SKIPME", "yes"};

void ensure_counter_user(const redis_server& s) {
    set_acl_user(s, {"rlock-counter", "on", ">pw", "~*", "&*", "+@all"});
}

// ---------------------------------------------------------------------------------------------
// a. A killed subscriber connection is re-made and its waiters re-subscribed.

TYPED_TEST(fault_test, a_waiter_wakes_on_unlock_after_its_subscriber_connection_was_killed) {
    rlock::client holder(this->options()), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(30s);  // the waiter must not wait this lease out
    std::promise<steady::time_point> acquired;
    std::thread waiter([&] {
        // try_lock_for bounds a failure of this test at 10 s; the lease is 30 s.
        if (theirs.try_lock_for(10s)) {
            acquired.set_value(steady::now());
            theirs.unlock();
        } else {
            acquired.set_value(steady::time_point::max());
        }
    });
    std::this_thread::sleep_for(300ms);  // subscribed and blocked
    const long long killed = this->server().integer({"CLIENT", "KILL", "TYPE", "pubsub"});
    std::this_thread::sleep_for(500ms);  // time to reconnect and resubscribe
    const auto released = steady::now();
    mine.unlock();
    auto got = acquired.get_future();
    const auto at = got.get();
    waiter.join();
    EXPECT_GE(killed, 1) << "no subscriber connection was killed: the fault was not injected";
    ASSERT_NE(at, steady::time_point::max()) << "the waiter never got the lock";
    EXPECT_LT(at - released, 1500ms) << "woke " << millis(at - released) << " ms after the unlock";
}

TYPED_TEST(fault_test, a_waiter_wakes_on_unlock_right_after_its_subscriber_connection_was_killed) {
    // The unlock lands while the subscriber reconnects and resubscribes: the message may be
    // missed, and the waiter must notice anyway (not sleep for the holder's TTL).
    rlock::client holder(this->options()), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    std::string slow;
    // The race is narrow: many rounds close to the kill, a few further away.
    for (const auto gap :
         {0ms, 0ms, 0ms, 0ms, 0ms, 0ms, 1ms, 1ms, 1ms, 1ms, 2ms, 2ms, 2ms, 3ms, 5ms, 10ms, 50ms}) {
        mine.lock(4s);
        std::promise<steady::time_point> acquired;
        std::thread waiter([&] {
            if (theirs.try_lock_for(8s)) {
                acquired.set_value(steady::now());
                theirs.unlock();
            } else {
                acquired.set_value(steady::time_point::max());
            }
        });
        std::this_thread::sleep_for(150ms);  // subscribed and blocked
        const long long killed = this->server().integer({"CLIENT", "KILL", "TYPE", "pubsub"});
        std::this_thread::sleep_for(gap);
        const auto released = steady::now();
        mine.unlock();
        const auto at = acquired.get_future().get();
        waiter.join();
        EXPECT_GE(killed, 1);
        if (at == steady::time_point::max() || at - released >= 1500ms) {
            slow +=
                " gap " + std::to_string(gap.count()) + " ms: " +
                (at == steady::time_point::max() ? std::string("never")
                                                 : std::to_string(millis(at - released)) + " ms");
        }
    }
    EXPECT_TRUE(slow.empty()) << "waiters that slept past the unlock:" << slow;
}

// ---------------------------------------------------------------------------------------------
// b. Connections killed under load: retried where safe, never two holders.

// Issue 31, item 2: a wait rides out a 2 s restart. The holder's key goes with the server's
// data; a blocking and an asynchronous waiter (default timeouts: 1 s) keep waiting through the
// refused connections and take the lock once the server is back, one after the other. Before,
// both failed with connection_failed about 2 ms after the shutdown.
TYPED_TEST(fault_test, a_wait_rides_out_a_two_second_restart_and_gets_the_lock_after_it) {
    redis_server own;
    rlock::client_options o = own.options();
    o.on_lock_lost = this->lost.handler();
    rlock::client holder(o), blocking_side(o), async_side(o);
    TypeParam mine(holder, this->name()), theirs(blocking_side, this->name()), later(async_side, this->name());
    mine.lock(30s);
    auto blocking = std::async(std::launch::async, [&]() -> std::string {
        try {
            if (!theirs.try_lock_for(20s)) return "returned false";
            theirs.unlock();
            return "got it";
        } catch (const rlock::error& e) {
            return std::string("threw: ") + e.what();
        }
    });
    std::future<rlock::hold> waited = later.async_try_lock_for(20s, rlock::use_future);
    std::this_thread::sleep_for(300ms);  // both wait for the holder
    own.kill_now();
    std::this_thread::sleep_for(2s);
    own.restart();  // empty: the holder's key is gone
    // Either may win first; the blocking one unlocks at once, the asynchronous hold here.
    ASSERT_EQ(waited.wait_for(15s), std::future_status::ready) << "the asynchronous waiter still waits";
    try {
        rlock::hold h = waited.get();
        EXPECT_TRUE(h) << "the asynchronous wait ran out";
    } catch (const rlock::error& e) {
        ADD_FAILURE() << "the asynchronous wait threw: " << e.what();
    }
    ASSERT_EQ(blocking.wait_for(15s), std::future_status::ready) << "the blocking waiter still waits";
    EXPECT_EQ(blocking.get(), "got it");
    EXPECT_NO_THROW(mine.unlock());
}

// A wait whose deadline comes while the server is still down ends with the outage's error (not
// "false", which would say the lock was held), at its deadline, not at once.
TYPED_TEST(fault_test, a_wait_whose_deadline_comes_during_an_outage_ends_then_with_its_error) {
    redis_server own;
    rlock::client holder(own.options()), other(own.options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(30s);
    const auto start = steady::now();
    auto blocking = std::async(std::launch::async, [&]() -> rlock::errc {
        try {
            (void)theirs.try_lock_for(1500ms);
            return rlock::errc{};
        } catch (const rlock::error& e) {
            return e.value();
        }
    });
    std::future<rlock::hold> waited = theirs.async_try_lock_for(1500ms, rlock::use_future);
    std::this_thread::sleep_for(200ms);
    own.kill_now();
    ASSERT_EQ(blocking.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(connection_error(blocking.get()));
    EXPECT_GE(steady::now() - start, 1400ms) << "gave up before its deadline";
    ASSERT_EQ(waited.wait_for(10s), std::future_status::ready);
    try {
        (void)waited.get();
        ADD_FAILURE() << "the asynchronous wait ended without an error";
    } catch (const rlock::error& e) {
        EXPECT_TRUE(connection_error(e.value())) << e.what();
    }
}

// The same with the server paused: nothing breaks, so no connection tells the waiters. At its
// deadline a wait tries once more, as a blocking one does, and that try's timeout is what it
// ends with. Before, the asynchronous wait completed with an empty hold ("held") at its deadline.
TYPED_TEST(fault_test, a_wait_whose_deadline_comes_while_the_server_is_paused_ends_with_its_error) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 300ms;
    rlock::client holder(o), other(o);
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(30s);
    auto blocking = std::async(std::launch::async, [&]() -> rlock::errc {
        try {
            (void)theirs.try_lock_for(1s);
            return rlock::errc{};
        } catch (const rlock::error& e) {
            return e.value();
        }
    });
    std::future<rlock::hold> waited = theirs.async_try_lock_for(1s, rlock::use_future);
    std::this_thread::sleep_for(200ms);
    own.pause();
    const bool blocking_ended = blocking.wait_for(8s) == std::future_status::ready;
    const bool async_ended = waited.wait_for(8s) == std::future_status::ready;
    own.resume();
    ASSERT_TRUE(blocking_ended);
    EXPECT_TRUE(connection_error(blocking.get()));
    ASSERT_TRUE(async_ended);
    try {
        (void)waited.get();
        ADD_FAILURE() << "the asynchronous wait ended without an error (an empty hold says the lock was held)";
    } catch (const rlock::error& e) {
        EXPECT_TRUE(connection_error(e.value())) << e.what();
    }
    EXPECT_NO_THROW(mine.unlock());
}

// Found by a probe: a blocking try_lock_for(1.5 s) on a paused server ended at 3.1 s, two
// command_timeouts past its deadline. Its first try timed out (its undo written after it on its
// connection); the next try first sent that undo again, on a new connection, and repeated it
// after the timeout. Now the written undo is owed no more: the wait ends one command_timeout
// past its deadline, and the server, once it answers, keeps nothing.
TYPED_TEST(fault_test, a_blocking_wait_on_a_paused_server_ends_one_command_timeout_past_its_deadline) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 1s;
    rlock::client c(o);
    TypeParam l(c, this->name());
    l.lock();  // a connection in the pool: the first try below is sent at once
    l.unlock();
    own.pause();
    const auto start = steady::now();
    try {
        (void)l.try_lock_for(1200ms);
        ADD_FAILURE() << "a wait on a paused server ended without an error";
    } catch (const rlock::error& e) {
        EXPECT_TRUE(connection_error(e.value())) << e.what();
    }
    const long long took = millis(steady::now() - start);
    own.resume();
    EXPECT_LT(took, 1200 + 1000 + 350) << "past its deadline by more than one command_timeout";
    EXPECT_TRUE(eventually([&] { return own.integer({"EXISTS", this->name()}) == 0; }, 3s))
        << "a try the pause left unanswered kept the lock";
}

// One client's asynchronous waits share its engine thread, where each try is a round trip:
// when their deadlines come in a pause, each one's last try waited for the paused server in
// turn, and the k-th ended k command_timeouts past its deadline (six waits of 1 s with 300 ms
// timeouts: 1.3, 1.6, ... 2.8 s). Once one try has gone unanswered, the others are not sent
// for a command_timeout: every wait ends one command_timeout past its deadline, with its error.
// Under ThreadSanitizer the waits end later now and then, together (tsan_symbolize_slack).
TYPED_TEST(fault_test, asynchronous_waits_whose_deadlines_come_in_a_pause_end_together) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 300ms;
    rlock::client holder(o), other(o);
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(30s);
    const auto start = steady::now();
    std::vector<std::future<rlock::hold>> waits;
    for (int i = 0; i < 6; ++i) waits.push_back(theirs.async_try_lock_for(1s, rlock::use_future));
    std::this_thread::sleep_for(200ms);
    own.pause();
    std::vector<long long> ended_ms;
    for (auto& w : waits) {
        if (w.wait_for(8s) != std::future_status::ready) break;
        ended_ms.push_back(millis(steady::now() - start));
        try {
            (void)w.get();
            ADD_FAILURE() << "a wait ended without an error (an empty hold says the lock was held)";
        } catch (const rlock::error& e) {
            EXPECT_TRUE(connection_error(e.value())) << e.what();
            EXPECT_NE(std::string(e.what()).find(this->name()), std::string::npos) << e.what();
        }
    }
    own.resume();
    ASSERT_EQ(ended_ms.size(), waits.size()) << "a wait did not end";
    // One command_timeout past the deadline, and scheduling; under TSan, its symbolizing too.
    const long long bound = 1000 + 300 + 400 + rlock_test::tsan_symbolize_slack.count();
    for (long long t : ended_ms) {
        EXPECT_LT(t, bound) << "past its deadline by more than one command_timeout";
    }
    EXPECT_NO_THROW(mine.unlock());
    EXPECT_TRUE(theirs.try_lock_for(5s)) << "a wait that ended left something that keeps the lock";
    theirs.unlock();
}

// An inner unlock that cannot reach the server tells the owner the hold is lost, and lost()
// says so. That verdict is final: the last unlock, made once the server answers again, finds
// the key still there and deletes it, and lost() still says true afterwards (until the thread
// locks again). Before, lost() went back to false.
template <class Lock>
void an_inner_unlock_that_failed_leaves_the_hold_lost_after_the_last(const std::string& name) {
    SCOPED_TRACE(rlock_test::kind_name<Lock>());
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 200ms;
    rlock_test::lost_log lost;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    Lock l(c, name);
    l.lock();
    l.lock();
    own.pause();
    EXPECT_NO_THROW(l.unlock());  // the inner level: told, not thrown
    own.resume();
    EXPECT_TRUE(l.lost());
    EXPECT_NO_THROW(l.unlock());
    EXPECT_TRUE(l.lost()) << "the verdict was taken back";
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(own.integer({"EXISTS", name}), 0);
    l.lock();
    EXPECT_FALSE(l.lost());
    l.unlock();
}

TEST(lost_is_final, an_inner_unlock_that_failed_leaves_the_hold_lost_after_the_last) {
    const std::string n = rlock_test::name();
    an_inner_unlock_that_failed_leaves_the_hold_lost_after_the_last<rlock::reentrant_lock>(n + ":reentrant");
    an_inner_unlock_that_failed_leaves_the_hold_lost_after_the_last<rlock::fair_lock>(n + ":fair");
    an_inner_unlock_that_failed_leaves_the_hold_lost_after_the_last<rlock::read_write_lock>(n + ":rw");
}

// A re-entry rides out a server that does not answer, as any lock() does, and adds exactly
// one level: its first try timed out, and the server ran it when it resumed, so the next try
// finds that level in place and keeps it rather than adding a second. Before, the re-entry
// threw at once.
template <class Lock>
void a_re_entry_rides_out_a_pause_and_adds_one_level(const std::string& name) {
    SCOPED_TRACE(rlock_test::kind_name<Lock>());
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 200ms;
    rlock_test::lost_log lost;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    Lock l(c, name);
    std::promise<void> held, paused;
    std::string outcome = "never returned";
    long long levels = -1;
    std::thread owner([&] {
        l.lock();
        held.set_value();
        paused.get_future().wait();
        try {
            l.lock();  // while the server is paused
            outcome = "re-entered";
        } catch (const rlock::error& e) {
            outcome = e.what();
            return;
        }
        // The levels Redis counts for this thread (its field; read_write_lock's "mode" aside).
        auto fields = own.cmd({"HGETALL", name});
        levels = 0;
        for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
            if (rlock::detail::reply_text(fields->element[i]) != "mode") {
                levels += std::stoll(std::string(rlock::detail::reply_text(fields->element[i + 1])));
            }
        }
        l.unlock();
        l.unlock();
    });
    held.get_future().wait();
    own.pause();
    paused.set_value();
    std::this_thread::sleep_for(1s);
    own.resume();
    owner.join();
    EXPECT_EQ(outcome, "re-entered");
    EXPECT_EQ(levels, 2) << "the re-entry added a level more or less than one";
    EXPECT_EQ(own.integer({"EXISTS", name}), 0);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    // The same for an asynchronous re-entry by an owner: its next try waits on a timer.
    rlock::owner me;
    rlock::hold outer = l.async_lock(me, rlock::use_future).get();
    own.pause();
    std::future<rlock::hold> inner = l.async_lock(me, rlock::use_future);
    std::this_thread::sleep_for(1s);
    own.resume();
    ASSERT_EQ(inner.wait_for(10s), std::future_status::ready);
    try {
        rlock::hold h = inner.get();
        EXPECT_TRUE(h);
        EXPECT_EQ(h.hold_id(), outer.hold_id());
        h.unlock();
    } catch (const rlock::error& e) {
        ADD_FAILURE() << "the asynchronous re-entry threw: " << e.what();
    }
    EXPECT_EQ(own.integer({"EXISTS", name}), 1) << "the inner unlock took the outer level too";
    // Cancelled while it rides the pause: it completes once, with operation_aborted; a level
    // its timed-out try added is drained by the last unlock.
    own.pause();
    std::promise<rlock::errc> cancelled;
    rlock::pending p = l.async_lock(me, [&](std::exception_ptr x, rlock::hold) {
        try {
            if (x) std::rethrow_exception(x);
            cancelled.set_value(rlock::errc{});
        } catch (const rlock::error& err) {
            cancelled.set_value(err.value());
        }
    });
    std::this_thread::sleep_for(700ms);
    p.cancel();
    std::future<rlock::errc> ended = cancelled.get_future();
    const bool ended_in_time = ended.wait_for(5s) == std::future_status::ready;
    own.resume();
    ASSERT_TRUE(ended_in_time);
    EXPECT_EQ(ended.get(), rlock::errc::operation_aborted);
    outer.unlock();
    EXPECT_EQ(own.integer({"EXISTS", name}), 0);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
}

TEST(re_entry, rides_out_a_pause_and_adds_one_level) {
    const std::string n = rlock_test::name();
    a_re_entry_rides_out_a_pause_and_adds_one_level<rlock::reentrant_lock>(n + ":reentrant");
    a_re_entry_rides_out_a_pause_and_adds_one_level<rlock::fair_lock>(n + ":fair");
    a_re_entry_rides_out_a_pause_and_adds_one_level<rlock::read_write_lock>(n + ":rw");
}

// A try while the server is paused costs one command_timeout, not three or four: the acquire's
// undo is written after it on its own connection (the server runs both, in order, when it
// resumes) instead of being sent on new connections that wait as long, and an acquire that was
// never sent (no connection could be opened) is not undone at all. Once the server resumes,
// the try's acquire and its undo have both run: another client takes the lock at once.
TYPED_TEST(fault_test, a_try_while_the_server_is_paused_costs_one_command_timeout_and_leaves_nothing) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 500ms;
    rlock::client c(o), other(o);
    TypeParam mine(c, this->name()), theirs(other, this->name());
    ASSERT_TRUE(mine.try_lock());  // scripts run on the client from now on
    mine.unlock();
    own.pause();
    std::vector<long long> took;
    for (int form = 0; form < 2; ++form) {  // a pooled connection, then a new one
        const auto start = steady::now();
        try {
            (void)mine.try_lock();
            ADD_FAILURE() << "try_lock on a paused server did not fail";
        } catch (const rlock::error& e) {
            EXPECT_TRUE(connection_error(e.value())) << e.what();
            if (e.value() == rlock::errc::timeout) {  // its cause said, not strerror(EAGAIN)
                EXPECT_NE(std::string(e.what()).find("no reply within 500 ms (client_options::command_timeout)"),
                          std::string::npos) << e.what();
            }
        }
        took.push_back(millis(steady::now() - start));
    }
    own.resume();
    for (long long ms : took) EXPECT_LT(ms, 1200) << "more than one command_timeout (500 ms) and slack";
    EXPECT_TRUE(theirs.try_lock_for(2s)) << "the paused try's acquire outlived it";
    theirs.unlock();
}

TYPED_TEST(fault_test, connection_kills_under_load_keep_mutual_exclusion) {
    auto& s = this->server();
    ensure_counter_user(s);
    rlock::client_options o = this->options(3s);
    o.pool_size = 4;
    rlock::client c(o);
    load_spec spec;
    spec.names = {this->name() + ":a", this->name() + ":b"};
    spec.threads = 4;
    spec.iterations = 100000;  // in effect: as many as fit in the time limit
    spec.limit = 3s;
    spec.counter_user = "rlock-counter";
    // lock() is documented to throw connection_failed / timeout when the retry on a new
    // connection fails too; it must never throw anything else, and unlock() must never throw.
    spec.connection_errors_allowed = true;
    load_report report;
    injector killer(s, kill_normal, 20ms);
    run_load<TypeParam>(c, s.port(), spec, report);
    killer.stop();
    SCOPED_TRACE(report.summary());
    EXPECT_TRUE(report.unexpected.empty());
    EXPECT_GT(killer.hits(), 10) << "too few connections were killed to test anything";
    EXPECT_GE(report.total_sections() * 2, report.attempts)
        << "most lock() calls should survive a kill by retrying on a new connection";
    expect_counters_match(s, report);
    // And the client works again afterwards (an unreleased key lives at most its 3 s lease).
    for (const auto& n : spec.names) {
        TypeParam again(c, n);
        EXPECT_TRUE(again.try_lock_for(6s)) << n;
        again.unlock();
    }
    std::printf("[   info   ] %s: %lld connections killed; %s; %d holds reported lost%s%s\n",
                kind_name<TypeParam>().c_str(), killer.hits(), report.summary().c_str(),
                this->lost.calls.load(), this->lost.calls > 0 ? ", last: " : "",
                this->last_lost_message().c_str());
}

TYPED_TEST(fault_test, a_watched_hold_survives_connection_kills_more_frequent_than_renewals) {
    // Renewal is idempotent (compare-and-pexpire), so a renewal that meets a connection killed
    // since the last tick is safe to retry on a new one. Kills every 100 ms, ticks every
    // 500 ms, lease 1.5 s: each kill costs one connection, never the hold. (A 900 ms lease
    // left too little margin for reconnects on an overloaded 2-core machine.)
    auto& s = this->server();
    rlock::client c(this->options(1500ms));
    TypeParam lock(c, this->name());
    lock.lock();
    {
        injector killer(s, kill_normal, 100ms);
        const auto end = steady::now() + 3s;
        while (steady::now() < end && !lock.lost()) std::this_thread::sleep_for(20ms);
        killer.stop();
        EXPECT_GT(killer.hits(), 5) << "the watchdog connection was never killed";
    }
    EXPECT_FALSE(lock.lost());
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 1);
    EXPECT_NO_THROW(lock.unlock());
}

// ---------------------------------------------------------------------------------------------
// c. SCRIPT FLUSH: NOSCRIPT is answered by EVAL, invisibly.

TYPED_TEST(fault_test, script_flush_in_a_loop_under_load_is_invisible) {
    auto& s = this->server();
    rlock::client c(this->options(300ms));  // renewals every 100 ms, across the flushes
    TypeParam held(c, this->name() + ":held", rlock::lock_options{true});
    held.lock();
    load_spec spec;
    spec.names = {this->name() + ":a", this->name() + ":b"};
    spec.threads = 4;
    spec.iterations = 30;
    spec.fence_even_threads = true;  // a mutex with fencing acquires by script too
    load_report report;
    injector flusher(s, {"SCRIPT", "FLUSH"}, 2ms);
    run_load<TypeParam>(c, s.port(), spec, report);
    std::this_thread::sleep_for(350ms);  // a few more renewals of `held` after flushes
    flusher.stop();
    SCOPED_TRACE(report.summary());
    EXPECT_TRUE(report.unexpected.empty());
    EXPECT_TRUE(report.refused.empty());
    EXPECT_EQ(report.total_sections(), spec.threads * spec.iterations);
    EXPECT_GT(flusher.runs(), 20);
    expect_counters_match(s, report);
    EXPECT_FALSE(held.lost());
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
    held.unlock();
    EXPECT_EQ(s.integer({"EXISTS", held.name()}), 0);
}

// ---------------------------------------------------------------------------------------------
// d. FLUSHALL while held.

TYPED_TEST(fault_test, flushall_while_held_is_reported_lost_once_and_unlock_does_not_throw) {
    auto& s = this->server();
    rlock::client c(this->options(300ms));
    TypeParam lock(c, this->name());
    lock.lock();
    EXPECT_FALSE(lock.lost());
    s.cmd({"FLUSHALL"});
    ASSERT_TRUE(eventually([&] { return this->lost.calls.load() > 0; }, 3s));
    EXPECT_TRUE(lock.lost());
    EXPECT_EQ(this->lost.code, static_cast<int>(rlock::errc::lock_lost));
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 0) << "renewal re-created the lock";
    EXPECT_NO_THROW(lock.unlock());
    std::this_thread::sleep_for(400ms);  // more ticks: no second report
    EXPECT_EQ(this->lost.calls, 1);
    EXPECT_TRUE(lock.lost());  // until this thread locks again
    EXPECT_TRUE(lock.try_lock());
    EXPECT_FALSE(lock.lost());
    lock.unlock();
    EXPECT_EQ(this->lost.calls, 1);
}

// ---------------------------------------------------------------------------------------------
// e. Ambiguous acquire: the server stalls (DEBUG SLEEP) past the command timeout while it still
// has the acquire to run. The caller gets an error or a hold that really is its own; nothing
// of it outlives its lease.

/// Runs DEBUG SLEEP on its own connection; join() returns once the server is awake again.
class stall {
public:
    stall(const redis_server& s, double seconds)
        : thread_([port = s.port(), seconds] {
              auto c = raw_connection(port);
              rlock::detail::command(c.get(), {"DEBUG", "SLEEP", std::to_string(seconds)});
          }) {
        std::this_thread::sleep_for(50ms);  // the server is asleep before the caller sends
    }
    stall(const stall&) = delete;
    stall& operator=(const stall&) = delete;
    ~stall() { join(); }
    void join() {
        if (thread_.joinable()) thread_.join();
    }

private:
    std::thread thread_;
};

TYPED_TEST(fault_test, an_ambiguous_acquire_is_an_error_or_a_real_hold_and_expires_with_its_lease) {
    auto& s = this->server();
    constexpr auto lease = 1500ms;
    rlock::client_options o = this->options(lease);  // watched holds: the same lease
    o.command_timeout = 100ms;
    o.connect_timeout = 300ms;
    rlock::client c(o), observer(this->options());
    TypeParam lock(c, this->name()), other(observer, this->name());
    lock.lock();  // scripts cached and the pool warm, so only the stall is new
    lock.unlock();
    for (const double stall_seconds : {0.5, 0.2}) {
        for (const bool watched : {false, true}) {
            SCOPED_TRACE("stall " + std::to_string(stall_seconds) + " s, " +
                         (watched ? "watched" : "leased"));
            bool held = false;
            std::string failure;
            {
                stall asleep(s, stall_seconds);
                try {
                    if (watched) {
                        lock.lock();
                    } else {
                        lock.lock(lease);
                    }
                    held = true;
                } catch (const rlock::error& e) {
                    failure = e.what();
                    EXPECT_TRUE(connection_error(e.value())) << e.what();
                }
            }  // the server is awake again
            const auto woke = steady::now();
            if (held) {
                // "Acquired" must mean the key is ours.
                EXPECT_TRUE(lock.is_held_by_current_thread());
                EXPECT_FALSE(other.try_lock());
                EXPECT_FALSE(lock.lost());
                lock.unlock();
                EXPECT_EQ(s.integer({"EXISTS", this->name()}), 0);
            } else {
                EXPECT_FALSE(lock.lost());  // nothing was recorded as held
                const long long pttl = s.integer({"PTTL", this->name()});
                EXPECT_LE(pttl, lease.count()) << "a key without expiry or past its lease";
                std::printf("[   info   ] %s: acquire failed (%s); key %s after the stall\n",
                            kind_name<TypeParam>().c_str(), failure.c_str(),
                            pttl == -2 ? "already gone (compensated)" : "left to its lease");
            }
            // Nothing of the ambiguous acquire outlives its lease (counted from the wake-up).
            EXPECT_TRUE(eventually(
                [&] {
                    return s.integer({"EXISTS", this->name()}) == 0;
                },
                lease + 1s))
                << "the key outlived its lease";
            EXPECT_LT(steady::now() - woke, lease + 1500ms);
            EXPECT_TRUE(other.try_lock());
            other.unlock();
        }
    }
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

TYPED_TEST(fault_test, an_ambiguous_acquire_on_a_held_lock_does_not_block_it_past_the_leases) {
    // B's acquire reaches the server while A holds the lock (fair_lock: it joins the queue), B
    // times out, and nothing can be undone while the server sleeps. After A's lease (and, for
    // the fair lock, B's queue deadline: fair_lock_wait_timeout) a third client gets in.
    auto& s = this->server();
    constexpr auto lease = 1500ms;
    constexpr auto wait_timeout = 2s;
    rlock::client a(this->options()), third(this->options());
    rlock::client_options ob = this->options();
    ob.command_timeout = 100ms;
    ob.connect_timeout = 300ms;
    rlock::client b(ob);
    rlock::lock_options lo;
    lo.fair_lock_wait_timeout = wait_timeout;
    TypeParam la(a, this->name()), lb(b, this->name(), lo), lc(third, this->name(), lo);
    la.lock(lease);
    EXPECT_FALSE(lb.try_lock());  // scripts cached, pool warm
    const auto start = steady::now();
    {
        stall asleep(s, 0.5);
        try {
            // Either the ambiguity surfaces as an error, or (once the compensating release got
            // through after the stall) the retried acquire waits its turn and gets a real hold,
            // necessarily after A's lease.
            lb.lock();
            EXPECT_GE(steady::now() - start, lease - 100ms) << "locked while A still held it";
            EXPECT_TRUE(lb.is_held_by_current_thread());
            lb.unlock();
        } catch (const rlock::error& e) {
            EXPECT_TRUE(connection_error(e.value())) << e.what();
        }
    }
    EXPECT_FALSE(lb.lost());
    const auto bound =
        lease + (std::is_same_v<TypeParam, rlock::fair_lock> ? wait_timeout : 0ms) + 2s;
    EXPECT_TRUE(lc.try_lock_for(bound)) << "the lock stayed blocked after every lease ran out";
    const auto waited = steady::now() - start;
    EXPECT_LT(waited, bound) << millis(waited) << " ms";
    lc.unlock();
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

// ---------------------------------------------------------------------------------------------
// f. Odd names work byte for byte; refused input sends nothing; durations do not overflow.

TYPED_TEST(fault_test, odd_lock_names_round_trip_byte_for_byte) {
    auto& s = this->server();
    const std::vector<std::pair<std::string, std::string>> names = {
        {"spaces", " a lock  with spaces "},
        {"braces", "{a}b"},
        {"unbalanced braces", "}{x{"},
        {"lua quotes", "x']]'); redis.call('set', 'pwned', '1') --"},
        {"binary", std::string("b\0i\xff"
                               "n\r\n",
                               7)},
        {"1 MB", std::string(1 << 20, 'm') + "!"},
    };
    rlock::client one(this->options()), two(this->options());
    for (const auto& [what, n] : names) {
        SCOPED_TRACE(what);
        ASSERT_EQ(s.integer({"EXISTS", n}), 0);
        TypeParam mine(one, n), theirs(two, n);
        ASSERT_NO_THROW(mine.lock());
        EXPECT_EQ(s.integer({"EXISTS", n}), 1) << "the key is not the name, byte for byte";
        EXPECT_EQ(s.text({"TYPE", n}), is_hash_kind<TypeParam>() ? "hash" : "string");
        if (what == "binary") {
            EXPECT_EQ(s.integer({"EXISTS", std::string("b")}), 0) << "cut at the NUL";
        }
        EXPECT_TRUE(mine.is_held_by_current_thread());
        EXPECT_GT(mine.remaining_lease(), 0ms);
        EXPECT_FALSE(theirs.try_lock());
        // A waiter on another client wakes on the unlock message: the channel name carries the
        // lock name intact too (a mangled one would leave it waiting for the 30 s lease).
        std::promise<steady::time_point> acquired;
        std::thread waiter([&] {
            const bool got = theirs.try_lock_for(5s);
            acquired.set_value(got ? steady::now() : steady::time_point::max());
            if (got) theirs.unlock();
        });
        std::this_thread::sleep_for(200ms);
        const auto released = steady::now();
        mine.unlock();
        const auto at = acquired.get_future().get();
        waiter.join();
        ASSERT_NE(at, steady::time_point::max()) << "the waiter never got the lock";
        EXPECT_LT(at - released, 1500ms);
        EXPECT_EQ(s.integer({"EXISTS", n}), 0);
        EXPECT_EQ(s.integer({"EXISTS", "redisson_lock_queue:{" + n + "}"}), 0);
        EXPECT_EQ(s.integer({"EXISTS", "redisson_lock_timeout:{" + n + "}"}), 0);
    }
    EXPECT_EQ(s.integer({"EXISTS", "pwned"}), 0);
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

TYPED_TEST(fault_test, refused_input_is_invalid_argument_and_sends_nothing) {
    auto& s = this->server();
    rlock::client c(this->options());
    TypeParam lock(c, this->name());
    std::this_thread::sleep_for(100ms);  // the subscriber has connected (it sends nothing)
    s.cmd({"CONFIG", "RESETSTAT"});
    const std::vector<std::pair<std::string, std::function<void()>>> refused = {
        {"empty name", [&] { TypeParam unnamed(c, ""); }},
        {"lock(0ms)", [&] { lock.lock(0ms); }},
        {"lock(-1s)", [&] { lock.lock(-1s); }},
        {"lock(0ns)", [&] { lock.lock(std::chrono::nanoseconds(0)); }},
        {"lock(-0.5 s as double)", [&] { lock.lock(std::chrono::duration<double>(-0.5)); }},
        {"try_lock_for(1s, 0ms)", [&] { (void)lock.try_lock_for(1s, 0ms); }},
        {"try_lock_for(1s, -5ms)", [&] { (void)lock.try_lock_for(1s, -5ms); }},
        {"try_lock_until(+1s, hours::min())",
         [&] { (void)lock.try_lock_until(steady::now() + 1s, std::chrono::hours::min()); }},
    };
    for (const auto& [what, call] : refused) {
        try {
            call();
            ADD_FAILURE() << what << " was accepted";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << what << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(c.server()), std::string::npos) << e.what();
        }
    }
    EXPECT_EQ(commands_besides_bookkeeping(s), "") << "refused input reached the server";
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 0);
}

TYPED_TEST(fault_test, a_huge_lease_is_refused_or_kept_never_cut_short_or_left_without_expiry) {
    auto& s = this->server();
    rlock::client c(this->options());
    TypeParam lock(c, this->name());
    const std::vector<std::pair<std::string, std::function<void()>>> leases = {
        {"hours::max()", [&] { lock.lock(std::chrono::hours::max()); }},
        {"milliseconds::max()", [&] { lock.lock(std::chrono::milliseconds::max()); }},
        {"1000 years", [&] { lock.lock(std::chrono::hours(24 * 365 * 1000)); }},
    };
    for (const auto& [what, call] : leases) {
        SCOPED_TRACE(what);
        s.cmd({"CONFIG", "RESETSTAT"});
        bool held = false;
        try {
            call();
            held = true;
        } catch (const rlock::error& e) {
            // Refused with a clear error (invalid_argument up front, or the server's own
            // "invalid expire time"), and then nothing may be left behind (checked below).
            std::printf("[   info   ] %s %s: refused (%s; sent: %s)\n",
                        kind_name<TypeParam>().c_str(), what.c_str(), e.what(),
                        commands_besides_bookkeeping(s).c_str());
        }
        const long long pttl = s.integer({"PTTL", this->name()});
        if (held) {
            EXPECT_GT(pttl, 3600 * 1000LL) << "the lease was cut to " << pttl << " ms";
            EXPECT_FALSE(lock.lost());
            EXPECT_NO_THROW(lock.unlock());
        }
        EXPECT_NE(pttl, -1) << "a lock key without expiry: it would never be freed";
        if (!held) {
            EXPECT_EQ(pttl, -2) << "a refused lock left its key behind";
        }
        s.cmd({"DEL", this->name()});  // whatever happened, the next case starts clean
    }
}

TYPED_TEST(fault_test, an_unbounded_wait_does_not_overflow_and_waits_for_the_unlock) {
    rlock::client holder_client(this->options()), c(this->options());
    TypeParam waiter(c, this->name());
    const std::vector<std::pair<std::string, std::function<bool()>>> waits = {
        {"try_lock_for(hours::max())",
         [&] { return waiter.try_lock_for(std::chrono::hours::max()); }},
        {"try_lock_for(nanoseconds::max())",
         [&] { return waiter.try_lock_for(std::chrono::nanoseconds::max()); }},
        {"try_lock_for(1e300 s)",
         [&] { return waiter.try_lock_for(std::chrono::duration<double>(1e300)); }},
        {"try_lock_until(system_clock max)",
         [&] { return waiter.try_lock_until(std::chrono::system_clock::time_point::max()); }},
        {"try_lock_until(steady_clock max)",
         [&] { return waiter.try_lock_until(steady::time_point::max()); }},
        {"try_lock_for(hours::max(), 10s)",
         [&] { return waiter.try_lock_for(std::chrono::hours::max(), 10s); }},
    };
    for (const auto& [what, call] : waits) {
        SCOPED_TRACE(what);
        std::promise<void> locked;
        std::thread holder([&] {
            TypeParam h(holder_client, this->name());
            h.lock(20s);
            locked.set_value();
            std::this_thread::sleep_for(200ms);
            h.unlock();
        });
        locked.get_future().wait();
        const auto start = steady::now();
        const bool got = call();
        const auto waited = steady::now() - start;
        holder.join();
        EXPECT_TRUE(got) << "gave up after " << millis(waited) << " ms";
        EXPECT_GE(waited, 100ms) << "did not wait for the holder";
        EXPECT_LT(waited, 3s);
        if (got) waiter.unlock();
    }
}

TYPED_TEST(fault_test, a_deadline_in_the_far_past_gives_up_at_once) {
    rlock::client holder_client(this->options()), c(this->options());
    TypeParam holder(holder_client, this->name()), waiter(c, this->name());
    using sys = std::chrono::system_clock;
    const std::vector<std::pair<std::string, std::function<bool()>>> waits = {
        {"try_lock_for(hours::min())",
         [&] { return waiter.try_lock_for(std::chrono::hours::min()); }},
        {"try_lock_for(nanoseconds::min())",
         [&] { return waiter.try_lock_for(std::chrono::nanoseconds::min()); }},
        {"try_lock_for(-1s)", [&] { return waiter.try_lock_for(-1s); }},
        {"try_lock_until(system_clock now - 1h)",
         [&] { return waiter.try_lock_until(sys::now() - 1h); }},
        {"try_lock_until(steady_clock min)",
         [&] { return waiter.try_lock_until(steady::time_point::min()); }},
        {"try_lock_until(system_clock min)",
         [&] { return waiter.try_lock_until(sys::time_point::min()); }},
    };
    for (const auto& [what, call] : waits) {
        SCOPED_TRACE(what);
        holder.lock(3s);  // a wait gone wrong ends with this lease
        const auto start = steady::now();
        std::promise<bool> result;
        std::thread t([&] {
            const bool got = call();
            if (got) waiter.unlock();
            result.set_value(got);
        });
        const bool got = result.get_future().get();
        t.join();
        const auto waited = steady::now() - start;
        EXPECT_FALSE(got) << "took the lock after " << millis(waited) << " ms";
        EXPECT_LT(waited, 1s) << "waited " << millis(waited) << " ms for a past deadline";
        holder.unlock();
    }
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

// ---------------------------------------------------------------------------------------------
// g. Names are KEYS/ARGV, never script text: the script cache does not grow with them.

TYPED_TEST(fault_test, the_script_cache_does_not_grow_with_the_number_of_lock_names) {
    auto& s = this->server();
    s.cmd({"SCRIPT", "FLUSH"});
    rlock::client c(this->options(600ms));  // a renewal tick every 200 ms
    std::vector<std::unique_ptr<TypeParam>> locks;
    for (int i = 0; i < 200; ++i) {
        const std::string n = this->name() + ":" + std::to_string(i) + (i % 7 ? "" : "'\"]]");
        locks.push_back(std::make_unique<TypeParam>(c, n, rlock::lock_options{i % 2 == 0}));
        locks.back()->lock();
    }
    std::this_thread::sleep_for(450ms);  // renewals of all 200
    for (auto& l : locks) {
        EXPECT_FALSE(l->lost());
        l->unlock();
    }
    // A waiter path too (PTTL / queue scripts).
    rlock::client other(this->options());
    TypeParam a(c, this->name() + ":contended"), b(other, this->name() + ":contended");
    a.lock();
    std::thread t([&] {
        if (b.try_lock_for(3s)) b.unlock();
    });
    std::this_thread::sleep_for(100ms);
    a.unlock();
    t.join();
    const long long cached = info_value(s.text({"INFO", "memory"}), "number_of_cached_scripts");
    EXPECT_GE(cached, 1) << "no script ran: the check proves nothing";
    EXPECT_LE(cached, 20) << "lock names reached the script text";
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

// ---------------------------------------------------------------------------------------------
// i. An ACL user without scripts, or without the lock's keys: NOPERM, reported as such.

TYPED_TEST(fault_test, a_user_without_scripting_gets_auth_failed_naming_noperm_and_leaves_nothing) {
    auto& s = this->server();
    set_acl_user(s, {"noscript", "reset", "on", ">pw", "~*", "&*", "+@all", "-@scripting"});
    rlock::client_options o = this->options();
    o.username = "noscript";
    o.password = "pw";
    rlock::client c(o);
    for (const bool fenced : {true, false}) {
        const std::string n = this->name() + (fenced ? ":fenced" : ":plain");
        SCOPED_TRACE(n);
        TypeParam lock(c, n, rlock::lock_options{fenced});
        try {
            lock.lock();
            ADD_FAILURE() << "locked although this user may not run the release script";
            lock.unlock();  // reports to on_lock_lost, leaves the key to its lease
            std::printf("[   info   ] unlock without EVALSHA reported: %s\n",
                        this->last_lost_message().c_str());
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::auth_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
        }
        EXPECT_EQ(s.integer({"EXISTS", n}), 0) << "left in Redis";
        s.cmd({"DEL", n});
    }
}

TYPED_TEST(fault_test, a_user_without_access_to_the_key_gets_auth_failed_naming_noperm) {
    auto& s = this->server();
    set_acl_user(s, {"narrow", "reset", "on", ">pw", "~app:*", "&*", "+@all"});
    rlock::client_options o = this->options();
    o.username = "narrow";
    o.password = "pw";
    rlock::client c(o);
    const std::string n = "other:" + this->name();
    TypeParam lock(c, n);
    try {
        lock.lock();
        ADD_FAILURE() << "locked a key outside the user's key patterns";
        lock.unlock();
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::auth_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.integer({"EXISTS", n}), 0);
}

// ---------------------------------------------------------------------------------------------
// j. Misuse: unlock twice; a lock object destroyed while held.

TYPED_TEST(fault_test, a_second_unlock_throws_not_owner_and_leaves_the_next_holder_alone) {
    rlock::client c(this->options()), other(this->options());
    TypeParam lock(c, this->name()), theirs(other, this->name());
    lock.lock();
    lock.unlock();
    theirs.lock();
    try {
        lock.unlock();
        FAIL() << "a second unlock did not throw";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::not_owner) << e.what();
    }
    EXPECT_TRUE(theirs.is_held_by_current_thread());
    theirs.unlock();
    if constexpr (is_reentrant_kind<TypeParam>()) {
        lock.lock();
        lock.lock();
        lock.unlock();
        EXPECT_TRUE(lock.is_held_by_current_thread());
        lock.unlock();
        EXPECT_THROW(lock.unlock(), rlock::error);
        EXPECT_FALSE(lock.is_locked());
    }
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

// A waiter's deadline that ends just as the release message arrives: whichever wins, the waiter
// holds the lock or nothing, no subscription stays on the server and no queue entry (fair_lock)
// is left. The holder's unlock is timed to land on the waiter's deadline, give or take a few
// milliseconds either way, over many rounds.
TYPED_TEST(fault_test, a_deadline_ending_as_the_release_arrives_leaks_no_subscription_or_queue_entry) {
    auto& s = this->server();
    rlock::client c(this->options()), other(this->options());
    TypeParam holder(c, this->name());
    int got = 0, missed = 0;
    for (int round = 0; round < 24; ++round) {
        holder.lock();
        const auto wait = 40ms + std::chrono::milliseconds(round % 8);  // the deadline moves
        std::promise<void> started;
        std::thread waiter([&] {
            TypeParam w(other, this->name());
            started.set_value();
            if (w.try_lock_for(wait)) {
                ++got;
                w.unlock();
            } else {
                ++missed;
            }
        });
        started.get_future().wait();
        std::this_thread::sleep_for(40ms + std::chrono::milliseconds(3));
        holder.unlock();
        waiter.join();
    }
    // Which side wins each round depends on the machine; both outcomes must leave nothing.
    std::printf("[   info   ] %s: %d rounds got the lock, %d gave up\n",
                kind_name<TypeParam>().c_str(), got, missed);
    EXPECT_EQ(got + missed, 24);
    EXPECT_TRUE(eventually([&] {
        auto channels = s.cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels});
        return channels && channels->type == REDIS_REPLY_ARRAY && channels->elements == 0;
    })) << "a subscription outlived its waiter";
    EXPECT_EQ(keys_left(s), "") << "keys left in Redis (a queue entry?)";
    EXPECT_FALSE(holder.is_locked());
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

TYPED_TEST(fault_test, a_lock_object_destroyed_while_held_leaves_a_leased_hold_to_its_lease) {
    auto& s = this->server();
    rlock::client c(this->options()), other(this->options());
    {
        TypeParam lock(c, this->name());
        lock.lock(600ms);
    }  // destroyed while held: no unlock, no crash
    TypeParam theirs(other, this->name());
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 1);
    EXPECT_FALSE(theirs.try_lock());
    EXPECT_TRUE(eventually(
        [&] {
            return s.integer({"EXISTS", this->name()}) == 0;
        },
        2s))
        << "the key outlived its lease";
    EXPECT_TRUE(theirs.try_lock_for(2s));
    theirs.unlock();
    // The hold belongs to (client, thread, name), not to the object: a new object sees it,
    // lost by now, and may unlock it without error.
    TypeParam again(c, this->name());
    EXPECT_TRUE(again.lost());
    EXPECT_NO_THROW(again.unlock());
    EXPECT_FALSE(again.lost());
    EXPECT_TRUE(again.try_lock());
    again.unlock();
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

TYPED_TEST(fault_test, a_watched_hold_outlives_its_lock_object_until_unlocked_by_name) {
    auto& s = this->server();
    rlock::client c(this->options(600ms));
    {
        TypeParam lock(c, this->name());
        lock.lock();
    }
    std::this_thread::sleep_for(1200ms);  // two leases: still renewed
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 1);
    TypeParam again(c, this->name());
    EXPECT_FALSE(again.lost());
    EXPECT_TRUE(again.is_held_by_current_thread());
    again.unlock();
    EXPECT_EQ(s.integer({"EXISTS", this->name()}), 0);
    EXPECT_EQ(this->lost.calls, 0) << this->last_lost_message();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// h. A port that is not Redis: construction fails fast with the server in the message.

namespace {

/// A TCP listener on a free loopback port that speaks something other than RESP.
class fake_server {
public:
    enum class mode { http_400, silent, close_at_once };

    explicit fake_server(mode m) : mode_(m), fd_(rlock_test::loopback_listener(0, 16)) {
        if (fd_ < 0) throw std::runtime_error("fake_server: cannot listen");
        sockaddr_in a{};
        socklen_t len = sizeof a;
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    fake_server(const fake_server&) = delete;
    fake_server& operator=(const fake_server&) = delete;
    ~fake_server() {
        stop_ = true;
        thread_.join();
        for (int c : open_) ::close(c);
        ::close(fd_);
    }
    int port() const { return port_; }
    int accepted() const { return accepted_; }

private:
    void serve() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) continue;
            ++accepted_;
            if (mode_ == mode::http_400) {
                // Read the request first, so that closing sends FIN, not RST.
                pollfd q{c, POLLIN, 0};
                char buf[256];
                if (::poll(&q, 1, 2000) > 0) (void)::read(c, buf, sizeof buf);
                const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
                (void)::write(c, reply, sizeof reply - 1);
                ::close(c);
            } else if (mode_ == mode::close_at_once) {
                ::close(c);
            } else {
                open_.push_back(c);  // accepted, never answered
            }
        }
    }

    mode mode_;
    int fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> accepted_{0};
    std::vector<int> open_;
    std::thread thread_;
};

TEST(fault_connect, a_port_that_is_not_redis_fails_fast_with_a_clear_error_naming_it) {
    const std::vector<std::tuple<std::string, fake_server::mode, rlock::errc>> cases = {
        {"HTTP server", fake_server::mode::http_400, rlock::errc::protocol_error},
        {"silent server", fake_server::mode::silent, rlock::errc::timeout},
        {"server closing at once", fake_server::mode::close_at_once,
         rlock::errc::connection_failed},
    };
    for (const auto& [what, mode, expected] : cases) {
        SCOPED_TRACE(what);
        fake_server fake(mode);
        rlock::client_options o;
        o.host = "127.0.0.1";
        o.port = fake.port();
        o.connect_timeout = 300ms;
        o.command_timeout = 300ms;
        const auto start = steady::now();
        try {
            rlock::client c(o);
            ADD_FAILURE() << "a client was made on a port that is not Redis";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), expected) << e.what();
            EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(fake.port())),
                      std::string::npos)
                << e.what();
        }
        const auto took = steady::now() - start;
        EXPECT_LT(took, 3s) << millis(took) << " ms";
        EXPECT_GE(fake.accepted(), 1) << "the fake server was never reached";
    }
}


// ---- Losses told at once (issue 34, loss_watch.hpp) ----------------------------------------

template <class Lock>
class loss_told : public rlock_test::kind_fixture<loss_told<Lock>> {};
TYPED_TEST_SUITE(loss_told, rlock_test::lock_kinds, rlock_test::kind_names);

/// How long after `fault()` the owner of `held` was told (on_lock_lost), or 20 s.
template <class Lock, class Fault>
std::chrono::milliseconds told_after(Lock& held, rlock_test::lost_log& lost, Fault fault) {
    const int before = lost.calls.load();
    // Past arm_delay: the hold's key is read on the watchdog's tracked connection.
    std::this_thread::sleep_for(150ms);
    const auto start = steady::now();
    fault();
    eventually([&] { return lost.calls.load() > before; }, 20s);
    EXPECT_TRUE(held.lost());
    return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start);
}

// With the watchdog at its default 30 s (a tick every 10 s), a hold whose key is deleted,
// flushed or overwritten by another holder is told at once: the server's invalidation makes
// the watchdog renew it, and the renewal finds it gone. Before, the owner heard at the next
// tick, up to 10 s later. (Bound 2 s: far under a tick, far over a loaded machine's delay.)
TYPED_TEST(loss_told, a_deleted_flushed_or_overwritten_hold_is_told_at_once) {
    rlock::client c(this->options());
    const std::string name = this->name();
    TypeParam a(c, name), b(c, name + ":2"), d(c, name + ":3");
    a.lock();
    EXPECT_LT(told_after(a, this->lost, [&] { this->server().cmd({"DEL", name}); }), 2s);
    a.unlock();
    b.lock();
    EXPECT_LT(told_after(b, this->lost, [&] { this->server().cmd({"FLUSHALL"}); }), 2s);
    b.unlock();
    d.lock();
    EXPECT_LT(told_after(d, this->lost, [&] {
                  this->server().cmd({"DEL", name + ":3"});
                  this->server().cmd({"SET", name + ":3", "another holder's token", "PX", "30000"});
              }),
              2s);
    d.unlock();
}

// Another client's waiter behind a hold whose key was deleted gets the lock as soon as the
// holder unlocks (the unlock finds its hold gone: told, and, the lock being free, its waiters
// woken as a release would), not at the holder's TTL it last read (30 s). Before, the release
// that found nothing published nothing, and the waiter slept to its deadline (a probe's find:
// 30 s for every kind).
TYPED_TEST(loss_told, a_waiter_gets_the_lock_once_the_holder_unlocks_a_deleted_hold) {
    rlock::client holder(this->options()), waiter(this->options());
    const std::string name = this->name();
    TypeParam held(holder, name), wanted(waiter, name);
    held.lock();
    auto got = std::async(std::launch::async, [&] {
        const bool ok = wanted.try_lock_for(20s);
        if (ok) wanted.unlock();
        return ok;
    });
    std::this_thread::sleep_for(300ms);  // waiting behind the holder's lease
    EXPECT_LT(told_after(held, this->lost, [&] { this->server().cmd({"DEL", name}); }), 2s);
    held.unlock();
    ASSERT_EQ(got.wait_for(5s), std::future_status::ready) << "the waiter slept on behind a hold that is gone";
    EXPECT_TRUE(got.get());
}

// A leased hold (never renewed) is armed too: a key deleted or overwritten before its lease
// ends is told at once, found by a check that writes nothing; a lease that simply runs out
// (the key expires: an invalidation too) is not a loss.
TYPED_TEST(loss_told, a_leased_hold_is_told_at_once_and_its_lease_running_out_is_no_loss) {
    rlock::client c(this->options());
    const std::string name = this->name();
    TypeParam a(c, name), b(c, name + ":2");
    a.lock(30s);
    EXPECT_LT(told_after(a, this->lost, [&] { this->server().cmd({"DEL", name}); }), 2s);
    a.unlock();
    const int told = this->lost.calls.load();
    b.lock(700ms);
    std::this_thread::sleep_for(1200ms);  // armed, then expired
    EXPECT_EQ(this->server().integer({"EXISTS", name + ":2"}), 0);
    EXPECT_EQ(this->lost.calls.load(), told) << this->last_lost_message();
    b.unlock();
}

// No false loss where an invalidation does not mean the hold is gone: the holder's own
// re-entries and renewals, another client refused, the same name in another database, a flush
// of another database. Each is an invalidation (or none), verified by a renewal that finds the
// hold still there.
TYPED_TEST(loss_told, changes_that_leave_the_hold_in_place_are_not_losses) {
    rlock::client_options o = this->options(600ms);  // renewed every 200 ms
    rlock::client c(o), other(this->options());
    const std::string name = this->name();
    TypeParam a(c, name), rival(other, name);
    a.lock();
    std::this_thread::sleep_for(150ms);
    if constexpr (std::is_same_v<TypeParam, rlock::reentrant_lock> || std::is_same_v<TypeParam, rlock::fair_lock>) {
        a.lock();  // a re-entry: a write to the key by the holder's own pooled connection
        a.unlock();
    }
    EXPECT_FALSE(rival.try_lock_for(100ms));
    auto db1 = rlock_test::raw_connection(this->server().port());
    ASSERT_TRUE(rlock::detail::command(db1.get(), {"SELECT", "1"}));
    ASSERT_TRUE(rlock::detail::command(db1.get(), {"SET", name, "x"}));
    ASSERT_TRUE(rlock::detail::command(db1.get(), {"DEL", name}));
    ASSERT_TRUE(rlock::detail::command(db1.get(), {"FLUSHDB"}));
    std::this_thread::sleep_for(700ms);  // three renewals more
    EXPECT_FALSE(a.lost());
    EXPECT_EQ(this->lost.calls.load(), 0) << this->last_lost_message();
    a.unlock();
}

// A read_write_lock's read side and a permit are told at once too; another reader joining the
// hash the holder reads is not a loss.
TEST(loss_told_more, a_read_hold_and_a_permit_are_told_at_once_and_a_new_reader_is_no_loss) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o), other(s.options());
    rlock::read_write_lock rw(c, "told:rw"), rw2(other, "told:rw");
    rw.lock_shared();
    std::this_thread::sleep_for(150ms);
    rw2.lock_shared();  // another reader: the hash changes
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    rw2.unlock_shared();
    auto start = steady::now();
    s.cmd({"DEL", "told:rw"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 20s));
    EXPECT_LT(steady::now() - start, 2s);
    rw.unlock_shared();

    rlock::permit_expirable_semaphore sem(c, "told:permits");
    ASSERT_TRUE(sem.try_set_permits(2));
    rlock::permit p = sem.acquire();
    std::this_thread::sleep_for(150ms);
    start = steady::now();
    s.cmd({"DEL", "{told:permits}:timeout"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 2; }, 20s));
    EXPECT_LT(steady::now() - start, 2s);
    EXPECT_TRUE(p.lost());
}

// loss_tracking off: the server tracks nothing for the client (no tracking client), and a
// deleted hold is still found — by the watchdog's renewal. With it on (the default), the same
// server counts the client as a tracking client.
// A leased mutex whose key another connection rewrites unchanged (value and TTL kept) is no
// loss: the check finds it still held, and renews nothing — its TTL keeps running down. A
// leased permit deleted is told at once.
TEST(loss_told_more, a_leased_hold_left_in_place_is_no_loss_and_a_leased_permit_is_told_at_once) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "told:leased");
    m.lock(3s);
    std::this_thread::sleep_for(150ms);  // armed
    auto raw = rlock_test::raw_connection(s.port());
    rlock::detail::reply_ptr token = rlock::detail::command(raw.get(), {"GET", "told:leased"});
    ASSERT_TRUE(token && token->type == REDIS_REPLY_STRING);
    ASSERT_TRUE(rlock::detail::command(raw.get(), {"SET", "told:leased", rlock::detail::reply_text(token.get()), "KEEPTTL"}));
    std::this_thread::sleep_for(300ms);  // the invalidation's check
    EXPECT_FALSE(m.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_LT(s.integer({"PTTL", "told:leased"}), 2600) << "the check renewed the lease";
    m.unlock();

    rlock::permit_expirable_semaphore sem(c, "told:leased-permits");
    ASSERT_TRUE(sem.try_set_permits(2));
    rlock::permit p = sem.acquire(30s);
    std::this_thread::sleep_for(150ms);
    const auto start = steady::now();
    s.cmd({"DEL", "{told:leased-permits}:timeout"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 20s));
    EXPECT_LT(steady::now() - start, 2s);
    EXPECT_TRUE(p.lost());
}

// A read hold's count overwritten with what rlock never writes (a fraction, text, the int64
// limit) is someone else's write, not the hold gone: the check (a leased hold's, at once) says
// so without telling a loss, and does not walk such a count — at the int64 limit that loop
// would keep the server busy for good. Before, the first two were told lost and the third hung
// the server.
TEST(loss_told_more, a_read_holds_count_overwritten_is_not_a_loss_and_is_not_walked) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    const std::string holder = c.id() + ":" + std::to_string(rlock::detail::current_thread_number());
    for (const char* bad : {"2.5", "abc", "9223372036854775807"}) {
        SCOPED_TRACE(bad);
        const std::string name = std::string("told:count:") + bad;
        rlock::read_write_lock rw(c, name);
        rw.lock_shared(60s);
        std::this_thread::sleep_for(150ms);  // armed
        s.cmd({"HSET", name, holder, bad});
        std::this_thread::sleep_for(300ms);  // the invalidation's check has run
        const auto start = steady::now();
        auto pong = s.cmd({"PING"});
        EXPECT_LT(steady::now() - start, 1s) << "the server is busy in a script";
        EXPECT_TRUE(pong && pong->type == REDIS_REPLY_STATUS);
        EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
        EXPECT_FALSE(rw.lost());
        s.cmd({"HSET", name, holder, "1"});
        rw.unlock_shared();
    }
}

TEST(loss_told_more, turned_off_the_server_tracks_nothing_and_the_watchdog_still_finds_a_loss) {
    redis_server s;
    rlock_test::lost_log lost;
    auto tracking_clients = [&] { return info_value(s.text({"INFO", "clients"}), "tracking_clients"); };
    {
        rlock::client on(s.options());
        rlock::mutex m(on, "told:on");
        m.lock();
        // The watchdog's connection, and the subscriber's (for flushes alone).
        EXPECT_TRUE(eventually([&] { return tracking_clients() == 2; })) << "the default tracks";
        m.unlock();
    }
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 600ms;  // renewed every 200 ms
    o.loss_tracking = false;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "told:off");
    m.lock();
    std::this_thread::sleep_for(300ms);  // a renewal or more
    EXPECT_EQ(tracking_clients(), 0);
    s.cmd({"DEL", "told:off"});
    EXPECT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 5s));
    EXPECT_TRUE(m.lost());
    m.unlock();
}

/// Voluntary context switches of every thread of this process so far (Linux: /proc).
long long voluntary_switches() {
    long long total = 0;
    DIR* d = opendir("/proc/self/task");
    if (!d) return -1;
    while (const dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/status");
        std::string line;
        while (std::getline(f, line)) {
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) total += std::atoll(line.c_str() + 24);
        }
    }
    closedir(d);
    return total;
}

// An idle client sleeps: its watchdog polls (every 25 ms, to arm new holds and notice a killed
// tracked connection) only while it has watched holds, and stops soon after the last goes.
// Before, an idle client's threads woke 40 times a second for ever. A hold taken after the
// idle time wakes it and is still told at once.
TEST(loss_told_more, an_idle_client_sleeps_and_a_hold_taken_later_is_still_told_at_once) {
    redis_server s;
    // What this process wakes for without a client (the test's sleep; under TSan its
    // background thread, which it starts at the first thread created — so one is, first).
    std::thread([] {}).join();
    long long start = voluntary_switches();
    std::this_thread::sleep_for(1s);
    const long long baseline = voluntary_switches() - start;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "told:idle");
    m.lock();
    std::this_thread::sleep_for(100ms);  // armed
    m.unlock();
    std::this_thread::sleep_for(500ms);
    start = voluntary_switches();
    std::this_thread::sleep_for(1s);
    const long long idle = voluntary_switches() - start;
    EXPECT_LT(idle - baseline, 5) << "an idle client's threads woke " << idle << " times in a second ("
                                  << baseline << " without a client)";

    m.lock();
    std::this_thread::sleep_for(150ms);  // armed
    const auto deleted = steady::now();
    s.cmd({"DEL", "told:idle"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 20s));
    EXPECT_LT(steady::now() - deleted, 2s);
    m.unlock();
}

// A mutex hold whose key another holder overwrote in its first milliseconds, before the
// watchdog armed it (the server tracked nothing of it yet), is told when it is armed (25 ms
// in), not at the next tick (10 s at the default lock_watchdog_timeout): arming reads a mutex's
// value and compares it. The same read tells a hold passed within the process whose key was
// overwritten during the pass (the key's invalidation came while no hold named the key, and
// was dropped; an outside probe, with local_handoff_time raised).
TEST(loss_told_more, a_mutex_hold_overwritten_before_it_was_armed_is_told_when_armed) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "told:early");
    m.lock();
    std::this_thread::sleep_for(150ms);  // tracking on: the client's first hold was armed
    m.unlock();
    for (int round = 0; round < 3; ++round) {
        m.lock();
        const auto written = steady::now();
        s.cmd({"SET", "told:early", "another-holder", "PX", "60000"});
        ASSERT_TRUE(eventually([&] { return lost.calls.load() == round + 1; }, 20s));
        EXPECT_LT(steady::now() - written, 2s) << "round " << round << ": told at the watchdog's tick";
        EXPECT_TRUE(m.lost());
        m.unlock();
        EXPECT_EQ(s.text({"GET", "told:early"}), "another-holder") << "the unlock touched the other's key";
        s.cmd({"DEL", "told:early"});
    }
}

// Renewals refused for a whole batch (one script for every mutex hold of the client; here the
// server wants a replica it does not have: NOREPLICAS) tell each hold the refusal naming its
// own lock. Before, every hold of the batch was told one error naming one of the locks.
TEST(loss_told_more, a_refused_renewal_batch_tells_each_hold_an_error_naming_its_own_lock) {
    redis_server s;
    std::mutex mu;
    std::vector<std::pair<std::string, std::string>> told;  // (hold's lock, error's lock)
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 900ms;
    o.on_lock_lost = [&](std::string_view lock, const rlock::error& why) {
        std::lock_guard<std::mutex> g(mu);
        told.emplace_back(std::string(lock), why.lock());
    };
    rlock::client c(o);
    rlock::mutex a(c, "batch:a"), b(c, "batch:b"), d(c, "batch:c");
    a.lock();
    b.lock();
    d.lock();
    s.cmd({"CONFIG", "SET", "min-replicas-to-write", "1"});
    ASSERT_TRUE(eventually([&] {
        std::lock_guard<std::mutex> g(mu);
        return told.size() >= 3;
    }, 10s));
    s.cmd({"CONFIG", "SET", "min-replicas-to-write", "0"});
    {
        std::lock_guard<std::mutex> g(mu);
        std::set<std::string> holds;
        for (const auto& [hold, named] : told) {
            EXPECT_EQ(named, hold) << "the error told for " << hold << " names " << named;
            holds.insert(hold);
        }
        EXPECT_EQ(holds.size(), 3u);
    }
    a.unlock();
    b.unlock();
    d.unlock();
}

// The server's maxmemory-policy may evict lock keys (anything but noeviction): the listener
// is told once, at connect.
TEST(loss_told_more, an_evicting_maxmemory_policy_is_told_once) {
    redis_server s;
    s.cmd({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"});
    struct notices : rlock::lock_listener {
        std::mutex mu;
        std::vector<std::string> told;
        void notice(const rlock::notice_event& e) override {
            std::lock_guard<std::mutex> g(mu);
            told.emplace_back(e.message);
        }
    };
    auto n = std::make_shared<notices>();
    rlock::client_options o = s.options();
    o.listener = n;
    {
        rlock::client c(o);
        rlock::mutex m(c, "told:evict");
        m.lock();
        m.unlock();
    }
    auto told = [&] {
        std::lock_guard<std::mutex> g(n->mu);
        return n->told;
    };
    ASSERT_EQ(told().size(), 1u);
    EXPECT_NE(told()[0].find("volatile-lru"), std::string::npos) << told()[0];
    s.cmd({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
    rlock::client quiet(o);
    EXPECT_EQ(told().size(), 1u);
}

}  // namespace
