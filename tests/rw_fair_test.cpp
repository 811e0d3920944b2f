// read_write_lock and fair_lock: what is particular to each (the common contract of their
// exclusive side is in lock_test.cpp), their layout in Redis, and the failure modes Redisson's
// versions are known for.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>

#include <atomic>
#include <future>
#include <iostream>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_server;
using rlock_test::steady;

namespace {

using rlock_test::server;

using rlock_test::name;

std::string hold_key(const std::string& lock, const std::string& holder, int n) {
    return "{" + lock + "}:" + holder + ":rwlock_timeout:" + std::to_string(n);
}

/// The holder id of the calling thread on `c`, read back from the hash it just wrote.
std::string only_field_except_mode(const std::string& lock) {
    auto r = server().cmd({"HKEYS", lock});
    for (std::size_t i = 0; i < r->elements; ++i) {
        std::string f(rlock::detail::reply_text(r->element[i]));
        if (f != "mode") return f;
    }
    return "";
}


// ---- read_write_lock ---------------------------------------------------------------------

TEST(read_write_layout, each_read_hold_has_its_own_expiring_key) {
    rlock::client c(server().options());
    rlock::read_write_lock rw(c, name());
    rw.lock_shared();
    rw.lock_shared();
    EXPECT_EQ(server().text({"HGET", name(), "mode"}), "read");
    const std::string holder = only_field_except_mode(name());
    EXPECT_EQ(holder.rfind(c.id() + ":", 0), 0u) << holder;
    EXPECT_EQ(server().text({"HGET", name(), holder}), "2");
    for (int n = 1; n <= 2; ++n) {
        const long long pttl = server().integer({"PTTL", hold_key(name(), holder, n)});
        EXPECT_GT(pttl, 0);
        EXPECT_LE(pttl, 30000);
    }
    rw.unlock_shared();
    EXPECT_EQ(server().integer({"EXISTS", hold_key(name(), holder, 2)}), 0);
    EXPECT_EQ(server().text({"HGET", name(), holder}), "1");
    rlock_test::raw_subscriber sub(server().port(), "redisson_rwlock:{" + name() + "}");
    rw.unlock_shared();
    EXPECT_EQ(sub.next(), "0");
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    EXPECT_EQ(server().integer({"EXISTS", hold_key(name(), holder, 1)}), 0);
}

TEST(read_write_layout, the_write_hold_is_a_write_field_and_its_unlock_publishes_1) {
    rlock::client c(server().options());
    rlock::read_write_lock rw(c, name());
    rw.lock();
    EXPECT_EQ(server().text({"HGET", name(), "mode"}), "write");
    const std::string field = only_field_except_mode(name());
    EXPECT_EQ(field.substr(field.size() - 6), ":write");
    EXPECT_EQ(server().text({"HGET", name(), field}), "1");
    rw.lock();  // reentrant
    EXPECT_EQ(server().text({"HGET", name(), field}), "2");
    rw.unlock();
    rlock_test::raw_subscriber sub(server().port(), "redisson_rwlock:{" + name() + "}");
    rw.unlock();
    EXPECT_EQ(sub.next(), "1");
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

TEST(read_write_lock, readers_share_and_a_writer_waits_for_all_of_them) {
    rlock::client a(server().options()), b(server().options()), w(server().options());
    rlock::read_write_lock ra(a, name()), rb(b, name()), rw(w, name());
    std::shared_lock<rlock::read_write_lock> first(ra);
    ASSERT_TRUE(rb.try_lock_shared()) << "a second reader was refused";
    EXPECT_FALSE(rw.try_lock());
    std::promise<steady::time_point> wrote;
    std::thread writer([&] {
        rw.lock();
        wrote.set_value(steady::now());
        rw.unlock();
    });
    std::this_thread::sleep_for(200ms);
    first.unlock();
    auto got = wrote.get_future();
    EXPECT_EQ(got.wait_for(300ms), std::future_status::timeout) << "writer got in past a reader";
    const auto last_reader_left = steady::now();
    rb.unlock_shared();
    ASSERT_EQ(got.wait_for(5s), std::future_status::ready);
    EXPECT_LT(got.get() - last_reader_left, 500ms);
    writer.join();
}

TEST(read_write_lock, a_writer_excludes_readers_and_wakes_them_on_unlock) {
    rlock::client a(server().options()), b(server().options());
    rlock::read_write_lock writer(a, name()), reader(b, name());
    writer.lock();
    EXPECT_FALSE(reader.try_lock_shared());
    std::promise<steady::time_point> read;
    std::thread t([&] {
        reader.lock_shared();
        read.set_value(steady::now());
        reader.unlock_shared();
    });
    std::this_thread::sleep_for(200ms);
    const auto released = steady::now();
    writer.unlock();
    auto f = read.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_LT(f.get() - released, 500ms);
    t.join();
}

TEST(read_write_lock, a_downgrade_keeps_the_read_side_and_wakes_waiting_readers) {
    rlock::client a(server().options()), b(server().options());
    rlock::read_write_lock rw(a, name()), other(b, name());
    rw.lock();
    rw.lock_shared();  // the writer may read
    std::promise<steady::time_point> read;
    std::thread waiting_reader([&] {
        other.lock_shared();
        read.set_value(steady::now());
        other.unlock_shared();
    });
    std::this_thread::sleep_for(200ms);
    const auto downgraded = steady::now();
    rw.unlock();  // downgrade complete: mode read, this thread still reads
    EXPECT_EQ(server().text({"HGET", name(), "mode"}), "read");
    auto f = read.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_LT(f.get() - downgraded, 500ms) << "a waiting reader waited out the TTL";
    waiting_reader.join();
    EXPECT_FALSE(other.try_lock()) << "a writer got in while the downgraded reader reads";
    EXPECT_TRUE(rw.is_held_shared_by_current_thread());
    rw.unlock_shared();
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

TEST(read_write_lock, readers_waiting_behind_a_writer_of_their_client_still_enter_at_a_downgrade) {
    // A client's waiters take turns per kind: a writer queued first must not hold its client's
    // readers back when the lock turns to read mode.
    rlock::client a(server().options()), b(server().options());
    rlock::read_write_lock rw(a, name()), other(b, name());
    rw.lock();
    rw.lock_shared();
    std::promise<void> wrote;
    std::thread writer([&] {
        other.lock();
        wrote.set_value();
        other.unlock();
    });
    std::this_thread::sleep_for(200ms);  // the writer is the client's first waiter
    std::atomic<int> reading{0};
    std::promise<void> all_read, done;
    std::shared_future<void> finish = done.get_future().share();
    std::vector<std::thread> readers;
    for (int i = 0; i < 3; ++i) {
        readers.emplace_back([&] {
            other.lock_shared();
            if (++reading == 3) all_read.set_value();
            finish.wait();
            other.unlock_shared();
        });
    }
    std::this_thread::sleep_for(200ms);
    rw.unlock();  // downgrade: read mode, the readers may enter, the writer may not
    auto f = all_read.get_future();
    EXPECT_EQ(f.wait_for(5s), std::future_status::ready) << "readers waited behind their client's writer";
    done.set_value();
    for (auto& t : readers) t.join();
    rw.unlock_shared();
    auto w = wrote.get_future();
    EXPECT_EQ(w.wait_for(5s), std::future_status::ready);
    writer.join();
}

TEST(read_write_lock, a_reader_asking_for_the_write_side_is_would_deadlock_at_once) {
    rlock::client c(server().options());
    rlock::read_write_lock rw(c, name());
    rw.lock_shared();
    const auto start = steady::now();
    try {
        rw.lock();
        FAIL() << "a reader got the write side";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::would_deadlock);
    }
    EXPECT_LT(steady::now() - start, 100ms);
    EXPECT_EQ(server().text({"HGET", name(), "mode"}), "read");
    rw.unlock_shared();
}

TEST(read_write_lock, a_killed_reader_blocks_a_writer_no_longer_than_its_own_lease) {
    // The dead reader's lease is 1 s. A live reader renews its own hold all along (Redisson's
    // renewal would keep the dead one's alive too).
    pid_t dead = rlock_test::spawn({RLOCK_TEST_WORKER, std::to_string(server().port()),
                                    "rw-read-hang", name(), "1000"});
    ASSERT_GT(dead, 0);
    ASSERT_TRUE(eventually([&] { return server().integer({"EXISTS", name() + ":ready"}) == 1; }));
    rlock::client_options live_options = server().options();
    live_options.lock_watchdog_timeout = 600ms;
    rlock::client live(live_options), w(server().options());
    rlock::read_write_lock live_reader(live, name()), writer(w, name());
    live_reader.lock_shared();
    ::kill(dead, SIGKILL);
    rlock_test::wait_exit(dead);
    std::this_thread::sleep_for(2500ms);  // the dead reader's lease is over; the live one renewed
    EXPECT_FALSE(live_reader.lost_shared());
    EXPECT_FALSE(writer.try_lock()) << "the live reader must still exclude the writer";
    std::promise<steady::time_point> wrote;
    std::thread t([&] {
        writer.lock();
        wrote.set_value(steady::now());
        writer.unlock();
    });
    std::this_thread::sleep_for(200ms);
    const auto released = steady::now();
    live_reader.unlock_shared();
    auto f = wrote.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_LT(f.get() - released, 500ms) << "the dead reader's share outlived its lease";
    t.join();
}

TEST(read_write_lock, a_killed_lone_reader_frees_the_lock_after_its_lease) {
    pid_t dead = rlock_test::spawn({RLOCK_TEST_WORKER, std::to_string(server().port()),
                                    "rw-read-hang", name(), "1000"});
    ASSERT_TRUE(eventually([&] { return server().integer({"EXISTS", name() + ":ready"}) == 1; }));
    ::kill(dead, SIGKILL);
    rlock_test::wait_exit(dead);
    const auto killed = steady::now();
    rlock::client w(server().options());
    rlock::read_write_lock writer(w, name());
    ASSERT_TRUE(writer.try_lock_for(5s));
    EXPECT_LT(steady::now() - killed, 1000ms + 700ms);
    writer.unlock();
}

// A reader's count no one but a foreign writer makes (rlock and Redisson step it by one): the
// scripts do not walk its 2^63 hold keys — which kept the server in the script, answering
// BUSY to everyone — and take that reader for alive until the hash expires.
TEST(read_write_lock, a_foreign_readers_huge_count_is_not_walked_and_holds_until_the_hash_expires) {
    rlock::client_options o = server().options();
    o.command_timeout = 1s;
    rlock::client c(o);
    rlock::read_write_lock lock(c, name());
    server().cmd({"HSET", name(), "mode", "read", "foreign:1", "9223372036854775806"});
    server().cmd({"PEXPIRE", name(), "1500"});
    const auto set = steady::now();
    bool refused = false;
    try {
        refused = !lock.try_lock();
    } catch (const rlock::error& e) {
        ADD_FAILURE() << e.what();
    }
    EXPECT_TRUE(refused) << "a writer got in over a reader it could not tell dead";
    EXPECT_EQ(server().text({"PING"}), "PONG");
    EXPECT_TRUE(lock.try_lock_for(5s)) << "the lock stayed taken after the hash expired";
    EXPECT_GE(steady::now() - set, 1400ms);
    lock.unlock();
    // A reader joins and leaves (its last unlock scans the readers), and force_unlock clears
    // the hold keys it can name.
    server().cmd({"HSET", name(), "mode", "read", "foreign:1", "9223372036854775806"});
    server().cmd({"PEXPIRE", name(), "1500"});
    lock.lock_shared();
    lock.unlock_shared();
    EXPECT_EQ(server().text({"HGET", name(), "foreign:1"}), "9223372036854775806");
    EXPECT_TRUE(lock.force_unlock());
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    server().cmd({"SCRIPT", "KILL"});  // what an unbounded walk would need (NOTBUSY otherwise)
}

// The same for any count neither rlock nor Redisson writes (text, 0, a negative or fractional
// count): such a reader cannot be told dead, so a writer is kept out until the hash expires,
// and a reader's last unlock leaves the hash (and that field) alone. Before, such a reader was
// taken for dead: a writer got in over it, and an unlock deleted the hash.
TEST(read_write_lock, a_foreign_reader_count_that_is_not_a_level_count_is_never_taken_for_dead) {
    rlock::client c(server().options());
    rlock::read_write_lock lock(c, name());
    for (const char* count : {"abc", "0", "-1", "1.5"}) {
        SCOPED_TRACE(count);
        server().cmd({"HSET", name(), "mode", "read", "foreign:1", count});
        server().cmd({"PEXPIRE", name(), "30000"});
        bool refused = false;
        try {
            refused = !lock.try_lock();
            if (!refused) lock.unlock();
        } catch (const rlock::error& e) {
            ADD_FAILURE() << e.what();
        }
        EXPECT_TRUE(refused) << "a writer got in over a reader it could not tell dead";
        lock.lock_shared();
        lock.unlock_shared();
        EXPECT_EQ(server().text({"HGET", name(), "foreign:1"}), count) << "the unlock dropped the reader";
        EXPECT_EQ(server().text({"HGET", name(), "mode"}), "read");
        server().cmd({"DEL", name()});
    }
}

TEST(read_write_lock, a_downgraded_read_hold_keeps_its_own_longer_lease) {
    // The write side is watched (renewed every 100 ms to 300 ms); the read side has a 5 s
    // lease. Neither renewal nor the downgrade may cut the lock's TTL below the read lease.
    rlock::client_options o = server().options();
    o.lock_watchdog_timeout = 300ms;
    rlock::client c(o), other(server().options());
    rlock::read_write_lock rw(c, name()), writer(other, name());
    rw.lock();
    rw.lock_shared(5s);
    std::this_thread::sleep_for(350ms);  // several write renewals
    EXPECT_GT(server().integer({"PTTL", name()}), 4000);
    rw.unlock();  // downgrade
    EXPECT_GT(server().integer({"PTTL", name()}), 4000);
    std::this_thread::sleep_for(600ms);
    EXPECT_FALSE(rw.lost_shared());
    EXPECT_FALSE(writer.try_lock()) << "a writer got in under a live read hold";
    rw.unlock_shared();
    EXPECT_TRUE(writer.try_lock());
    writer.unlock();
}

// ---- fair_lock -------------------------------------------------------------------------

std::string queue_of(const std::string& n) { return "redisson_lock_queue:{" + n + "}"; }
std::string timeouts_of(const std::string& n) { return "redisson_lock_timeout:{" + n + "}"; }

void expect_no_fair_keys(const std::string& n) {
    EXPECT_EQ(server().integer({"EXISTS", n, queue_of(n), timeouts_of(n)}), 0)
        << "fair-lock keys left behind";
}

// Issue 16, the read side: a server restarted empty between lock_shared() and unlock_shared(),
// before any watchdog tick. Whether a writer took the lock meanwhile or not, unlock_shared()
// tells the owner once, under the read hold's id, and lost_shared() is true. The write side's
// form of this test is lock_test's an_unlock_after_a_restart_lost_the_hold_tells_the_owner.
TEST(read_write_lock, an_unlock_after_a_restart_lost_a_read_hold_tells_the_owner) {
    for (const bool taken : {true, false}) {
        SCOPED_TRACE(taken ? "a writer took the lock" : "nobody took the lock");
        redis_server own;
        rlock_test::lost_log lost;
        rlock::client_options o = own.options();
        o.on_lock_lost = lost.hold_handler();
        rlock::client c(o), other(own.options());
        rlock::read_write_lock lock(c, name()), theirs(other, name());
        lock.lock_shared();
        const std::uint64_t id = lock.hold_id_shared();
        own.restart();  // empty
        if (taken) {
            ASSERT_TRUE(theirs.try_lock_for(2s));
        }
        EXPECT_NO_THROW(lock.unlock_shared());
        EXPECT_TRUE(lock.lost_shared());
        EXPECT_EQ(lost.calls.load(), 1);
        EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
        EXPECT_EQ(lost.last_hold_id.load(), id);
        if (taken) {
            EXPECT_TRUE(theirs.is_held_by_current_thread()) << "the unlock released another's hold";
            theirs.unlock();
        }
    }
}

// A read hold of several levels whose hash is deleted: its unlocks (told lost) delete the
// level keys too, which otherwise outlived them by their lease (a probe's find: one
// {name}:<holder>:rwlock_timeout:<n> key per level left for 30 s).
TEST(read_write_lock, the_unlocks_of_a_read_hold_whose_hash_was_deleted_leave_no_level_keys) {
    redis_server own;
    rlock_test::lost_log lost;
    rlock::client_options o = own.options();
    o.on_lock_lost = lost.hold_handler();
    rlock::client c(o);
    rlock::read_write_lock lock(c, name());
    for (int level = 0; level < 3; ++level) lock.lock_shared();
    ASSERT_EQ(own.cmd({"KEYS", "*rwlock_timeout*"})->elements, 3U);
    own.cmd({"DEL", name()});
    for (int level = 0; level < 3; ++level) EXPECT_NO_THROW(lock.unlock_shared());
    EXPECT_TRUE(lock.lost_shared());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(own.cmd({"KEYS", "*"})->elements, 0U) << rlock_test::keys_left(own);
}

TEST(fair_lock_layout, a_waiter_is_queued_with_a_deadline_and_the_release_wakes_it) {
    rlock::client holder(server().options()), waiter(server().options());
    rlock::fair_lock mine(holder, name()), theirs(waiter, name());
    mine.lock();
    std::promise<steady::time_point> got;
    std::thread t([&] {
        theirs.lock();
        got.set_value(steady::now());
        theirs.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    const std::string queued = server().text({"LINDEX", queue_of(name()), "0"});
    EXPECT_EQ(queued.rfind(waiter.id() + ":", 0), 0u) << queued;
    auto now = server().cmd({"TIME"});
    const long long now_ms = std::atoll(now->element[0]->str) * 1000;
    const long long deadline = std::atoll(server().text({"ZSCORE", timeouts_of(name()), queued}).c_str());
    // The head waiter: now + 5 min (its slot) + 100 s (a heartbeat, a third of that), renewed
    // while it waits.
    EXPECT_GT(deadline, now_ms + 350000);
    EXPECT_LE(deadline, now_ms + 401000);
    rlock_test::raw_subscriber sub(server().port(), "redisson_lock__channel:{" + name() + "}:" + queued);
    const auto released = steady::now();
    mine.unlock();
    EXPECT_EQ(sub.next(), "0");
    auto f = got.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_LT(f.get() - released, 500ms);
    t.join();
    expect_no_fair_keys(name());
}

TEST(fair_lock, processes_get_the_lock_in_the_order_they_queued) {
    rlock::client c(server().options());
    rlock::fair_lock lock(c, name());
    lock.lock();
    std::vector<pid_t> pids;
    for (int i = 0; i < 4; ++i) {
        pids.push_back(rlock_test::spawn({RLOCK_TEST_WORKER, std::to_string(server().port()),
                                          "fair-order", name(), std::to_string(i), "300000"}));
        ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == i + 1; }))
            << "worker " << i << " did not queue";
    }
    lock.unlock();
    for (pid_t p : pids) EXPECT_EQ(rlock_test::wait_exit(p), 0);
    auto order = server().cmd({"LRANGE", name() + ":order", "0", "-1"});
    ASSERT_EQ(order->elements, 4u);
    for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(rlock::detail::reply_text(order->element[i]), std::to_string(i));
    }
    expect_no_fair_keys(name());
}

