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
#include <mutex>
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

using rlock_test::server;

using rlock_test::name;

std::string channel_of(const std::string& n) { return "redisson_sc:{" + n + "}"; }

/// How many times the server has run `cmd` (lowercase), from INFO commandstats.
using rlock_test::calls_of;

/// How many scripts the server has run (EVAL and EVALSHA).
long long scripts_run(const redis_server& s) { return calls_of(s, "evalsha") + calls_of(s, "eval"); }

/// `call` must throw rlock::error `code` naming the object `lock` and (when not empty) `server`.
template <class F>
void expect_refused(rlock::errc code, const std::string& lock, const std::string& server,
                    const char* what, F call) {
    try {
        call();
        ADD_FAILURE() << what << " was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), code) << what << ": " << e.what();
        EXPECT_EQ(e.lock(), lock) << what;
        if (!server.empty()) {
            EXPECT_EQ(e.server(), server) << what;
        }
    }
}

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
// A release message carries the new count: this client's blocking waiters are woken only as
// far as it goes (first fit, in arrival order), not all of them. One permit released to four
// waiters costs the release, one acquire and the check the next waiter at Redis makes when it
// takes over (one of the client's waiters waits at Redis, the others in the process: local
// hand-off); before, every waiter tried (five scripts), and under a flash sale's hot keys most
// tries failed. Three more permits serve the other three.
TEST(semaphore, a_release_wakes_only_as_many_of_the_clients_waiters_as_it_frees_permits) {
    redis_server own;
    rlock::client waiters_client(own.options()), releaser_client(own.options());
    rlock::semaphore waiting_side(waiters_client, name()), releaser(releaser_client, name());
    ASSERT_TRUE(releaser.try_set_permits(0));
    releaser.release();  // both scripts loaded: each counts once below (no NOSCRIPT + EVAL)
    ASSERT_TRUE(waiting_side.try_acquire());
    std::vector<std::future<bool>> waiters;
    for (int i = 0; i < 4; ++i) {
        waiters.push_back(std::async(std::launch::async, [&] { return waiting_side.try_acquire_for(20s); }));
    }
    std::this_thread::sleep_for(500ms);  // all four subscribed and waiting
    const long long before = scripts_run(own);
    releaser.release();
    auto served = [&] {
        int n = 0;
        for (auto& w : waiters) n += w.wait_for(0s) == std::future_status::ready ? 1 : 0;
        return n;
    };
    ASSERT_TRUE(eventually([&] { return served() == 1; }, 10s));
    std::this_thread::sleep_for(300ms);  // any other waiter woken would have tried by now
    EXPECT_EQ(served(), 1);
    EXPECT_LE(scripts_run(own) - before, 3) << "a release of one permit woke more than one waiter";
    releaser.release(3);
    for (auto& w : waiters) {
        ASSERT_EQ(w.wait_for(10s), std::future_status::ready);
        EXPECT_TRUE(w.get());
    }
    EXPECT_EQ(own.text({"GET", name()}), "0");
}

// Local hand-off: threads of one client waiting for permits queue in the process behind the
// one that waits at Redis; a release by a thread of the client hands its permits to them
// without a round trip (no INCRBY, no message, no acquire script), and the count in Redis
// stays as it was.
TEST(semaphore, a_release_hands_permits_to_a_waiting_thread_of_the_client_without_a_round_trip) {
    redis_server own;
    rlock::client_options o = own.options();
    o.local_handoff_time = 60s;
    rlock::client c(o);
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(0));
    s.release();  // the scripts loaded
    ASSERT_TRUE(s.try_acquire());
    auto at_redis = std::async(std::launch::async, [&] { return s.try_acquire_for(20s); });
    ASSERT_TRUE(eventually([&] {
        rlock::detail::reply_ptr r = own.cmd({"PUBSUB", "NUMSUB", channel_of(name())});
        return r && r->elements == 2 && r->element[1]->integer == 1;
    })) << "the first waiter never subscribed";
    auto in_process = std::async(std::launch::async, [&] { return s.try_acquire_for(20s); });
    std::this_thread::sleep_for(300ms);  // it waits in the process
    own.cmd({"CONFIG", "RESETSTAT"});
    s.release();
    ASSERT_EQ(in_process.wait_for(5s), std::future_status::ready) << "the release did not reach the waiting thread";
    EXPECT_TRUE(in_process.get());
    const std::string stats = own.text({"INFO", "commandstats"});
    for (const char* cmd : {"cmdstat_evalsha", "cmdstat_eval:", "cmdstat_incrby", "cmdstat_publish"}) {
        EXPECT_EQ(stats.find(cmd), std::string::npos) << "the hand-over sent " << cmd;
    }
    EXPECT_EQ(own.text({"GET", name()}), "0");
    EXPECT_EQ(at_redis.wait_for(0s), std::future_status::timeout);
    s.release();  // no one queued in the process: through Redis, to the waiter there
    ASSERT_EQ(at_redis.wait_for(5s), std::future_status::ready);
    EXPECT_TRUE(at_redis.get());
    s.release();
    EXPECT_EQ(s.available_permits(), 1);
}

// A thread of the client waiting for several permits at Redis does not hold up one that needs
// fewer: that one waits at Redis too, and a release of one permit by another client serves it
// (first fit) while the first still waits.
TEST(semaphore, a_thread_needing_fewer_permits_is_not_held_up_behind_one_waiting_for_more) {
    rlock::client c(server().options()), other(server().options());
    rlock::semaphore s(c, name()), releaser(other, name());
    ASSERT_TRUE(s.try_set_permits(0));
    auto many = std::async(std::launch::async, [&] { return s.try_acquire_for(3s, 5); });
    std::this_thread::sleep_for(200ms);  // it waits at Redis for the client
    auto one = std::async(std::launch::async, [&] { return s.try_acquire_for(10s); });
    std::this_thread::sleep_for(200ms);
    releaser.release();
    ASSERT_EQ(one.wait_for(2s), std::future_status::ready) << "the one-permit waiter was held up behind the five-permit one";
    EXPECT_TRUE(one.get());
    EXPECT_FALSE(many.get());
    EXPECT_EQ(releaser.available_permits(), 0);
    s.release();
}

// The same when the thread waiting for more comes to lead later: the leader, waiting for one
// permit, is served, and the next in line waits for five; the thread behind it that needs two
// waits at Redis on its own from then on. Failed before: it waited in the process until the
// five-permit waiter's wait ended, with its two permits free at Redis.
TEST(semaphore, a_thread_needing_fewer_permits_is_not_held_up_behind_a_new_leader_waiting_for_more) {
    rlock::client c(server().options()), other(server().options());
    rlock::semaphore s(c, name()), releaser(other, name());
    ASSERT_TRUE(s.try_set_permits(0));
    auto first = std::async(std::launch::async, [&] { return s.try_acquire_for(10s); });
    std::this_thread::sleep_for(200ms);  // refused: it waits at Redis for the client
    auto five = std::async(std::launch::async, [&] { return s.try_acquire_for(4s, 5); });
    std::this_thread::sleep_for(200ms);  // queued behind it in the process
    auto two = std::async(std::launch::async, [&] { return s.try_acquire_for(10s, 2); });
    std::this_thread::sleep_for(200ms);  // queued too
    releaser.release();
    ASSERT_EQ(first.wait_for(2s), std::future_status::ready);
    EXPECT_TRUE(first.get());
    releaser.release(2);
    ASSERT_EQ(two.wait_for(2s), std::future_status::ready)
        << "the two-permit waiter was held up behind the five-permit one";
    EXPECT_TRUE(two.get());
    EXPECT_FALSE(five.get());
    EXPECT_EQ(releaser.available_permits(), 0);
    s.release(3);
}

// The bound: threads of one client that keep passing a permit between them release it through
// Redis after local_handoff_passes passes in a row, and another client's waiter gets it.
TEST(semaphore, another_clients_waiter_gets_a_permit_while_threads_of_one_client_keep_passing_it) {
    rlock::client_options o = server().options();
    o.local_handoff_passes = 4;
    o.local_handoff_time = 60s;
    rlock::client busy(o), other(server().options());
    rlock::semaphore mine(busy, name()), theirs(other, name());
    ASSERT_TRUE(mine.try_set_permits(1));
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
        threads.emplace_back([&] {
            for (int n = 0; n < 5000 && !stop.load(); ++n) {  // bounded
                if (!mine.try_acquire_for(5s)) continue;
                ++cycles;
                std::this_thread::sleep_for(1ms);
                mine.release();
            }
        });
    }
    ASSERT_TRUE(eventually([&] { return cycles.load() > 20; }));
    const int before = cycles.load();
    const bool got = theirs.try_acquire_for(5s);
    const int waited_cycles = cycles.load() - before;
    if (got) theirs.release();
    stop = true;
    for (auto& t : threads) t.join();
    ASSERT_TRUE(got) << "the other client's waiter starved behind " << waited_cycles << " local passes";
    EXPECT_LE(waited_cycles, 40);
    EXPECT_EQ(mine.available_permits(), 1);
}

