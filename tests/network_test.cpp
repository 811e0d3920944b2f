// Faults of the network, the client's clock, the server's memory and the client's own lifetime
// (issue 8, continued), against real redis-servers the tests start themselves:
//
//   network_*  a client behind tests/support/tcp_proxy.hpp: a slow link, a partition longer and
//              shorter than the lease, every connection reset, a reply cut mid-way;
//   clock_*    the test worker under libfaketime, its wall clock jumping by hours and days;
//   memory_*   a server at maxmemory: OOM refusals, and a lock key evicted under volatile-lru;
//   hygiene_*  threads and server connections after a client is gone, waiters of a destroyed
//              client, and ten thousand watched holds on one client.
//
// Bounds on time are generous on purpose: the suite runs on small, noisy machines.
#include <dirent.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"

using namespace std::chrono_literals;
using rlock_test::connection_error;
using rlock_test::eventually;
using rlock_test::millis;
using rlock_test::redis_server;
using rlock_test::steady;
using rlock_test::tcp_proxy;

namespace {

/// A thread blocked in `lock.try_lock_for(20s)` from construction on. acquired_at() waits for it:
/// when it got the lock (it unlocks at once), or time_point::max() when it did not (an error
/// it met is printed).
template <class Lock>
class blocked_waiter {
public:
    explicit blocked_waiter(Lock& lock) : thread_([this, &lock] { run(lock); }) {}
    blocked_waiter(const blocked_waiter&) = delete;
    blocked_waiter& operator=(const blocked_waiter&) = delete;
    ~blocked_waiter() {
        if (thread_.joinable()) thread_.join();
    }

    steady::time_point acquired_at() {
        const steady::time_point at = result_.get();
        thread_.join();
        return at;
    }

private:
    void run(Lock& lock) {
        try {
            if (lock.try_lock_for(20s)) {
                acquired_.set_value(steady::now());
                lock.unlock();
                return;
            }
        } catch (const rlock::error& e) {
            std::printf("[   info   ] the waiter threw: %s\n", e.what());
        }
        acquired_.set_value(steady::time_point::max());
    }

    std::promise<steady::time_point> acquired_;
    std::future<steady::time_point> result_ = acquired_.get_future();
    std::thread thread_;  // last: starts once the promise and its future exist
};

/// What a call ended with: nothing thrown, an rlock::error, or still running at the limit.
struct call_outcome {
    bool finished = false;
    bool threw = false;
    rlock::errc code{};
    std::string what;
};

/// Runs f on its own thread and waits up to `limit` for it. The caller must make sure f ends
/// eventually (heal the fault) before the returned joiner is destroyed.
class bounded_call {
public:
    template <class F>
    explicit bounded_call(F f)
        : done_(promise_.get_future()), thread_([this, f]() mutable {
              call_outcome o;
              o.finished = true;
              try {
                  f();
              } catch (const rlock::error& e) {
                  o.threw = true;
                  o.code = e.value();
                  o.what = e.what();
              }
              promise_.set_value(o);
          }) {}
    bounded_call(const bounded_call&) = delete;
    bounded_call& operator=(const bounded_call&) = delete;
    ~bounded_call() {
        if (thread_.joinable()) thread_.join();
    }
    /// The outcome, or one with finished == false after `limit`.
    call_outcome wait(std::chrono::milliseconds limit) {
        if (done_.wait_for(limit) != std::future_status::ready) return {};
        thread_.join();
        return done_.get();
    }

private:
    std::promise<call_outcome> promise_;
    std::future<call_outcome> done_;
    std::thread thread_;
};

std::string last_message(rlock_test::lost_log& log) {
    std::lock_guard<std::mutex> g(log.mu);
    return log.last_message;
}

// ---------------------------------------------------------------------------------------------
// network_*: a client whose every connection (pool, subscriber, watchdog) goes through a proxy.

struct network : ::testing::Test {
    redis_server server;
    tcp_proxy proxy{server.port()};
    rlock_test::lost_log lost;

