// The contract both rlock::mutex and rlock::reentrant_lock keep, tested on each against a real
// redis-server: standard guards, waiting and wake-ups, leases, the watchdog, lost holds,
// recovery from SCRIPT FLUSH and restarts, fencing, and mutual exclusion across processes.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/kinds.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::kind_name;
using rlock_test::redis_server;
using rlock_test::steady;

namespace {

template <class Lock>
class lock_test : public rlock_test::kind_fixture<lock_test<Lock>> {};

TYPED_TEST_SUITE(lock_test, rlock_test::lock_kinds, rlock_test::kind_names);

TYPED_TEST(lock_test, works_with_the_standard_guards) {
    rlock::client c(this->options());
    TypeParam a(c, this->name() + "a"), b(c, this->name() + "b");
    {
        std::lock_guard<TypeParam> guard(a);
        EXPECT_TRUE(a.is_locked());
        EXPECT_TRUE(a.is_held_by_current_thread());
    }
    EXPECT_FALSE(a.is_locked());
    {
        std::unique_lock<TypeParam> u(a, 1s);  // try_lock_for
        EXPECT_TRUE(u.owns_lock());
        u.unlock();
        EXPECT_TRUE(u.try_lock_until(std::chrono::system_clock::now() + 1s));
    }
    {
        std::scoped_lock both(a, b);
        EXPECT_TRUE(a.is_locked());
        EXPECT_TRUE(b.is_locked());
    }
    EXPECT_FALSE(a.is_locked());
    EXPECT_FALSE(b.is_locked());
}

// Found by a probe: a far deadline in coarse units (a time_point of seconds or hours at its
// max(), a system_clock time in the year 2300) overflowed its conversion to steady_clock
// nanoseconds, and try_lock_until gave up at once, false, on a lock freed a moment later.
TYPED_TEST(lock_test, a_far_deadline_in_coarse_units_is_waited_for) {
    rlock::client holder(this->options()), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    // Another thread holds it for 300 ms.
    auto held_briefly = [&] {
        std::promise<void> taken;
        auto done = std::async(std::launch::async, [&] {
            mine.lock();
            taken.set_value();
            std::this_thread::sleep_for(300ms);
            mine.unlock();
        });
        taken.get_future().wait();
        return done;
    };
    using std::chrono::time_point;
    auto waits = [&](const auto& deadline, const char* what) {
        auto holder_done = held_briefly();
        EXPECT_TRUE(theirs.try_lock_until(deadline)) << what;
        if (theirs.is_held_by_current_thread()) theirs.unlock();
        holder_done.get();
    };
    waits(time_point<std::chrono::steady_clock, std::chrono::seconds>::max(), "steady seconds max()");
    waits(time_point<std::chrono::system_clock, std::chrono::hours>::max(), "system hours max()");
    waits(time_point<std::chrono::system_clock, std::chrono::seconds>(std::chrono::seconds(10400000000)),
          "system seconds, year 2300");
    // A clock whose epoch is far away (libstdc++'s file_clock: 2174) is measured from its now.
    waits(std::filesystem::file_time_type::clock::now() + 5s, "file_clock now + 5 s");
    // As far in the past: one try, refused.
    auto holder_done = held_briefly();
    EXPECT_FALSE(theirs.try_lock_until(time_point<std::chrono::system_clock, std::chrono::hours>::min()));
    holder_done.get();
}

TYPED_TEST(lock_test, another_client_is_refused_until_unlock) {
    rlock::client holder(this->options()), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock();
    EXPECT_FALSE(theirs.try_lock());
    const auto start = steady::now();
    EXPECT_FALSE(theirs.try_lock_for(200ms));
    EXPECT_GE(steady::now() - start, 200ms);
    mine.unlock();
    EXPECT_TRUE(theirs.try_lock());
    theirs.unlock();
}

TYPED_TEST(lock_test, another_thread_of_the_same_client_is_refused) {
    rlock::client c(this->options());
    TypeParam lock(c, this->name());
    lock.lock();
    bool other_got_it = true;
    std::thread([&] { other_got_it = lock.try_lock(); }).join();
    EXPECT_FALSE(other_got_it);
    lock.unlock();
}

TYPED_TEST(lock_test, unlock_by_a_thread_that_never_held_it_throws_not_owner) {
    rlock::client c(this->options());
    TypeParam lock(c, this->name());
    try {
        lock.unlock();
        FAIL() << "unlock without a hold did not throw";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::not_owner);
        EXPECT_NE(std::string(e.what()).find(this->name()), std::string::npos) << e.what();
    }
    lock.lock();
    std::thread([&] { EXPECT_THROW(lock.unlock(), rlock::error); }).join();
    EXPECT_TRUE(lock.is_held_by_current_thread());
    lock.unlock();
}

TYPED_TEST(lock_test, a_blocked_waiter_wakes_at_once_when_the_holder_unlocks) {
    rlock::client holder(this->options()), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(30s);  // the waiter must not wait this lease out
    std::promise<steady::time_point> acquired;
    std::thread waiter([&] {
        theirs.lock();
        acquired.set_value(steady::now());
        theirs.unlock();
    });
    std::this_thread::sleep_for(300ms);  // let it subscribe and block
    const auto released = steady::now();
    mine.unlock();
    auto got = acquired.get_future();
    ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
    const auto delay = got.get() - released;
    waiter.join();
    EXPECT_LT(delay, 500ms) << "waited "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(delay).count()
                            << " ms after the unlock";
}

TYPED_TEST(lock_test, a_clients_blocked_waiters_take_turns_one_unlock_makes_one_of_them_try) {
    rlock::client holder(this->options()), waiters(this->options());
    TypeParam mine(holder, this->name()), theirs(waiters, this->name());
    mine.lock();
    mine.unlock();  // the release script is loaded (its first EVALSHA would be refused)
    mine.lock();
    // Top-level attempts and releases (a script's own commands are not among these).
    auto calls = [&] {
        const std::string info = this->server().text({"INFO", "commandstats"});
        long long n = 0;
        for (const char* cmd : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls=", "cmdstat_set:calls=",
                                "cmdstat_pttl:calls="}) {
            const auto at = info.find(cmd);
            if (at != std::string::npos) n += std::stoll(info.substr(at + std::strlen(cmd)));
        }
        return n;
    };
    constexpr int n = 8;
    std::atomic<int> got{0};
    std::promise<void> go_on;
    std::shared_future<void> go = go_on.get_future().share();
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
        threads.emplace_back([&] {
            theirs.lock();
            ++got;
            go.wait();
            theirs.unlock();
        });
    }
    std::this_thread::sleep_for(500ms);  // every waiter has tried once and is waiting
    const long long before = calls();
    mine.unlock();
    ASSERT_TRUE(eventually([&] { return got.load() == 1; }));
    std::this_thread::sleep_for(300ms);  // time for the others to try (they should not)
    const long long after = calls();
    EXPECT_EQ(got.load(), 1);
    EXPECT_LE(after - before, 3) << "the unlock and the first waiter's attempt; the others tried too";
    go_on.set_value();
    for (auto& t : threads) t.join();
    EXPECT_EQ(got.load(), n);
    EXPECT_FALSE(mine.is_locked());
}