// The bound for a waiter of another client that needs more permits than one release frees:
// when the bound cuts a run of passes, every permit the client holds goes back through Redis
// once before passes resume, so the count there reaches that waiter's need. Before, only the
// releasing thread's permit went to Redis while the client's other permit kept being passed,
// and a waiter for 2 of 2 permits ran out every time (0 of 2 in each of 4 runs of 4 s).
TEST(semaphore, another_clients_waiter_for_every_permit_gets_them_while_threads_of_one_client_keep_passing) {
    rlock::client busy(server().options()), other(server().options());  // the default bound
    rlock::semaphore mine(busy, name()), theirs(other, name());
    ASSERT_TRUE(mine.try_set_permits(2));
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&] {
            for (int n = 0; n < 20000 && !stop.load(); ++n) {  // bounded
                if (!mine.try_acquire_for(2s)) continue;
                ++cycles;
                std::this_thread::sleep_for(500us);
                mine.release();
            }
        });
    }
    ASSERT_TRUE(eventually([&] { return cycles.load() > 50; }));
    int got = 0;
    for (int round = 0; round < 3; ++round) {
        if (theirs.try_acquire_for(3s, 2)) {
            ++got;
            theirs.release(2);
        }
        std::this_thread::sleep_for(5ms);
    }
    const int total = cycles.load();
    stop = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(got, 3) << "the other client's waiter for 2 permits ran out behind " << total
                      << " holds of the busy client";
    EXPECT_EQ(mine.available_permits(), 2);
}

