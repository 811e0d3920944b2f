// Faults and bad input (issue 8), against real redis-servers that the tests start themselves:
// connections killed under load, SCRIPT FLUSH and FLUSHALL, a server that stalls past the
// command timeout while it still runs an acquire, odd and huge inputs, a port that is not
// Redis, ACL users without scripts or keys, and misuse of lock objects. Every lock kind runs
// each test where it makes sense (read_write_lock: its write side). Bounds on time are generous
// on purpose: the suite runs on small, noisy machines.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
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
        auto channels = s.cmd({"PUBSUB", "CHANNELS", "*"});
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

    explicit fake_server(mode m) : mode_(m) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        const int one = 1;
        ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) {
            throw std::runtime_error("fake_server: cannot listen");
        }
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

// ---- The minimal ACL (README "ACL"): exactly these rules run every lock kind. -------------------

/// The rules README.md documents for lock names starting with `app:`, word for word.
const char* const minimal_acl =
    "on >pw resetkeys resetchannels -@all "
    "+ping +select +get +set +del +exists +pttl +pexpire +publish +subscribe +unsubscribe "
    "+eval +evalsha +hexists +hget +hmget +hset +hdel +hlen +hkeys +hincrby +incr "
    "+rpush +lpop +lindex +lrem +lrange +zadd +zrem +zscore +zincrby +zrange +zrevrange "
    "+zrangebyscore +time "
    "~app:* ~{app:* ~rlock_lock__channel:{app:* ~redisson_lock__channel:{app:* "
    "~redisson_rwlock:{app:* ~redisson_lock_token:{app:* ~redisson_lock_queue:{app:* "
    "~redisson_lock_timeout:{app:* "
    "&rlock_lock__channel:{app:* &redisson_lock__channel:{app:* &redisson_rwlock:{app:*";

std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at < text.size();) {
        const auto end = std::min(text.find(' ', at), text.size());
        if (end > at) out.push_back(text.substr(at, end - at));
        at = end + 1;
    }
    return out;
}

/// Holds `name` from client a with renewals, refuses client b, then hands it to a blocked b:
/// every script, the subscriber and the watchdog run as the ACL user.
template <class Lock>
void hold_renew_and_hand_off(rlock::client& a, rlock::client& b, const std::string& name) {
    SCOPED_TRACE(name);
    Lock held(a, name, rlock::lock_options{true});
    Lock other(b, name, rlock::lock_options{true});
    held.lock();
    EXPECT_GT(held.fencing_token(), 0);
    EXPECT_FALSE(other.try_lock_for(30ms));
    std::this_thread::sleep_for(900ms);  // three renewal periods of the 600 ms watchdog
    EXPECT_TRUE(held.is_locked());
    EXPECT_FALSE(held.lost());
    EXPECT_GT(held.remaining_lease(), 0ms);
    std::atomic<bool> got{false};
    std::thread waiter([&] {
        other.lock();
        got = true;
        other.unlock();
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(got.load());
    held.unlock();
    waiter.join();
    EXPECT_TRUE(got.load());
    // Forced open by the other client: the watchdog reports the hold lost, as the ACL user.
    held.lock();
    EXPECT_TRUE(other.force_unlock());
    EXPECT_FALSE(held.is_locked());
    EXPECT_TRUE(eventually([&] { return held.lost(); }));
    held.unlock();
}

/// Creates the ACL user `locker` (password `pw`) with `rules` on `s`; returns client options
/// that log in as it and report lost holds to `lost`.
rlock::client_options as_locker(const redis_server& s, std::vector<std::string> rules,
                                rlock_test::lost_log& lost) {
    rules.insert(rules.begin(), "locker");
    set_acl_user(s, rules);
    rlock::client_options o = s.options();
    o.username = "locker";
    o.password = "pw";
    o.on_lock_lost = lost.handler();
    return o;
}

TEST(acl, the_documented_minimal_acl_runs_every_lock_kind) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 600ms;
    rlock::client a(o);
    rlock::client b(o);

    hold_renew_and_hand_off<rlock::mutex>(a, b, "app:mutex");
    hold_renew_and_hand_off<rlock::reentrant_lock>(a, b, "app:reentrant");
    hold_renew_and_hand_off<rlock::fair_lock>(a, b, "app:fair");
    hold_renew_and_hand_off<rlock::read_write_lock>(a, b, "app:rw");  // the write side

    {  // read side: two readers at once, a writer waits for both, a downgrade
        rlock::read_write_lock r1(a, "app:rw-read");
        rlock::read_write_lock r2(b, "app:rw-read");
        r1.lock_shared();
        r2.lock_shared();
        std::this_thread::sleep_for(700ms);  // read holds renewed
        std::thread([&] {
            rlock::read_write_lock w(b, "app:rw-read");
            EXPECT_FALSE(w.try_lock_for(30ms)) << "a writer got in past two readers";
        }).join();
        r2.unlock_shared();
        r1.unlock_shared();
        r2.lock();
        r2.lock_shared();  // downgrade
        r2.unlock();
        EXPECT_TRUE(r1.try_lock_shared_for(1s));
        r1.unlock_shared();
        r2.unlock_shared();
    }
    {  // multi_lock on one node (its own script) and a one-node red_lock
        rlock::mutex m1(a, "app:multi-1");
        rlock::reentrant_lock m2(a, "app:multi-2");
        rlock::multi_lock both{m1, m2};
        both.lock();
        std::this_thread::sleep_for(700ms);
        EXPECT_TRUE(m1.is_locked());
        EXPECT_TRUE(m2.is_locked());
        both.unlock();
        rlock::red_lock red({&a}, "app:red");
        red.lock();
        std::this_thread::sleep_for(700ms);
        EXPECT_FALSE(red.lost());
        red.unlock();
    }
    // One report per forced unlock above, and no other: no NOPERM anywhere.
    EXPECT_EQ(lost.calls.load(), 4) << lost.last_lock << ": " << lost.last_message;
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost)) << lost.last_message;
    // Fencing counters never expire, by design; nothing else may be left.
    EXPECT_EQ(keys_left(s, "redisson_lock_token:"), "") << "keys left in Redis";
}