// A thread that locks again right after its unlock used to beat, every time, the waiter its
// unlock message had just woken (that waiter waited seconds: docs/benchmarks.md, A = 0).
TYPED_TEST(lock_test, a_thread_that_locks_again_at_once_lets_the_waiter_it_woke_go_first) {
    rlock::client looping(this->options()), waiting(this->options());
    TypeParam mine(looping, this->name()), theirs(waiting, this->name());
    mine.lock();
    std::atomic<int> cycles{0};
    std::atomic<int> cycles_before_theirs{-1};
    std::thread waiter([&] {
        if (theirs.try_lock_for(30s)) {
            cycles_before_theirs = cycles.load();
            theirs.unlock();
        }
    });
    std::this_thread::sleep_for(500ms);  // the waiter has tried once and is waiting
    constexpr int most = 1000;  // bounded: without the courtesy the waiter is rarely let in
    for (int i = 0; i < most && cycles_before_theirs.load() < 0; ++i) {
        std::this_thread::sleep_for(1ms);  // holding, as a section does: the waiter is waiting
        mine.unlock();
        mine.lock();
        ++cycles;
    }
    mine.unlock();
    waiter.join();
    ASSERT_GE(cycles_before_theirs.load(), 0) << "the waiter never got the lock in " << most << " cycles";
    EXPECT_LE(cycles_before_theirs.load(), 20) << "the re-locking thread kept winning";
}

TYPED_TEST(lock_test, a_leased_hold_expires_after_its_lease_and_is_not_renewed) {
    rlock::client holder(this->options(300ms)), other(this->options());
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock(700ms);
    EXPECT_LE(mine.remaining_lease(), 700ms);
    const auto start = steady::now();
    ASSERT_TRUE(theirs.try_lock_for(5s));
    const auto waited = steady::now() - start;
    EXPECT_GE(waited, 400ms);  // it was held, not handed over early
    EXPECT_LT(waited, 2s);     // and the watchdog (300 ms ticks) did not keep it alive
    EXPECT_TRUE(mine.lost());
    EXPECT_NO_THROW(mine.unlock());
    EXPECT_TRUE(theirs.is_held_by_current_thread());  // the old holder's unlock left it alone
    EXPECT_EQ(this->lost.calls, 0);  // a lease running out as asked is no loss to report
    theirs.unlock();
}

TYPED_TEST(lock_test, a_watched_hold_stays_exclusive_past_its_lease_until_unlock) {
    rlock::client holder(this->options(600ms)), other(this->options(600ms));
    TypeParam mine(holder, this->name()), theirs(other, this->name());
    mine.lock();
    const auto end = steady::now() + 3s;
    int refusals = 0;
    while (steady::now() < end) {
        ASSERT_FALSE(theirs.try_lock()) << "a second holder got in while watched";
        ++refusals;
        std::this_thread::sleep_for(100ms);
    }
    EXPECT_GE(refusals, 10);
    EXPECT_FALSE(mine.lost());
    EXPECT_GT(mine.remaining_lease(), 0ms);
    mine.unlock();
    EXPECT_FALSE(theirs.is_locked());
    EXPECT_TRUE(theirs.try_lock());
    theirs.unlock();
    EXPECT_EQ(this->lost.calls, 0);
}

TYPED_TEST(lock_test, a_deleted_key_is_reported_lost_once_and_unlock_does_not_throw) {
    rlock::client c(this->options(300ms));
    TypeParam lock(c, this->name());
    lock.lock();
    EXPECT_FALSE(lock.lost());
    this->server().cmd({"DEL", this->name()});
    ASSERT_TRUE(eventually([&] { return this->lost.calls.load() > 0; }));
    EXPECT_TRUE(lock.lost());
    EXPECT_EQ(this->lost.code, static_cast<int>(rlock::errc::lock_lost));
    {
        std::lock_guard<std::mutex> g(this->lost.mu);
        EXPECT_EQ(this->lost.last_lock, this->name());
        EXPECT_NE(this->lost.last_message.find(c.server()), std::string::npos);
    }
    EXPECT_EQ(this->server().integer({"EXISTS", this->name()}), 0) << "renewal re-created it";
    EXPECT_NO_THROW(lock.unlock());
    std::this_thread::sleep_for(400ms);
    EXPECT_EQ(this->lost.calls, 1);
    // The loss stays visible after the unlock that found it, until this thread locks again.
    EXPECT_TRUE(lock.lost());
    lock.lock();
    EXPECT_FALSE(lock.lost());
    lock.unlock();
    EXPECT_FALSE(lock.lost());
    EXPECT_EQ(this->lost.calls, 1);
}

TYPED_TEST(lock_test, a_server_paused_past_the_lease_makes_the_hold_lost) {
    rlock::client_options o = this->options(400ms);
    o.command_timeout = 100ms;
    rlock::client c(o);
    TypeParam lock(c, this->name());
    lock.lock();
    this->server().pause();
    const bool lost_in_time = eventually([&] { return lock.lost(); }, 2s);
    this->server().resume();
    EXPECT_TRUE(lost_in_time);
    ASSERT_TRUE(eventually([&] { return this->lost.calls.load() > 0; }));
    EXPECT_NO_THROW(lock.unlock());
    EXPECT_EQ(this->lost.calls, 1);
    EXPECT_TRUE(lock.try_lock_for(2s));  // the client recovered
    lock.unlock();
}