TEST(semaphore, a_thread_waiting_in_the_process_throws_connection_failed_when_the_client_is_destroyed) {
    auto c = std::make_unique<rlock::client>(server().options());
    rlock::semaphore s(*c, name());
    ASSERT_TRUE(s.try_set_permits(0));
    auto at_redis = std::async(std::launch::async, [&] {
        try {
            return s.try_acquire_for(20s) ? 0 : -1;
        } catch (const rlock::error& e) {
            return static_cast<int>(e.value());
        }
    });
    std::this_thread::sleep_for(200ms);
    auto in_process = std::async(std::launch::async, [&] {
        try {
            return s.try_acquire_for(20s) ? 0 : -1;
        } catch (const rlock::error& e) {
            return static_cast<int>(e.value());
        }
    });
    std::this_thread::sleep_for(300ms);
    c.reset();
    ASSERT_EQ(in_process.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(in_process.get(), static_cast<int>(rlock::errc::connection_failed));
    ASSERT_EQ(at_redis.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(at_redis.get(), static_cast<int>(rlock::errc::connection_failed));
}

// Two threads of one client wait (one at Redis, one in the process) and their deadlines come
// while the server is down: each ends with the outage's error at its deadline, not with false
// (which would say the permits were taken) — the one in the process too, whose wait ran out
// there while the other still rode the outage at Redis.
TEST(semaphore, waits_in_the_process_whose_deadline_comes_during_an_outage_end_with_its_error) {
    redis_server own;
    rlock::client c(own.options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(0));
    const auto start = std::chrono::steady_clock::now();
    auto wait = [&](std::chrono::milliseconds limit) {
        try {
            return s.try_acquire_for(limit) ? rlock::errc::invalid_argument : rlock::errc{};
        } catch (const rlock::error& e) {
            return e.value();
        }
    };
    auto at_redis = std::async(std::launch::async, wait, 3000ms);
    std::this_thread::sleep_for(100ms);
    // Its deadline comes first, while the one at Redis still rides the outage.
    auto in_process = std::async(std::launch::async, wait, 1500ms);
    std::this_thread::sleep_for(200ms);
    own.kill_now();
    for (auto* f : {&at_redis, &in_process}) {
        ASSERT_EQ(f->wait_for(10s), std::future_status::ready);
        const rlock::errc e = f->get();
        EXPECT_TRUE(rlock_test::connection_error(e)) << "ended with " << static_cast<int>(e) << " (0: false)";
    }
    EXPECT_GE(std::chrono::steady_clock::now() - start, 1400ms) << "gave up before its deadline";
}

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

// Issue 31, item 5: counts are compared and returned exactly, also beyond 2^53 where a Lua
// number (a double) is not. Before, try_acquire(2^53 + 1) on a count of 2^53 returned true
// and left -1 (more holders than permits), count_down(1) from LLONG_MAX returned LLONG_MIN,
// add_permits(1) on 2^53 + 2 returned ...996 where Redis stored ...995.
TEST(semaphore, counts_beyond_2_to_the_53_are_compared_and_returned_exactly) {
    rlock::client c(server().options());
    rlock::semaphore s(c, name());
    server().cmd({"SET", name(), "9007199254740992"});  // 2^53
    EXPECT_FALSE(s.try_acquire(9007199254740993LL)) << "took one permit more than there are";
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740992");
    EXPECT_TRUE(s.try_acquire(9007199254740991LL));
    EXPECT_EQ(server().text({"GET", name()}), "1");

    server().cmd({"SET", name(), "9007199254740994"});
    EXPECT_EQ(s.add_permits(1), 9007199254740995LL);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740995");
    s.release(2);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740997");
    EXPECT_EQ(s.add_permits(-9007199254740997LL), 0);
    EXPECT_EQ(s.add_permits(-1), -1);
    EXPECT_EQ(s.add_permits(9223372036854775807LL), 9223372036854775806LL);

    // The release message carries the exact count (Redisson's waiters read it as a number).
    server().cmd({"SET", name(), "9007199254740992"});
    auto sub = rlock_test::raw_connection(server().port());
    rlock::detail::reply_ptr r = rlock::detail::command(sub.get(), {"SUBSCRIBE", channel_of(name())});
    s.release(1);
    redisReply* raw = nullptr;
    ASSERT_EQ(redisGetReply(sub.get(), reinterpret_cast<void**>(&raw)), REDIS_OK);
    rlock::detail::reply_ptr msg(raw);
    ASSERT_EQ(msg->type, REDIS_REPLY_ARRAY);
    EXPECT_EQ(std::string(msg->element[2]->str, msg->element[2]->len), "9007199254740993");
}

TEST(count_down_latch, counts_beyond_2_to_the_53_are_compared_and_returned_exactly) {
    rlock::client c(server().options());
    rlock::count_down_latch l(c, name());
    server().cmd({"SET", name(), "9223372036854775807"});
    EXPECT_EQ(l.count_down(1), 9223372036854775806LL);
    EXPECT_EQ(server().text({"GET", name()}), "9223372036854775806");
    server().cmd({"SET", name(), "9007199254740993"});
    EXPECT_EQ(l.count_down(9007199254740992LL), 1) << "reached zero a count early";
    EXPECT_EQ(server().text({"GET", name()}), "1");
    server().cmd({"SET", name(), "9007199254740993"});
    EXPECT_EQ(l.count_down(9007199254740993LL), 0);
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    ASSERT_TRUE(l.try_set_count(9007199254740993LL));
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740993");
    EXPECT_EQ(l.count(), 9007199254740993LL);
}

TEST(permit_expirable_semaphore, counts_beyond_2_to_the_53_are_compared_and_returned_exactly) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    server().cmd({"SET", name(), "9007199254740993"});
    EXPECT_EQ(s.available_permits(), 9007199254740993LL);
    rlock::permit p = s.try_acquire(1);
    ASSERT_TRUE(p);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740992");
    EXPECT_EQ(s.available_permits(), 9007199254740992LL);
    p.release();
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740993");
    EXPECT_EQ(s.available_permits(), 9007199254740993LL);

    // Released by id (a detached permit): the count goes back exactly.
    rlock::permit q = s.try_acquire(2);
    ASSERT_TRUE(q);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740991");
    s.release(q.detach());
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740993");
    EXPECT_EQ(s.add_permits(1), 9007199254740994LL);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740994");
}

// A capacity beyond 2^53 sets a lost count back exactly, and a release never lifts the count
// over it by rounding.
TEST(semaphore, a_capacity_beyond_2_to_the_53_is_kept_exactly) {
    rlock::client c(server().options());
    rlock::semaphore_options big;
    big.capacity = 9007199254740993LL;
    rlock::semaphore s(c, name(), big);
    ASSERT_TRUE(s.try_acquire(1));  // no count: set back to the capacity, less the one taken
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740992");
    s.release(1);
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740993");
    s.release(1);  // one over: kept at the capacity (compared as text: a Lua number rounds both)
    EXPECT_EQ(server().text({"GET", name()}), "9007199254740993");
}

// A release that does not fit under the capacity brings the count back to it and leaves the
// key as it was otherwise: an expiry its users set on it (Redisson's RSemaphore.expire) stays.
// Before, the count was SET back, which dropped the TTL.
// With a capacity, an absent count means the capacity (the next acquire sets it back): that is
// what available_permits reads and what drain_permits takes, setting the count to 0 so that the
// drain holds. Before, both read 0 and the drain left the key absent, so the next acquire set the
// count back to the capacity and got a permit.
TEST(semaphore, with_a_capacity_an_absent_count_is_read_and_drained_as_the_capacity) {
    rlock::client c(server().options());
    rlock::semaphore_options with_capacity;
    with_capacity.capacity = 3;
    rlock::semaphore s(c, name(), with_capacity);
    EXPECT_EQ(s.available_permits(), 3);
    EXPECT_EQ(s.drain_permits(), 3);
    EXPECT_EQ(server().text({"GET", name()}), "0");
    EXPECT_FALSE(s.try_acquire()) << "the drain did not hold";
    EXPECT_EQ(s.available_permits(), 0);
    s.release(2);
    EXPECT_EQ(s.available_permits(), 2);
}

TEST(semaphore, a_release_over_the_capacity_keeps_the_keys_expiry) {
    rlock::client c(server().options());
    rlock::semaphore_options three;
    three.capacity = 3;
    rlock::semaphore s(c, name(), three);
    ASSERT_TRUE(s.try_set_permits(2));
    server().cmd({"PEXPIRE", name(), "600000"});
    s.release(2);  // one over
    EXPECT_EQ(server().text({"GET", name()}), "3");
    EXPECT_GT(server().integer({"PTTL", name()}), 0) << "the release dropped the key's expiry";
}

// A count set above the capacity (try_set_permits, add_permits) is the user's: a release
// adds nothing to it and takes nothing from it, and what it released is told as not fitting,
// never more permits than it released. Before, the release clamped the count down to the
// capacity (10 free permits became 5) and told "5 of the 1 permits" did not fit.
TEST(semaphore, a_release_never_lowers_a_count_set_above_the_capacity) {
    rlock_test::lost_log lost;
    rlock::client_options o = server().options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::semaphore_options five;
    five.capacity = 5;
    rlock::semaphore s(c, name(), five);
    ASSERT_TRUE(s.try_set_permits(10));
    ASSERT_TRUE(s.try_acquire());
    s.release();
    EXPECT_EQ(server().text({"GET", name()}), "9") << "a release lowered the count";
    ASSERT_EQ(lost.calls.load(), 1);
    {
        std::lock_guard<std::mutex> g(lost.mu);
        EXPECT_NE(lost.last_message.find("1 of the 1 permits released did not fit"), std::string::npos)
            << lost.last_message;
    }
    EXPECT_EQ(s.add_permits(3), 12);
    s.release(2);
    EXPECT_EQ(server().text({"GET", name()}), "12");
    ASSERT_EQ(lost.calls.load(), 2);
    {
        std::lock_guard<std::mutex> g(lost.mu);
        EXPECT_NE(lost.last_message.find("2 of the 2 permits released did not fit"), std::string::npos)
            << lost.last_message;
    }
    // At the capacity exactly, too: nothing fits, the count stays.
    server().cmd({"SET", name(), "5"});
    s.release();
    EXPECT_EQ(server().text({"GET", name()}), "5");
    EXPECT_EQ(lost.calls.load(), 3);
}

TEST(semaphore, bad_counts_and_foreign_keys_are_refused_with_redis_unchanged) {
    rlock::client c(server().options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    const auto before = snapshot(server());
    auto expect_invalid = [&](auto call, const char* what) {
        expect_refused(rlock::errc::invalid_argument, name(), c.server(), what, call);
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
            expect_refused(rlock::errc::wrong_type, name(), "", what, call);
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
// Issue 31, item 2: the waiters of a semaphore, a latch and a permit-expirable semaphore ride
// out a 2 s restart (blocking and asynchronous), and get what is set after it. Before, a
// semaphore waiter failed with connection_failed at the shutdown, a latch's and a permit
// semaphore's one command_timeout later. (The restarted server is empty: the latch's count is
// gone, which opens it, as in Redisson.)
TEST(semaphore, waiters_ride_out_a_two_second_restart) {
    redis_server own;
    rlock::client a(own.options()), b(own.options());
    rlock::semaphore waiter_side(a, name()), setter(b, name());
    rlock::count_down_latch latch(a, name() + ":latch"), counter(b, name() + ":latch");
    rlock::permit_expirable_semaphore slots(a, name() + ":permits"), slot_setter(b, name() + ":permits");
    ASSERT_TRUE(counter.try_set_count(1));
    auto outcome = [](auto wait) {
        return std::async(std::launch::async, [wait]() -> std::string {
            try {
                return wait() ? "got it" : "returned false";
            } catch (const rlock::error& e) {
                return std::string("threw: ") + e.what();
            }
        });
    };
    auto blocking = outcome([&] { return waiter_side.try_acquire_for(20s); });
    auto blocking_latch = outcome([&] { return latch.wait_for(20s); });
    std::vector<rlock::permit> taken;  // released while `slots` lives (the end of the test)
    std::mutex taken_mu;
    auto blocking_permit = outcome([&] {
        rlock::permit p = slots.try_acquire_for(20s);
        const bool got = static_cast<bool>(p);
        std::lock_guard<std::mutex> g(taken_mu);
        taken.push_back(std::move(p));
        return got;
    });
    std::future<bool> async_acquire = waiter_side.async_try_acquire_for(20s, rlock::use_future);
    std::future<bool> async_latch = latch.async_wait_for(20s, rlock::use_future);
    std::future<rlock::permit> async_permit = slots.async_try_acquire_for(20s, 1, rlock::use_future);
    std::this_thread::sleep_for(300ms);
    own.kill_now();
    std::this_thread::sleep_for(1500ms);
    // Mid-outage every wait still waits (none ended with connection_failed).
    EXPECT_EQ(blocking.wait_for(0s), std::future_status::timeout) << blocking.get();
    EXPECT_EQ(blocking_latch.wait_for(0s), std::future_status::timeout) << blocking_latch.get();
    EXPECT_EQ(blocking_permit.wait_for(0s), std::future_status::timeout) << blocking_permit.get();
    std::this_thread::sleep_for(500ms);
    own.restart();  // empty: the latch's count is gone, which opens it (Redisson's rule)
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(blocking.wait_for(0s), std::future_status::timeout) << blocking.get();
    EXPECT_EQ(blocking_permit.wait_for(0s), std::future_status::timeout) << blocking_permit.get();
    ASSERT_TRUE(setter.try_set_permits(2));
    ASSERT_TRUE(counter.try_set_count(1));
    counter.count_down();
    ASSERT_TRUE(slot_setter.try_set_permits(2));
    for (auto* f : {&blocking, &blocking_latch, &blocking_permit}) {
        ASSERT_EQ(f->wait_for(15s), std::future_status::ready);
        EXPECT_EQ(f->get(), "got it");
    }
    ASSERT_EQ(async_acquire.wait_for(15s), std::future_status::ready);
    EXPECT_TRUE(async_acquire.get());
    ASSERT_EQ(async_latch.wait_for(15s), std::future_status::ready);
    EXPECT_TRUE(async_latch.get());
    ASSERT_EQ(async_permit.wait_for(15s), std::future_status::ready);
    EXPECT_TRUE(async_permit.get());
}

/// What a wait on another thread ended with: "got it", "returned false", or the error's code.
template <class Wait>
std::future<std::string> waiting(Wait wait) {
    return std::async(std::launch::async, [wait]() -> std::string {
        try {
            return wait() ? "got it" : "returned false";
        } catch (const rlock::error& e) {
            return "threw " + std::to_string(static_cast<int>(e.value())) + ": " + e.what();
        }
    });
}

const std::string threw_lock_lost = "threw " + std::to_string(static_cast<int>(rlock::errc::lock_lost)) + ": ";

// A FLUSHALL publishes nothing and breaks no connection: the waiters learn of it from the
// server's flush notice (the subscriber's own tracking) and try again at once — a latch's
// waiters pass (its count is gone: Redisson's rule), a semaphore waiter whose client saw the
// count set is told it is gone, and a lock's waiter behind a 30 s lease gets the lock. Before,
// each slept until its deadline (20 s) or a message that never came.
TEST(count_down_latch, a_flushall_opens_it_for_every_waiter_at_once) {
    redis_server own;
    rlock::client a(own.options()), b(own.options());
    rlock::count_down_latch latch(a, name()), setter(b, name());
    ASSERT_TRUE(setter.try_set_count(1));
    rlock::semaphore sem(a, name("-sem"));
    ASSERT_TRUE(sem.try_set_permits(0));
    rlock::mutex held(b, name("-lock")), wanted(a, name("-lock"));
    held.lock();
    auto blocking = waiting([&] { return latch.wait_for(20s); });
    std::future<bool> async = latch.async_wait_for(20s, rlock::use_future);
    auto sem_wait = waiting([&] { return sem.try_acquire_for(20s); });
    auto lock_wait = waiting([&] {
        const bool got = wanted.try_lock_for(20s);
        if (got) wanted.unlock();
        return got;
    });
    ASSERT_TRUE(eventually([&] { return own.cmd({"PUBSUB", "CHANNELS", "*{*"})->elements == 3; }))
        << "the waiters never subscribed";
    std::this_thread::sleep_for(300ms);  // past the tries that follow the subscriptions
    ASSERT_EQ(blocking.wait_for(0s), std::future_status::timeout) << blocking.get();
    own.cmd({"FLUSHALL"});
    ASSERT_EQ(blocking.wait_for(5s), std::future_status::ready) << "the latch's waiter slept on";
    EXPECT_EQ(blocking.get(), "got it");
    ASSERT_EQ(async.wait_for(5s), std::future_status::ready) << "the asynchronous waiter slept on";
    EXPECT_TRUE(async.get());
    ASSERT_EQ(sem_wait.wait_for(5s), std::future_status::ready) << "the semaphore's waiter slept on";
    EXPECT_EQ(sem_wait.get().rfind(threw_lock_lost, 0), 0U);
    ASSERT_EQ(lock_wait.wait_for(5s), std::future_status::ready) << "the lock's waiter slept on";
    EXPECT_EQ(lock_wait.get(), "got it");
}

// As a lock's (fault_test.asynchronous_waits_whose_deadlines_come_in_a_pause_end_together):
// one client's asynchronous synchronizer waits share its engine thread, and each last try
// waited for the paused server in turn. Now every wait ends one command_timeout past its
// deadline, with its error. A semaphore's try sent itself a second time on a new connection
// after a timeout, so its waits (and the other waits of its client, which the engine held
// back meanwhile) ended two command_timeouts past it; a blocking wait of another client too.
TEST(semaphore, asynchronous_waits_of_one_client_whose_deadlines_come_in_a_pause_end_together) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 600ms;
    rlock::client c(o), other(o);
    rlock::semaphore sem(c, name());
    ASSERT_TRUE(sem.try_set_permits(0));
    rlock::count_down_latch latch(c, name("-latch"));
    ASSERT_TRUE(latch.try_set_count(1));
    rlock::permit_expirable_semaphore slots(c, name("-permits"));
    ASSERT_TRUE(slots.try_set_permits(0));
    rlock::semaphore blocking(other, name());
    const auto start = rlock_test::steady::now();
    std::vector<std::future<bool>> waits;
    std::vector<std::future<rlock::permit>> permits;
    for (int i = 0; i < 2; ++i) {
        waits.push_back(sem.async_try_acquire_for(1s, rlock::use_future));
        waits.push_back(latch.async_wait_for(1s, rlock::use_future));
        permits.push_back(slots.async_try_acquire_for(1s, 1, rlock::use_future));
    }
    waits.push_back(std::async(std::launch::async, [&] { return blocking.try_acquire_for(1s); }));
    std::this_thread::sleep_for(200ms);
    own.pause();
    std::vector<long long> ended_ms;
    auto ended = [&](auto& f) {
        if (f.wait_for(8s) != std::future_status::ready) return;
        ended_ms.push_back(rlock_test::millis(rlock_test::steady::now() - start));
        try {
            (void)f.get();
            ADD_FAILURE() << "a wait ended without an error";
        } catch (const rlock::error& e) {
            EXPECT_TRUE(rlock_test::connection_error(e.value())) << e.what();
        }
    };
    for (auto& f : waits) ended(f);
    for (auto& f : permits) ended(f);
    own.resume();
    ASSERT_EQ(ended_ms.size(), 7u) << "a wait did not end";
    const long long bound = 1000 + 600 + 350 + rlock_test::tsan_symbolize_slack.count();
    for (long long t : ended_ms) {
        EXPECT_LT(t, bound) << "past its deadline by more than one command_timeout";
    }
}

// Issue 31, item 4: a restart without persistence takes the count with it. The waiters of a
// client that saw the count set are told (lock_lost, naming the semaphore) instead of waiting
// for ever, as are its later acquires; a client that never saw it set reads an absent count as
// no permit (Redisson's rule), and a count set again serves everyone. Before, every waiter
// waited out its deadline and returned false, told nothing.
TEST(semaphore, waiters_are_told_when_the_server_lost_the_count) {
    redis_server own;
    rlock::client a(own.options()), fresh(own.options());
    rlock::semaphore sem(a, name()), other(fresh, name());
    ASSERT_TRUE(sem.try_set_permits(1));
    ASSERT_TRUE(sem.try_acquire());
    auto blocking = waiting([&] { return sem.try_acquire_for(20s); });
    std::future<bool> async_wait = sem.async_try_acquire_for(20s, rlock::use_future);
    std::this_thread::sleep_for(300ms);
    own.kill_now();
    own.restart();
    ASSERT_EQ(blocking.wait_for(10s), std::future_status::ready) << "a waiter still waits on a lost count";
    const std::string ended = blocking.get();
    EXPECT_EQ(ended.rfind(threw_lock_lost, 0), 0u) << ended;
    EXPECT_NE(ended.find(name()), std::string::npos) << ended;
    ASSERT_EQ(async_wait.wait_for(10s), std::future_status::ready);
    try {
        (void)async_wait.get();
        ADD_FAILURE() << "the asynchronous waiter was not told";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::lock_lost) << e.what();
    }
    try {
        (void)sem.try_acquire_for(5s);
        ADD_FAILURE() << "an acquire on the lost count was not told";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::lock_lost) << e.what();
        EXPECT_EQ(e.lock(), name());
        EXPECT_EQ(e.server(), a.server());
    }
    EXPECT_EQ(own.integer({"EXISTS", name()}), 0) << "a told acquire wrote";
    EXPECT_FALSE(other.try_acquire()) << "a client that never saw the count reads no permit";
    ASSERT_TRUE(other.try_set_permits(2));
    EXPECT_TRUE(sem.try_acquire());
    EXPECT_TRUE(other.try_acquire());
}

// With semaphore_options::capacity the lost count is set back by the next acquire, which is
// served (and so are the waiters); the holders of the client that set it back are told at
// once; a release never raises the count above the capacity, so the permits taken before the
// loss do not add up to more than the capacity once everyone has released. No set-up either:
// a semaphore with a capacity starts at it.
TEST(semaphore, a_capacity_sets_a_lost_count_back_and_tells_the_holders) {
    redis_server own;
    rlock_test::lost_log a_lost, b_lost;
    rlock::client_options ao = own.options(), bo = own.options();
    ao.on_lock_lost = a_lost.handler();
    bo.on_lock_lost = b_lost.handler();
    rlock::client a(ao), b(bo);
    rlock::semaphore_options two;
    two.capacity = 2;
    rlock::semaphore sa(a, name(), two), sb(b, name(), two);
    ASSERT_TRUE(sa.try_acquire()) << "a semaphore with a capacity starts at it";
    ASSERT_TRUE(sb.try_acquire());
    EXPECT_EQ(own.text({"GET", name()}), "0");
    auto waiter = waiting([&] { return sb.try_acquire_for(20s); });
    std::this_thread::sleep_for(300ms);
    own.kill_now();
    own.restart();
    ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready) << "a waiter still waits on a lost count";
    EXPECT_EQ(waiter.get(), "got it");
    EXPECT_EQ(own.text({"GET", name()}), "1");
    EXPECT_EQ(b_lost.calls.load(), 1) << "b set it back while holding a permit of the lost count";
    EXPECT_EQ(b_lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
    EXPECT_EQ(a_lost.calls.load(), 0);
    EXPECT_TRUE(sa.try_acquire());
    EXPECT_FALSE(sa.try_acquire()) << "more than the capacity taken after the loss";
    // Everything taken is released: the two new permits and the two of the lost count. Two
    // releases do not fit; b's own was told already, the other (a's) is told at the release
    // that did not fit (permits are not owned: to whoever released it). One tell per permit
    // of the lost count.
    for (int i = 0; i < 2; ++i) sa.release();
    for (int i = 0; i < 2; ++i) sb.release();
    EXPECT_EQ(own.text({"GET", name()}), "2") << "the count went above its capacity";
    EXPECT_EQ(a_lost.calls.load() + b_lost.calls.load(), 2) << b_lost.last_message;
    {
        std::lock_guard<std::mutex> g(b_lost.mu);
        EXPECT_NE(b_lost.last_message.find("did not fit under the semaphore's capacity 2"), std::string::npos)
            << b_lost.last_message;
    }
    rlock::semaphore_options bad;
    bad.capacity = -1;
    EXPECT_THROW(rlock::semaphore(a, name(), bad), rlock::error);
    EXPECT_THROW((void)sa.try_acquire(3), rlock::error);
    EXPECT_EQ(own.text({"GET", name()}), "2");
}

// The project's rule for bad input ("a clear rlock::error naming the lock, the server and the
// cause, and Redis exactly as it was") with semaphore_options::capacity set, where the acquire
// and release scripts may also write (set a lost count back to the capacity). Each failing
// call — bad permits (over the capacity too), a key of another type or a string that is not a
// count, an overflowing release or add, a channel the ACL refuses — leaves every key as it was
// (type, value, TTL), whether the count is there or absent (lost: a failing call must not set
// it back), and tells nobody a permit was lost.
TEST(semaphore, a_failing_call_with_a_capacity_leaves_redis_exactly_as_it_was) {
    redis_server own;
    rlock_test::lost_log lost;
    rlock::client_options o = own.options();
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::semaphore_options two;
    two.capacity = 2;
    rlock::semaphore s(c, name(), two);
    rlock::semaphore_options five;
    five.capacity = 5;
    rlock::semaphore other(c, name() + ":other", five);  // a second key that must not move either
    ASSERT_TRUE(other.try_acquire());
    own.cmd({"PEXPIRE", name() + ":other", "600000"});
    auto expect_invalid = [&](auto call, const char* what) {
        expect_refused(rlock::errc::invalid_argument, name(), c.server(), what, call);
    };
    auto bad_permits = [&] {
        expect_invalid([&] { s.acquire(0); }, "acquire(0)");
        expect_invalid([&] { (void)s.try_acquire(-1); }, "try_acquire(-1)");
        expect_invalid([&] { (void)s.try_acquire(3); }, "try_acquire(3), over the capacity 2");
        expect_invalid([&] { (void)s.try_acquire_for(10ms, 3); }, "try_acquire_for(.., 3)");
        expect_invalid([&] { s.acquire(9223372036854775807LL); }, "acquire(LLONG_MAX)");
        expect_invalid([&] { (void)s.async_try_acquire_for(10ms, 3, rlock::use_future).get(); },
                       "async_try_acquire_for(.., 3)");
        expect_invalid([&] { (void)s.async_acquire(0, rlock::use_future).get(); },
                       "async_acquire(0)");
        expect_invalid([&] { s.release(0); }, "release(0)");
        expect_invalid([&] { s.release(-3); }, "release(-3)");
        expect_invalid([&] { (void)s.try_set_permits(-1); }, "try_set_permits(-1)");
    };

    {
        SCOPED_TRACE("a count that is there, with a TTL");
        ASSERT_TRUE(s.try_acquire());
        own.cmd({"PEXPIRE", name(), "600000"});
        const auto before = snapshot(own);
        ASSERT_EQ(before.count(name()), 1u);
        bad_permits();
        expect_unchanged(before, snapshot(own));
        s.release();
    }
    {
        SCOPED_TRACE("a count the server lost");
        own.cmd({"DEL", name()});
        const auto before = snapshot(own);
        ASSERT_EQ(before.count(name()), 0u);
        bad_permits();
        expect_unchanged(before, snapshot(own));
        EXPECT_EQ(own.integer({"EXISTS", name()}), 0) << "a refused call set the lost count back";
    }
    {
        SCOPED_TRACE("at the overflow");
        for (const char* at : {"9223372036854775807", "-9223372036854775808"}) {
            own.cmd({"SET", name(), at, "PX", "600000"});
            const auto before = snapshot(own);
            const bool top = at[0] != '-';
            if (top) {
                // A count above the capacity takes no release (told as not fitting, below):
                // nothing is written, so nothing overflows.
                EXPECT_NO_THROW(s.release());
            }
            try {
                (void)s.add_permits(top ? 1 : -1);
                ADD_FAILURE() << "an overflow at " << at << " was accepted";
            } catch (const rlock::error& e) {
                EXPECT_EQ(e.value(), rlock::errc::server_error) << e.what();
                EXPECT_EQ(e.lock(), name()) << e.what();
                EXPECT_EQ(e.server(), c.server()) << e.what();
            }
            expect_unchanged(before, snapshot(own));
        }
    }

    // A key of another kind, with a TTL: every member, blocking and asynchronous.
    for (const auto& setup : std::vector<std::vector<std::string>>{
             {"HSET", name(), "f", "1"}, {"RPUSH", name(), "x"}, {"SET", name(), "abc"},
             {"SET", name(), "007"}, {"SET", name(), "1.5"}, {"SET", name(), "-0"},
             {"SET", name(), "9223372036854775808"}, {"SET", name(), "99999999999999999999"}}) {
        own.cmd({"DEL", name()});
        (void)rlock_test::command_vec(rlock_test::raw_connection(own.port()).get(), setup);
        own.cmd({"PEXPIRE", name(), "600000"});
        SCOPED_TRACE(setup[0] + " " + setup.back());
        const auto foreign = snapshot(own);
        auto expect_wrong_type = [&](auto call, const char* what) {
            expect_refused(rlock::errc::wrong_type, name(), "", what, call);
        };
        expect_wrong_type([&] { (void)s.try_acquire(); }, "try_acquire");
        expect_wrong_type([&] { (void)s.try_acquire(2); }, "try_acquire(2)");
        expect_wrong_type([&] { (void)s.try_acquire_for(50ms); }, "try_acquire_for");
        expect_wrong_type([&] { (void)s.async_try_acquire_for(50ms, rlock::use_future).get(); },
                          "async_try_acquire_for");
        expect_wrong_type([&] { s.release(); }, "release");
        expect_wrong_type([&] { s.release(2); }, "release(2)");
        expect_wrong_type([&] { (void)s.add_permits(1); }, "add_permits");
        expect_wrong_type([&] { (void)s.drain_permits(); }, "drain_permits");
        expect_wrong_type([&] { (void)s.available_permits(); }, "available_permits");
        expect_wrong_type([&] { (void)s.try_set_permits(1); }, "try_set_permits");
        expect_unchanged(foreign, snapshot(own));
    }
    own.cmd({"DEL", name()});

    // A user who may use the key but not publish on its channel: setting a lost count back
    // publishes the permits it frees, so the acquire and the release that would do it are
    // refused before they write (Redis 7 asks the ACL; Redis 6 has no such question).
    rlock_test::set_acl_user(own, {"counter", "on", ">pw", "~*", "resetchannels", "+@all"});
    rlock::client_options ao = own.options();
    ao.username = "counter";
    ao.password = "pw";
    ao.on_lock_lost = lost.handler();
    rlock::client limited(ao);
    rlock::semaphore ls(limited, name(), two);
    const std::string version = own.text({"INFO", "server"});
    if (version.find("redis_version:6.") == std::string::npos) {
        const auto before = snapshot(own);
        ASSERT_EQ(before.count(name()), 0u);
        auto expect_no_channel = [&](auto call, const char* what) {
            expect_refused(rlock::errc::auth_failed, name(), limited.server(), what, call);
        };
        expect_no_channel([&] { (void)ls.try_acquire(); }, "try_acquire on a lost count");
        expect_no_channel([&] { ls.release(); }, "release on a lost count");
        expect_unchanged(before, snapshot(own));
        EXPECT_EQ(own.integer({"EXISTS", name()}), 0) << "a refused call set the lost count back";
    }
    EXPECT_EQ(lost.calls.load(), 1) << lost.last_message;  // the release at the overflow, alone
    EXPECT_NE(lost.last_message.find("1 of the 1 permits released did not fit"), std::string::npos)
        << lost.last_message;
    EXPECT_EQ(own.text({"GET", name() + ":other"}), "4");
}

// Found by an outside probe: an acquire that starts while the server is down failed at once with
// connection_failed, though nothing was sent (not ambiguous: documented to be ridden out to the
// deadline, as every other kind's is). With no other thread of the client waiting for the
// semaphore, its first try ran outside the wait, which rides such failures; with the local
// hand-off off it was ridden out. (The server is restarted from this thread: a server started
// by a thread that then exits is killed with it.)
TEST(semaphore, an_acquire_that_starts_while_the_server_is_down_rides_out_its_restart) {
    redis_server srv({"--appendonly", "yes", "--appendfsync", "always"});
    rlock::client c(srv.options());
    rlock::semaphore s(c, rlock_test::test_lock_name());
    ASSERT_TRUE(s.try_set_permits(2));
    srv.kill_now();
    std::thread waiter([&] {
        try {
            EXPECT_TRUE(s.try_acquire_for(8s));
        } catch (const rlock::error& e) {
            ADD_FAILURE() << "try_acquire_for threw: " << e.what();
        }
    });
    std::this_thread::sleep_for(1500ms);
    srv.restart();
    waiter.join();
    EXPECT_EQ(srv.text({"GET", rlock_test::test_lock_name()}), "1");
}

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

// The same under faults: every connection of the waiters' clients (pooled and subscriber)
// killed again and again while the count goes down, and the server stopped (SIGSTOP) for a
// while before the first count down. No waiter passes before the last count down has started; all
// pass after it, woken again by the zero message over their new subscriber connection.
TEST(count_down_latch, no_waiter_passes_early_while_its_connections_are_killed) {
    redis_server own;
    // The waiters log in as "waiter", whose connections the kills aim at; the counters as
    // "counter", whose connections they spare (a count down whose connection broke is not
    // repeated: it may have run, so it would throw). A connection being opened is the default
    // user's until its AUTH, so the kills never cut a login short.
    auto as_user = [&](const std::string& user) {
        rlock_test::set_acl_user(own, {user, "on", ">pw", "~*", "&*", "+@all"});
        rlock::client_options o = own.options();
        o.username = user;
        o.password = "pw";
        return o;
    };
    const rlock::client_options as_waiter = as_user("waiter"), as_counter = as_user("counter");
    rlock::client a(as_waiter), b(as_waiter);
    rlock::count_down_latch la(a, name()), lb(b, name());
    ASSERT_TRUE(la.try_set_count(3));
    std::atomic<bool> last_started{false};
    std::atomic<int> early{0}, passed{0}, errors{0};
    std::vector<std::thread> waiters;
    for (int w = 0; w < 4; ++w) {
        waiters.emplace_back([&, w] {
            rlock::count_down_latch& l = w % 2 ? la : lb;
            try {
                if (l.wait_for(60s)) {
                    if (!last_started.load()) ++early;
                    ++passed;
                }
            } catch (const rlock::error& e) {
                ADD_FAILURE() << "a waiter failed: " << e.what();
                ++errors;
            }
        });
    }
    std::atomic<bool> stop{false};
    std::thread killer([&] {
        for (int i = 0; i < 1000 && !stop.load(); ++i) {
            own.cmd({"CLIENT", "KILL", "USER", "waiter"});
            std::this_thread::sleep_for(10ms);
        }
    });
    // Each count down from a client of its own, as another process's would be.
    auto count_down_once = [&](bool stall) {
        rlock::client counter(as_counter);
        rlock::count_down_latch l(counter, name());
        if (stall) {
            own.pause();
            std::this_thread::sleep_for(300ms);
            own.resume();
        }
        return l.count_down();
    };
    EXPECT_EQ(count_down_once(true), 2);
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(count_down_once(false), 1);
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(passed.load(), 0) << "a waiter passed at count 1";
    last_started = true;
    EXPECT_EQ(count_down_once(false), 0);
    for (auto& t : waiters) t.join();
    stop = true;
    killer.join();
    EXPECT_EQ(errors.load(), 0) << "a waiter failed instead of riding out the killed connections";
    EXPECT_EQ(passed.load(), 4);
    EXPECT_EQ(early.load(), 0) << "a waiter passed before the last count down";
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

// rlock::permit_expirable_semaphore
namespace {

std::string permit_timeouts_of(const std::string& n) { return "{" + n + "}:timeout"; }

/// The bytes a permit id (hex) stands for, as Redisson stores them.
std::string id_bytes(const std::string& hex) {
    std::string out;
    EXPECT_TRUE(rlock::detail::permit_id_bytes(hex, out)) << hex;
    return out;
}

rlock::client_options quick_watchdog(const redis_server& s, rlock_test::lost_log* lost = nullptr) {
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 600ms;
    if (lost) o.on_lock_lost = lost->hold_handler();
    return o;
}

TEST(permit_expirable_semaphore, permits_bound_the_holders_across_clients) {
    rlock::client a(server().options()), b(server().options());
    rlock::permit_expirable_semaphore sa(a, name()), sb(b, name());
    ASSERT_TRUE(sa.try_set_permits(3));
    std::atomic<int> inside{0}, most{0}, rounds{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < 8; ++w) {
        workers.emplace_back([&, w] {
            rlock::permit_expirable_semaphore& s = w % 2 ? sa : sb;
            for (int i = 0; i < 10; ++i) {
                rlock::permit p = w % 3 ? s.acquire() : s.acquire(30s);
                const int now = ++inside;
                int seen = most.load();
                while (now > seen && !most.compare_exchange_weak(seen, now)) {
                }
                std::this_thread::sleep_for(2ms);
                --inside;
                ++rounds;
            }  // released by the handle
        });
    }
    for (auto& t : workers) t.join();
    EXPECT_EQ(rounds.load(), 8 * 10);
    EXPECT_LE(most.load(), 3) << "more holders at once than permits";
    EXPECT_GE(most.load(), 2) << "the permits were never used in parallel: the check proves little";
    EXPECT_EQ(sa.available_permits(), 3);
    EXPECT_EQ(sa.acquired_permits(), 0);
    EXPECT_EQ(server().integer({"ZCARD", permit_timeouts_of(name())}), 0);
}

TEST(permit_expirable_semaphore, the_layout_and_messages_are_redissons) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(3));
    const long long server_ms =
        std::stoll(std::string(rlock::detail::reply_text(server().cmd({"TIME"})->element[0]))) * 1000;
    rlock::permit p = s.acquire(60s, 2);
    ASSERT_TRUE(p);
    ASSERT_EQ(p.ids().size(), 2u);
    for (const std::string& id : p.ids()) {
        EXPECT_EQ(id.size(), 32u) << "Redisson's ids are 16 bytes in hex";
        const std::string score = server().text({"ZSCORE", permit_timeouts_of(name()), id_bytes(id)});
        ASSERT_FALSE(score.empty()) << "the id's bytes are not a member of " << permit_timeouts_of(name());
        EXPECT_NEAR(std::stod(score), static_cast<double>(server_ms + 60000), 5000.0)
            << "the score is when the lease ends, in Unix ms";
    }
    EXPECT_EQ(server().text({"GET", name()}), "1");
    {
        rlock_test::raw_subscriber listener(server().port(), channel_of(name()));
        p.release();
        EXPECT_EQ(listener.next(), "2") << "a release publishes how many permits it freed";
    }
    EXPECT_FALSE(p);
    EXPECT_EQ(server().text({"GET", name()}), "3");
    EXPECT_EQ(server().integer({"EXISTS", permit_timeouts_of(name())}), 0);

    // A name with '{' keeps its own hash tag, as Redisson's suffixName does.
    rlock::permit_expirable_semaphore tagged(c, "{" + name() + "}x");
    ASSERT_TRUE(tagged.try_set_permits(1));
    rlock::permit q = tagged.try_acquire();
    ASSERT_TRUE(q);
    EXPECT_EQ(server().integer({"ZCARD", "{" + name() + "}x:timeout"}), 1);
}

// A permit Redisson took without a lease is scored 922337203685477: taken for good. rlock
// counts it taken, never reclaims it, and releases it by its id.
TEST(permit_expirable_semaphore, redissons_permits_are_released_by_id_and_its_permanent_ones_never_end) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    const std::string id = "00112233445566778899aabbccddeeff";
    server().cmd({"SET", name(), "0"});
    server().cmd({"ZADD", permit_timeouts_of(name()), "922337203685477", id_bytes(id)});
    EXPECT_FALSE(s.try_acquire());
    EXPECT_EQ(s.acquired_permits(), 1);
    EXPECT_EQ(s.available_permits(), 0);
    EXPECT_THROW(s.release("00112233445566778899aabbccddee00"), rlock::error);
    s.release(id);
    EXPECT_EQ(s.available_permits(), 1);
    EXPECT_FALSE(s.try_release(id)) << "released twice";
}