TEST(fair_lock, a_waiter_that_times_out_leaves_the_queue_at_once) {
    rlock::client a(server().options()), b(server().options());
    rlock::fair_lock holder(a, name()), waiter(b, name());
    holder.lock();
    EXPECT_FALSE(waiter.try_lock_for(300ms));
    EXPECT_EQ(server().integer({"EXISTS", queue_of(name()), timeouts_of(name())}), 0);
    EXPECT_FALSE(waiter.try_lock());  // a plain try_lock never queues
    EXPECT_EQ(server().integer({"EXISTS", queue_of(name())}), 0);
    holder.unlock();
    expect_no_fair_keys(name());
}

TEST(fair_lock, a_killed_waiter_in_the_middle_is_evicted_after_the_wait_timeout) {
    rlock::lock_options lo;
    lo.fair_lock_wait_timeout = 1000ms;
    rlock::client c(server().options());
    rlock::fair_lock lock(c, name(), lo);
    lock.lock();
    std::vector<pid_t> pids;
    for (int i = 0; i < 3; ++i) {
        pids.push_back(rlock_test::spawn({RLOCK_TEST_WORKER, std::to_string(server().port()),
                                          "fair-order", name(), std::to_string(i), "1000"}));
        ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == i + 1; }));
    }
    ::kill(pids[1], SIGKILL);  // the middle one dies while queued
    rlock_test::wait_exit(pids[1]);
    const auto start = steady::now();
    lock.unlock();
    EXPECT_EQ(rlock_test::wait_exit(pids[0]), 0);
    EXPECT_EQ(rlock_test::wait_exit(pids[2]), 0);
    EXPECT_LT(steady::now() - start, 1000ms + 1500ms) << "the dead waiter stalled the queue";
    auto order = server().cmd({"LRANGE", name() + ":order", "0", "-1"});
    ASSERT_EQ(order->elements, 2u);
    EXPECT_EQ(rlock::detail::reply_text(order->element[0]), "0");
    EXPECT_EQ(rlock::detail::reply_text(order->element[1]), "2");
    expect_no_fair_keys(name());
}