TYPED_TEST(lock_test, script_flush_is_recovered_invisibly) {
    rlock::client c(this->options(300ms));
    TypeParam lock(c, this->name(), rlock::lock_options{true});
    lock.lock();
    lock.unlock();
    this->server().cmd({"SCRIPT", "FLUSH"});
    lock.lock();  // acquire (fenced: a script) after the flush
    this->server().cmd({"SCRIPT", "FLUSH"});
    std::this_thread::sleep_for(500ms);  // renewals after the flush
    EXPECT_FALSE(lock.lost());
    this->server().cmd({"SCRIPT", "FLUSH"});
    lock.unlock();  // release after the flush
    EXPECT_FALSE(lock.is_locked());
    EXPECT_EQ(this->lost.calls, 0);
}

TYPED_TEST(lock_test, a_server_restart_while_held_is_reported_and_the_client_recovers) {
    redis_server own;
    rlock::client_options o = own.options();
    o.lock_watchdog_timeout = 300ms;
    o.on_lock_lost = this->lost.handler();
    rlock::client c(o);
    TypeParam lock(c, this->name());
    lock.lock();
    own.restart();  // empty: the hold is gone
    ASSERT_TRUE(eventually([&] { return this->lost.calls.load() > 0; }));
    EXPECT_TRUE(lock.lost());
    EXPECT_NO_THROW(lock.unlock());
    EXPECT_TRUE(lock.try_lock_for(2s));
    EXPECT_EQ(own.integer({"EXISTS", this->name()}), 1);
    lock.unlock();
    EXPECT_EQ(this->lost.calls, 1);
}

// Issue 16: a server restarted empty between lock() and unlock(), before any watchdog tick
// (30 s watchdog: its next tick is 10 s away). Whether another client took the lock meanwhile
// or not, unlock() tells the owner: lost() is true and on_lock_lost was called once with
// lock_lost naming the lock and the server. Failed before: the release went into the
// connection the old server had closed, its retry found the key gone, and that was counted as
// the first try's work.
TYPED_TEST(lock_test, an_unlock_after_a_restart_lost_the_hold_tells_the_owner) {
    for (const bool taken : {true, false}) {
        SCOPED_TRACE(taken ? "another client took the lock" : "nobody took the lock");
        redis_server own;
        rlock_test::lost_log lost;
        rlock::client_options o = own.options();
        o.on_lock_lost = lost.hold_handler();
        rlock::client c(o);
        rlock::client other(own.options());
        TypeParam lock(c, this->name()), theirs(other, this->name());
        lock.lock();
        const std::uint64_t id = lock.hold_id();
        own.restart();  // empty
        if (taken) {
            ASSERT_TRUE(theirs.try_lock_for(2s));
        }
        EXPECT_NO_THROW(lock.unlock());
        EXPECT_TRUE(lock.lost());
        EXPECT_EQ(lost.calls.load(), 1);
        EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
        EXPECT_EQ(lost.last_hold_id.load(), id);
        {
            std::lock_guard<std::mutex> g(lost.mu);
            EXPECT_EQ(lost.last_lock, this->name());
            EXPECT_NE(lost.last_message.find(this->name()), std::string::npos) << lost.last_message;
            EXPECT_NE(lost.last_message.find(c.server()), std::string::npos) << lost.last_message;
        }
        if (taken) {
            EXPECT_TRUE(theirs.is_held_by_current_thread()) << "the unlock released another's hold";
            theirs.unlock();
        }
    }
}

// The owner told of a loss at unlock sees lost() true from inside its on_lock_lost handler: the
// hold is marked lost before the owner is told. Failed before: lost() read false there.
TYPED_TEST(lock_test, a_handler_told_of_a_loss_at_unlock_already_sees_lost) {
    redis_server own;
    std::atomic<TypeParam*> watched{nullptr};
    std::atomic<int> calls{0}, seen_lost{0};
    const std::thread::id me = std::this_thread::get_id();
    rlock::client_options o = own.options();
    o.on_lock_lost = [&](std::string_view, const rlock::error&) {
        if (std::this_thread::get_id() != me) return;  // the watchdog's (below)
        ++calls;
        if (TypeParam* l = watched.load()) seen_lost += l->lost() ? 1 : 0;
    };
    // The case under test is a loss found by unlock. With loss tracking on, the FLUSHALL's
    // invalidation races the unlock and the watchdog's check often tells first (seen under
    // ASan in CI: all five rounds): tracking is off here, as a server that refuses it.
    o.loss_tracking = false;
    rlock::client c(o);
    // On a busy machine the subscriber's first connection can still come after the FLUSHALL,
    // and the check of the holds it asks for then finds the loss first, on the watchdog's
    // thread, and unlock tells nothing more: then the round is made again with the same
    // client, whose subscriber is connected by then.
    for (int round = 0; round < 5; ++round) {
        TypeParam lock(c, this->name() + "-" + std::to_string(round));
        calls = 0;
        seen_lost = 0;
        watched = &lock;
        lock.lock();
        own.cmd({"FLUSHALL"});
        EXPECT_NO_THROW(lock.unlock());
        watched = nullptr;
        if (calls.load() == 0) continue;  // told on the watchdog's thread
        EXPECT_EQ(calls.load(), 1);
        EXPECT_EQ(seen_lost.load(), 1) << "lost() read false inside the handler";
        EXPECT_TRUE(lock.lost());
        return;
    }
    FAIL() << "the loss was never found by unlock in five rounds";
}

// Issue 16: when the client's connections break and the server comes back without the hold,
// the watchdog checks at once instead of at its next tick (10 s away here): the owner is told
// within a command_timeout or so of the server answering again. Failed before: told only at the
// next tick.
TYPED_TEST(lock_test, a_restart_that_lost_a_watched_hold_is_found_at_once) {
    redis_server own;
    rlock_test::lost_log lost;
    rlock::client_options o = own.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    TypeParam lock(c, this->name());
    lock.lock();
    own.restart();
    const auto back = steady::now();
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 4s))
        << "not told within 4 s of the restart (the next watchdog tick is 10 s away)";
    EXPECT_LT(steady::now() - back, 4s);
    EXPECT_TRUE(lock.lost());
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
    lock.unlock();
    EXPECT_EQ(lost.calls.load(), 1);
}