// Redisson #2045 for plain semaphores: a holder's machine dies and its permits never come
// back. A leased permit of a holder that went away comes back when the lease ends, and a
// waiter takes it then, with no message to wake it.
TEST(permit_expirable_semaphore, a_gone_holders_leased_permit_comes_back_when_its_lease_ends_and_wakes_a_waiter) {
    rlock::client b(server().options());
    rlock::permit_expirable_semaphore sb(b, name());
    {
        rlock::client a(server().options());
        rlock::permit_expirable_semaphore sa(a, name());
        ASSERT_TRUE(sa.try_set_permits(1));
        rlock::permit p = sa.acquire(700ms);
        (void)p.detach();  // as a holder that died: nothing releases it
    }
    const long long scripts_before = scripts_run(server());
    const auto start = std::chrono::steady_clock::now();
    rlock::permit got = sb.try_acquire_for(30s);
    const auto waited = std::chrono::steady_clock::now() - start;
    ASSERT_TRUE(got) << "the ended lease was never reclaimed";
    EXPECT_LT(rlock_test::millis(waited), 10000) << "the waiter slept past the lease's end (no message comes for it)";
    EXPECT_LE(scripts_run(server()) - scripts_before, 6) << "the waiter polled";
}

// A watched permit is renewed for as long as its client lives (three watchdog periods here
// and still held), and comes back within lock_watchdog_timeout once its client is gone.
TEST(permit_expirable_semaphore, watched_permits_are_renewed_and_come_back_when_their_client_dies) {
    rlock::client b(server().options());
    rlock::permit_expirable_semaphore sb(b, name());
    std::vector<std::string> ids;
    {
        rlock::client a(quick_watchdog(server()));
        rlock::permit_expirable_semaphore sa(a, name());
        ASSERT_TRUE(sa.try_set_permits(1));
        rlock::permit p = sa.acquire();
        std::this_thread::sleep_for(1800ms);
        EXPECT_FALSE(p.lost());
        EXPECT_EQ(sb.acquired_permits(), 1) << "not renewed: the lease ran out";
        EXPECT_FALSE(sb.try_acquire());
        ids = p.detach();  // the client dies with it taken
    }
    rlock::permit got = sb.try_acquire_for(30s);
    ASSERT_TRUE(got) << "a dead client's watched permit never came back";
    EXPECT_FALSE(sb.try_release(ids.front())) << "the dead client's permit is still taken";
}