TEST(fair_lock, a_live_waiter_is_never_evicted_however_long_it_waits) {
    rlock::lock_options lo;
    lo.fair_lock_wait_timeout = 300ms;  // much shorter than the wait below
    rlock::client a(server().options()), b(server().options()), c(server().options());
    rlock::fair_lock holder(a, name(), lo), first(b, name(), lo), second(c, name(), lo);
    holder.lock();
    std::vector<int> order;
    std::mutex order_mu;
    std::thread t1([&] {
        first.lock();
        std::lock_guard<std::mutex> g(order_mu);
        order.push_back(1);
        first.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    std::thread t2([&] {
        second.lock();
        std::lock_guard<std::mutex> g(order_mu);
        order.push_back(2);
        second.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 2; }));
    std::this_thread::sleep_for(1500ms);  // five wait timeouts
    EXPECT_EQ(server().integer({"LLEN", queue_of(name())}), 2) << "a live waiter was evicted";
    holder.unlock();
    t1.join();
    t2.join();
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
    expect_no_fair_keys(name());
}

// A stand-in for Redisson's RFairLock (3.35.0 and 4.7.0) as seen from Redis: not its code,
// the arithmetic it applies to `redisson_lock_timeout:{name}`. Stale waiters leave only from
// the head (deadline <= the client's clock); a newcomer's deadline is the last waiter's (or now
// + the lock's PTTL) + its wait; the head that takes the lock shifts every queued deadline by
// -wait (ZINCRBY); a queued waiter's retry renews nothing. Returns -1 when `id` took the lock,
// else a wait in ms. KEYS: lock, queue, deadlines; ARGV: lease ms, id, wait ms, client now ms.
constexpr const char* redisson_like_acquire = R"lua(
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then break end
    local due = redis.call('zscore', KEYS[3], head)
    if due and tonumber(due) <= tonumber(ARGV[4]) then
        redis.call('zrem', KEYS[3], head)
        redis.call('lpop', KEYS[2])
    else
        break
    end
end
if redis.call('exists', KEYS[1]) == 0 and (redis.call('exists', KEYS[2]) == 0
        or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], ARGV[2])
    for _, w in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
        redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), w)
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return -1
end
if redis.call('zscore', KEYS[3], ARGV[2]) then
    return math.max(0, redis.call('pttl', KEYS[1]))