// Issue 16: a hold is told apart from the next hold of the same name by its id, and the report
// carries its fencing token. The two-argument handler still works (lost_log::handler).
TYPED_TEST(lock_test, a_loss_report_names_the_hold_and_its_fencing_token) {
    rlock_test::lost_log lost;
    rlock::client_options o = this->options(300ms);
    o.on_lock_lost = lost.hold_handler();
    rlock::client c(o);
    TypeParam lock(c, this->name(), rlock::lock_options{true});
    lock.lock();
    const std::uint64_t first = lock.hold_id();
    lock.unlock();
    lock.lock();
    const std::uint64_t id = lock.hold_id();
    const std::uint64_t token = lock.fencing_token();
    EXPECT_NE(id, first);
    this->server().cmd({"DEL", this->name()});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }));
    EXPECT_EQ(lost.last_hold_id.load(), id);
    EXPECT_EQ(lost.last_fencing.load(), token);
    lock.unlock();
    EXPECT_THROW((void)lock.hold_id(), rlock::error);
}

// Issue 16: a thread that exits holding a watched lock does not keep it for the client's
// lifetime: renewal stops, the owner is told (naming the cause), and another client gets the
// lock once the lease has run out. Failed before: renewed forever, never told.
TYPED_TEST(lock_test, a_thread_that_exits_holding_a_watched_lock_stops_renewing_it) {
    rlock_test::lost_log lost;
    rlock::client_options o = this->options(600ms);
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::client other(this->options());
    TypeParam lock(c, this->name()), theirs(other, this->name());
    std::thread([&] { lock.lock(); }).join();
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 2s));
    {
        std::lock_guard<std::mutex> g(lost.mu);
        EXPECT_NE(lost.last_message.find("exited"), std::string::npos) << lost.last_message;
    }
    EXPECT_TRUE(theirs.try_lock_for(3s)) << "the exited thread's hold is still renewed";
    theirs.unlock();
    EXPECT_EQ(lost.calls.load(), 1);
}

// Issue 16: a lock object used after its client was destroyed refuses to take a hold that
// nothing would renew or release. Failed before: lock() succeeded.
TYPED_TEST(lock_test, acquiring_through_a_destroyed_client_fails_with_connection_failed) {
    auto c = std::make_unique<rlock::client>(this->options());
    TypeParam lock(*c, this->name());
    c.reset();
    try {
        lock.lock();
        FAIL() << "lock() through a destroyed client succeeded";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
    }
    EXPECT_EQ(this->server().integer({"EXISTS", this->name()}), 0);
}

TYPED_TEST(lock_test, fencing_tokens_strictly_increase_across_clients) {
    rlock::client one(this->options()), two(this->options());
    const rlock::lock_options fenced{true};
    TypeParam a(one, this->name(), fenced), b(two, this->name(), fenced);
    std::uint64_t last = 0;
    for (int i = 0; i < 5; ++i) {
        TypeParam& l = i % 2 ? b : a;
        l.lock();
        const std::uint64_t token = l.fencing_token();
        EXPECT_GT(token, last);
        last = token;
        l.unlock();
    }
    EXPECT_EQ(std::to_string(last),
              this->server().text({"GET", "redisson_lock_token:{" + this->name() + "}"}));
    // The counter never expires (docs/api.md, "Fencing"): the tokens lean on the server's clock
    // only for a name's first one and after a data loss, not after every idle spell.
    EXPECT_EQ(this->server().integer({"PTTL", "redisson_lock_token:{" + this->name() + "}"}), -1);
    TypeParam plain(one, this->name() + "plain");
    plain.lock();
    EXPECT_THROW((void)plain.fencing_token(), rlock::error);
    plain.unlock();
    EXPECT_EQ(this->server().integer({"EXISTS", "redisson_lock_token:{" + this->name() + "plain}"}), 0);
}

TYPED_TEST(lock_test, fencing_tokens_keep_increasing_after_the_server_loses_its_data) {
    // A server without persistence loses the counter with the locks (FLUSHALL, a restart). A
    // counter that started again at 1 would make a fenced resource refuse every rightful
    // holder until it passed the old high-water mark; a missing counter starts from the
    // server's clock in microseconds instead.
    const rlock::lock_options fenced{true};
    const std::string counter = "redisson_lock_token:{" + this->name() + "}";
    std::uint64_t highest = 0;
    auto take = [&](const char* after) {
        SCOPED_TRACE(after);
        rlock::client c(this->options());
        TypeParam l(c, this->name(), fenced);
        for (int i = 0; i < 3; ++i) {
            l.lock();
            const std::uint64_t token = l.fencing_token();
            EXPECT_GT(token, highest);
            highest = std::max(highest, token);
            l.unlock();
        }
    };
    take("the first tokens");
    this->server().cmd({"FLUSHALL"});
    take("after FLUSHALL");
    this->server().restart();
    take("after a restart without persistence");
    // Redisson's RFencedLock only INCRs the same key: its tokens keep increasing too.
    EXPECT_GT(static_cast<std::uint64_t>(this->server().integer({"INCR", counter})), highest);
}

TYPED_TEST(lock_test, queries_report_the_state_in_redis) {
    rlock::client c(this->options()), other(this->options());
    TypeParam lock(c, this->name()), theirs(other, this->name());
    EXPECT_FALSE(lock.is_locked());
    EXPECT_EQ(lock.remaining_lease(), 0ms);
    EXPECT_FALSE(lock.is_held_by_current_thread());
    EXPECT_FALSE(lock.lost());
    lock.lock(10s);
    EXPECT_TRUE(theirs.is_locked());
    EXPECT_FALSE(theirs.is_held_by_current_thread());
    const auto left = theirs.remaining_lease();
    EXPECT_GT(left, 5s);
    EXPECT_LE(left, 10s);
    // force_unlock frees it for everyone and wakes waiters; the old holder is not disturbed.
    std::promise<void> got;
    std::thread waiter([&] {
        rlock::client third(this->options());
        TypeParam l(third, this->name());
        l.lock();
        got.set_value();
        l.unlock();
    });
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(theirs.force_unlock());
    EXPECT_EQ(got.get_future().wait_for(5s), std::future_status::ready);
    waiter.join();
    EXPECT_NO_THROW(lock.unlock());
    EXPECT_FALSE(theirs.force_unlock());
}

TYPED_TEST(lock_test, bad_input_is_refused_before_anything_is_sent) {
    rlock::client c(this->options());
    try {
        TypeParam unnamed(c, "");
        FAIL() << "an empty name was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find(c.server()), std::string::npos) << e.what();
    }
    TypeParam lock(c, this->name());
    EXPECT_THROW(lock.lock(0ms), rlock::error);
    EXPECT_THROW((void)lock.try_lock_for(1s, -5ms), rlock::error);
    EXPECT_EQ(this->server().integer({"EXISTS", this->name()}), 0);
}