// Another client releases a watched permit by its id: the watchdog finds it gone and tells the
// owner, once, with the permit's hold id; lost() says so; the handle's release frees nothing
// twice.
TEST(permit_expirable_semaphore, a_permit_found_gone_is_told_to_its_owner) {
    rlock_test::lost_log lost;
    rlock::client a(quick_watchdog(server(), &lost)), b(server().options());
    rlock::permit_expirable_semaphore sa(a, name()), sb(b, name());
    ASSERT_TRUE(sa.try_set_permits(2));
    rlock::permit p = sa.acquire();
    sb.release(p.id());
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; })) << "the loss was never told";
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(lost.last_hold_id.load(), p.hold_id());
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
    {
        std::lock_guard<std::mutex> g(lost.mu);
        EXPECT_EQ(lost.last_lock, name());
        EXPECT_NE(lost.last_message.find("permit gone"), std::string::npos) << lost.last_message;
    }
    EXPECT_TRUE(p.lost());
    p.release();
    EXPECT_EQ(lost.calls.load(), 1) << "told twice";
    EXPECT_EQ(sa.available_permits(), 2) << "a permit was freed twice";

    // Found gone at release (a leased permit, released by id meanwhile): told at release.
    rlock::permit q = sa.acquire(60s);
    sb.release(q.id());
    q.release();
    EXPECT_EQ(lost.calls.load(), 2);
    EXPECT_TRUE(q.lost());
    EXPECT_EQ(sa.available_permits(), 2);
}