end
local last = redis.call('lindex', KEYS[2], -1)
local base
if last and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) then
    base = tonumber(redis.call('zscore', KEYS[3], last))
else
    base = tonumber(ARGV[4]) + redis.call('pttl', KEYS[1])
end
if redis.call('zadd', KEYS[3], base + tonumber(ARGV[3]), ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2])
end
return math.max(0, base - tonumber(ARGV[4]))
)lua";

// Its unlock: stale heads out (as above), delete the hash, publish 0 to the head's channel.
// KEYS: lock, queue, deadlines, channel prefix; ARGV: id, client now ms. Returns 1 / -1.
constexpr const char* redisson_like_unlock = R"lua(
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then break end
    local due = redis.call('zscore', KEYS[3], head)
    if due and tonumber(due) <= tonumber(ARGV[2]) then
        redis.call('zrem', KEYS[3], head)
        redis.call('lpop', KEYS[2])
    else
        break
    end
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call('del', KEYS[1])
local head = redis.call('lindex', KEYS[2], 0)
if head then redis.call('publish', KEYS[4] .. ':' .. head, '0') end
return 1
)lua";

long long server_now_ms() {
    auto t = server().cmd({"TIME"});
    return std::atoll(t->element[0]->str) * 1000 + std::atoll(t->element[1]->str) / 1000;
}