TEST(acl, a_release_the_acl_forbids_is_reported_as_that_error_not_as_a_lost_lock) {
    // The release scripts read the key with pcall, so that a key of another type is an answer
    // ("not held"); any other error (here the ACL's refusal) must reach the owner as itself.
    redis_server s;
    std::vector<std::string> rules;
    for (const std::string& w : words(minimal_acl)) {
        if (w != "+get" && w != "+hget") rules.push_back(w);
    }
    rlock_test::lost_log lost;
    rlock::client c(as_locker(s, rules, lost));
    rlock::mutex m(c, "app:acl-mutex");
    rlock::reentrant_lock r(c, "app:acl-reentrant");
    m.lock();  // SET: allowed
    r.lock();  // EXISTS, HINCRBY, PEXPIRE: allowed
    EXPECT_NO_THROW(m.unlock());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_NE(lost.code.load(), static_cast<int>(rlock::errc::lock_lost)) << lost.last_message;
    EXPECT_NE(lost.last_message.find("app:acl-mutex"), std::string::npos) << lost.last_message;
    EXPECT_NO_THROW(r.unlock());
    EXPECT_EQ(lost.calls.load(), 2);
    EXPECT_NE(lost.code.load(), static_cast<int>(rlock::errc::lock_lost)) << lost.last_message;
    EXPECT_NE(lost.last_message.find("app:acl-reentrant"), std::string::npos) << lost.last_message;
    // Nothing was claimed released: both keys still there, for their leases.
    EXPECT_EQ(s.integer({"EXISTS", "app:acl-mutex", "app:acl-reentrant"}), 2);
}