// Redisson #6343: releasing several ids, one of them unknown, released the others.
TEST(permit_expirable_semaphore, releasing_several_ids_is_all_or_nothing) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(3));
    rlock::permit p = s.acquire(60s, 2);
    std::vector<std::string> ids = p.detach();
    const auto before = snapshot(server());
    try {
        s.release({ids[0], "ffffffffffffffffffffffffffffffff", ids[1]});
        ADD_FAILURE() << "an unknown id was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::not_owner) << e.what();
        EXPECT_NE(std::string(e.what()).find("ffffffffffffffffffffffffffffffff"), std::string::npos)
            << "the error does not name the unknown id: " << e.what();
    }
    expect_unchanged(before, snapshot(server()));
    s.release(ids);
    EXPECT_EQ(s.available_permits(), 3);
    EXPECT_EQ(s.acquired_permits(), 0);
}

// Redisson #659: availablePermits counted permits whose lease had ended as taken. Counting
// them free writes nothing.
TEST(permit_expirable_semaphore, available_permits_counts_ended_leases_as_free) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    rlock::permit p = s.acquire(300ms);
    (void)p.detach();
    EXPECT_EQ(s.available_permits(), 1);
    std::this_thread::sleep_for(600ms);
    const auto before = snapshot(server());
    EXPECT_EQ(s.available_permits(), 2);
    EXPECT_EQ(s.acquired_permits(), 0);
    EXPECT_EQ(s.permits(), 2);
    expect_unchanged(before, snapshot(server()));
}

// Redisson #6664, for permits with ids.
TEST(permit_expirable_semaphore, a_waiter_for_several_permits_is_served_once_they_are_free) {
    rlock::client a(server().options()), b(server().options());
    rlock::permit_expirable_semaphore waiter_side(a, name()), other(b, name());
    ASSERT_TRUE(other.try_set_permits(3));
    std::vector<rlock::permit> held;
    for (int i = 0; i < 3; ++i) held.push_back(other.acquire());
    auto got = std::async(std::launch::async, [&] { return waiter_side.try_acquire_for(60s, 3); });
    for (rlock::permit& p : held) {
        std::this_thread::sleep_for(100ms);
        p.release();
    }
    ASSERT_EQ(got.wait_for(20s), std::future_status::ready)
        << "still waiting 20 s after its 3 permits were free (its deadline is 60 s)";
    rlock::permit three = got.get();
    EXPECT_TRUE(three);
    EXPECT_EQ(three.ids().size(), 3u);
    EXPECT_EQ(other.available_permits(), 0);
}

