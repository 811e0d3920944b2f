// rlock::semaphore and rlock::count_down_latch against real redis-server processes: permits
// bound the holders across clients, no waiter passes a latch before its count reaches zero,
// waiters wake on the release or zero message (never polling) and a waiter for several permits
// is served once they are free, Redisson's layouts and messages, bad input refused with Redis
// unchanged.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::expect_unchanged;
using rlock_test::redis_server;
using rlock_test::snapshot;

namespace {

redis_server& server() {
    static redis_server s;
    return s;
}

std::string name() { return rlock_test::test_lock_name(); }

std::string channel_of(const std::string& n) { return "redisson_sc:{" + n + "}"; }

/// How many times the server has run `cmd` (lowercase), from INFO commandstats.
long long calls_of(const redis_server& s, const std::string& cmd) {
    const std::string info = s.text({"INFO", "commandstats"});
    const std::string field = "cmdstat_" + cmd + ":calls=";
    const std::size_t at = info.find(field);
    return at == std::string::npos ? 0 : std::stoll(info.substr(at + field.size()));
}

/// How many scripts the server has run (EVAL and EVALSHA).
long long scripts_run(const redis_server& s) { return calls_of(s, "evalsha") + calls_of(s, "eval"); }

/// What a wait on another thread ends with (errc{} when it returned) when `doomed`, the client
/// its object was made from, is destroyed 300 ms in: it must stop with an error rather than
/// wait out its deadline.
template <class Wait>
rlock::errc ending_when_the_client_goes(std::unique_ptr<rlock::client>& doomed, Wait wait) {
    auto ended = std::async(std::launch::async, [&] {
        try {
            wait();
            return rlock::errc{};
        } catch (const rlock::error& e) {
            return e.value();
        }
    });
    std::this_thread::sleep_for(300ms);
    doomed.reset();
    EXPECT_EQ(ended.wait_for(20s), std::future_status::ready) << "still waiting after its client went";
    return ended.get();
}

TEST(semaphore, permits_bound_the_holders_across_clients) {
    rlock::client a(server().options()), b(server().options());
    rlock::semaphore sa(a, name()), sb(b, name());
    ASSERT_TRUE(sa.try_set_permits(3));
    EXPECT_FALSE(sb.try_set_permits(7)) << "a second try_set_permits replaced the count";
    std::atomic<int> inside{0}, most{0}, rounds{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < 8; ++w) {
        workers.emplace_back([&, w] {
            rlock::semaphore& s = w % 2 ? sa : sb;
            for (int i = 0; i < 15; ++i) {
                s.acquire();
                const int now = ++inside;
                int seen = most.load();
                while (now > seen && !most.compare_exchange_weak(seen, now)) {
                }
                std::this_thread::sleep_for(2ms);
                --inside;
                s.release();
                ++rounds;
            }
        });
    }
    for (auto& t : workers) t.join();
    EXPECT_EQ(rounds.load(), 8 * 15);
    EXPECT_LE(most.load(), 3) << "more holders at once than permits";
    EXPECT_GE(most.load(), 2) << "the permits were never used in parallel: the check proves little";
    EXPECT_EQ(sa.available_permits(), 3);
}

// Redisson #6664: a waiter for several permits woken by a release of one, then left waiting
// until its deadline although all it asked for had become free.
TEST(semaphore, a_waiter_for_several_permits_is_served_once_they_are_free) {
    rlock::client a(server().options()), b(server().options());
    rlock::semaphore waiter_side(a, name()), releaser(b, name());
    ASSERT_TRUE(releaser.try_set_permits(0));
    auto got = std::async(std::launch::async, [&] { return waiter_side.try_acquire_for(60s, 3); });
    for (int i = 0; i < 3; ++i) {
        std::this_thread::sleep_for(100ms);
        releaser.release();
    }
    ASSERT_EQ(got.wait_for(20s), std::future_status::ready)
        << "still waiting 20 s after its 3 permits were free (its deadline is 60 s)";
    EXPECT_TRUE(got.get());
    EXPECT_EQ(releaser.available_permits(), 0);
}

// A waiter sleeps until a message changes the count: no attempt is sent while nothing
// happens, and one release wakes it at once.
TEST(semaphore, a_waiter_sends_nothing_until_the_release_message_wakes_it) {
    rlock::client a(server().options()), b(server().options());
    rlock::semaphore waiter_side(a, name()), releaser(b, name());
    ASSERT_TRUE(releaser.try_set_permits(0));
    auto got = std::async(std::launch::async, [&] { return waiter_side.try_acquire_for(60s); });
    ASSERT_TRUE(eventually([&] {
        rlock::detail::reply_ptr r = server().cmd({"PUBSUB", "NUMSUB", channel_of(name())});
        return r && r->elements == 2 && r->element[1]->integer == 1;
    })) << "the waiter never subscribed";
    std::this_thread::sleep_for(200ms);  // past the attempt that follows the subscription
    const long long before = scripts_run(server());
    std::this_thread::sleep_for(1s);
    EXPECT_EQ(scripts_run(server()), before) << "the waiter polled while nothing changed";
    releaser.release();
    ASSERT_EQ(got.wait_for(20s), std::future_status::ready) << "the release message did not wake it";
    EXPECT_TRUE(got.get());
}

// Redisson's layout: the count is a plain string under the name, and a release publishes the
// new count on redisson_sc:{name}. What Redisson's release sends (INCRBY, PUBLISH) wakes an
// rlock waiter; what rlock's release sends is what a Redisson waiter listens for.
TEST(semaphore, the_layout_and_messages_are_redissons) {
    rlock::client c(server().options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    EXPECT_EQ(server().text({"GET", name()}), "2");
    EXPECT_EQ(server().text({"TYPE", name()}), "string");
    EXPECT_EQ(server().integer({"PTTL", name()}), -1);
    {
        rlock_test::raw_subscriber listener(server().port(), channel_of(name()));
        s.release(3);
        EXPECT_EQ(listener.next(), "5");
    }
    EXPECT_TRUE(s.try_acquire(5));
    EXPECT_EQ(server().text({"GET", name()}), "0");

    auto got = std::async(std::launch::async, [&] { return s.try_acquire_for(60s, 2); });
    std::this_thread::sleep_for(300ms);
    server().cmd({"INCRBY", name(), "2"});  // a Redisson release, as its script sends it
    server().cmd({"PUBLISH", channel_of(name()), "2"});
    ASSERT_EQ(got.wait_for(20s), std::future_status::ready) << "Redisson's release message did not wake it";
    EXPECT_TRUE(got.get());
}

TEST(semaphore, drain_add_and_available_permits_follow_redissons_rules) {
    rlock::client c(server().options());
    rlock::semaphore s(c, name());
    EXPECT_EQ(s.available_permits(), 0) << "never set";
    EXPECT_EQ(s.drain_permits(), 0);
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0) << "draining an unset semaphore created it";
    EXPECT_EQ(s.add_permits(4), 4);
    EXPECT_FALSE(s.try_set_permits(10)) << "a count exists";
    EXPECT_EQ(s.drain_permits(), 4);
    EXPECT_EQ(s.available_permits(), 0);
    EXPECT_EQ(s.add_permits(-2), -2) << "add_permits may take the count below 0";
    EXPECT_FALSE(s.try_acquire());
    EXPECT_EQ(s.drain_permits(), -2);
    EXPECT_EQ(s.available_permits(), 0);
    // Exact beyond 2^53, where a Lua number is not.
    server().cmd({"SET", name(), "9007199254740993"});
    EXPECT_EQ(s.available_permits(), 9007199254740993LL);
    EXPECT_EQ(s.drain_permits(), 9007199254740993LL);
}

TEST(semaphore, bad_counts_and_foreign_keys_are_refused_with_redis_unchanged) {
    rlock::client c(server().options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    const auto before = snapshot(server());
    auto expect_invalid = [&](auto call, const char* what) {
        try {
            call();
            ADD_FAILURE() << what << " was accepted";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << what << ": " << e.what();
            EXPECT_EQ(e.lock(), name()) << what;
            EXPECT_EQ(e.server(), c.server()) << what;
        }
    };
    expect_invalid([&] { s.acquire(0); }, "acquire(0)");
    expect_invalid([&] { (void)s.try_acquire(-1); }, "try_acquire(-1)");
    expect_invalid([&] { (void)s.try_acquire_for(10ms, 0); }, "try_acquire_for(.., 0)");
    expect_invalid([&] { s.release(0); }, "release(0)");
    expect_invalid([&] { s.release(-3); }, "release(-3)");
    expect_invalid([&] { (void)s.try_set_permits(-1); }, "try_set_permits(-1)");
    expect_unchanged(before, snapshot(server()));
    EXPECT_THROW(rlock::semaphore(c, ""), rlock::error);

    // At the overflow, INCRBY refuses before anything is written.
    server().cmd({"SET", name(), "9223372036854775807"});
    const auto at_max = snapshot(server());
    EXPECT_THROW(s.release(), rlock::error);
    expect_unchanged(at_max, snapshot(server()));

    // A key of another kind: a hash, a list, a string that is not a count.
    for (const auto& setup : std::vector<std::vector<std::string>>{
             {"HSET", name(), "f", "1"}, {"RPUSH", name(), "x"}, {"SET", name(), "abc"},
             {"SET", name(), "007"}, {"SET", name(), "1.5"}, {"SET", name(), "-0"},
             {"SET", name(), "9223372036854775808"}, {"SET", name(), "99999999999999999999"}}) {
        server().cmd({"DEL", name()});
        (void)rlock_test::command_vec(rlock_test::raw_connection(server().port()).get(), setup);
        SCOPED_TRACE(setup[0] + " " + setup.back());
        const auto foreign = snapshot(server());
        auto expect_wrong_type = [&](auto call, const char* what) {
            try {
                call();
                ADD_FAILURE() << what << " worked on a foreign key";
            } catch (const rlock::error& e) {
                EXPECT_EQ(e.value(), rlock::errc::wrong_type) << what << ": " << e.what();
                EXPECT_EQ(e.lock(), name()) << what;
            }
        };
        expect_wrong_type([&] { (void)s.try_acquire(); }, "try_acquire");
        expect_wrong_type([&] { s.release(); }, "release");
        expect_wrong_type([&] { (void)s.add_permits(1); }, "add_permits");
        expect_wrong_type([&] { (void)s.drain_permits(); }, "drain_permits");
        expect_wrong_type([&] { (void)s.available_permits(); }, "available_permits");
        expect_wrong_type([&] { (void)s.try_set_permits(1); }, "try_set_permits");
        expect_unchanged(foreign, snapshot(server()));
    }
}

// Every connection of the server killed while a waiter waits (its pooled connection and the
// subscriber's): the subscriber reconnects, the waiter tries again, and the permits set
// afterwards wake it. Its client destroyed meanwhile, a waiter stops with an error instead of
// waiting out its deadline.
TEST(semaphore, waiters_outlive_killed_connections_and_end_with_an_error_when_their_client_goes) {
    redis_server own;
    rlock::client a(own.options()), b(own.options());
    rlock::semaphore waiter_side(a, name()), setter(b, name());
    auto got = std::async(std::launch::async, [&] { return waiter_side.try_acquire_for(60s); });
    ASSERT_TRUE(eventually([&] {
        rlock::detail::reply_ptr r = own.cmd({"PUBSUB", "NUMSUB", channel_of(name())});
        return r && r->elements == 2 && r->element[1]->integer == 1;
    })) << "the waiter never subscribed";
    std::this_thread::sleep_for(100ms);
    own.cmd({"CLIENT", "KILL", "TYPE", "pubsub"});
    own.cmd({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
    ASSERT_TRUE(eventually([&] {
        rlock::detail::reply_ptr r = own.cmd({"PUBSUB", "NUMSUB", channel_of(name())});
        return r && r->elements == 2 && r->element[1]->integer == 1;
    })) << "the subscriber did not come back";
    EXPECT_EQ(got.wait_for(0s), std::future_status::timeout) << "the waiter gave up";
    ASSERT_TRUE(setter.try_set_permits(1));
    ASSERT_EQ(got.wait_for(20s), std::future_status::ready) << "the waiter missed the new permits";
    EXPECT_TRUE(got.get());

    auto doomed = std::make_unique<rlock::client>(own.options());
    rlock::semaphore orphan(*doomed, name());
    EXPECT_EQ(ending_when_the_client_goes(doomed, [&] { (void)orphan.try_acquire_for(60s); }),
              rlock::errc::connection_failed);
}

}  // namespace

namespace {

std::string latch_channel_of(const std::string& n) {
    return "redisson_countdownlatch__channel__{" + n + "}";
}

// Waiters on two clients never pass before the last count down: each checks, as it passes,
// that the last count_down had been started. They wake on the zero message, not by looking.
TEST(count_down_latch, no_waiter_passes_before_the_count_reaches_zero) {
    rlock::client a(server().options()), b(server().options());
    rlock::count_down_latch la(a, name()), lb(b, name());
    ASSERT_TRUE(la.try_set_count(3));
    EXPECT_FALSE(lb.try_set_count(5)) << "a second try_set_count replaced the count";
    EXPECT_EQ(lb.count(), 3);
    std::atomic<bool> last_started{false};
    std::atomic<int> early{0}, passed{0};
    std::vector<std::thread> waiters;
    for (int w = 0; w < 6; ++w) {
        waiters.emplace_back([&, w] {
            rlock::count_down_latch& l = w % 2 ? la : lb;
            if (l.wait_for(60s)) {
                if (!last_started.load()) ++early;
                ++passed;
            }
        });
    }
    ASSERT_TRUE(eventually([&] {
        rlock::detail::reply_ptr r = server().cmd({"PUBSUB", "NUMSUB", latch_channel_of(name())});
        return r && r->elements == 2 && r->element[1]->integer == 2;
    })) << "the waiters' clients never subscribed";
    EXPECT_EQ(la.count_down(), 2);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(lb.count_down(), 1);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(passed.load(), 0) << "a waiter passed at count 1";
    const long long gets_before = calls_of(server(), "get");
    std::this_thread::sleep_for(500ms);
    const long long gets_after = calls_of(server(), "get");
    EXPECT_EQ(gets_after, gets_before) << "waiters looked at the count while nothing changed";
    last_started = true;
    EXPECT_EQ(la.count_down(), 0);
    for (auto& t : waiters) t.join();
    EXPECT_EQ(passed.load(), 6);
    EXPECT_EQ(early.load(), 0) << "a waiter passed before the last count down";
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0) << "the key outlived the count";
    EXPECT_TRUE(la.try_wait());
    EXPECT_EQ(la.count_down(), 0) << "a latch at 0 stays at 0";
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0) << "a count down at 0 created a key";
}

// Redisson's layout: the count under the name, deleted at 0; `0` on the channel when it reaches
// 0, `1` when a count is set. What Redisson's countDown sends (DECR, DEL, PUBLISH 0) wakes an
// rlock waiter.
TEST(count_down_latch, the_layout_and_messages_are_redissons) {
    rlock::client c(server().options());
    rlock::count_down_latch l(c, name());
    {
        rlock_test::raw_subscriber listener(server().port(), latch_channel_of(name()));
        ASSERT_TRUE(l.try_set_count(2));
        EXPECT_EQ(listener.next(), "1");
        EXPECT_EQ(server().text({"GET", name()}), "2");
        EXPECT_EQ(server().text({"TYPE", name()}), "string");
        EXPECT_EQ(l.count_down(2), 0);
        EXPECT_EQ(listener.next(), "0");
    }
    ASSERT_TRUE(l.try_set_count(1));
    auto passed = std::async(std::launch::async, [&] { return l.wait_for(60s); });
    std::this_thread::sleep_for(300ms);
    server().cmd({"DECR", name()});  // Redisson's countDown, as its script sends it
    server().cmd({"DEL", name()});
    server().cmd({"PUBLISH", latch_channel_of(name()), "0"});
    ASSERT_EQ(passed.wait_for(20s), std::future_status::ready) << "Redisson's zero message did not wake it";
    EXPECT_TRUE(passed.get());
}

TEST(count_down_latch, bad_counts_and_foreign_keys_are_refused_with_redis_unchanged) {
    rlock::client c(server().options());
    rlock::count_down_latch l(c, name());
    ASSERT_TRUE(l.try_set_count(2));
    const auto before = snapshot(server());
    for (long long bad : {0LL, -1LL}) {
        try {
            (void)l.try_set_count(bad);
            ADD_FAILURE() << "try_set_count(" << bad << ") was accepted";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
            EXPECT_EQ(e.lock(), name());
        }
        EXPECT_THROW((void)l.count_down(bad), rlock::error);
    }
    expect_unchanged(before, snapshot(server()));
    EXPECT_THROW(rlock::count_down_latch(c, ""), rlock::error);

    for (const auto& setup : std::vector<std::vector<std::string>>{
             {"HSET", name(), "f", "1"}, {"SET", name(), "abc"}, {"SET", name(), "1.5"},
             {"SET", name(), "9223372036854775808"}, {"SET", name(), "99999999999999999999"}}) {
        server().cmd({"DEL", name()});
        (void)rlock_test::command_vec(rlock_test::raw_connection(server().port()).get(), setup);
        SCOPED_TRACE(setup[0] + " " + setup.back());
        const auto foreign = snapshot(server());
        for (int op = 0; op < 4; ++op) {
            try {
                if (op == 0) (void)l.count_down();
                if (op == 1) (void)l.count();
                if (op == 2) (void)l.wait_for(10ms);
                if (op == 3) (void)l.try_set_count(3);
                ADD_FAILURE() << "operation " << op << " worked on a foreign key";
            } catch (const rlock::error& e) {
                EXPECT_EQ(e.value(), rlock::errc::wrong_type) << op << ": " << e.what();
                EXPECT_EQ(e.lock(), name());
            }
        }
        expect_unchanged(foreign, snapshot(server()));
    }
}

TEST(count_down_latch, a_waiter_ends_with_an_error_when_its_client_goes) {
    auto doomed = std::make_unique<rlock::client>(server().options());
    rlock::count_down_latch orphan(*doomed, name());
    ASSERT_TRUE(orphan.try_set_count(1));
    EXPECT_EQ(ending_when_the_client_goes(doomed, [&] { (void)orphan.wait_for(60s); }),
              rlock::errc::connection_failed);
}

}  // namespace