long long redisson_like_try(const std::string& n, const std::string& id, long long wait_ms) {
    return server().integer({"EVAL", redisson_like_acquire, "3", n, queue_of(n), timeouts_of(n),
                             "5000", id, std::to_string(wait_ms), std::to_string(server_now_ms())});
}

long long redisson_like_unlock_of(const std::string& n, const std::string& id) {
    return server().integer({"EVAL", redisson_like_unlock, "4", n, queue_of(n), timeouts_of(n),
                             "redisson_lock__channel:{" + n + "}", id,
                             std::to_string(server_now_ms())});
}

// Finding F1 of the interop suite (docs/comparison.md), without Java: Redisson waiters that
// called lock() (wait = 5 min) and an rlock waiter share one queue, J1 C1 J2. When J1 takes the
// lock Redisson shifts every deadline by -5 min; C1's must still be in the future, so J1's
// unlock wakes C1, and J2 cannot take the lock before C1 has had it.
TEST(fair_lock, a_redisson_acquisition_shifting_deadlines_evicts_no_live_rlock_waiter) {
    const std::string n = name();
    const long long wait = 300000;  // Redisson's fairLockWaitTimeout, rlock's default
    server().cmd({"HSET", n, "jh:1", "1"});  // a Redisson holder
    server().cmd({"PEXPIRE", n, "5000"});
    ASSERT_GE(redisson_like_try(n, "j1:1", wait), 0);
    rlock::client c(server().options());
    rlock::fair_lock c1(c, n);
    std::atomic<bool> c1_held{false};
    std::promise<void> c1_may_unlock;
    std::thread t([&] {
        c1.lock();
        c1_held = true;
        c1_may_unlock.get_future().wait();
        c1.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(n)}) == 2; }));
    ASSERT_GE(redisson_like_try(n, "j2:1", wait), 0);
    ASSERT_EQ(server().integer({"LLEN", queue_of(n)}), 3);
    const std::string c1_id = server().text({"LINDEX", queue_of(n), "1"});

    ASSERT_EQ(redisson_like_unlock_of(n, "jh:1"), 1);
    ASSERT_EQ(redisson_like_try(n, "j1:1", wait), -1) << "J1, the head, takes the freed lock";
    const long long c1_due = std::atoll(server().text({"ZSCORE", timeouts_of(n), c1_id}).c_str());
    EXPECT_GT(c1_due, server_now_ms()) << "Redisson's -wait shift put a live rlock waiter's "
                                          "deadline in the past";
    std::this_thread::sleep_for(20ms);  // J1 holds a moment
    ASSERT_EQ(redisson_like_unlock_of(n, "j1:1"), 1);
    // C1 is at the head, or has already taken the lock (it leaves the queue in Redis a
    // moment before c1_held is set): read in that order, one of them holds.
    EXPECT_TRUE(c1_held.load() || server().text({"LINDEX", queue_of(n), "0"}) == c1_id ||
                server().integer({"HEXISTS", n, c1_id}) == 1)
        << "J1's unlock evicted the live rlock waiter C1";
    const long long j2_early = redisson_like_try(n, "j2:1", wait);
    EXPECT_NE(j2_early, -1) << "J2 took the lock before C1, who queued earlier";
    if (j2_early == -1) redisson_like_unlock_of(n, "j2:1");  // let C1 through anyway
    EXPECT_TRUE(eventually([&] { return c1_held.load(); }, 2s)) << "C1 was not woken";
    c1_may_unlock.set_value();
    t.join();
    if (j2_early != -1) {
        EXPECT_EQ(redisson_like_try(n, "j2:1", wait), -1) << "J2 is next after C1";
        EXPECT_EQ(redisson_like_unlock_of(n, "j2:1"), 1);
    }
    if (!HasFailure()) expect_no_fair_keys(n);
    server().cmd({"DEL", n, queue_of(n), timeouts_of(n)});  // a failed run's re-queued entries
}

TEST(fair_lock, a_newcomer_does_not_overtake_a_queued_waiter) {
    // A live (Redisson-style) waiter queued while the lock is free: a newcomer must queue
    // behind it, not take the lock.
    auto now = server().cmd({"TIME"});
    const long long now_ms = std::atoll(now->element[0]->str) * 1000;
    server().cmd({"RPUSH", queue_of(name()), "ghost:1"});
    server().cmd({"ZADD", timeouts_of(name()), std::to_string(now_ms + 60000), "ghost:1"});
    rlock::client c(server().options());
    rlock::fair_lock lock(c, name());
    EXPECT_FALSE(lock.try_lock());
    EXPECT_FALSE(lock.try_lock_for(300ms));
    EXPECT_EQ(server().integer({"LLEN", queue_of(name())}), 1) << "the newcomer stayed queued";
    // Once the ghost's deadline has passed it is evicted and the lock is free for the newcomer.
    server().cmd({"ZADD", timeouts_of(name()), std::to_string(now_ms - 1), "ghost:1"});
    EXPECT_TRUE(lock.try_lock());
    lock.unlock();
    expect_no_fair_keys(name());
}

/// The order in which threads took a lock, each recording itself once it holds it.
struct acquisition_order {
    std::mutex mu;
    std::vector<std::string> seen;
    void operator()(const char* who) {
        std::lock_guard<std::mutex> g(mu);
        seen.emplace_back(who);
    }
};