// An acquire sent twice with the same ids (its first reply lost with its connection) takes
// its permits once; the repeat says they were taken already ({2, ...}) with their lease's
// time left, from which the client counts the lease.
TEST(permit_expirable_semaphore, an_acquire_repeated_after_a_lost_reply_takes_its_permits_once) {
    server().cmd({"SET", name(), "3"});
    const std::string body(rlock::detail::permit_scripts::acquire().body());
    const std::string a = id_bytes("0123456789abcdef0123456789abcdef"),
                      b = id_bytes("fedcba9876543210fedcba9876543210");
    for (int i = 0; i < 2; ++i) {
        rlock::detail::reply_ptr r = server().cmd(
            {"EVAL", body, "2", name(), permit_timeouts_of(name()), "2", "60000", channel_of(name()), a, b});
        ASSERT_TRUE(r && r->type == REDIS_REPLY_ARRAY) << rlock::detail::reply_text(r.get());
        EXPECT_EQ(r->element[0]->integer, i == 0 ? 1 : 2);
        if (i == 1) {
            EXPECT_GT(r->element[1]->integer, 50000) << "the lease left of the permits taken first";
            EXPECT_LE(r->element[1]->integer, 60000);
        }
    }
    EXPECT_EQ(server().text({"GET", name()}), "1") << "the repeat took two more permits";
    EXPECT_EQ(server().integer({"ZCARD", permit_timeouts_of(name())}), 2);
}

TEST(permit_expirable_semaphore, bad_input_and_foreign_keys_are_refused_with_redis_unchanged) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    rlock::permit held = s.acquire(60s);
    const auto before = snapshot(server());
    auto expect_invalid = [&](auto call, const char* what) {
        expect_refused(rlock::errc::invalid_argument, name(), c.server(), what, call);
    };
    expect_invalid([&] { (void)s.acquire(0); }, "acquire(0)");
    expect_invalid([&] { (void)s.try_acquire(-1); }, "try_acquire(-1)");
    expect_invalid([&] { (void)s.try_acquire(1001); }, "try_acquire(1001)");
    expect_invalid([&] { (void)s.try_acquire_for(10ms, 0ms); }, "try_acquire_for(10ms, lease 0)");
    expect_invalid([&] { (void)s.acquire(-5s); }, "acquire(lease -5s)");
    expect_invalid([&] { s.release("xyz"); }, "release(\"xyz\")");
    expect_invalid([&] { s.release("ABCD"); }, "release(uppercase)");
    expect_invalid([&] { s.release(std::vector<std::string>{}); }, "release({})");
    expect_invalid([&] { s.release({held.id(), held.id()}); }, "release(a repeated id)");
    expect_invalid([&] { (void)s.update_lease_time(held.id(), 0s); }, "update_lease_time(0s)");
    expect_invalid([&] { (void)s.try_set_permits(-1); }, "try_set_permits(-1)");
    expect_unchanged(before, snapshot(server()));
    EXPECT_THROW(rlock::permit_expirable_semaphore(c, ""), rlock::error);
    EXPECT_THROW((void)rlock::permit().id(), rlock::error);
    rlock::permit empty;
    EXPECT_THROW(empty.release(), rlock::error);

    // At the overflow every script that would write refuses at INCRBY, its first write, and
    // leaves every key as it was: an acquire that would put an ended lease back, a release by
    // id and a handle's release.
    {
        rlock::permit_expirable_semaphore full(c, name() + "-full");
        const std::string key = full.name(), set = permit_timeouts_of(full.name());
        ASSERT_TRUE(full.try_set_permits(1));
        rlock::permit mine = full.acquire(60s);
        server().cmd({"SET", key, "9223372036854775807"});
        server().cmd({"ZADD", set, "1", id_bytes("00000000000000000000000000000001")});  // ended
        const auto at_max = snapshot(server());
        EXPECT_THROW((void)full.try_acquire(), rlock::error);
        EXPECT_THROW(full.release(mine.id()), rlock::error);
        mine.release();  // told through on_lock_lost, never thrown
        expect_unchanged(at_max, snapshot(server()));
        server().cmd({"DEL", key, set});
    }

    // A count key of another kind, or a timeout key that is not a sorted set.
    rlock::permit_expirable_semaphore other(c, name() + "-foreign");
    const std::string key = other.name(), set = permit_timeouts_of(other.name());
    for (const auto& setup : std::vector<std::vector<std::string>>{
             {"HSET", key, "f", "1"}, {"SET", key, "abc"}, {"SET", key, "1.5"},
             {"SET", set, "x"}, {"HSET", set, "f", "1"}}) {
        server().cmd({"DEL", key, set});
        server().cmd({"SET", key, "5"});
        (void)rlock_test::command_vec(rlock_test::raw_connection(server().port()).get(),
                                      {"DEL", setup[1]});
        (void)rlock_test::command_vec(rlock_test::raw_connection(server().port()).get(), setup);
        SCOPED_TRACE(setup[0] + " " + setup[1]);
        const auto foreign = snapshot(server());
        auto expect_wrong_type = [&](auto call, const char* what) {
            expect_refused(rlock::errc::wrong_type, key, "", what, call);
        };
        expect_wrong_type([&] { (void)other.try_acquire(); }, "try_acquire");
        expect_wrong_type([&] { (void)other.try_release(held.id()); }, "try_release");
        expect_wrong_type([&] { (void)other.available_permits(); }, "available_permits");
        expect_wrong_type([&] { (void)other.update_lease_time(held.id(), 1s); }, "update_lease_time");
        expect_unchanged(foreign, snapshot(server()));
    }
}

// A leased permit released after its lease ended: lost() said so before release and still
// says so after; nobody is told (a lease that ends is how a leased permit ends), and nothing
// is freed twice.
TEST(permit_expirable_semaphore, a_leased_permit_ends_with_its_lease_and_stays_lost) {
    rlock_test::lost_log lost;
    rlock::client c(quick_watchdog(server(), &lost));
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(1));
    rlock::permit p = s.acquire(200ms);
    EXPECT_FALSE(p.lost());
    std::this_thread::sleep_for(400ms);
    EXPECT_TRUE(p.lost());
    p.release();
    EXPECT_TRUE(p.lost()) << "release took back the verdict";
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_EQ(s.available_permits(), 1);
}

// Redisson #2444: the timeout set outlived a semaphore whose key expired. An acquire gives
// the set the semaphore's TTL, so the two go together.
TEST(permit_expirable_semaphore, the_timeout_set_expires_with_the_semaphore) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(2));
    server().cmd({"PEXPIRE", name(), "600"});
    rlock::permit p = s.acquire(60s);
    const long long ttl = server().integer({"PTTL", permit_timeouts_of(name())});
    EXPECT_GT(ttl, 0) << "the timeout set has no TTL while the semaphore has one";
    EXPECT_LE(ttl, 600);
    (void)p.detach();
    ASSERT_TRUE(eventually([&] { return server().integer({"EXISTS", name()}) == 0; }));
    EXPECT_TRUE(eventually([&] { return server().integer({"EXISTS", permit_timeouts_of(name())}) == 0; }, 1000ms))
        << "the timeout set outlived the semaphore";
}

TEST(permit_expirable_semaphore, update_lease_time_moves_a_permits_end) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(1));
    rlock::permit p = s.acquire(400ms);
    // A handle judges lost() by the lease it took: a lease changed behind it is refused.
    EXPECT_THROW((void)s.update_lease_time(p.id(), 100ms), rlock::error);
    // An id that is only the start of the handle's is another permit, not taken: false (it
    // was refused as the handle's).
    EXPECT_FALSE(s.update_lease_time(p.id().substr(0, 2), 1s));
    EXPECT_FALSE(s.update_lease_time(p.id().substr(0, 30), 1s));
    const std::vector<std::string> ids = p.detach();
    EXPECT_TRUE(s.update_lease_time(ids.front(), 60s));
    std::this_thread::sleep_for(700ms);
    EXPECT_FALSE(s.try_acquire()) << "the permit ended with its first lease";
    EXPECT_TRUE(s.update_lease_time(ids.front(), 100ms));
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(s.try_acquire()) << "the shortened lease did not end";
    EXPECT_FALSE(s.update_lease_time("0123456789abcdef0123456789abcdef", 1s));
}

TEST(permit_expirable_semaphore, a_waiter_ends_with_an_error_when_its_client_goes) {
    auto doomed = std::make_unique<rlock::client>(server().options());
    rlock::permit_expirable_semaphore orphan(*doomed, name());
    EXPECT_EQ(ending_when_the_client_goes(doomed, [&] { (void)orphan.try_acquire_for(60s); }),
              rlock::errc::connection_failed);
}

// A semaphore object that outlives its client takes no permits: nothing would renew or release
// them. Before, its blocking acquires went on taking permits, left for their whole lease.
TEST(permit_expirable_semaphore, a_destroyed_clients_semaphore_takes_nothing) {
    rlock::client setter(server().options());
    rlock::permit_expirable_semaphore counts(setter, name());
    ASSERT_TRUE(counts.try_set_permits(3));
    auto doomed = std::make_unique<rlock::client>(server().options());
    rlock::permit_expirable_semaphore orphan(*doomed, name());
    doomed.reset();
    for (int form = 0; form < 3; ++form) {
        SCOPED_TRACE(form);
        try {
            rlock::permit p = form == 0   ? orphan.acquire()
                              : form == 1 ? orphan.try_acquire()
                                          : orphan.try_acquire_for(1s);
            ADD_FAILURE() << "took a permit through a destroyed client: " << p.id();
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), rlock::errc::connection_failed) << e.what();
        }
    }
    EXPECT_EQ(counts.available_permits(), 3);
}