TYPED_TEST(lock_test, excludes_across_four_processes_of_two_threads) {
    const std::string kind = kind_name<TypeParam>();
    const std::string counter = this->name() + ":counter";
    this->server().cmd({"DEL", counter});
    constexpr int processes = 4, threads = 2, iterations = 40;
    std::vector<pid_t> pids;
    for (int p = 0; p < processes; ++p) {
        pids.push_back(rlock_test::spawn({RLOCK_TEST_WORKER, std::to_string(this->server().port()),
                                          kind, this->name(), std::to_string(threads),
                                          std::to_string(iterations), counter}));
        ASSERT_GT(pids.back(), 0);
    }
    for (pid_t pid : pids) EXPECT_EQ(rlock_test::wait_exit(pid), 0);
    EXPECT_EQ(this->server().text({"GET", counter}),
              std::to_string(processes * threads * iterations));
    EXPECT_EQ(this->server().integer({"EXISTS", this->name()}), 0);
}


// Issue 32: local hand-off. Threads of one client that want one mutex wait for it in the
// process, behind one of them that waits at Redis; an unlock hands the hold to the next of them
// without a round trip, within a bound, so that other clients still get their turn.
class local_handoff : public rlock_test::kind_fixture<local_handoff> {
protected:
    // Top-level lock commands the server ran: acquires (SET, scripts), releases (scripts).
    long long lock_calls() {
        const std::string info = server().text({"INFO", "commandstats"});
        long long n = 0;
        for (const char* cmd : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls=", "cmdstat_set:calls=",
                                "cmdstat_publish:calls="}) {
            const auto at = info.find(cmd);
            if (at != std::string::npos) n += std::stoll(info.substr(at + std::strlen(cmd)));
        }
        return n;
    }

    // A thread of `c` waits for the lock while this thread holds it; this thread unlocks.
    // Returns the key's value while each held it, and the lock commands the hand-over cost.
    struct hand_over {
        std::string first, second;
        long long calls = 0;
    };
    void another_client_gets_in(const rlock::client_options& o);
    hand_over unlock_to_a_waiting_thread(rlock::client& c, rlock::lock_options lo = {}) {
        rlock::mutex mine(c, name(), lo), theirs(c, name(), lo);
        mine.lock();
        hand_over out;
        out.first = server().text({"GET", name()});
        std::promise<std::string> seen;
        std::promise<void> done;
        std::thread waiter([&] {
            theirs.lock();
            seen.set_value(server().text({"GET", name()}));
            done.get_future().wait();
            theirs.unlock();
        });
        std::this_thread::sleep_for(300ms);  // it waits
        const long long before = lock_calls();
        mine.unlock();
        auto got = seen.get_future();
        if (got.wait_for(5s) == std::future_status::ready) {
            out.second = got.get();
            out.calls = lock_calls() - before;
        }
        done.set_value();
        waiter.join();
        return out;
    }
};

// The waiter must be waiting when the unlock comes: a hold of 300 ms, longer than the default
// local_handoff_time (10 ms) from the acquisition at Redis, which would end the passes.
rlock::client_options patient(rlock::client_options o) {
    o.local_handoff_time = 60s;
    return o;
}

TEST_F(local_handoff, an_unlock_hands_the_hold_to_a_waiting_thread_of_the_client_without_a_round_trip) {
    rlock::client c(patient(options()));
    const hand_over h = unlock_to_a_waiting_thread(c);
    ASSERT_FALSE(h.second.empty()) << "the waiting thread did not get the lock";
    EXPECT_EQ(h.second, h.first) << "the hold went through Redis (a new token)";
    EXPECT_EQ(h.calls, 0) << "the hand-over sent lock commands";
    // The last unlock, with no one waiting, releases through Redis.
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

TEST_F(local_handoff, turned_off_for_a_lock_or_a_client_every_hold_goes_through_redis) {
    {
        rlock::client c(patient(options()));
        const hand_over h = unlock_to_a_waiting_thread(c, rlock::lock_options{false, 300000ms, false});
        ASSERT_FALSE(h.second.empty());
        EXPECT_NE(h.second, h.first);
        EXPECT_GE(h.calls, 2) << "a release and an acquire";
    }
    rlock::client_options o = patient(options());
    o.local_handoff_passes = 0;
    rlock::client c(o);
    const hand_over h = unlock_to_a_waiting_thread(c);
    ASSERT_FALSE(h.second.empty());
    EXPECT_NE(h.second, h.first);
}

TEST_F(local_handoff, a_fenced_hold_is_not_handed_over_each_holder_gets_its_own_token) {
    rlock::client c(patient(options()));
    const hand_over h = unlock_to_a_waiting_thread(c, rlock::lock_options{true});
    ASSERT_FALSE(h.second.empty());
    EXPECT_NE(h.second, h.first);
}

// The bound: threads of one client that keep the lock busy between them release it through
// Redis after local_handoff_passes passes, or local_handoff_time after they took it at Redis,
// and another client's waiter gets in. Without a bound it starves (the threads always have a
// waiter to pass to).
TEST_F(local_handoff, another_clients_waiter_gets_in_while_threads_of_one_client_keep_the_lock_busy) {
    rlock::client_options o = options();
    o.local_handoff_passes = 4;
    o.local_handoff_time = 60s;  // the passes bound it
    another_client_gets_in(o);
    o.local_handoff_passes = 100000;
    o.local_handoff_time = 20ms;  // the time bounds it
    another_client_gets_in(o);
}

void local_handoff::another_client_gets_in(const rlock::client_options& o) {
    SCOPED_TRACE(std::to_string(o.local_handoff_passes) + " passes, " +
                 std::to_string(o.local_handoff_time.count()) + " ms");
    rlock::client busy(o), other(options());
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    // The critical sections under one acquisition at Redis (one token), in a row: the first
    // holder and the holders it was passed to. The lock orders the sections; the mutex is for
    // the record's sake.
    std::mutex record_mu;
    std::string token;
    int in_row = 0, longest = 0;
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
        threads.emplace_back([&] {
            rlock::mutex m(busy, name());
            for (int n = 0; n < 5000 && !stop.load(); ++n) {  // bounded
                m.lock();
                const std::string now = server().text({"GET", name()});
                {
                    std::lock_guard<std::mutex> g(record_mu);
                    in_row = now == token ? in_row + 1 : 1;
                    token = now;
                    longest = std::max(longest, in_row);
                }
                ++cycles;
                std::this_thread::sleep_for(1ms);
                m.unlock();
            }
        });
    }
    ASSERT_TRUE(eventually([&] { return cycles.load() > 20; }));
    rlock::mutex theirs(other, name());
    const int before = cycles.load();
    const bool got = theirs.try_lock_for(5s);
    const int waited_cycles = cycles.load() - before;
    if (got) theirs.unlock();
    stop = true;
    for (auto& t : threads) t.join();
    ASSERT_TRUE(got) << "the other client's waiter starved behind " << waited_cycles << " local passes";
    // The bound itself: at most local_handoff_passes passes after the acquisition, and none
    // once local_handoff_time has passed since it (each section sleeps 1 ms: 20 + 1 at most,
    // and one for the clock's grain). What follows a release through Redis is a race there,
    // which a loaded machine may let this client win again (CI: 66 sections went by in one
    // wait, under a second test run and two busy loops).
    const int allowed = o.local_handoff_passes < 1000
                            ? static_cast<int>(o.local_handoff_passes) + 1
                            : static_cast<int>(o.local_handoff_time / 1ms) + 2;
    EXPECT_LE(longest, allowed) << "sections under one acquisition at Redis";
}