    rlock::client_options through_proxy(std::chrono::milliseconds watchdog,
                                        std::chrono::milliseconds command_timeout) {
        rlock::client_options o = proxy.options();
        o.connect_timeout = command_timeout;
        o.command_timeout = command_timeout;
        o.lock_watchdog_timeout = watchdog;
        o.on_lock_lost = lost.handler();
        return o;
    }
    std::string name() const { return rlock_test::test_lock_name(); }
};

TEST_F(network, a_delay_below_the_command_timeout_keeps_locks_working) {
    // 150 ms each way per chunk against a 2 s command timeout; the watchdog (lease 2.4 s,
    // renewed every 800 ms) must keep up although each renewal takes ~300 ms (more under
    // sanitizers on a loaded machine: the margin is for them).
    rlock::client c(through_proxy(2400ms, 2000ms));
    rlock::client direct(server.options());
    proxy.delay(150ms);
    rlock::mutex m(c, name());
    rlock::reentrant_lock r(c, name() + ":r");
    const auto t0 = steady::now();
    m.lock();
    r.lock();
    EXPECT_GE(steady::now() - t0, 500ms) << "the delay was not applied: nothing was tested";
    std::this_thread::sleep_for(5s);  // six renewal periods, two leases
    EXPECT_FALSE(m.lost());
    EXPECT_FALSE(r.lost());
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
    rlock::mutex other(direct, name());
    EXPECT_FALSE(other.try_lock()) << "the watched hold was not renewed through the slow link";
    EXPECT_GT(server.integer({"PTTL", name()}), 0);
    m.unlock();
    r.unlock();
    EXPECT_EQ(server.integer({"EXISTS", name(), name() + ":r"}), 0);
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
}

TEST_F(network, a_partition_longer_than_the_lease_reports_the_hold_lost_and_lock_calls_fail) {
    rlock::client c(through_proxy(900ms, 300ms));
    rlock::client direct(server.options());
    rlock::mutex m(c, name());
    m.lock();  // watched: lease 900 ms, renewed every 300 ms
    proxy.blackhole();
    // Another client takes the lock once Redis has let it expire; by then the cut-off holder
    // must already know (lost() counts the lease from when the last renewal was sent).
    rlock::mutex other(direct, name());
    bool stale_holder = false;
    const auto end = steady::now() + 10s;
    bool taken = false;
    while (steady::now() < end && !taken) {
        const bool lost_before = m.lost();
        taken = other.try_lock();
        if (taken && !lost_before && !m.lost()) stale_holder = true;
        if (!taken) std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(taken) << "the lock never expired in Redis during the partition";
    EXPECT_FALSE(stale_holder) << "another client got the lock while this one still held it";
    EXPECT_TRUE(m.lost());
    EXPECT_TRUE(eventually([&] { return lost.calls == 1; }, 5s)) << lost.calls;
    EXPECT_EQ(lost.code, static_cast<int>(rlock::errc::lock_lost)) << last_message(lost);

    // A wait behind the partition rides it out to its deadline, then fails with a clear
    // timeout / connection error (never false, which would say the lock was held).
    rlock::mutex fresh(c, name() + ":fresh");
    bounded_call call([&] { (void)fresh.try_lock_for(2s); });
    const call_outcome o = call.wait(20s);
    ASSERT_TRUE(o.finished) << "try_lock_for(2s) hung for 20 s behind a partition";
    ASSERT_TRUE(o.threw) << "try_lock_for(2s) answered behind a partition";
    EXPECT_TRUE(connection_error(o.code)) << o.what;
    EXPECT_NE(o.what.find(c.server()), std::string::npos) << o.what;
    // lock() has no deadline: it waits through the partition and takes the lock once it heals.
    bounded_call waiting([&] {
        fresh.lock();
        fresh.unlock();
    });
    EXPECT_FALSE(waiting.wait(500ms).finished) << "lock() returned behind a partition";
    proxy.pass_through();
    const call_outcome healed = waiting.wait(20s);
    ASSERT_TRUE(healed.finished) << "lock() still waits after the partition healed";
    EXPECT_FALSE(healed.threw) << healed.what;

    EXPECT_NO_THROW(m.unlock());
    EXPECT_EQ(lost.calls, 1) << "a lost hold must be told once: " << last_message(lost);
    EXPECT_EQ(server.integer({"EXISTS", name()}), 1) << "unlock of the lost hold deleted the new "
                                                        "holder's key";
    other.unlock();
}

TEST_F(network, a_partition_shorter_than_the_lease_is_survived_and_waiters_resume) {
    // Lease 6 s, renewed every 2 s; command timeout 1 s; the link is down for 1.5 s.
    rlock::client holder(through_proxy(6000ms, 1000ms)), waiter(through_proxy(6000ms, 1000ms));
    rlock::mutex mine(holder, name()), theirs(waiter, name());
    mine.lock();
    blocked_waiter<rlock::mutex> blocked(theirs);
    std::this_thread::sleep_for(300ms);  // the waiter is subscribed and blocked
    proxy.blackhole();
    std::this_thread::sleep_for(1500ms);
    proxy.pass_through();
    std::this_thread::sleep_for(4500ms);  // at least two renewals after the partition
    EXPECT_FALSE(mine.lost());
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
    EXPECT_GT(server.integer({"PTTL", name()}), 0);
    const auto released = steady::now();
    mine.unlock();
    const auto at = blocked.acquired_at();
    ASSERT_NE(at, steady::time_point::max()) << "the waiter never got the lock";
    EXPECT_LT(at - released, 3s) << "the waiter woke " << millis(at - released)
                                 << " ms after the unlock: it slept on the TTL, no message";
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
}

TEST_F(network, resetting_every_connection_is_survived_and_a_blocked_waiter_still_wakes) {
    rlock::client holder(through_proxy(1500ms, 1000ms)), waiter(through_proxy(1500ms, 1000ms));
    rlock::mutex mine(holder, name()), theirs(waiter, name());
    rlock::reentrant_lock watched(holder, name() + ":watched");
    mine.lock(30s);  // the waiter must not wait this lease out
    watched.lock();
    blocked_waiter<rlock::mutex> blocked(theirs);
    std::this_thread::sleep_for(800ms);  // subscribed and blocked; the watchdog renewed once
    const std::size_t open = proxy.open_connections();
    for (int round = 0; round < 3; ++round) {
        const std::size_t before = proxy.resets();
        proxy.reset_all();
        ASSERT_TRUE(eventually([&] { return proxy.resets() > before; }, 5s));
        std::this_thread::sleep_for(600ms);  // the subscribers reconnect and resubscribe
    }
    EXPECT_GE(open, 5u) << "two pools, two subscribers and a watchdog should have been connected";
    EXPECT_GE(proxy.resets(), open) << "not every connection was reset";
    // Queries retry on a new connection; the watched hold was renewed after the resets.
    EXPECT_TRUE(mine.is_locked());
    EXPECT_TRUE(watched.is_held_by_current_thread());
    EXPECT_FALSE(watched.lost());
    const auto released = steady::now();
    EXPECT_NO_THROW(mine.unlock());  // its pooled connection was reset: released on a new one
    const auto at = blocked.acquired_at();
    ASSERT_NE(at, steady::time_point::max()) << "the waiter never got the lock";
    EXPECT_LT(at - released, 3s) << "the waiter woke " << millis(at - released)
                                 << " ms after the unlock";
    watched.unlock();
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
    EXPECT_EQ(server.integer({"EXISTS", name(), name() + ":watched"}), 0);
}

TEST_F(network, a_reply_cut_mid_way_is_a_clear_error_or_a_real_hold_never_two_holders) {
    // Only the lock calls talk through the proxy here (leased holds: no watchdog traffic, no
    // waiters: no subscriber traffic), so each cut lands in the reply to an acquire or release.
    rlock::client c(through_proxy(30s, 1000ms));
    rlock::client direct(server.options());
    rlock::mutex m(c, name());
    rlock::reentrant_lock r(c, name() + ":r");
    rlock::mutex other_m(direct, name());
    rlock::reentrant_lock other_r(direct, name() + ":r");
    int held = 0, refused = 0;
    auto round = [&](auto& mine, auto& other, const std::string& key, std::size_t cut) {
        SCOPED_TRACE(key + " cut after " + std::to_string(cut) + " bytes");
        const std::size_t before = proxy.resets();
        proxy.cut_after(cut);
        bool locked = false;
        try {
            mine.lock(5s);
            locked = true;
        } catch (const rlock::error& e) {
            EXPECT_TRUE(connection_error(e.value()) || e.value() == rlock::errc::protocol_error)
                << e.what();
        }
        proxy.pass_through();  // disarm a cut that no reply reached
        if (locked) {
            ++held;
            EXPECT_FALSE(other.try_lock()) << "two holders after a cut reply";
            mine.unlock();
        } else {
            ++refused;
            EXPECT_EQ(server.integer({"EXISTS", key}), 0) << "a failed lock() left its key";
        }
        EXPECT_TRUE(other.try_lock()) << "the lock is not free after the round";
        other.unlock();
        // The proxy resets the connection just after writing the last byte it lets through,
        // so the client may return first: give the proxy thread a moment to count it.
        return rlock_test::eventually([&] { return proxy.resets() > before; }, 500ms);
    };
    int cuts = 0;
    for (std::size_t cut = 0; cut < 6; ++cut) {
        cuts += round(m, other_m, name(), cut);
        cuts += round(r, other_r, name() + ":r", cut);
    }
    // A cut in the reply to a release: unlock never throws, and the key is gone or expires.
    for (std::size_t cut = 0; cut < 3; ++cut) {
        m.lock(1s);
        proxy.cut_after(cut);
        EXPECT_NO_THROW(m.unlock());
        proxy.pass_through();
        EXPECT_TRUE(other_m.try_lock_for(5s)) << "cut after " << cut;
        other_m.unlock();
    }
    EXPECT_GE(cuts, 10) << "the cuts did not land: nothing was tested";
    std::printf("[   info   ] %d cuts: %d lock() calls held, %d threw\n", cuts, held, refused);
}

// A final unlock whose first try runs on the server but whose reply comes too late (this
// connection's replies are slowed past command_timeout) is tried again on a new connection, which
// finds the lock no longer held: that is the first try's work, not a loss. unlock() returns, the
// key is gone, and on_lock_lost is not called. Fails when the retry's "not held" is taken for a
// loss. Watched holds, with no renewal tick during the test.
TEST_F(network, a_final_unlock_whose_reply_comes_too_late_is_retried_without_a_false_loss) {
    rlock::client c(through_proxy(30s, 500ms));
    auto late_reply = [&](auto& lock, const std::string& key) {
        SCOPED_TRACE(key);
        lock.lock();
        lock.unlock();  // the release script is cached now: the slowed try runs it, not NOSCRIPT
        lock.lock();
        ASSERT_EQ(server.integer({"EXISTS", key}), 1);
        const std::size_t before = proxy.accepted();
        proxy.slow_replies_on_open_connections(1500ms);
        EXPECT_NO_THROW(lock.unlock());
        proxy.slow_replies_on_open_connections(0ms);
        EXPECT_GT(proxy.accepted(), before) << "unlock was not retried on a new connection";
        EXPECT_EQ(server.integer({"EXISTS", key}), 0);
    };
    rlock::mutex m(c, name());
    late_reply(m, m.name());
    rlock::reentrant_lock r(c, name() + ":r");
    late_reply(r, r.name());
    rlock::fair_lock f(c, name() + ":f");
    late_reply(f, f.name());
    rlock::read_write_lock rw(c, name() + ":rw");
    late_reply(rw, rw.name());
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
}

// A fair_lock unlock passes the hold to a waiter of its own client (the queue's head), and the
// pass script's reply comes too late (this connection's replies are slowed past
// command_timeout): the script ran, the hash now names the waiter, and the unlock cannot know.
// It wakes the waiter and releases its own hold as usual, finding it gone (the pass's work, not
// a loss); the waiter's next try finds its field and takes it. Whether the waiter then holds
// (the usual end) or its wait ran out first, the lock is free once it is done, the unlock
// returned, and nobody was told of a loss.
TEST_F(network, a_fair_pass_whose_reply_comes_too_late_leaves_the_lock_to_the_waiter_or_free) {
    rlock::client c(through_proxy(30s, 400ms));
    rlock::client direct(server.options());
    rlock::fair_lock mine(c, name()), local(c, name());
    const std::string queue = "redisson_lock_queue:{" + name() + "}";
    // One pass first, replies on time: the pass script is cached, so the slowed one below runs
    // (an uncached one would be refused NOSCRIPT, and nothing passed).
    mine.lock();
    std::thread first([&] {
        local.lock();
        local.unlock();
    });
    ASSERT_TRUE(rlock_test::eventually([&] { return server.integer({"LLEN", queue}) == 1; }));
    std::this_thread::sleep_for(50ms);  // its try's reply is in: it may be passed the hold
    const long long passes = rlock_test::calls_of(server, "hset");
    mine.unlock();
    first.join();
    ASSERT_EQ(rlock_test::calls_of(server, "hset") - passes, 1) << "no pass: nothing was tested";
    mine.lock();
    bool won = false;
    std::thread waiter([&] {
        won = local.try_lock_for(2s);
        if (won) {
            EXPECT_FALSE(local.lost());
            local.unlock();
        }
    });
    ASSERT_TRUE(rlock_test::eventually([&] { return server.integer({"LLEN", queue}) == 1; }));
    std::this_thread::sleep_for(50ms);
    proxy.slow_replies_on_open_connections(1500ms);
    const long long before = rlock_test::calls_of(server, "hset");
    EXPECT_NO_THROW(mine.unlock());
    waiter.join();
    proxy.slow_replies_on_open_connections(0ms);
    EXPECT_EQ(rlock_test::calls_of(server, "hset") - before, 1) << "the slowed unlock did not pass";
    EXPECT_TRUE(won) << "the waiter was woken and found its field: it holds";
    EXPECT_TRUE(rlock_test::eventually([&] { return server.integer({"EXISTS", name()}) == 0; }, 2s))
        << "the lock is held by nobody: TTL " << server.integer({"PTTL", name()}) << " ms";
    EXPECT_EQ(server.integer({"LLEN", queue}), 0);
    rlock::fair_lock other(direct, name());
    EXPECT_TRUE(other.try_lock());
    other.unlock();
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
}

// A watched hold whose renewal's reply is late: its lease runs out by the client's clock while
// the renewal (which the server ran) is on its way, lost() says so, and the owner unlocks
// before the reply comes. The unlock finds the key still there (the late renewal extended it),
// but lost() has said lost: the owner is told, once. Failed before: never told (the watchdog
// skipped the released hold, and the release found nothing wrong). Loss tracking off: its read
// after each renewal would hold the batch another reply's delay.
TEST_F(network, a_hold_lost_says_lost_then_unlocked_before_its_late_renewal_returns_is_told) {
    rlock::client_options o = through_proxy(1500ms, 4000ms);  // renewed every 500 ms
    o.loss_tracking = false;
    rlock::client c(o);
    rlock::mutex m(c, name());
    m.lock();
    m.unlock();  // the release script is cached now: the unlock below is one round trip
    m.lock();
    // After a renewal (the watchdog's connection open, its lease counted from then)...
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(rlock_test::eventually([&] { return server.integer({"PTTL", name()}) > 1450; }, 1s))
        << "no renewal seen";
    // ...the next renewal's reply comes 1.2 s late: after the lease (1.5 s) by the client's clock.
    proxy.slow_replies_on_open_connections(1200ms);
    ASSERT_TRUE(rlock_test::eventually([&] { return m.lost(); }, 3s));
    ASSERT_EQ(lost.calls.load(), 0) << "told before the unlock: nothing was tested";
    EXPECT_NO_THROW(m.unlock());
    proxy.slow_replies_on_open_connections(0ms);
    EXPECT_TRUE(rlock_test::eventually([&] { return lost.calls.load() > 0; }, 2s))
        << "lost() said lost, and the owner was never told";
    std::this_thread::sleep_for(600ms);
    EXPECT_EQ(lost.calls.load(), 1) << last_message(lost);
}

// The same for a watched permit (permit_expirable_semaphore): released after lost() said lost,
// all its permits still there. Failed before: never told.
TEST_F(network, a_permit_lost_says_lost_then_released_before_its_late_renewal_returns_is_told) {
    rlock::client_options o = through_proxy(1500ms, 4000ms);  // renewed every 500 ms
    o.loss_tracking = false;
    rlock::client c(o);
    rlock::permit_expirable_semaphore permits(c, name());
    ASSERT_TRUE(permits.try_set_permits(1));
    permits.try_acquire().release();  // the release script is cached now: one round trip below
    rlock::permit p = permits.try_acquire();
    ASSERT_TRUE(p);
    std::this_thread::sleep_for(600ms);  // after a renewal: the watchdog's connection is open
    proxy.slow_replies_on_open_connections(1200ms);
    ASSERT_TRUE(rlock_test::eventually([&] { return p.lost(); }, 3s));
    ASSERT_EQ(lost.calls.load(), 0) << "told before the release: nothing was tested";
    EXPECT_NO_THROW(p.release());
    proxy.slow_replies_on_open_connections(0ms);
    EXPECT_TRUE(rlock_test::eventually([&] { return lost.calls.load() > 0; }, 2s))
        << "lost() said lost, and the owner was never told";
    std::this_thread::sleep_for(600ms);
    EXPECT_EQ(lost.calls.load(), 1) << last_message(lost);
}

// A hold whose key is deleted while its renewal is on its way, unlocked before the reply (which
// says "gone") comes, with another thread of the client waiting for it: the unlock, which waits
// for that reply, does not hand a hold known gone to the waiter: it releases (telling its owner)
// and the waiter acquires at Redis, a hold that exists. Failed before: the reply was dropped for
// the released hold, and the waiter was handed the gone hold (no key in Redis while it "held").
TEST_F(network, an_unlock_does_not_hand_on_a_hold_its_late_renewal_found_gone) {
    rlock::client_options o = through_proxy(3000ms, 4000ms);  // renewed every second
    o.loss_tracking = false;
    o.local_handoff_time = 60s;  // the hand-off is not ended by its time bound here
    rlock::client c(o);
    rlock::mutex mine(c, name()), theirs(c, name());
    mine.lock();
    mine.unlock();  // the release script is cached now: one round trip below
    mine.lock();
    std::promise<long long> key_while_held;
    std::promise<void> done;
    std::thread waiter([&] {
        theirs.lock();
        key_while_held.set_value(server.integer({"EXISTS", name()}));
        done.get_future().wait();
        theirs.unlock();
    });
    // Just after a renewal (the watchdog's connection open), the key goes, and replies come a
    // second late: the next renewal, a second later, finds it gone and says so at 2 s, within
    // the lease (3 s) by the client's clock.
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(rlock_test::eventually([&] { return server.integer({"PTTL", name()}) > 2950; }, 2s))
        << "no renewal seen";
    proxy.slow_replies_on_open_connections(1000ms);
    server.cmd({"DEL", name()});
    std::this_thread::sleep_for(1500ms);  // that renewal is on its way
    EXPECT_NO_THROW(mine.unlock());
    auto got = key_while_held.get_future();
    const bool acquired = got.wait_for(10s) == std::future_status::ready;
    proxy.slow_replies_on_open_connections(0ms);
    EXPECT_TRUE(acquired);
    if (acquired) {
        EXPECT_EQ(got.get(), 1) << "the waiter was handed a hold whose key was gone";
    }
    EXPECT_GE(lost.calls.load(), 1) << "the owner of the deleted hold was not told";
    done.set_value();
    waiter.join();
}

// multi_lock's one-script acquire (parts of one client) whose reply comes too late may have
// run on the server: it is undone, every part, before the error reaches the caller, as
// basic_lock's attempt undoes its own. Failed before: both parts stayed for the whole lease
// with nobody holding them.
TEST_F(network, a_multi_lock_acquire_whose_reply_comes_too_late_leaves_no_part_behind) {
    rlock::client c(through_proxy(30s, 500ms));
    rlock::mutex a(c, name() + ":a");
    rlock::reentrant_lock b(c, name() + ":b");
    rlock::multi_lock both{a, b};
    both.lock();
    both.unlock();  // the scripts are cached now: the slowed call runs, not NOSCRIPT
    proxy.slow_replies_on_open_connections(1500ms);
    bool locked = false;
    try {
        locked = both.try_lock();
    } catch (const rlock::error& e) {
        EXPECT_TRUE(connection_error(e.value())) << e.what();
    }
    proxy.slow_replies_on_open_connections(0ms);
    ASSERT_FALSE(locked) << "the slowed reply did not time out: nothing was tested";
    EXPECT_EQ(server.integer({"EXISTS", name() + ":a", name() + ":b"}), 0)
        << "a failed acquire left its parts for a whole lease";
    EXPECT_TRUE(both.try_lock_for(2s));
    both.unlock();
}

// ---------------------------------------------------------------------------------------------
// clock_*: the worker under libfaketime; its wall clock jumps by hours and days while it holds
// watched and leased locks and waits in try_lock_for. Redis runs on the real clock.

// A TSan worker runs under libfaketime fine (checked); ASan insists on coming first in the
// library list, which LD_PRELOAD breaks.
#if defined(__SANITIZE_ADDRESS__)
#define RLOCK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RLOCK_TEST_ASAN 1
#endif
#endif

const char* const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

TEST(clock_jumps, leases_renewals_and_waits_ignore_the_wall_clock) {
#ifdef RLOCK_TEST_ASAN
    GTEST_SKIP() << "libfaketime cannot be preloaded into an ASan build (the ASan runtime must "
                    "come first in the library list); the plain and TSan builds run this test";
#endif
    if (::access(libfaketime, R_OK) != 0) {
        GTEST_SKIP() << libfaketime
                     << " is missing: apt-get install faketime (scripts/lib.sh "
                        "installs it)";
    }
    redis_server s;
    char tmpl[] = "/tmp/rlock-faketime-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ::close(fd);
    const std::string file = tmpl;
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    // FAKETIME itself must stay unset: it would take priority over the file.
    env_s.push_back(std::string("LD_PRELOAD=") + libfaketime);
    env_s.push_back("FAKETIME_TIMESTAMP_FILE=" + file);
    env_s.push_back("FAKETIME_NO_CACHE=1");
    env_s.push_back("FAKETIME_DONT_FAKE_MONOTONIC=1");
    std::vector<char*> envp;
    for (auto& e : env_s) {
        if (e.rfind("FAKETIME=", 0) != 0) envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    std::vector<std::string> args = {RLOCK_TEST_WORKER, std::to_string(s.port()), "clock-jumps",
                                     rlock_test::test_lock_name(), file};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()), 0);
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 1200 && !exited; ++i) {  // 60 s: the worker needs about 8
        exited = ::waitpid(pid, &status, WNOHANG) == pid;
        if (!exited) std::this_thread::sleep_for(50ms);
    }
    if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
    }
    std::remove(file.c_str());
    ASSERT_TRUE(exited) << "the worker hung: a wait measured on the wall clock?";
    ASSERT_TRUE(WIFEXITED(status)) << "the worker died of signal " << WTERMSIG(status);
    ASSERT_NE(WEXITSTATUS(status), 5) << "libfaketime did not move the worker's wall clock";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "see the worker's messages above";
}