// Issue 32: the fair lock's local hand-off. A final unlock whose queue's next waiter is a thread
// of its own client passes the hold to it in the release's script: no unlock message, no
// acquire script by the waiter. The queue's order is kept: a waiter of another client ahead in
// the queue gets the lock first, and a pass never goes past it.
TEST(fair_lock, an_unlock_passes_the_hold_to_the_next_queued_thread_of_its_client_in_one_script) {
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = server().options();
    o.listener = log;
    rlock::client c(o), other(server().options());
    rlock::fair_lock mine(c, name()), local(c, name()), theirs(other, name());
    mine.lock();
    std::promise<std::string> local_saw;  // the hash's fields while the local waiter holds
    std::promise<void> local_may_unlock;
    acquisition_order record;
    std::thread t_local([&] {
        local.lock();
        record("local");
        auto f = server().cmd({"HKEYS", name()});
        local_saw.set_value(f->elements == 1 ? std::string(rlock::detail::reply_text(f->element[0])) : "");
        local_may_unlock.get_future().wait();
        local.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    const std::string local_id = server().text({"LINDEX", queue_of(name()), "0"});
    // The local waiter is waiting (subscribed, its try after subscribing made), not trying: a
    // try of its own racing the pass would take the hold as a re-entry.
    auto waiting = [&](const std::string& id) {
        const std::string channel = "redisson_lock__channel:{" + name() + "}:" + id;
        const bool subscribed = eventually([&] {
            auto r = server().cmd({"PUBSUB", "NUMSUB", channel});
            return r && r->elements == 2 && r->element[1]->integer == 1;
        });
        std::this_thread::sleep_for(200ms);
        return subscribed;
    };
    ASSERT_TRUE(waiting(local_id));
    std::thread t_other([&] {
        theirs.lock();
        record("other");
        theirs.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 2; }));
    const std::string other_id = server().text({"LINDEX", queue_of(name()), "1"});
    ASSERT_TRUE(waiting(other_id));
    const long long other_due = std::atoll(server().text({"ZSCORE", timeouts_of(name()), other_id}).c_str());
    // The waiter's acquire takes the lock with HINCRBY; the pass writes the field with HSET.
    const long long hincrbys = rlock_test::calls_of("hincrby");
    const long long hsets = rlock_test::calls_of("hset");
    const long long publishes = rlock_test::calls_of("publish");
    mine.unlock();
    auto saw = local_saw.get_future();
    ASSERT_EQ(saw.wait_for(5s), std::future_status::ready) << "the local waiter did not get the lock";
    EXPECT_EQ(saw.get(), local_id) << "the hash does not name the local waiter alone";
    EXPECT_EQ(rlock_test::calls_of("hincrby") - hincrbys, 0) << "the waiter ran its acquire";
    EXPECT_EQ(rlock_test::calls_of("hset") - hsets, 1) << "the unlock did not pass the hold";
    const auto acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 2u);
    EXPECT_TRUE(acquired[1].local) << "the local waiter's hold is not told as handed locally";
    const auto released = log->of("released");
    ASSERT_GE(released.size(), 1u);
    EXPECT_TRUE(released[0].local) << "the unlock is not told as handed on";
    EXPECT_EQ(rlock_test::calls_of("publish") - publishes, 0) << "the hand-over published";
    // The local waiter left the queue as its acquisition would have: the other client's waiter
    // is the head now, its deadline moved by one wait (5 min).
    EXPECT_EQ(server().integer({"LLEN", queue_of(name())}), 1);
    EXPECT_EQ(server().text({"LINDEX", queue_of(name()), "0"}), other_id);
    EXPECT_LE(std::atoll(server().text({"ZSCORE", timeouts_of(name()), other_id}).c_str()),
              other_due - 300000 + 1000);  // (+ its renewals meanwhile, a few ms)
    // Watched: the hash's expiry is the watchdog's lease, as for a hold taken at Redis.
    EXPECT_GT(server().integer({"PTTL", name()}), 20000);
    local_may_unlock.set_value();
    t_local.join();
    t_other.join();
    EXPECT_EQ(record.seen, (std::vector<std::string>{"local", "other"}));
    expect_no_fair_keys(name());
}

// A leased waiter is not passed the hold (api.md), also when its lease equals the watchdog's
// timeout: watched or leased is what it asked for, not the duration. Before, a lease of
// exactly lock_watchdog_timeout was taken as watched and passed to.
TEST(fair_lock, a_waiter_with_a_lease_as_long_as_the_watchdogs_timeout_is_not_passed_the_hold) {
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = server().options();
    o.listener = log;
    o.lock_watchdog_timeout = 6s;
    rlock::client c(o);
    rlock::fair_lock mine(c, name()), local(c, name());
    mine.lock();
    std::promise<bool> got;
    std::thread t_local([&] {
        const bool ok = local.try_lock_for(5s, 6s);
        got.set_value(ok);
        if (ok) local.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    std::this_thread::sleep_for(200ms);  // subscribed, waiting
    const long long hsets = rlock_test::calls_of("hset");
    mine.unlock();
    auto f = got.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(f.get());
    t_local.join();
    EXPECT_EQ(rlock_test::calls_of("hset") - hsets, 0) << "the unlock passed the hold";
    const auto acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 2u);
    EXPECT_FALSE(acquired[1].local) << "the leased waiter's hold came by a pass";
    expect_no_fair_keys(name());
}

TEST(fair_lock, a_pass_never_overtakes_another_clients_waiter_ahead_in_the_queue) {
    rlock::client c(server().options()), other(server().options());
    rlock::fair_lock mine(c, name()), local(c, name()), theirs(other, name());
    mine.lock();
    acquisition_order record;
    std::thread t_other([&] {
        theirs.lock();
        record("other");
        std::this_thread::sleep_for(100ms);
        theirs.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    std::thread t_local([&] {
        local.lock();
        record("local");
        local.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 2; }));
    mine.unlock();
    t_other.join();
    t_local.join();
    EXPECT_EQ(record.seen, (std::vector<std::string>{"other", "local"}));
    expect_no_fair_keys(name());
}

TEST(fair_lock, a_waiter_that_gave_up_is_passed_nothing_and_the_unlock_frees_the_lock) {
    rlock::client c(server().options());
    rlock::fair_lock mine(c, name()), local(c, name());
    mine.lock();
    std::thread t([&] { EXPECT_FALSE(local.try_lock_for(300ms)); });
    t.join();
    mine.unlock();
    expect_no_fair_keys(name());
    // Hand-off off for the client: the waiter acquires at Redis (its own acquire script).
    rlock::client_options o = server().options();
    o.local_handoff_passes = 0;
    rlock::client off(o);
    rlock::fair_lock a(off, name()), b(off, name());
    a.lock();
    std::thread w([&] {
        b.lock();
        b.unlock();
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    const long long publishes = rlock_test::calls_of("publish");
    a.unlock();
    w.join();
    EXPECT_EQ(rlock_test::calls_of("publish") - publishes, 1) << "the unlock did not wake the waiter at Redis";
    expect_no_fair_keys(name());
}

// The pass script checks what can fail before its first write (Redis does not roll a script
// back): a queue key of another type fails the unlock's script with every key as it was.
TEST(fair_lock, a_pass_failing_on_a_queue_key_of_another_type_writes_nothing) {
    rlock::client c(server().options());
    rlock::fair_lock mine(c, name()), local(c, name());
    mine.lock();
    const std::string holder = only_field_except_mode(name());
    std::thread t([&] {
        try {
            EXPECT_FALSE(local.try_lock_for(1500ms));
        } catch (const rlock::error& e) {  // its next try meets the queue key too
            EXPECT_EQ(e.code(), rlock::errc::wrong_type) << e.what();
        }
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue_of(name())}) == 1; }));
    const std::string waiter = server().text({"LINDEX", queue_of(name()), "0"});
    std::this_thread::sleep_for(200ms);  // enrolled: its try has queued it
    const std::string due = server().text({"ZSCORE", timeouts_of(name()), waiter});
    server().cmd({"DEL", queue_of(name())});
    server().cmd({"SET", queue_of(name()), "not a list"});
    EXPECT_NO_THROW(mine.unlock());  // told to the owner as a loss (the hold cannot be released)
    EXPECT_EQ(server().text({"HGET", name(), holder}), "1") << "the holder's field was written";
    EXPECT_EQ(server().integer({"HLEN", name()}), 1) << "the hold was passed";
    EXPECT_EQ(server().text({"GET", queue_of(name())}), "not a list");
    EXPECT_EQ(server().text({"ZSCORE", timeouts_of(name()), waiter}), due) << "the deadlines moved";
    t.join();
    server().cmd({"DEL", name(), queue_of(name()), timeouts_of(name())});
}

// A waiter whose wait runs out just as the unlock passes it the hold: whichever comes first,
// the hold is not left to nobody (the waiter releases a pass it found as it left, or the
// unlock releases one whose waiter had gone), and the lock is free at the end, at once.
TEST(fair_lock, a_pass_racing_the_waiters_give_up_never_leaves_the_lock_held_by_nobody) {
    rlock::client c(server().options());
    rlock::fair_lock mine(c, name()), local(c, name());
    int got = 0;
    for (int i = 0; i < 40; ++i) {
        mine.lock();
        std::atomic<bool> queued{false};
        bool won = false;
        std::thread t([&] {
            queued = true;
            won = local.try_lock_for(std::chrono::milliseconds(20 + i % 5));
            if (won) local.unlock();
        });
        while (!queued) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::microseconds(17000 + 997 * (i % 7)));
        mine.unlock();
        t.join();
        got += won ? 1 : 0;
        ASSERT_EQ(server().integer({"EXISTS", name()}), 0) << "iteration " << i << ": held by "
                                                           << only_field_except_mode(name());
        ASSERT_EQ(server().integer({"LLEN", queue_of(name())}), 0) << "iteration " << i;
    }
    std::cout << "[ info     ] the waiter got the lock in " << got << " of 40 races\n";
    expect_no_fair_keys(name());
}