// A hold the client knows lost is not handed on: the next thread acquires at Redis.
TEST_F(local_handoff, a_hold_known_lost_is_not_handed_over) {
    rlock::client c(options(300ms));
    rlock::mutex mine(c, name()), theirs(c, name());
    mine.lock();
    std::promise<bool> held;
    std::thread waiter([&] {
        theirs.lock();
        held.set_value(server().integer({"EXISTS", name()}) == 1 && !theirs.lost());
        theirs.unlock();
    });
    std::this_thread::sleep_for(200ms);
    server().cmd({"DEL", name()});
    ASSERT_TRUE(eventually([&] { return mine.lost(); }));
    mine.unlock();  // told, not thrown
    auto f = held.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(f.get()) << "the waiting thread was handed a hold that was gone";
    waiter.join();
    EXPECT_EQ(lost.calls.load(), 1);
}

// Loss during a hand-off: the key is deleted while one thread holds it, and that thread hands
// it on before the watchdog looks. When the watchdog finds it gone, the thread holding it is
// told — and so is the one that handed it on, which may have held nothing either. Loss
// tracking off (a server that refuses it, or a client that turned it off): with it on, the
// deletion is usually told before the unlock, which then does not hand on (the test above).
TEST_F(local_handoff, a_loss_found_after_a_hand_over_is_told_to_the_owner_that_handed_it_on_too) {
    rlock::client_options o = patient(options(3000ms));  // the watchdog looks every second
    o.loss_tracking = false;
    rlock::client c(o);
    rlock::mutex mine(c, name()), theirs(c, name());
    mine.lock();
    std::promise<void> got, done;
    std::thread waiter([&] {
        theirs.lock();
        got.set_value();
        done.get_future().wait();
        theirs.unlock();  // told already; nothing thrown
    });
    std::this_thread::sleep_for(200ms);  // it waits
    server().cmd({"DEL", name()});
    mine.unlock();  // handed on: the client does not know yet
    got.get_future().wait();
    EXPECT_TRUE(eventually([&] { return lost.calls.load() >= 2; }, 5s))
        << "told " << lost.calls.load() << " owner(s) of the lost hold";
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(lost.calls.load(), 2);
    done.set_value();
    waiter.join();
}