// Found by a probe: a permit that outlived its client was not released by release() (nothing
// sent: the permit kept others out for its whole watched lease, 30 s) and told the destroyed
// client's on_lock_lost. It is released as a hold's unlock after its client is: sent, and the
// permits free at once; nothing is told.
TEST(permit_expirable_semaphore, a_permit_released_after_its_client_frees_its_permits) {
    rlock::client setter(server().options());
    rlock::permit_expirable_semaphore counts(setter, name());
    ASSERT_TRUE(counts.try_set_permits(1));
    rlock_test::lost_log lost;
    rlock::client_options o = server().options();
    o.on_lock_lost = lost.hold_handler();
    auto doomed = std::make_unique<rlock::client>(o);
    rlock::permit_expirable_semaphore sem(*doomed, name());
    rlock::permit p = sem.acquire();
    EXPECT_EQ(counts.available_permits(), 0);
    doomed.reset();
    p.release();
    EXPECT_EQ(counts.available_permits(), 1) << "the permit was not released";
    EXPECT_FALSE(p.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
}

// A permit acquire that rides out a restart longer than the lease it asks for holds a permit
// whose lease runs from the try that took it: not lost, and renewed. The tries the restart
// refused sent nothing. Before, its lease was counted from the first of them, so the permit came
// back lost and was never renewed. (It starts once the server is down: a try that met a
// connection just as the server died may have run there, and then keeps the earlier start.)
TEST(permit_expirable_semaphore, an_acquire_that_rides_out_a_restart_longer_than_its_lease_holds_a_live_permit) {
    redis_server own({"--appendonly", "yes", "--appendfsync", "always"});  // the count survives
    rlock::client_options o = own.options();
    o.lock_watchdog_timeout = 1500ms;
    rlock_test::lost_log lost;
    o.on_lock_lost = lost.hold_handler();
    rlock::client a(o), b(o);
    rlock::permit_expirable_semaphore holder(a, name()), waiter(b, name());
    ASSERT_TRUE(holder.try_set_permits(1));
    rlock::permit leased = holder.acquire(1000ms, 1);  // its lease ends during the outage
    own.kill_now();
    std::this_thread::sleep_for(100ms);
    std::future<rlock::permit> got = std::async(std::launch::async, [&] { return waiter.try_acquire_for(20s); });
    std::this_thread::sleep_for(2500ms);
    own.restart();
    ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
    rlock::permit p = got.get();
    ASSERT_TRUE(p);
    EXPECT_FALSE(p.lost()) << "a permit just taken is lost by the client's clock";
    std::this_thread::sleep_for(2s);  // past its first lease: renewed
    EXPECT_FALSE(p.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_NO_THROW(p.release());
}

// The same through a pause longer than the lease (SIGSTOP: no connection breaks, every try
// before the resume times out), blocking and asynchronous. The tries the pause timed out never
// took the permit, so its lease runs from the try that did. Before, the lease was counted from
// the first try: the permit came back lost() already, its owner was told a false loss, and
// nothing renewed it, so it kept other clients out for a whole lease.
TEST(permit_expirable_semaphore, an_acquire_that_rides_out_a_pause_longer_than_its_lease_holds_a_live_permit) {
    redis_server own;
    rlock::client_options o = own.options();
    o.lock_watchdog_timeout = 1500ms;
    o.command_timeout = 300ms;
    rlock_test::lost_log lost;
    o.on_lock_lost = lost.hold_handler();
    rlock::client c(o);
    rlock::permit_expirable_semaphore sem(c, name());
    ASSERT_TRUE(sem.try_set_permits(2));
    own.pause();
    std::future<rlock::permit> blocking =
        std::async(std::launch::async, [&] { return sem.try_acquire_for(20s); });
    std::future<rlock::permit> async = sem.async_try_acquire_for(20s, 1, rlock::use_future);
    std::this_thread::sleep_for(2500ms);
    own.resume();
    ASSERT_EQ(blocking.wait_for(10s), std::future_status::ready);
    ASSERT_EQ(async.wait_for(10s), std::future_status::ready);
    rlock::permit a = blocking.get(), b = async.get();
    ASSERT_TRUE(a);
    ASSERT_TRUE(b);
    EXPECT_FALSE(a.lost()) << "a permit just taken is lost by the client's clock";
    EXPECT_FALSE(b.lost()) << "a permit just taken is lost by the client's clock";
    std::this_thread::sleep_for(2s);  // past its first lease: renewed
    EXPECT_FALSE(a.lost());
    EXPECT_FALSE(b.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_EQ(own.integer({"ZCARD", permit_timeouts_of(name())}), 2);
    EXPECT_NO_THROW(a.release());
    EXPECT_NO_THROW(b.release());
    EXPECT_EQ(own.text({"GET", name()}), "2");
}

// Found by a probe: a permit acquire the paused server had not answered, its client destroyed
// (blocking and asynchronous), left a permit taken by nobody once the server resumed, for its
// whole lease: its release was left to the watchdog, which a client being destroyed sends
// once, to a server that does not answer. The release is now written after the acquire on its
// own connection as the try times out, and the server runs both in order.
TEST(permit_expirable_semaphore, an_acquire_unanswered_when_its_client_is_destroyed_leaves_no_permit_taken) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 500ms;
    for (const bool blocking : {true, false}) {
        const std::string n = name(blocking ? "-blocking" : "-async");
        auto c = std::make_unique<rlock::client>(o);
        rlock::permit_expirable_semaphore sem(*c, n);
        ASSERT_TRUE(sem.try_set_permits(1));
        own.pause();
        std::future<bool> ended = std::async(std::launch::async, [&] {
            try {
                return blocking ? static_cast<bool>(sem.try_acquire_for(10s))
                                : static_cast<bool>(sem.async_try_acquire_for(10s, 1, rlock::use_future).get());
            } catch (const rlock::error&) {
                return false;
            }
        });
        std::this_thread::sleep_for(200ms);  // the try sent, unanswered
        c.reset();
        ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
        EXPECT_FALSE(ended.get()) << "a permit came through a destroyed client";
        own.resume();
        std::this_thread::sleep_for(300ms);  // the server runs what it was sent
        EXPECT_EQ(own.integer({"ZCARD", permit_timeouts_of(n)}), 0)
            << (blocking ? "blocking" : "asynchronous") << ": a permit was left taken by nobody";
        EXPECT_EQ(own.text({"GET", n}), "1");
    }
}

// A wait whose deadline comes while the server is paused ends with the outage's error one
// command_timeout past its deadline at most (its last try), latch and permit-expirable
// semaphore, blocking and asynchronous, as a lock's does. Before, each read or acquire attempt
// was repeated at once on a new connection (a second command_timeout) and a permit's undo
// waited for the paused server too: 2.0 s and 2.5 s for a 1 s wait with 500 ms timeouts.
TEST(permit_expirable_semaphore, a_wait_whose_deadline_comes_while_the_server_is_paused_ends_one_timeout_past_it) {
    redis_server own;
    rlock::client_options o = own.options();
    o.command_timeout = 500ms;
    // A client each for the asynchronous waits: one client's asynchronous attempts take turns
    // on its engine thread, each blocking it up to a command_timeout.
    rlock::client c(o), c_latch(o), c_permit(o);
    rlock::count_down_latch latch(c, name("-latch")), async_latch(c_latch, name("-latch"));
    ASSERT_TRUE(latch.try_set_count(1));
    rlock::permit_expirable_semaphore sem(c, name()), async_sem(c_permit, name());
    ASSERT_TRUE(sem.try_set_permits(0));
    using ms = std::chrono::milliseconds;
    // How long `wait` took, and whether it ended with a connection error.
    auto ended = [](auto wait) {
        return std::async(std::launch::async, [wait]() -> std::pair<ms, std::string> {
            const auto start = rlock_test::steady::now();
            std::string how = "no error";
            try {
                (void)wait();
            } catch (const rlock::error& e) {
                how = rlock_test::connection_error(e.value()) ? "connection error" : e.what();
            }
            return {std::chrono::duration_cast<ms>(rlock_test::steady::now() - start), how};
        });
    };
    auto latch_blocking = ended([&] { return latch.wait_for(1s); });
    auto latch_async = ended([&] { return async_latch.async_wait_for(1s, rlock::use_future).get(); });
    auto permit_blocking = ended([&] { return static_cast<bool>(sem.try_acquire_for(1s)); });
    auto permit_async =
        ended([&] { return static_cast<bool>(async_sem.async_try_acquire_for(1s, 1, rlock::use_future).get()); });
    std::this_thread::sleep_for(300ms);  // waiting for a message: the deadline comes in the pause
    own.pause();
    for (auto* f : {&latch_blocking, &latch_async, &permit_blocking, &permit_async}) {
        ASSERT_EQ(f->wait_for(10s), std::future_status::ready);
        const auto [took, how] = f->get();
        EXPECT_EQ(how, "connection error");
        EXPECT_LT(took.count(), 1000 + 500 + 350) << "past its deadline by more than one command_timeout";
    }
    own.resume();
    // The permits the pause kept unanswered (if any ran) are released once it answers.
    EXPECT_TRUE(eventually([&] { return own.integer({"ZCARD", permit_timeouts_of(name())}) == 0; }, 5000ms));
    EXPECT_EQ(own.text({"GET", name()}), "0");
}

// A handle that holds nothing any more still says which semaphore it came from, and where.
TEST(permit_expirable_semaphore, a_released_handles_errors_name_the_semaphore_and_the_server) {
    rlock::client c(server().options());
    rlock::permit_expirable_semaphore ps(c, name());
    ASSERT_TRUE(ps.try_set_permits(1));
    rlock::permit p = ps.acquire();
    p.release();
    for (int call = 0; call < 2; ++call) {
        try {
            if (call == 0) p.release();
            if (call == 1) (void)p.id();
            ADD_FAILURE() << "no error";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), rlock::errc::not_owner);
            EXPECT_EQ(e.lock(), name()) << e.what();
            EXPECT_EQ(e.server(), c.server()) << e.what();
        }
    }
}

}  // namespace