// Issue 16: a renewal the server refuses with an error (here an ACL that stops covering the
// key) is told once as that error (auth_failed, naming NOPERM), not as lock_lost: the key is
// still there. The watchdog keeps trying while the lease lasts, so a refusal that ends in time
// (the ACL restored) costs nothing more, and one that outlasts the lease turns lost() true with
// no second report. Failed before: told lock_lost, "found the hold gone".
TEST(acl, a_renewal_refused_with_an_error_is_told_as_that_error_once) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 1500ms;  // renewed every 500 ms
    rlock::client c(o);
    rlock::mutex m(c, "app:renew-refused");
    m.lock();
    set_acl_user(s, {"locker", "resetkeys", "~other:*"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 3s));
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::auth_failed)) << lost.last_message;
    EXPECT_NE(lost.last_message.find("NOPERM"), std::string::npos) << lost.last_message;
    EXPECT_NE(lost.last_message.find("app:renew-refused"), std::string::npos) << lost.last_message;
    EXPECT_EQ(s.integer({"EXISTS", "app:renew-refused"}), 1);
    // Restored within the lease: the next tick renews it, and the hold goes on.
    std::vector<std::string> back = words(minimal_acl);
    back.insert(back.begin(), "locker");
    set_acl_user(s, back);
    std::this_thread::sleep_for(2500ms);  // past the lease the refused tick did not extend
    EXPECT_FALSE(m.lost());
    EXPECT_EQ(s.integer({"EXISTS", "app:renew-refused"}), 1);
    // Refused again, now for longer than the lease: lost, without a second report.
    const int told = lost.calls.load();
    set_acl_user(s, {"locker", "resetkeys", "~other:*"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > told; }, 3s));
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::auth_failed)) << lost.last_message;
    EXPECT_TRUE(eventually([&] { return m.lost(); }, 4s));
    std::this_thread::sleep_for(600ms);  // a tick after the lease ran out
    EXPECT_EQ(lost.calls.load(), told + 1) << lost.last_message;
    set_acl_user(s, back);
    EXPECT_NO_THROW(m.unlock());
    EXPECT_EQ(lost.calls.load(), told + 1) << lost.last_message;
}

// --- replica sync (client_options::sync_replicas) -------------------------------------------

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
            10s);
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
        o.sync_timeout = 300ms;
        return o;
    }
    long long waits() const {
        const std::string stats = master.text({"INFO", "commandstats"});
        const auto at = stats.find("cmdstat_wait:calls=");
        return at == std::string::npos ? 0 : std::atoll(stats.c_str() + at + 19);
    }
};

TEST(replica_sync, a_lock_is_granted_only_once_the_replica_has_it_and_released_likewise) {
    replicated r;
    rlock::client c(r.options(1));
    const std::string name = rlock_test::test_lock_name();
    {
        rlock::mutex m(c, name);
        m.lock();
        // No polling: WAIT returned before lock() did, so the replica has the key already.
        const std::string token = r.master.text({"GET", name});
        EXPECT_TRUE(rlock::detail::is_rlock_token(token)) << token;
        EXPECT_EQ(r.replica.text({"GET", name}), token);
        m.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name}), 0);
    }
    {
        rlock::reentrant_lock l(c, name + ":re");
        l.lock();
        l.lock();
        EXPECT_EQ(r.replica.integer({"HLEN", name + ":re"}), 1);
        EXPECT_EQ(r.replica.text({"HGET", name + ":re", c.id() + ":" +
                                                          std::to_string(rlock::detail::current_thread_number())}),
                  "2");
        l.unlock();
        l.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":re"}), 0);
    }
    {
        rlock::fair_lock f(c, name + ":fair");
        f.lock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":fair"}), 1);
        f.unlock();
        rlock::read_write_lock rw(c, name + ":rw");
        rw.lock_shared();
        EXPECT_EQ(r.replica.text({"HGET", name + ":rw", "mode"}), "read");
        rw.unlock_shared();
        rw.lock();
        EXPECT_EQ(r.replica.text({"HGET", name + ":rw", "mode"}), "write");
        rw.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":rw"}), 0);
    }
}

// Issue 18: multi_lock's one-script path (parts of one client) waits for replicas as its parts
// do one by one: an acquire too few replicas acknowledged is undone, every part, and reported.
// Failed before: the one-script acquire sent no WAIT and was granted.
TEST(replica_sync, a_multi_lock_of_one_node_is_synced_and_undone_as_its_parts_are) {
    replicated r;
    const std::string name = rlock_test::test_lock_name();
    rlock::client c(r.options(2));  // one replica exists: always short
    rlock::mutex a(c, name + ":a");
    rlock::reentrant_lock b(c, name + ":b");
    rlock::multi_lock both{a, b};
    try {
        both.lock();
        FAIL() << "lock() succeeded with one replica of the two asked for";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::replica_sync_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("undone"), std::string::npos) << e.what();
    }
    EXPECT_EQ(r.master.integer({"EXISTS", name + ":a", name + ":b"}), 0)
        << "the undone acquire left a part";
}