// A thread that exits holding frees the gate: the next local waiter waits at Redis, and gets
// the lock when the exited thread's lease runs out.
// A long run of passes (local_handoff_passes and local_handoff_time set high) is let go one
// record at a time. Each owner's record is kept while a loss found later may be theirs (until
// a renewal finds the key); before, the records of the whole run were freed by a recursion as
// deep as the run, on the thread that let go of the last one: 138,000 passes overflowed an
// 8 MB stack. Here the threads have 512 KB stacks and pass the lock some 18,000 times.
TEST_F(local_handoff, a_long_run_of_passes_is_let_go_without_a_recursion_as_deep_as_the_run) {
    rlock::client_options o = options();
    o.local_handoff_passes = 1000000;
    o.local_handoff_time = 3600s;
    struct count_passes : rlock::lock_listener {
        std::atomic<long> handed{0}, all{0};
        void acquired(const rlock::acquired_event& e) override {
            ++all;
            if (e.handed_locally) ++handed;
        }
    };
    auto passes = std::make_shared<count_passes>();
    o.listener = passes;
    rlock::client c(o);
    std::atomic<int> inside{0}, overlaps{0};
    struct job {
        rlock::client* c;
        std::string name;
        std::atomic<int>* inside;
        std::atomic<int>* overlaps;
    } j{&c, name(), &inside, &overlaps};
    const auto run = [](void* arg) -> void* {
        job& j = *static_cast<job*>(arg);
        rlock::mutex m(*j.c, j.name);
        for (int i = 0; i < 6000; ++i) {
            m.lock();
            if (j.inside->fetch_add(1) != 0) ++*j.overlaps;
            j.inside->fetch_sub(1);
            m.unlock();
        }
        return nullptr;
    };
    pthread_attr_t small;
    ASSERT_EQ(pthread_attr_init(&small), 0);
    ASSERT_EQ(pthread_attr_setstacksize(&small, 512 * 1024), 0);
    std::vector<pthread_t> threads(3);
    for (pthread_t& t : threads) ASSERT_EQ(pthread_create(&t, &small, run, &j), 0);
    for (pthread_t t : threads) pthread_join(t, nullptr);
    pthread_attr_destroy(&small);
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_EQ(passes->all.load(), 18000);
    EXPECT_GT(passes->handed.load(), 9000) << "too few passes to make a long run";
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

TEST_F(local_handoff, a_thread_that_exits_holding_does_not_strand_the_local_waiters) {
    rlock::client c(options(300ms));
    rlock::mutex theirs(c, name());
    std::promise<void> locked;
    std::thread holder([&] {
        rlock::mutex(c, name()).lock();
        locked.set_value();
        std::this_thread::sleep_for(300ms);  // the other thread waits behind it; then it exits
    });
    locked.get_future().wait();
    EXPECT_TRUE(theirs.try_lock_for(5s));
    holder.join();
    theirs.unlock();
}

// A multi_lock whose head part waited at a mutex's gate, released with the other parts in one
// script, frees the gate: the client's next thread gets that mutex. (Before gate_place, the
// gate stayed taken and every later lock() of the mutex on the client waited for ever: the
// safety matrix's multi_lock runs hung.)
TEST_F(local_handoff, a_multi_lock_released_in_one_script_frees_its_parts_gates) {
    rlock::client c(options()), other(options());
    rlock::mutex first(c, name() + "1"), second(c, name() + "2"), held_elsewhere(other, name() + "1");
    std::promise<void> locked;
    std::thread unlocker([&] {
        held_elsewhere.lock();
        locked.set_value();
        std::this_thread::sleep_for(200ms);
        held_elsewhere.unlock();
    });
    locked.get_future().wait();
    rlock::multi_lock both(first, second);
    both.lock();  // refused in one script, then waits for the first part at its gate
    unlocker.join();
    both.unlock();  // one script
    std::promise<bool> got;
    std::thread next([&] {
        rlock::mutex again(c, name() + "1");
        const bool ok = again.try_lock_for(3s);
        if (ok) again.unlock();
        got.set_value(ok);
    });
    auto f = got.get_future();
    EXPECT_TRUE(f.get()) << "the mutex's gate stayed taken after the multi_lock's release";
    next.join();
}

TEST_F(local_handoff, a_thread_waiting_in_the_process_throws_connection_failed_when_the_client_is_destroyed) {
    auto c = std::make_unique<rlock::client>(options());
    rlock::mutex mine(*c, name()), theirs(*c, name());
    mine.lock();
    std::promise<int> ended;
    std::thread waiter([&] {
        try {
            theirs.lock();
            ended.set_value(0);
        } catch (const rlock::error& e) {
            ended.set_value(static_cast<int>(e.value()));
        }
    });
    std::this_thread::sleep_for(300ms);
    c.reset();
    auto f = ended.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(f.get(), static_cast<int>(rlock::errc::connection_failed));
    waiter.join();
}

// Asynchronous acquires of the client meet the blocking ones at the same gate: an unlock hands
// the hold to a waiting async_lock, and an asynchronous holder's unlock to a waiting thread,
// without a round trip; the key keeps its token.
TEST_F(local_handoff, an_unlock_hands_the_hold_to_an_asynchronous_waiter_and_it_hands_it_on_to_a_thread) {
    rlock::client c(patient(options()));
    rlock::mutex m(c, name());
    m.lock();
    const std::string token = server().text({"GET", name()});
    std::future<rlock::hold> f = m.async_lock(rlock::use_future);
    std::this_thread::sleep_for(300ms);  // it waits
    ASSERT_EQ(f.wait_for(0s), std::future_status::timeout) << "acquired while the lock was held";
    const long long before = lock_calls();
    m.unlock();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    rlock::hold h = f.get();
    ASSERT_TRUE(h);
    EXPECT_EQ(server().text({"GET", name()}), token) << "the hold went through Redis (a new token)";
    std::promise<std::string> seen;
    std::promise<void> done;
    std::thread waiter([&] {
        rlock::mutex theirs(c, name());
        theirs.lock();
        seen.set_value(server().text({"GET", name()}));
        done.get_future().wait();
        theirs.unlock();
    });
    std::this_thread::sleep_for(300ms);  // it waits
    h.unlock();
    auto got = seen.get_future();
    ASSERT_EQ(got.wait_for(5s), std::future_status::ready) << "the waiting thread did not get the lock";
    EXPECT_EQ(got.get(), token) << "the asynchronous holder's unlock went through Redis";
    EXPECT_EQ(lock_calls() - before, 0) << "the two hand-overs sent lock commands";
    done.set_value();
    waiter.join();
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

// A blocking acquire inside a completion handler (on the client's engine thread) waits at Redis
// beside the gate: an unlock then goes through Redis, where the handler gets the lock, instead
// of handing the hold to an asynchronous acquire queued before it, whose turn is told on the
// thread the handler keeps busy. Failed before: the handler's try_lock_for(5 s) ran out with the
// hold passed to the queued acquire (a lock() there waited for ever).
TEST_F(local_handoff, a_blocking_acquire_inside_a_completion_handler_is_not_held_up_by_a_queued_asynchronous_one) {
    rlock::client c(patient(options()));
    rlock::mutex m(c, name()), in_handler(c, name()), other(c, name() + "-other");
    m.lock();
    std::future<rlock::hold> queued = m.async_lock(rlock::use_future);
    std::promise<bool> got;
    other.async_lock([&](std::exception_ptr e, rlock::hold) {
        if (e) {
            got.set_value(false);
            return;
        }
        const bool taken = in_handler.try_lock_for(5s);
        if (taken) in_handler.unlock();
        got.set_value(taken);
    });
    std::this_thread::sleep_for(300ms);  // the handler waits, behind the queued acquire
    m.unlock();
    auto result = got.get_future();
    ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(result.get()) << "the handler's acquire waited behind the acquire its thread was to run";
    ASSERT_EQ(queued.wait_for(5s), std::future_status::ready);
    rlock::hold h = queued.get();
    EXPECT_TRUE(h);
    h.unlock();
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

// An asynchronous acquire waiting at the gate that is cancelled or whose wait runs out leaves
// its place: the hold goes to the next waiter, and nothing is left behind.
TEST_F(local_handoff, an_asynchronous_waiter_that_is_cancelled_or_runs_out_leaves_the_gate_to_the_next) {
    rlock::client c(patient(options()));
    rlock::mutex m(c, name());
    m.lock();
    const std::string token = server().text({"GET", name()});
    std::promise<std::exception_ptr> cancelled;
    const rlock::pending p =
        m.async_lock([&](std::exception_ptr e, rlock::hold) { cancelled.set_value(std::move(e)); });
    std::future<rlock::hold> runs_out = m.async_try_lock_for(200ms, rlock::use_future);
    std::future<rlock::hold> last = m.async_lock(rlock::use_future);
    std::this_thread::sleep_for(50ms);
    p.cancel();
    auto c_f = cancelled.get_future();
    ASSERT_EQ(c_f.wait_for(5s), std::future_status::ready);
    try {
        std::rethrow_exception(c_f.get());
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::operation_aborted);
    } catch (...) {
        ADD_FAILURE() << "the cancelled acquire did not complete with operation_aborted";
    }
    ASSERT_EQ(runs_out.wait_for(5s), std::future_status::ready);
    EXPECT_FALSE(runs_out.get()) << "acquired while the lock was held";
    m.unlock();
    ASSERT_EQ(last.wait_for(5s), std::future_status::ready) << "the gate was left taken";
    rlock::hold h = last.get();
    ASSERT_TRUE(h);
    EXPECT_EQ(server().text({"GET", name()}), token);
    h.unlock();
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

// A hold handed to an asynchronous acquire whose cancellation crossed the hand-over is
// released through Redis unclaimed; when that release finds the key gone, the owner that
// handed it on is told: it may have held a lock that was gone. The engine is kept busy by a
// handler so that the cancellation and the turn are queued behind it, in that order. Failed
// before: the release's answer was dropped and the owner was never told.
TEST_F(local_handoff, a_hold_handed_to_a_cancelled_asynchronous_acquire_and_found_gone_is_told_to_its_owner) {
    rlock::client_options o = patient(options(3000ms));  // the watchdog looks every second
    o.loss_tracking = false;
    rlock::client c(o);
    rlock::mutex m(c, name()), other(c, name() + "-busy");
    m.lock();
    std::promise<std::exception_ptr> ended;
    const rlock::pending p =
        m.async_lock([&](std::exception_ptr e, rlock::hold) { ended.set_value(std::move(e)); });
    std::this_thread::sleep_for(200ms);  // it waits at the gate
    std::promise<void> busy, free_engine;
    std::shared_future<void> go = free_engine.get_future().share();
    other.async_lock([&busy, go](std::exception_ptr, rlock::hold) {
        busy.set_value();
        go.wait();
    });
    ASSERT_EQ(busy.get_future().wait_for(5s), std::future_status::ready);
    p.cancel();                       // queued behind the handler
    server().cmd({"DEL", name()});    // the hold is gone; this client does not know yet
    m.unlock();                       // handed to the waiter: its turn is queued after the cancel
    free_engine.set_value();
    auto e = ended.get_future();
    ASSERT_EQ(e.wait_for(5s), std::future_status::ready);
    try {
        std::rethrow_exception(e.get());
    } catch (const rlock::error& err) {
        EXPECT_EQ(err.value(), rlock::errc::operation_aborted);
    } catch (...) {
        ADD_FAILURE() << "the cancelled acquire did not complete with operation_aborted";
    }
    EXPECT_TRUE(eventually([&] { return lost.calls.load() >= 1; }, 5s))
        << "the owner that handed the gone hold on was not told";
    EXPECT_EQ(lost.last_lock, name());
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    EXPECT_TRUE(m.try_lock()) << "the gate was left taken";
    m.unlock();
}

TEST_F(local_handoff, an_asynchronous_waiter_in_the_process_completes_with_connection_failed_when_the_client_is_destroyed) {
    auto c = std::make_unique<rlock::client>(options());
    rlock::mutex m(*c, name());
    m.lock();
    std::future<rlock::hold> f = m.async_lock(rlock::use_future);
    std::this_thread::sleep_for(300ms);
    c.reset();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    try {
        (void)f.get();
        ADD_FAILURE() << "completed with a hold";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::connection_failed);
    }
}

// A thread waiting in the process whose deadline comes while the server is down (the one at
// Redis still riding the outage) ends with the outage's error, not false (which would say the
// lock was held): its wait ends with one last try at Redis.
TEST_F(local_handoff, a_wait_that_runs_out_in_the_process_during_an_outage_ends_with_its_error) {
    redis_server own;
    rlock::client holder(own.options()), c(own.options());
    rlock::mutex held(holder, name()), m(c, name());
    held.lock();
    auto wait = [&](std::chrono::milliseconds limit) {
        try {
            return m.try_lock_for(limit) ? rlock::errc::invalid_argument : rlock::errc{};
        } catch (const rlock::error& e) {
            return e.value();
        }
    };
    auto at_redis = std::async(std::launch::async, wait, 3000ms);
    std::this_thread::sleep_for(200ms);
    auto in_process = std::async(std::launch::async, wait, 1000ms);
    std::this_thread::sleep_for(200ms);
    own.kill_now();
    for (auto* f : {&in_process, &at_redis}) {
        ASSERT_EQ(f->wait_for(10s), std::future_status::ready);
        const rlock::errc e = f->get();
        EXPECT_TRUE(rlock_test::connection_error(e)) << "ended with " << static_cast<int>(e) << " (0: false)";
    }
}

// Blocking threads and asynchronous acquires of one client (some cancelled at once, some with
// short deadlines) and a thread of another client, on one mutex: one holder at a time, every
// hold passed on or released, and the gate free at the end (the races of a turn told just as
// an acquire ends).
TEST_F(local_handoff, blocking_and_asynchronous_acquires_pass_the_lock_around_and_exclude_each_other) {
    rlock::client c(options()), other(options());
    std::atomic<int> inside{0}, overlaps{0}, held{0};
    auto critical = [&] {
        if (inside.fetch_add(1) != 0) ++overlaps;
        std::this_thread::sleep_for(200us);
        inside.fetch_sub(1);
        ++held;
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&] {
            rlock::mutex m(c, name());
            for (int i = 0; i < 60; ++i) {
                ASSERT_TRUE(m.try_lock_for(10s)) << "a blocking thread starved";
                critical();
                m.unlock();
            }
        });
        threads.emplace_back([&, t] {
            rlock::mutex m(c, name());
            for (int i = 0; i < 60; ++i) {
                rlock::hold h;
                if (i % 3 == 0) {  // cancelled at once: it may still have won
                    auto p = std::make_shared<std::promise<rlock::hold>>();
                    const rlock::pending pending = m.async_lock([p](std::exception_ptr e, rlock::hold got) {
                        if (e) got = rlock::hold();
                        p->set_value(std::move(got));
                    });
                    pending.cancel();
                    auto f = p->get_future();
                    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
                    h = f.get();
                } else {
                    auto f = m.async_try_lock_for(std::chrono::microseconds(500 * (i % 4) + 100 * t), rlock::use_future);
                    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
                    h = f.get();
                }
                if (!h) continue;
                critical();
                h.unlock();
            }
        });
    }
    threads.emplace_back([&] {
        rlock::mutex m(other, name());
        for (int i = 0; i < 30; ++i) {
            ASSERT_TRUE(m.try_lock_for(10s)) << "the other client starved";
            critical();
            m.unlock();
        }
    });
    for (auto& t : threads) t.join();
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_GE(held.load(), 2 * 60 + 30);
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0) << "a hold was left behind";
    rlock::mutex m(c, name());
    EXPECT_TRUE(m.try_lock()) << "the gate was left taken";
    m.unlock();
}

}  // namespace