// ---------------------------------------------------------------------------------------------
// memory_*: a server at maxmemory.

/// Writes 16 KB values under junk:* until the server refuses one with OOM; their count.
int fill_until_oom(const redis_server& s) {
    rlock::detail::context_ptr c(redisConnect("127.0.0.1", s.port()));
    const std::string value(16 * 1024, 'x');
    for (int i = 0; i < 4000; ++i) {
        auto r = rlock::detail::command(c.get(), {"SET", "junk:" + std::to_string(i), value});
        if (rlock::detail::reply_is_error(r.get(), "OOM")) return i;
    }
    return -1;
}

/// An acquire on a full server fails with the server's OOM error, named as such; never a
/// "busy" false. With `may_hold`, a real hold is the other acceptable answer: Redis lets a script
/// write once it has written (the fair lock's first write is a ZREM, which OOM allows).
template <class Lock>
void expect_oom_refusal(rlock::client& c, const std::string& name, bool may_hold = false) {
    Lock lock(c, name);
    for (int call = 0; call < 2; ++call) {
        SCOPED_TRACE(name + (call == 0 ? " try_lock" : " lock"));
        try {
            bool got = false;
            if (call == 0) {
                got = lock.try_lock();
            } else {
                lock.lock();
                got = true;
            }
            if (got && may_hold) {
                std::printf("[   info   ] %s was taken on a full server (Redis let it write)\n",
                            name.c_str());
                lock.unlock();  // may fail with OOM in turn: then the key expires with its lease
                continue;
            }
            ADD_FAILURE() << (got ? "acquired" : "refused as if busy") << " on a server that is "
                          << "out of memory";
            if (got) lock.unlock();
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::server_error) << e.what();
            EXPECT_NE(std::string(e.what()).find("OOM"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    }
}

TEST(memory_pressure, an_acquire_on_a_full_server_reports_oom_not_busy) {
    redis_server s({"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"});
    rlock::client c(s.options());
    rlock::mutex warm(c, "warm-up");  // let the client learn that scripts run (plain SET path)
    warm.lock();
    warm.unlock();
    ASSERT_GT(fill_until_oom(s), 0) << "the server never refused a write: nothing to test";
    // At the limit, the memory freed with each refused command's buffer lets the next small
    // write through now and then. Hold the server firmly over its limit instead.
    s.cmd({"CONFIG", "SET", "maxmemory", "1mb"});
    expect_oom_refusal<rlock::mutex>(c, "full:mutex");
    expect_oom_refusal<rlock::reentrant_lock>(c, "full:reentrant");
    expect_oom_refusal<rlock::fair_lock>(c, "full:fair", /*may_hold=*/true);
    // A fresh client's first acquire goes by script: the same answer.
    rlock::client fresh(s.options());
    expect_oom_refusal<rlock::mutex>(fresh, "full:fresh");
    EXPECT_EQ(s.integer({"EXISTS", "full:mutex", "full:reentrant", "full:fresh"}), 0)
        << "a refused acquire left its key";
    // Room again: the same client locks at once.
    s.cmd({"FLUSHALL"});
    s.cmd({"CONFIG", "SET", "maxmemory", "0"});
    rlock::mutex m(c, "full:mutex");
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST(memory_pressure, a_lock_key_evicted_under_volatile_lru_is_reported_lost_at_the_next_renewal) {
    redis_server s({"--maxmemory", "2mb", "--maxmemory-policy", "volatile-lru"});
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 3000ms;  // renewed every second
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "evicted");
    m.lock();
    // The lock key is the only key with a TTL, so it is the one volatile-lru evicts.
    ASSERT_GT(fill_until_oom(s), 0);
    ASSERT_EQ(s.integer({"EXISTS", "evicted"}), 0) << "the lock key was not evicted";
    ASSERT_TRUE(eventually([&] { return lost.calls > 0; }, 2500ms))
        << "the eviction was not reported within one renewal period and a half";
    EXPECT_TRUE(m.lost());
    EXPECT_EQ(lost.code, static_cast<int>(rlock::errc::lock_lost));
    EXPECT_NE(last_message(lost).find("found the hold gone"), std::string::npos)
        << "not found by the renewal: " << last_message(lost);
    EXPECT_NO_THROW(m.unlock());
    EXPECT_EQ(lost.calls, 1);
}

// ---------------------------------------------------------------------------------------------
// hygiene_*: what a client leaves behind.

std::size_t thread_count() {
    std::size_t n = 0;
    if (DIR* d = ::opendir("/proc/self/task")) {
        while (dirent* e = ::readdir(d)) {
            if (e->d_name[0] != '.') ++n;
        }
        ::closedir(d);
    }
    return n;
}

long long client_connections(const redis_server& s) {
    const std::string list = s.text({"CLIENT", "LIST"});
    long long n = 0;
    for (char ch : list) n += ch == '\n';
    return n - 1;  // the asking connection itself
}

TEST(hygiene, a_destroyed_client_leaves_no_threads_and_no_server_connections) {
    redis_server s;
    // ThreadSanitizer starts a background thread of its own at the process's first
    // pthread_create; start (and end) one thread first so that it is counted in the baseline.
    // A joined thread can stay listed in /proc/self/task for a moment (the kernel wakes the
    // joiner before it unlists the task: 37 of 20,000 joins here); counted then, it made the
    // baseline one too high and the test fail ("1 threads, 2 before"). So the baseline is
    // counted once that thread is gone.
    pid_t warm = 0;
    std::thread([&warm] { warm = static_cast<pid_t>(::syscall(SYS_gettid)); }).join();
    ASSERT_TRUE(eventually([&] { return ::access(("/proc/self/task/" + std::to_string(warm)).c_str(), F_OK) != 0; }, 5s));
    const std::size_t threads_before = thread_count();
    const long long connections_before = client_connections(s);
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 900ms;
    {
        rlock::client c(o), other(o);
        rlock::mutex a(c, "a"), b(c, "b");
        rlock::reentrant_lock r(c, "r");
        a.lock();
        b.lock(30s);
        r.lock();
        std::thread waiter([&] {
            rlock::mutex w(c, "a");
            if (w.try_lock_for(10s)) w.unlock();
        });
        std::thread again([&] {
            rlock::mutex w(other, "r2");
            w.lock();
            w.unlock();
        });
        std::this_thread::sleep_for(300ms);  // the waiter is subscribed
        EXPECT_GE(client_connections(s), connections_before + 4);
        EXPECT_GE(thread_count(), threads_before + 4);
        a.unlock();
        waiter.join();
        again.join();
        std::this_thread::sleep_for(700ms);  // renewals ran
        r.unlock();
    }  // b is left held: destruction does not release it
    EXPECT_TRUE(eventually([&] { return thread_count() == threads_before; }, 5s))
        << thread_count() << " threads, " << threads_before << " before";
    EXPECT_TRUE(eventually([&] { return client_connections(s) == connections_before; }, 5s))
        << client_connections(s) << " connections, " << connections_before << " before";
}

// Found by a probe: a lock object or a hold that outlived its client kept the client's pooled
// connections open (6 of 7) until the last of them was destroyed. Now they close with the
// client, and a hold's unlock after it (which still releases) keeps none.
TEST(hygiene, lock_objects_and_holds_that_outlive_their_client_keep_no_connection) {
    redis_server s;
    const long long connections_before = client_connections(s);
    auto c = std::make_unique<rlock::client>(s.options());
    auto m = std::make_unique<rlock::mutex>(*c, "kept");
    rlock::mutex other(*c, "other");
    rlock::hold h = other.async_lock(rlock::use_future).get();
    m->lock();
    m->unlock();
    EXPECT_GT(client_connections(s), connections_before);
    c.reset();
    EXPECT_TRUE(eventually([&] { return client_connections(s) == connections_before; }, 5s))
        << client_connections(s) << " connections, " << connections_before << " before";
    h.unlock();  // after the client: still released, on a connection of its own
    EXPECT_EQ(s.integer({"EXISTS", "other"}), 0);
    EXPECT_TRUE(eventually([&] { return client_connections(s) == connections_before; }, 5s))
        << client_connections(s) << " connections after the unlock, " << connections_before << " before";
    m.reset();
}

TEST(hygiene, waiters_of_a_destroyed_client_wake_with_an_error) {
    redis_server s;
    rlock::client holder(s.options());
    rlock::mutex held(holder, "busy");
    rlock::reentrant_lock held_r(holder, "busy:r");
    rlock::fair_lock held_f(holder, "busy:f");
    held.lock(60s);
    held_r.lock(60s);
    held_f.lock(60s);
    auto c = std::make_unique<rlock::client>(s.options());
    constexpr int n = 3;
    std::vector<std::promise<call_outcome>> results(n);
    std::vector<std::thread> waiters;
    // Made before the threads start: only the blocked calls race with the destruction.
    rlock::mutex w0(*c, "busy");
    rlock::reentrant_lock w1(*c, "busy:r");
    rlock::fair_lock w2(*c, "busy:f");
    for (int i = 0; i < n; ++i) {
        waiters.emplace_back([&, i] {
            call_outcome o;
            try {
                if (i == 0) {
                    w0.lock();
                } else if (i == 1) {
                    (void)w1.try_lock_for(30s);
                } else {
                    w2.lock();
                }
                o.finished = true;
            } catch (const rlock::error& e) {
                o.finished = true;
                o.threw = true;
                o.code = e.value();
                o.what = e.what();
            }
            results[i].set_value(o);
        });
    }
    std::this_thread::sleep_for(500ms);  // all three blocked
    c.reset();
    for (int i = 0; i < n; ++i) {
        auto f = results[i].get_future();
        ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "waiter " << i << " hangs";
        const call_outcome o = f.get();
        EXPECT_TRUE(o.threw) << "waiter " << i << " returned instead of reporting the client gone";
        EXPECT_EQ(o.code, rlock::errc::connection_failed) << o.what;
    }
    for (auto& t : waiters) t.join();
    held.unlock();
    held_r.unlock();
    held_f.unlock();
}

TEST(hygiene, ten_thousand_watched_holds_stay_held_across_renewals_and_unlock_leaves_nothing) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 1500ms;  // renewed every 500 ms
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    constexpr int n = 10000;
    std::vector<std::unique_ptr<rlock::mutex>> locks;
    locks.reserve(n);
    for (int i = 0; i < n; ++i) {
        locks.push_back(std::make_unique<rlock::mutex>(c, "many:" + std::to_string(i)));
        locks.back()->lock();
    }
    const auto all_held = steady::now();
    std::this_thread::sleep_for(3200ms);  // two leases, six renewal periods
    auto raw = rlock::detail::context_ptr(redisConnect("127.0.0.1", s.port()));
    for (int i = 0; i < n; ++i) {
        const std::string key = "many:" + std::to_string(i);
        redisAppendCommand(raw.get(), "PTTL %b", key.data(), key.size());
    }
    int alive = 0;
    for (int i = 0; i < n; ++i) {
        void* reply = nullptr;
        ASSERT_EQ(redisGetReply(raw.get(), &reply), REDIS_OK);
        rlock::detail::reply_ptr r(static_cast<redisReply*>(reply));
        alive += r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    }
    EXPECT_EQ(alive, n) << "keys gone " << millis(steady::now() - all_held) << " ms after the "
                        << "last lock(): renewal did not keep up";
    int lost_holds = 0;
    for (auto& l : locks) lost_holds += l->lost();
    EXPECT_EQ(lost_holds, 0);
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
    for (auto& l : locks) l->unlock();
    EXPECT_EQ(s.integer({"DBSIZE"}), 0);
    EXPECT_EQ(lost.calls, 0) << last_message(lost);
}

}  // namespace