TEST(replica_sync, an_acquire_too_few_replicas_acknowledge_is_undone_and_reported) {
    replicated r;
    const std::string name = rlock_test::test_lock_name();
    {  // more replicas asked for than exist
        rlock::client c(r.options(2));
        rlock::mutex m(c, name);
        try {
            m.lock();
            FAIL() << "lock() succeeded with one replica of the two asked for";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::replica_sync_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("undone"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(m.is_held_by_current_thread());
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0) << "the undone acquire left its key";
        rlock::reentrant_lock l(c, name);
        EXPECT_THROW((void)l.try_lock_for(100ms), rlock::error);
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0);
    }
    {  // the one replica stops answering: nothing is granted while it is away
        rlock::client c(r.options(1));
        rlock::reentrant_lock l(c, name);
        l.lock();  // replica up: granted
        r.replica.pause();
        // A re-entry that is not acknowledged is undone one level: the first level stays.
        EXPECT_THROW(l.lock(), rlock::error);
        EXPECT_TRUE(l.is_held_by_current_thread());
        l.unlock();  // WAIT falls short here too: not an error, the key is gone on the master
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0);
        rlock::mutex m(c, name + ":m");
        EXPECT_THROW(m.lock(), rlock::error);
        EXPECT_EQ(r.master.integer({"EXISTS", name + ":m"}), 0);
        r.replica.resume();
        ASSERT_TRUE(eventually([&] { return r.replica.integer({"EXISTS", name}) == 0; }, 5s));
        m.lock();  // back: granted again
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":m"}), 1);
        m.unlock();
    }
}

TEST(replica_sync, the_watchdog_waits_for_replicas_after_each_renewal_batch) {
    replicated r;
    rlock::client_options o = r.options(1);
    o.lock_watchdog_timeout = 600ms;  // a tick every 200 ms
    rlock::client c(o);
    rlock::mutex m(c, rlock_test::test_lock_name());
    m.lock();
    const long long before = r.waits();
    std::this_thread::sleep_for(700ms);
    EXPECT_GE(r.waits() - before, 2) << "renewal ticks without WAIT";
    EXPECT_GT(r.replica.integer({"PTTL", m.name()}), 0);
    m.unlock();
}

TEST(replica_sync, bad_sync_options_are_refused_before_connecting) {
    rlock::client_options o;
    o.port = 1;  // never reached: validation comes first
    o.sync_replicas = -1;
    try {
        rlock::client c(o);
        FAIL() << "a negative sync_replicas was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("sync_replicas"), std::string::npos) << e.what();
    }
    o.sync_replicas = 1;
    o.sync_timeout = o.command_timeout;
    try {
        rlock::client c(o);
        FAIL() << "a sync_timeout as long as command_timeout was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("sync_timeout"), std::string::npos) << e.what();
    }
}

// --- Sentinel (client_options::sentinels) -----------------------------------------------------

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
        const bool ready = eventually([&] { return known_replicas() == 1; }, 20s);
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
        return "redis-sentinel://127.0.0.1:" + std::to_string(rlock_test::free_port()) +
               ",127.0.0.1:" + std::to_string(sentinel->port()) + "/m";
    }
    /// SENTINEL FAILOVER, and back once the sentinel names the replica as the master.
    void fail_over() {
        auto rep = sentinel->cmd({"SENTINEL", "FAILOVER", "m"});
        if (rep->type == REDIS_REPLY_ERROR) {
            throw std::runtime_error("test: SENTINEL FAILOVER: " + std::string(rep->str));
        }
        if (!eventually([&] { return master_port() == r.replica.port(); }, 30s)) {
            throw std::runtime_error("test: the sentinel did not switch to the replica");
        }
    }
    long long subscribers(const redis_server& s, const std::string& channel) const {
        auto rep = s.cmd({"PUBSUB", "NUMSUB", channel});
        return rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 ? rep->element[1]->integer : -1;
    }
};