// The table the fair pass shares between the unlock and its waiters: when the pass script's
// reply is lost, the unlock cannot know whether it passed the hold to its head, so a waiter that
// leaves before any try of its own has found its field is told it may hold (and releases every
// level of its id: lock_acquisition::give_up, lock_site::undo); one that stays (take) is handed
// nothing, and tries at Redis. Without the ambiguous settle a waiter that gave up just then left
// the passed field to nobody until the watchdog's lease ran out.
TEST(fair_lock, a_waiter_leaving_after_an_ambiguous_pass_is_told_it_may_hold_the_lock) {
    rlock::detail::queue_passes table;
    table.enroll("lock", "a:1");
    table.enroll("lock", "a:2");
    const auto offered = table.offer("lock");
    ASSERT_EQ(offered.size(), 2u);
    table.settle("lock", offered, {}, {}, /*ambiguous=*/true);
    EXPECT_FALSE(table.take("lock", "a:1")) << "a pass that may not have run is not a hold to keep";
    const auto left = table.withdraw("lock", "a:1");
    ASSERT_TRUE(left) << "a waiter leaving after an ambiguous pass was not told it may hold";
    EXPECT_TRUE(left->maybe);
    const auto undone = table.clear("lock", "a:2");  // an acquire undone: it stays enrolled
    ASSERT_TRUE(undone);
    EXPECT_TRUE(undone->maybe);
    EXPECT_FALSE(table.withdraw("lock", "a:2")) << "told twice";
    // A pass that did not go to it (the script answered): nothing to release.
    table.enroll("lock", "a:3");
    table.settle("lock", table.offer("lock"), {}, {});
    EXPECT_FALSE(table.withdraw("lock", "a:3"));
    EXPECT_FALSE(table.any());
}

// A waiter that gives up while the server does not answer (paused: its leave times out) still
// leaves the queue: once the server answers again, the client removes the entry for it. Left,
// the entry would keep every other client out of the free lock until it was evicted
// (fair_lock_wait_timeout, 5 minutes by default).
TEST(fair_lock, a_waiter_that_gives_up_while_the_server_is_paused_leaves_the_queue_once_it_answers) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 200ms;
    rlock::client a(o), b(o), d(o), e(o);
    rlock::fair_lock holder(a, name()), cancelled(b, name()), timed_out(d, name()), third(e, name());
    const std::string queue = queue_of(name());
    holder.lock();
    std::promise<rlock::errc> aborted;
    rlock::pending p = cancelled.async_lock([&](std::exception_ptr x, rlock::hold) {
        try {
            if (x) std::rethrow_exception(x);
            aborted.set_value(rlock::errc{});
        } catch (const rlock::error& err) {
            aborted.set_value(err.value());
        }
    });
    ASSERT_TRUE(eventually([&] { return own.integer({"LLEN", queue}) == 1; }));
    // Its deadline passes while the server is paused: it ends with the outage's error.
    std::atomic<bool> failed{false};
    std::thread waiter([&] {
        try {
            if (timed_out.try_lock_for(1200ms)) timed_out.unlock();
        } catch (const rlock::error&) {
            failed = true;
        }
    });
    ASSERT_TRUE(eventually([&] { return own.integer({"LLEN", queue}) == 2; }));
    own.pause();
    p.cancel();  // its leave cannot reach the server
    std::future<rlock::errc> cancel_result = aborted.get_future();
    const bool completed = cancel_result.wait_for(5s) == std::future_status::ready;
    waiter.join();
    std::this_thread::sleep_for(500ms);
    own.resume();
    ASSERT_TRUE(completed);
    EXPECT_EQ(cancel_result.get(), rlock::errc::operation_aborted);
    EXPECT_TRUE(failed.load());
    holder.unlock();
    ASSERT_TRUE(third.try_lock_for(5s)) << "a waiter that gave up still heads the queue";
    third.unlock();
    EXPECT_EQ(own.integer({"EXISTS", name(), queue, timeouts_of(name())}), 0);
}