TEST(sentinel, a_failover_moves_holds_waiters_and_new_commands_to_the_new_master) {
    sentinel_deployment d(true);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.sync_replicas = 1;  // the hold is on the replica before lock() returns
    o.sync_timeout = 300ms;
    // Longer than a failover takes: the key the replica got must outlive the switch (the
    // client renews on the new master only once the sentinel has named it).
    o.lock_watchdog_timeout = 5s;
    std::atomic<int> told{0};
    o.on_lock_lost = [&](std::string_view, const rlock::error&) { ++told; };
    rlock::client holder(o);
    rlock::client_options unsynced = o;  // after the failover the new master has no replica
    unsynced.sync_replicas = 0;
    rlock::client other(unsynced);
    EXPECT_EQ(holder.server(), "master m via sentinel");

    const std::string name = rlock_test::test_lock_name();
    const std::string channel = "redisson_lock__channel:{" + name + "}";
    rlock::reentrant_lock l(holder, name);
    l.lock();
    const std::string field = holder.id() + ":" + std::to_string(rlock::detail::current_thread_number());
    ASSERT_EQ(d.r.master.text({"HGET", name, field}), "1") << "the lock is not on the master";
    ASSERT_EQ(d.r.replica.text({"HGET", name, field}), "1") << "WAIT returned before the replica had it";

    std::string waiter_field;  // the waiter's count on the new master while it holds the lock
    auto waiter = std::async(std::launch::async, [&] {
        rlock::reentrant_lock w(other, name);
        if (!w.try_lock_for(60s)) return false;
        waiter_field = d.r.replica.text(
            {"HGET", name, other.id() + ":" + std::to_string(rlock::detail::current_thread_number())});
        w.unlock();
        return true;
    });
    ASSERT_TRUE(eventually([&] { return d.subscribers(d.r.master, channel) == 1; }, 10s));

    d.fail_over();
    // The old master stays a master for a while (the sentinel converts it later), so nothing
    // but the switch tells the clients to leave it. The waiter's subscription moves...
    EXPECT_TRUE(eventually([&] { return d.subscribers(d.r.replica, channel) == 1; }, 10s))
        << "the waiter's subscription did not move to the new master";
    // ... and the watchdog renews on the new master: a lease on, the key would be gone.
    std::this_thread::sleep_for(o.lock_watchdog_timeout + 1s);
    EXPECT_GT(d.r.replica.integer({"PTTL", name}), 0) << "not renewed on the new master";
    EXPECT_FALSE(l.lost());
    EXPECT_EQ(told.load(), 0) << "a hold that moved with the failover was reported lost";

    l.unlock();  // on the new master (too few replicas there now: not an error at release)
    EXPECT_EQ(d.r.replica.text({"HGET", name, field}), "") << "unlock did not reach the new master";
    ASSERT_EQ(waiter.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(waiter.get());
    EXPECT_EQ(waiter_field, "1") << "the waiter's lock is not on the new master";
    EXPECT_EQ(told.load(), 0);
}

// What a client still connected to a demoted master sees: READONLY, reported as
// connection_failed (the connection is replaced; with Sentinel the new one goes to the new
// master), carrying Redis's text, with nothing written.
TEST(sentinel, a_replica_refuses_an_acquire_as_a_connection_error_naming_readonly) {
    replicated r;
    rlock::client c(r.replica.options());
    rlock::mutex m(c, rlock_test::test_lock_name());
    rlock::reentrant_lock l(c, rlock_test::test_lock_name(":r"));
    auto refused = [&](const std::function<void()>& f) {
        try {
            f();
            ADD_FAILURE() << "a replica granted a lock";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find("READONLY"), std::string::npos) << e.what();
        }
    };
    refused([&] { m.lock(); });
    refused([&] { l.lock(); });
    EXPECT_EQ(r.replica.integer({"EXISTS", m.name(), l.name()}), 0);
    EXPECT_EQ(r.master.integer({"EXISTS", m.name(), l.name()}), 0);
}

TEST(sentinel, an_unknown_master_or_a_refused_sentinel_password_is_a_clear_error) {
    sentinel_deployment d(false);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.sentinel_master = "nope";
    o.connect_timeout = 300ms;
    try {
        rlock::client c(o);
        FAIL() << "a client of an unknown master connected";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("master nope via sentinel"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("does not know a master named nope"), std::string::npos)
            << e.what();
    }

    sentinel_deployment guarded(false, "requirepass sentinel-secret\n");
    o = rlock::client_options::from_uri(guarded.uri());
    try {
        rlock::client c(o);
        FAIL() << "a sentinel with a password answered without one";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::auth_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("sentinel 127.0.0.1:" +
                                             std::to_string(guarded.sentinel->port())),
                  std::string::npos)
            << e.what();
    }
    o.sentinel_password = "sentinel-secret";
    rlock::client c(o);
    rlock::mutex m(c, rlock_test::test_lock_name());
    m.lock();
    EXPECT_EQ(guarded.r.master.integer({"EXISTS", m.name()}), 1);
    m.unlock();
}

}  // namespace