// A client destroyed with asynchronous fair acquires pending while the server is paused:
// each pending acquire's leave waited out the paused server in turn (about 2 command_timeouts
// each: a probe measured 11.2 s for eight with 500 ms timeouts), in ~client. Now one leave
// that the server leaves unanswered sends the others to the watchdog at once, whose last pass
// as the client goes stops at its first timeout: ~client costs a couple of command_timeouts
// whatever the number of waiters. The entries left are evicted after fair_lock_wait_timeout,
// as a crashed client's are (api.md, "Cancellation").
TEST(fair_lock, a_client_destroyed_with_acquires_pending_on_a_paused_server_does_not_wait_for_each) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 300ms;
    rlock::client a(o);
    auto b = std::make_unique<rlock::client>(o);
    rlock::fair_lock holder(a, name()), waiting(*b, name());
    holder.lock();
    std::vector<std::future<rlock::hold>> pending;
    for (int i = 0; i < 8; ++i) pending.push_back(waiting.async_lock(rlock::use_future));
    ASSERT_TRUE(eventually([&] { return own.integer({"LLEN", queue_of(name())}) == 8; }));
    own.pause();
    const auto start = rlock_test::steady::now();
    b.reset();
    const long long took = rlock_test::millis(rlock_test::steady::now() - start);
    own.resume();
    EXPECT_LT(took, 5 * 300) << "~client waited for the paused server once per pending acquire";
    for (auto& f : pending) {
        ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
        try {
            (void)f.get();
            ADD_FAILURE() << "a pending acquire got the lock";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
        }
    }
    holder.unlock();
}

TEST(fair_lock, an_expired_head_or_an_out_of_sync_queue_never_hangs_lock_or_errors) {
    // Redisson failure modes: a dead head whose deadline passed with the lock free (Redisson's
    // enqueue path then returns a negative TTL and lock() waits for ever), and a queue entry
    // with no deadline ("attempt to compare nil with number").
    auto now = server().cmd({"TIME"});
    const long long now_ms = std::atoll(now->element[0]->str) * 1000;
    server().cmd({"RPUSH", queue_of(name()), "dead:1", "orphan:2"});
    server().cmd({"ZADD", timeouts_of(name()), std::to_string(now_ms - 5000), "dead:1"});
    rlock::client c(server().options());
    rlock::fair_lock lock(c, name());
    const auto start = steady::now();
    ASSERT_TRUE(lock.try_lock_for(3s));
    EXPECT_LT(steady::now() - start, 500ms);
    lock.unlock();
    expect_no_fair_keys(name());
}

// An inner unlock of a reentrant_lock or fair_lock whose holder's count is no integer (a hand
// edit, a peer gone wrong) is refused with nothing changed, and the owner is told. Before, such
// a count read as the last level: the inner unlock deleted the lock while its owner still held
// the outer level and believed it held (lost() false), and another client took it.
template <class Lock>
void an_inner_unlock_over_a_count_that_is_no_integer_changes_nothing(const std::string& n) {
    rlock_test::lost_log lost;
    rlock::client_options o = server().options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o), other(server().options());
    Lock l(c, n);
    l.lock();
    l.lock();
    auto fields = server().cmd({"HKEYS", n});
    ASSERT_EQ(fields->elements, 1u);
    const std::string holder(rlock::detail::reply_text(fields->element[0]));
    server().cmd({"HSET", n, holder, "abc"});
    l.unlock();  // the inner level
    EXPECT_EQ(server().text({"HGET", n, holder}), "abc") << "the inner unlock changed the count";
    EXPECT_EQ(server().integer({"HLEN", n}), 1);
    EXPECT_TRUE(eventually([&] { return lost.calls.load() >= 1; }, 2s)) << "the owner was not told";
    EXPECT_TRUE(l.lost());
    Lock intruder(other, n);
    EXPECT_FALSE(intruder.try_lock()) << "another client took the lock its owner still held";
    server().cmd({"DEL", n});
    try {
        l.unlock();
    } catch (const rlock::error&) {
    }
}

TEST(fair_lock, an_inner_unlock_over_a_count_that_is_no_integer_changes_nothing) {
    an_inner_unlock_over_a_count_that_is_no_integer_changes_nothing<rlock::reentrant_lock>(name() + ".reentrant");
    an_inner_unlock_over_a_count_that_is_no_integer_changes_nothing<rlock::fair_lock>(name() + ".fair");
}

// A queue whose head's deadline no live waiter could have written (+inf, 1e20: a Redisson
// waiter's chained deadline can be far, never infinite) keeps the lock from a waiter until that
// head leaves, as Redisson's rule says, and a waiter that runs out leaves the queue as it found
// it. Before, the queuing script gave the queue keys a TTL computed from the latest deadline,
// which Redis refused after the waiter's entry was written: the call threw server_error and its
// entry stayed queued with no TTL.
TEST(fair_lock, a_head_with_a_deadline_beyond_reach_is_waited_for_and_left_as_it_was) {
    rlock::client c(server().options());
    for (const char* due : {"+inf", "1e20"}) {
        SCOPED_TRACE(due);
        server().cmd({"DEL", queue_of(name()), timeouts_of(name())});
        server().cmd({"RPUSH", queue_of(name()), "junk"});
        server().cmd({"ZADD", timeouts_of(name()), due, "junk"});
        rlock::fair_lock lock(c, name());
        EXPECT_FALSE(lock.try_lock_for(300ms));
        auto q = server().cmd({"LRANGE", queue_of(name()), "0", "-1"});
        ASSERT_EQ(q->elements, 1u);
        EXPECT_EQ(rlock::detail::reply_text(q->element[0]), "junk");
        EXPECT_EQ(server().integer({"ZCARD", timeouts_of(name())}), 1);
        EXPECT_EQ(server().integer({"PTTL", queue_of(name())}), -1);
        EXPECT_EQ(server().integer({"PTTL", timeouts_of(name())}), -1);
        EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    }
    server().cmd({"DEL", queue_of(name()), timeouts_of(name())});
}

}  // namespace
