// The asynchronous forms (async_lock, async_try_lock_for, ...; rlock::hold, rlock::owner,
// rlock::pending, rlock::use_future) on every lock kind, against a real redis-server: a hold
// that excludes and is released like a guard, waiters woken by the unlock message, deadlines
// and cancellation that leave nothing behind, handlers called once and never inside the call,
// the client destroyed with operations pending, re-entry by owner, losses told through the hold;
// red_lock over three servers and multi_lock over parts on two clients.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#if __has_include(<asio.hpp>)
#include "rlock/asio.hpp"
#if ASIO_VERSION < 102400
#include <asio/experimental/deferred.hpp>
#endif
#endif
#include "support/helpers.hpp"
#include "support/kinds.hpp"
#include "support/red_nodes.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_server;

namespace {

template <class Lock>
class async_test : public rlock_test::kind_fixture<async_test<Lock>> {
protected:
    /// The server's keys, sorted and space-separated.
    std::string keys() {
        std::istringstream in(rlock_test::keys_left(this->server()));
        std::vector<std::string> all;
        for (std::string k; in >> k;) all.push_back(k);
        std::sort(all.begin(), all.end());
        std::string out;
        for (const std::string& k : all) out += (out.empty() ? "" : " ") + k;
        return out;
    }
    /// How many channels anyone is subscribed to.
    long long channels() {
        rlock::detail::reply_ptr r = this->server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels});
        return static_cast<long long>(r->elements);
    }
};

TYPED_TEST_SUITE(async_test, rlock_test::lock_kinds, rlock_test::kind_names);

/// The rlock::errc an operation completed with (errc{} for none).
rlock::errc code_of(const std::exception_ptr& e) {
    try {
        if (e) std::rethrow_exception(e);
    } catch (const rlock::error& x) {
        return x.value();
    }
    return rlock::errc{};
}

/// What a callback was completed with, waited for by the test.
struct outcome {
    std::promise<void> called;
    std::atomic<int> calls{0};
    std::exception_ptr error;
    rlock::hold hold;
    std::thread::id thread;

    auto handler() {
        return [this](std::exception_ptr e, rlock::hold h) {
            error = std::move(e);
            hold = std::move(h);
            thread = std::this_thread::get_id();
            if (calls++ == 0) called.set_value();
        };
    }
    bool wait(std::chrono::milliseconds limit = 10s) {
        return called.get_future().wait_for(limit) == std::future_status::ready;
    }
    rlock::errc code() const { return code_of(error); }
};

TYPED_TEST(async_test, a_hold_excludes_other_clients_and_releases_when_destroyed) {
    rlock::client mine(this->options()), other(this->options());
    TypeParam a(mine, this->name()), b(other, this->name());
    {
        rlock::hold h = a.async_lock(rlock::use_future).get();
        ASSERT_TRUE(h);
        EXPECT_EQ(h.name(), this->name());
        EXPECT_FALSE(h.lost());
        EXPECT_FALSE(b.try_lock());
        rlock::hold moved = std::move(h);
        EXPECT_FALSE(h);  // NOLINT(bugprone-use-after-move): a moved-from hold is empty
        EXPECT_TRUE(moved);
        EXPECT_FALSE(b.try_lock());
    }
    EXPECT_TRUE(b.try_lock());
    b.unlock();
    EXPECT_EQ(this->keys(), "");
}

TYPED_TEST(async_test, a_hold_is_unlocked_from_another_thread) {
    rlock::client c(this->options());
    TypeParam l(c, this->name());
    rlock::hold h = l.async_lock(rlock::use_future).get();
    std::thread([h = std::move(h)]() mutable { h.unlock(); }).join();
    EXPECT_FALSE(l.is_locked());
    EXPECT_THROW(rlock::hold().unlock(), rlock::error);
}

TYPED_TEST(async_test, an_async_unlock_completes_once_the_lock_is_released) {
    rlock::client mine(this->options()), other(this->options());
    TypeParam a(mine, this->name()), b(other, this->name());
    rlock::hold h = a.async_lock(rlock::use_future).get();
    std::future<void> released = h.async_unlock(rlock::use_future);
    EXPECT_FALSE(h) << "the level passes to the operation";
    released.get();
    EXPECT_FALSE(a.is_locked());
    // The callback form, and a waiter of another client woken by it.
    rlock::hold again = a.async_lock(rlock::use_future).get();
    std::future<rlock::hold> theirs = b.async_try_lock_for(10s, rlock::use_future);
    std::promise<std::thread::id> called;
    again.async_unlock([&](std::exception_ptr e) {
        EXPECT_FALSE(e);
        called.set_value(std::this_thread::get_id());
    });
    EXPECT_NE(called.get_future().get(), std::this_thread::get_id());
    EXPECT_TRUE(theirs.get());
    EXPECT_THROW(again.async_unlock(rlock::use_future), rlock::error);
}

TYPED_TEST(async_test, no_handler_runs_inside_the_initiating_call) {
    rlock::client c(this->options());
    TypeParam l(c, this->name());
    outcome got;
    (void)l.async_try_lock(got.handler());
    ASSERT_TRUE(got.wait());
    EXPECT_NE(got.thread, std::this_thread::get_id());
    EXPECT_TRUE(got.hold);
}

TYPED_TEST(async_test, a_waiter_is_woken_by_the_unlock_message_not_the_holders_ttl) {
    rlock::client holder(this->options()), waiter(this->options());
    TypeParam mine(holder, this->name()), theirs(waiter, this->name());
    mine.lock();  // watched: a 30 s lease, renewed
    std::future<rlock::hold> f = theirs.async_try_lock_for(20s, rlock::use_future);
    ASSERT_EQ(f.wait_for(300ms), std::future_status::timeout);
    mine.unlock();
    ASSERT_EQ(f.wait_for(15s), std::future_status::ready) << "woken only by the holder's TTL";
    rlock::hold h = f.get();
    EXPECT_TRUE(h);
    EXPECT_FALSE(mine.try_lock());
}

TYPED_TEST(async_test, a_wait_that_runs_out_completes_empty_and_leaves_nothing_behind) {
    rlock::client holder(this->options()), waiter(this->options());
    TypeParam mine(holder, this->name()), theirs(waiter, this->name());
    mine.lock();
    const std::string before = this->keys();
    outcome got;
    (void)theirs.async_try_lock_for(300ms, got.handler());
    ASSERT_TRUE(got.wait());
    EXPECT_FALSE(got.error);
    EXPECT_FALSE(got.hold);
    EXPECT_TRUE(eventually([&] { return this->channels() == 0; })) << "the subscription was kept";
    EXPECT_EQ(this->keys(), before);  // fair_lock: no queue entry left
    mine.unlock();
    EXPECT_EQ(got.calls, 1);
}

TYPED_TEST(async_test, a_cancelled_acquire_completes_once_with_operation_aborted_and_leaves_nothing) {
    rlock::client holder(this->options()), waiter(this->options());
    TypeParam mine(holder, this->name()), theirs(waiter, this->name());
    mine.lock();
    const std::string before = this->keys();
    outcome got;
    rlock::pending p = theirs.async_lock(got.handler());
    ASSERT_TRUE(eventually([&] { return this->channels() == 1; }));
    p.cancel();
    ASSERT_TRUE(got.wait());
    EXPECT_EQ(got.code(), rlock::errc::operation_aborted);
    EXPECT_FALSE(got.hold);
    EXPECT_TRUE(eventually([&] { return this->channels() == 0; })) << "the subscription was kept";
    EXPECT_EQ(this->keys(), before);
    p.cancel();  // after completion: nothing
    mine.unlock();
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(got.calls, 1);
    EXPECT_TRUE(mine.try_lock()) << "the cancelled waiter took the lock after all";
    mine.unlock();
}

TYPED_TEST(async_test, destroying_the_client_completes_every_pending_acquire_before_it_returns) {
    rlock::client holder(this->options());
    TypeParam mine(holder, this->name());
    mine.lock();
    auto waiter = std::make_unique<rlock::client>(this->options());
    TypeParam theirs(*waiter, this->name());
    std::vector<std::unique_ptr<outcome>> got;
    for (int i = 0; i < 20; ++i) {
        got.push_back(std::make_unique<outcome>());
        (void)theirs.async_lock(got.back()->handler());
    }
    std::this_thread::sleep_for(100ms);
    waiter.reset();
    for (auto& o : got) {
        EXPECT_EQ(o->calls, 1);
        EXPECT_EQ(o->code(), rlock::errc::connection_failed);
    }
    EXPECT_THROW((void)theirs.async_lock(rlock::use_future), rlock::error);
    mine.unlock();
}

TYPED_TEST(async_test, a_lost_hold_is_told_through_the_hold_and_on_lock_lost) {
    rlock::client c(this->options(300ms));
    TypeParam l(c, this->name());
    rlock::hold h = l.async_lock(rlock::use_future).get();
    ASSERT_TRUE(h);
    this->server().cmd({"DEL", this->name()});
    EXPECT_TRUE(eventually([&] { return h.lost(); }));
    EXPECT_TRUE(eventually([&] { return this->lost.calls.load() == 1; }));
    h.unlock();  // told already: not again
    EXPECT_EQ(this->lost.calls.load(), 1);
    EXPECT_TRUE(h.lost());
}

TYPED_TEST(async_test, a_hold_carries_its_fencing_token) {
    rlock::lock_options o;
    o.fencing = true;
    rlock::client c(this->options());
    TypeParam l(c, this->name(), o);
    rlock::hold first = l.async_lock(rlock::use_future).get();
    const std::uint64_t t1 = first.fencing_token();
    first.unlock();
    rlock::hold second = l.async_lock(rlock::use_future).get();
    EXPECT_GT(second.fencing_token(), t1);
}

TYPED_TEST(async_test, a_lease_given_ends_the_hold_without_renewal) {
    rlock::client c(this->options());
    TypeParam l(c, this->name());
    rlock::hold h = l.async_lock(200ms, rlock::use_future).get();
    ASSERT_TRUE(h);
    EXPECT_TRUE(eventually([&] { return !l.is_locked(); }));
    EXPECT_TRUE(h.lost());
    EXPECT_THROW((void)l.async_lock(0ms, rlock::use_future), rlock::error);
}

// ---- one kind each ----

class async_one : public rlock_test::kind_fixture<async_one> {};

TEST_F(async_one, a_hundred_waiters_behind_one_unlock_cost_one_attempt) {
    rlock::client holder(options()), waiter(options());
    rlock::mutex mine(holder, name()), theirs(waiter, name());
    mine.lock();
    std::vector<std::unique_ptr<outcome>> got;
    for (int i = 0; i < 100; ++i) {
        got.push_back(std::make_unique<outcome>());
        (void)theirs.async_lock(got.back()->handler());
    }
    auto scripts = [&] {
        const std::string info = server().text({"INFO", "commandstats"});
        long long n = 0;
        for (const char* cmd : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls=", "cmdstat_set:calls="}) {
            const auto at = info.find(cmd);
            if (at != std::string::npos) n += std::stoll(info.substr(at + std::strlen(cmd)));
        }
        return n;
    };
    std::this_thread::sleep_for(300ms);  // every waiter has started
    const long long before = scripts();
    mine.unlock();
    ASSERT_TRUE(got[0]->wait());
    std::this_thread::sleep_for(200ms);  // time for any other waiter to try (none should)
    const long long after = scripts();
    EXPECT_LE(after - before, 3) << "the unlock (1) and the head's attempt (1); every waiter tried";
    EXPECT_TRUE(got[0]->hold);
    for (std::size_t i = 1; i < got.size(); ++i) EXPECT_EQ(got[i]->calls, 0);
    // Each hold handed on in turn, in arrival order.
    for (std::size_t i = 0; i + 1 < got.size(); ++i) {
        got[i]->hold.unlock();
        ASSERT_TRUE(got[i + 1]->wait()) << i;
        EXPECT_TRUE(got[i + 1]->hold);
    }
}

TEST_F(async_one, a_waiter_behind_a_holder_that_never_publishes_gets_the_lock_soon_after_it_frees) {
    // A redis-py / node-redlock holder: a token without rlock's mark, deleted without a message.
    server().cmd({"SET", name(), "py-token-1234", "PX", "30000"});
    rlock::client c(options());
    rlock::mutex m(c, name());
    std::future<rlock::hold> f = m.async_try_lock_for(20s, rlock::use_future);
    std::this_thread::sleep_for(300ms);
    server().cmd({"DEL", name()});
    const auto freed = rlock_test::steady::now();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready) << "waited for the foreign holder's TTL";
    EXPECT_TRUE(f.get());
    EXPECT_LT(rlock_test::millis(rlock_test::steady::now() - freed), 2000);
}

TEST_F(async_one, an_owner_re_enters_a_reentrant_lock_and_another_owner_waits) {
    rlock::client c(options());
    rlock::reentrant_lock l(c, name());
    rlock::owner me, someone;
    rlock::hold outer = l.async_lock(me, rlock::use_future).get();
    rlock::hold inner = l.async_lock(me, rlock::use_future).get();
    EXPECT_EQ(outer.hold_id(), inner.hold_id());
    EXPECT_FALSE(l.async_try_lock(someone, rlock::use_future).get());
    EXPECT_FALSE(l.try_lock()) << "a thread is another owner";
    inner.unlock();
    EXPECT_FALSE(l.async_try_lock(someone, rlock::use_future).get());
    outer.unlock();
    EXPECT_TRUE(l.async_try_lock(someone, rlock::use_future).get());
}

// A re-entry of a lost hold names its owner too: an rlock::owner's, not "this thread's".
TEST_F(async_one, an_owners_re_entry_of_a_lost_hold_is_refused_naming_the_owner) {
    rlock::client c(options());
    rlock::reentrant_lock l(c, name());
    rlock::owner me;
    rlock::hold outer = l.async_lock(me, rlock::use_future).get();
    server().cmd({"DEL", name()});
    ASSERT_TRUE(rlock_test::eventually([&] { return outer.lost(); }));
    try {
        (void)l.async_lock(me, rlock::use_future).get();
        ADD_FAILURE() << "no lock_lost";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::lock_lost) << e.what();
        EXPECT_NE(std::string(e.what()).find("rlock::owner " + std::to_string(me.number())), std::string::npos)
            << e.what();
    }
}

TEST_F(async_one, a_mutex_refuses_its_owners_second_acquire) {
    rlock::client c(options());
    rlock::mutex m(c, name());
    rlock::owner me;
    rlock::hold h = m.async_lock(me, rlock::use_future).get();
    try {
        (void)m.async_lock(me, rlock::use_future).get();
        ADD_FAILURE() << "no would_deadlock";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::would_deadlock) << e.what();
        // Issue 31, item 6: it names the owner, not "this thread".
        EXPECT_NE(std::string(e.what()).find("rlock::owner " + std::to_string(me.number())), std::string::npos)
            << e.what();
    }
}

TEST_F(async_one, readers_queued_behind_a_writer_all_enter_at_its_unlock) {
    rlock::client writer(options()), readers(options());
    rlock::read_write_lock w(writer, name()), r(readers, name());
    w.lock();
    std::vector<std::future<rlock::hold>> got;
    for (int i = 0; i < 5; ++i) got.push_back(r.async_lock_shared(rlock::use_future));
    std::this_thread::sleep_for(200ms);
    w.unlock();
    std::vector<rlock::hold> held;
    for (auto& f : got) {
        ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
        held.push_back(f.get());
        EXPECT_TRUE(held.back());
    }
    EXPECT_FALSE(w.try_lock());
    held.clear();
    EXPECT_TRUE(w.try_lock());
    w.unlock();
}

TEST_F(async_one, a_handler_may_destroy_the_client) {
    auto c = std::make_unique<rlock::client>(options());
    rlock::mutex m(*c, name());
    std::promise<void> done;
    (void)m.async_lock([&](std::exception_ptr, rlock::hold h) {
        h.unlock();
        c.reset();  // on the engine's own thread
        done.set_value();
    });
    EXPECT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

// A handler that destroys the client while other operations of it were posted in the same
// turn of the engine: those complete before the destructor returns, as promised. Failed
// before: the second handler ran after the destructor had returned (the rest of the engine's
// batch ran after it).
TEST_F(async_one, a_handler_that_destroys_the_client_sees_every_other_operation_completed_first) {
    auto c = std::make_unique<rlock::client>(options());
    rlock::mutex busy(*c, name() + ":busy"), first(*c, name() + ":1"), second(*c, name() + ":2");
    std::promise<void> engine_busy, done;
    std::atomic<bool> second_ran{false};
    bool second_ran_before_return = false;
    (void)busy.async_lock([&](std::exception_ptr, rlock::hold) {
        engine_busy.set_value();
        std::this_thread::sleep_for(200ms);  // the two below are posted meanwhile: one batch
    });
    engine_busy.get_future().wait();
    (void)first.async_try_lock([&](std::exception_ptr, rlock::hold h) {
        if (h) h.unlock();
        c.reset();  // on the engine's own thread
        second_ran_before_return = second_ran.load();
        done.set_value();
    });
    (void)second.async_try_lock([&](std::exception_ptr, rlock::hold h) {
        if (h) h.unlock();
        second_ran = true;
    });
    ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(second_ran_before_return) << "an operation completed after ~client returned";
    EXPECT_TRUE(eventually([&] { return rlock_test::keys_left(server()).empty(); }));
}

// ---- the locks of several keys: red_lock and multi_lock ----

/// red_lock over three real servers of its own.
class async_red : public rlock_test::red_nodes<3> {
protected:
    long long channels() {
        long long n = 0;
        for (auto& s : servers) n += static_cast<long long>(s->cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements);
        return n;
    }
};

TEST_F(async_red, a_hold_is_on_every_node_excludes_and_releases_everywhere_when_destroyed) {
    auto mine = make_clients(), theirs = make_clients();
    rlock::red_lock a(raw(mine), name()), b(raw(theirs), name());
    {
        outcome got;
        (void)a.async_lock(got.handler());
        ASSERT_TRUE(got.wait());
        EXPECT_NE(got.thread, std::this_thread::get_id());
        ASSERT_FALSE(got.error);
        rlock::hold h = std::move(got.hold);
        ASSERT_TRUE(h);
        EXPECT_FALSE(value_on_every_node(name()).empty());
        EXPECT_FALSE(h.lost());
        EXPECT_FALSE(b.try_lock());
        EXPECT_FALSE(a.is_held_by_current_thread()) << "the hold is the handle's, not the thread's";
        EXPECT_THROW((void)h.fencing_token(), rlock::error);
    }
    EXPECT_EQ(keys_named(name()), 0);
    EXPECT_TRUE(b.try_lock());
    b.unlock();
}

TEST_F(async_red, a_waiter_gets_it_when_the_holder_unlocks_and_a_wait_that_runs_out_leaves_nothing) {
    auto mine = make_clients(), theirs = make_clients();
    rlock::red_lock a(raw(mine), name()), b(raw(theirs), name());
    a.lock();
    const std::string token = value_on_every_node(name());
    ASSERT_FALSE(token.empty());
    outcome late;
    (void)b.async_try_lock_for(300ms, late.handler());
    ASSERT_TRUE(late.wait());
    EXPECT_FALSE(late.error);
    EXPECT_FALSE(late.hold);
    EXPECT_TRUE(eventually([&] { return channels() == 0; })) << "the subscription was kept";
    for (auto& s : servers) EXPECT_EQ(s->text({"GET", name()}), token) << "a failed round left a key";

    std::future<rlock::hold> f = b.async_try_lock_for(10s, rlock::use_future);
    ASSERT_EQ(f.wait_for(200ms), std::future_status::timeout);
    a.unlock();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    rlock::hold h = f.get();
    EXPECT_TRUE(h);
    EXPECT_FALSE(a.try_lock());
    h.async_unlock(rlock::use_future).get();
    EXPECT_EQ(keys_named(name()), 0);
}

TEST_F(async_red, a_cancelled_acquire_completes_once_with_operation_aborted_and_leaves_nothing) {
    auto mine = make_clients(), theirs = make_clients();
    rlock::red_lock a(raw(mine), name()), b(raw(theirs), name());
    a.lock();
    outcome got;
    rlock::pending p = b.async_lock(got.handler());
    ASSERT_TRUE(eventually([&] { return channels() == 1; }));
    p.cancel();
    ASSERT_TRUE(got.wait());
    EXPECT_EQ(got.code(), rlock::errc::operation_aborted);
    EXPECT_FALSE(got.hold);
    EXPECT_TRUE(eventually([&] { return channels() == 0; })) << "the subscription was kept";
    a.unlock();
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(got.calls, 1);
    EXPECT_EQ(keys_named(name()), 0) << "the cancelled waiter took the lock after all";
}

TEST_F(async_red, destroying_the_first_nodes_client_completes_pending_acquires_before_it_returns) {
    auto mine = make_clients(), theirs = make_clients();
    rlock::red_lock a(raw(mine), name());
    a.lock();
    std::vector<std::unique_ptr<outcome>> got;
    {
        rlock::red_lock b(raw(theirs), name());
        for (int i = 0; i < 5; ++i) {
            got.push_back(std::make_unique<outcome>());
            (void)b.async_lock(got.back()->handler());
        }
    }  // the operations outlive the red_lock object
    std::this_thread::sleep_for(100ms);
    theirs.front().reset();
    for (auto& o : got) {
        EXPECT_EQ(o->calls, 1);
        EXPECT_EQ(o->code(), rlock::errc::connection_failed);
    }
    a.unlock();
    EXPECT_EQ(keys_named(name()), 0);
}

TEST_F(async_red, an_owners_second_acquire_is_refused_and_too_few_nodes_is_quorum_not_reached) {
    auto mine = make_clients();
    rlock::red_lock a(raw(mine), name());
    rlock::owner me;
    rlock::hold h = a.async_lock(me, rlock::use_future).get();
    ASSERT_TRUE(h);
    try {
        (void)a.async_lock(me, rlock::use_future).get();
        ADD_FAILURE() << "no would_deadlock";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::would_deadlock) << e.what();
        EXPECT_NE(std::string(e.what()).find("rlock::owner " + std::to_string(me.number())), std::string::npos)
            << e.what();
    }
    h.unlock();
    servers[1]->kill_now();
    servers[2]->kill_now();
    try {
        (void)a.async_lock(rlock::use_future).get();
        ADD_FAILURE() << "no quorum_not_reached";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::quorum_not_reached) << e.what();
    }
    EXPECT_EQ(servers[0]->integer({"EXISTS", name()}), 0) << "the failed round was not undone";
}

TEST_F(async_red, a_hold_that_loses_its_majority_is_told_once_through_the_hold_and_on_lock_lost) {
    auto mine = make_clients(300ms);
    rlock::red_lock a(raw(mine), name());
    rlock::hold h = a.async_lock(rlock::use_future).get();
    ASSERT_TRUE(h);
    servers[0]->cmd({"DEL", name()});
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(h.lost()) << "one node of three is a minority";
    servers[1]->cmd({"DEL", name()});
    EXPECT_TRUE(eventually([&] { return h.lost(); }));
    EXPECT_TRUE(eventually([&] { return lost.calls.load() == 1; }));
    EXPECT_EQ(lost.last_hold_id.load(), h.hold_id());
    h.unlock();
    EXPECT_TRUE(h.lost());
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(lost.calls.load(), 1);
}

class async_multi : public rlock_test::kind_fixture<async_multi> {};

TEST_F(async_multi, a_hold_of_every_part_excludes_each_and_releases_all_when_destroyed) {
    rlock::client mine(options()), theirs(options());
    rlock::mutex a(mine, name() + ":a");
    rlock::reentrant_lock b(theirs, name() + ":b");  // parts on two clients
    rlock::fair_lock c(mine, name() + ":c");
    rlock::mutex oa(theirs, name() + ":a");
    rlock::reentrant_lock ob(mine, name() + ":b");
    rlock::fair_lock oc(theirs, name() + ":c");
    {
        rlock::multi_lock all{a, b, c};
        outcome got;
        (void)all.async_lock(got.handler());
        ASSERT_TRUE(got.wait());
        ASSERT_FALSE(got.error);
        rlock::hold h = std::move(got.hold);
        ASSERT_TRUE(h);
        EXPECT_NE(got.thread, std::this_thread::get_id());
        EXPECT_FALSE(oa.try_lock());
        EXPECT_FALSE(ob.try_lock());
        EXPECT_FALSE(oc.try_lock());
        EXPECT_FALSE(h.lost());
        EXPECT_THROW((void)h.fencing_token(), rlock::error);
    }  // the multi_lock object goes first: the hold does not need it
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

TEST_F(async_multi, all_or_nothing_a_refused_part_leaves_no_other_part_held_and_its_unlock_completes_the_wait) {
    rlock::client mine(options()), theirs(options());
    rlock::mutex a(mine, name() + ":a"), b(mine, name() + ":b"), c(mine, name() + ":c");
    rlock::mutex ob(theirs, name() + ":b");
    ob.lock();
    const std::string before = rlock_test::keys_left(server());
    rlock::multi_lock all{a, b, c};
    outcome late;
    (void)all.async_try_lock_for(300ms, late.handler());
    ASSERT_TRUE(late.wait());
    EXPECT_FALSE(late.error);
    EXPECT_FALSE(late.hold);
    EXPECT_EQ(rlock_test::keys_left(server()), before) << "a part was left held";
    // The subscription is dropped after the completion (its UNSUBSCRIBE goes out on the
    // subscriber's connection), as for every other kind above.
    EXPECT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 0; }))
        << "the subscription was kept";

    std::future<rlock::hold> f = all.async_lock(rlock::use_future);
    ASSERT_EQ(f.wait_for(300ms), std::future_status::timeout);
    EXPECT_EQ(rlock_test::keys_left(server()), before) << "a part is held while another is waited for";
    ob.unlock();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready) << "not woken by the part's unlock";
    rlock::hold h = f.get();
    EXPECT_TRUE(h);
    EXPECT_FALSE(ob.try_lock());
    h.async_unlock(rlock::use_future).get();
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

TEST_F(async_multi, a_cancelled_acquire_completes_once_with_operation_aborted_and_leaves_nothing) {
    rlock::client mine(options()), theirs(options());
    rlock::mutex a(mine, name() + ":a");
    rlock::fair_lock b(mine, name() + ":b");
    rlock::fair_lock ob(theirs, name() + ":b");
    ob.lock();
    const std::string before = rlock_test::keys_left(server());
    rlock::multi_lock all{a, b};
    outcome got;
    rlock::pending p = all.async_lock(got.handler());
    ASSERT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 1; }));
    p.cancel();
    ASSERT_TRUE(got.wait());
    EXPECT_EQ(got.code(), rlock::errc::operation_aborted);
    EXPECT_FALSE(got.hold);
    EXPECT_EQ(rlock_test::keys_left(server()), before) << "a part or a queue entry was left";
    ob.unlock();
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(got.calls, 1);
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

TEST_F(async_multi, destroying_a_parts_client_completes_the_pending_acquire_and_releases_the_parts_taken) {
    rlock::client holder(options());
    auto mine = std::make_unique<rlock::client>(options());
    auto other = std::make_unique<rlock::client>(options());
    rlock::mutex a(*other, name() + ":a"), b(*mine, name() + ":b");
    rlock::mutex hb(holder, name() + ":b");
    hb.lock();
    outcome got;
    {
        rlock::multi_lock both{a, b};
        (void)both.async_lock(got.handler());
    }
    std::this_thread::sleep_for(200ms);
    mine.reset();  // b's client: its pending acquire fails, and a (taken first) is released
    ASSERT_TRUE(got.wait(5s));
    EXPECT_EQ(got.code(), rlock::errc::connection_failed);
    EXPECT_EQ(server().integer({"EXISTS", name() + ":a"}), 0);
    hb.unlock();
}

// The client of a part the acquire is not waiting for: the acquire used to wait on for the
// other part (for ever with async_lock; until its deadline with a timed form, which then
// completed empty) and fail only when it came back to the destroyed part.
TEST_F(async_multi, destroying_the_client_of_a_part_not_waited_for_completes_the_pending_acquire) {
    rlock::client holder(options()), mine(options());
    auto other = std::make_unique<rlock::client>(options());
    const std::string where = other->server();
    rlock::mutex a(*other, name() + ":a"), b(mine, name() + ":b");
    rlock::mutex hb(holder, name() + ":b");
    hb.lock();
    const std::string before = rlock_test::keys_left(server());
    outcome untimed, timed;
    {
        rlock::multi_lock both{a, b};  // a is taken, b refused: a is released and b waited for
        (void)both.async_lock(untimed.handler());
        (void)both.async_try_lock_for(20s, timed.handler());
    }
    std::this_thread::sleep_for(200ms);
    ASSERT_EQ(untimed.calls, 0);
    other.reset();  // a's client
    for (outcome* o : {&untimed, &timed}) {
        ASSERT_TRUE(o->wait(5s)) << "the acquire waited on for b";
        EXPECT_FALSE(o->hold);
        ASSERT_TRUE(o->error);
        try {
            std::rethrow_exception(o->error);
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
            EXPECT_EQ(e.lock(), name() + ":a") << e.what();
            EXPECT_EQ(e.server(), where) << e.what();
        } catch (...) {
            ADD_FAILURE() << "not an rlock::error";
        }
    }
    EXPECT_EQ(rlock_test::keys_left(server()), before) << "a part or a queue entry was left";
    hb.unlock();
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(untimed.calls, 1);
    EXPECT_EQ(timed.calls, 1);
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

TEST_F(async_multi, a_lost_part_loses_the_whole_hold_told_once_under_its_id) {
    rlock_test::lost_log log;
    rlock::client_options o = options(300ms);
    o.on_lock_lost = log.hold_handler();
    rlock::client c(o);
    rlock::mutex a(c, name() + ":a");
    rlock::reentrant_lock b(c, name() + ":b");
    rlock::multi_lock both{a, b};
    rlock::hold h = both.async_lock(rlock::use_future).get();
    ASSERT_TRUE(h);
    server().cmd({"DEL", name() + ":b"});
    EXPECT_TRUE(eventually([&] { return h.lost(); }));
    EXPECT_TRUE(eventually([&] { return log.calls.load() == 1; }));
    EXPECT_EQ(log.last_hold_id.load(), h.hold_id());
    h.unlock();
    EXPECT_TRUE(h.lost());
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(log.calls.load(), 1);
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

TEST_F(async_multi, an_owner_re_enters_reentrant_parts_and_is_refused_by_a_mutex_part) {
    rlock::client c(options());
    rlock::reentrant_lock a(c, name() + ":a");
    rlock::fair_lock b(c, name() + ":b");
    rlock::multi_lock both{a, b};
    rlock::owner me, someone;
    rlock::hold outer = both.async_lock(me, rlock::use_future).get();
    rlock::hold inner = both.async_lock(me, rlock::use_future).get();
    ASSERT_TRUE(inner);
    EXPECT_FALSE(both.async_try_lock(someone, rlock::use_future).get());
    inner.unlock();
    EXPECT_FALSE(both.async_try_lock(someone, rlock::use_future).get()) << "the outer level went too";
    outer.unlock();
    EXPECT_TRUE(both.async_try_lock(someone, rlock::use_future).get());

    rlock::mutex m(c, name() + ":m");
    rlock::multi_lock with_mutex{a, m};
    rlock::hold first = with_mutex.async_lock(me, rlock::use_future).get();
    try {
        (void)with_mutex.async_lock(me, rlock::use_future).get();
        ADD_FAILURE() << "no would_deadlock";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::would_deadlock) << e.what();
    }
    EXPECT_TRUE(first);
    EXPECT_FALSE(first.lost());
    first.unlock();
    EXPECT_EQ(rlock_test::keys_left(server()), "");
}

// ---- the synchronizers' asynchronous waits ----

class async_synchronizers : public rlock_test::kind_fixture<async_synchronizers> {};

TEST_F(async_synchronizers, semaphore_waiters_are_served_by_release_messages_in_arrival_order) {
    rlock::client c(options()), other(options());
    rlock::semaphore s(c, name()), t(other, name());
    ASSERT_TRUE(s.try_set_permits(2));
    EXPECT_TRUE(s.async_acquire(2, rlock::use_future).get());
    std::vector<std::future<bool>> waiting;
    for (int i = 0; i < 3; ++i) waiting.push_back(s.async_acquire(rlock::use_future));
    std::this_thread::sleep_for(200ms);
    for (auto& f : waiting) EXPECT_EQ(f.wait_for(0ms), std::future_status::timeout);
    t.release(2);  // another client's release: its message wakes them
    EXPECT_TRUE(waiting[0].get());
    EXPECT_TRUE(waiting[1].get());
    EXPECT_EQ(waiting[2].wait_for(200ms), std::future_status::timeout);
    t.release();
    EXPECT_TRUE(waiting[2].get());
    EXPECT_EQ(s.available_permits(), 0);
}

TEST_F(async_synchronizers, a_semaphore_wait_that_runs_out_or_is_cancelled_takes_nothing) {
    rlock::client c(options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(1));
    EXPECT_FALSE(s.async_try_acquire_for(200ms, 2, rlock::use_future).get());
    std::promise<std::exception_ptr> got;
    rlock::pending p = s.async_acquire(2, [&](std::exception_ptr e, bool) { got.set_value(e); });
    ASSERT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 1; }));
    p.cancel();
    EXPECT_EQ(code_of(got.get_future().get()), rlock::errc::operation_aborted);
    EXPECT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 0; }));
    EXPECT_EQ(s.available_permits(), 1);
    EXPECT_THROW((void)s.async_acquire(0, rlock::use_future), rlock::error);
}

TEST_F(async_synchronizers, latch_waiters_all_pass_when_the_count_reaches_zero_and_not_before) {
    rlock::client c(options()), other(options());
    rlock::count_down_latch l(c, name()), m(other, name());
    ASSERT_TRUE(l.try_set_count(2));
    std::vector<std::future<bool>> waiting;
    for (int i = 0; i < 5; ++i) waiting.push_back(l.async_wait(rlock::use_future));
    std::future<bool> short_wait = l.async_wait_for(200ms, rlock::use_future);
    EXPECT_FALSE(short_wait.get());
    m.count_down();
    std::this_thread::sleep_for(200ms);
    for (auto& f : waiting) EXPECT_EQ(f.wait_for(0ms), std::future_status::timeout);
    m.count_down();
    for (auto& f : waiting) EXPECT_TRUE(f.get());
    EXPECT_TRUE(l.async_wait_until(std::chrono::system_clock::now(), rlock::use_future).get());
}

TEST_F(async_synchronizers, permit_waiters_get_released_and_expired_permits_and_cancelled_ones_take_nothing) {
    rlock::client c(options()), other(options());
    rlock::permit_expirable_semaphore s(c, name()), t(other, name());
    ASSERT_TRUE(s.try_set_permits(2));
    rlock::permit both = s.async_acquire(2, rlock::use_future).get();
    ASSERT_TRUE(both);
    EXPECT_EQ(both.ids().size(), 2u);
    std::future<rlock::permit> next = t.async_acquire(rlock::use_future);
    EXPECT_EQ(next.wait_for(200ms), std::future_status::timeout);
    EXPECT_FALSE(t.async_try_acquire_for(100ms, 1, rlock::use_future).get());
    both.release();  // its message wakes the waiter of the other client
    rlock::permit one = next.get();
    ASSERT_TRUE(one);
    // A leased permit frees itself: its waiter wakes when the lease ends, with no message.
    rlock::permit leased = s.async_acquire(300ms, 1, rlock::use_future).get();
    ASSERT_TRUE(leased);
    rlock::permit after = t.async_try_acquire_for(10s, 1, rlock::use_future).get();
    EXPECT_TRUE(after) << "woken only by a message";
    // A cancelled waiter takes nothing.
    std::promise<std::exception_ptr> got;
    rlock::pending p = t.async_acquire([&](std::exception_ptr e, rlock::permit) { got.set_value(e); });
    std::this_thread::sleep_for(100ms);
    p.cancel();
    EXPECT_TRUE(got.get_future().get());
    one.release();
    EXPECT_TRUE(eventually([&] { return s.available_permits() == 1; }));
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(s.available_permits(), 1) << "the cancelled waiter took the freed permit";
}

#if __has_include(<asio.hpp>)
// ---- Asio completion tokens (rlock/asio.hpp); the C++20 coroutine form is example 11 ----

class asio_tokens : public rlock_test::kind_fixture<asio_tokens> {};

TEST_F(asio_tokens, a_bound_handler_runs_on_its_executor_and_keeps_run_busy_until_then) {
    rlock::client holder(options()), waiter(options());
    rlock::mutex mine(holder, name()), theirs(waiter, name());
    std::promise<void> locked;
    std::thread unlocker([&] {
        mine.lock();
        locked.set_value();
        std::this_thread::sleep_for(200ms);
        mine.unlock();
    });
    locked.get_future().wait();
    asio::io_context io;
    std::thread::id ran_on;
    rlock::hold got;
    theirs.async_lock(asio::bind_executor(io, [&](std::exception_ptr e, rlock::hold h) {
        EXPECT_FALSE(e);
        ran_on = std::this_thread::get_id();
        got = std::move(h);
    }));
    io.run();  // returns only once the pending acquire has completed here
    unlocker.join();
    EXPECT_EQ(ran_on, std::this_thread::get_id());
    EXPECT_TRUE(got);
}

TEST_F(asio_tokens, use_future_and_deferred_complete_with_the_hold) {
    rlock::client c(options());
    rlock::mutex m(c, name());
    std::future<rlock::hold> f = m.async_lock(asio::use_future);
    rlock::hold h = f.get();
    EXPECT_TRUE(h);
    h.unlock();
#if ASIO_VERSION >= 102400
    auto op = m.async_try_lock_for(1s, asio::deferred);
#else
    auto op = m.async_try_lock_for(1s, asio::experimental::deferred);  // moved to asio:: in 1.24
#endif
    std::promise<bool> held;
    std::move(op)([&](std::exception_ptr e, rlock::hold got) { held.set_value(!e && got); });
    EXPECT_TRUE(held.get_future().get());
}

TEST_F(asio_tokens, an_async_unlock_takes_asio_tokens_too) {
    rlock::client c(options());
    rlock::mutex m(c, name());
    asio::io_context io;
    bool released = false;
    rlock::hold h = m.async_lock(asio::use_future).get();
    h.async_unlock(asio::bind_executor(io, [&](std::exception_ptr e) { released = !e; }));
    io.run();
    EXPECT_TRUE(released);
    EXPECT_FALSE(m.is_locked());
}

// asio::deferred is callable with one argument (it takes a token), so it passed for an unlock's
// callback: the unlock ran at once and nothing was deferred. It is an Asio token.
TEST_F(asio_tokens, an_async_unlock_with_deferred_unlocks_only_when_launched) {
    rlock::client c(options());
    rlock::mutex m(c, name());
    rlock::hold h = m.async_lock(asio::use_future).get();
#if ASIO_VERSION >= 102400
    auto op = h.async_unlock(asio::deferred);
#else
    auto op = h.async_unlock(asio::experimental::deferred);
#endif
    std::this_thread::sleep_for(50ms);  // an unlock started now would be done by then
    EXPECT_TRUE(m.is_locked()) << "the unlock ran before it was launched";
    std::promise<bool> released;
    std::move(op)([&](std::exception_ptr e) { released.set_value(!e); });
    EXPECT_TRUE(released.get_future().get());
    EXPECT_FALSE(m.is_locked());
}

TEST_F(asio_tokens, an_emitted_cancellation_completes_with_operation_aborted_and_leaves_nothing) {
    rlock::client holder(options()), waiter(options());
    rlock::mutex mine(holder, name()), theirs(waiter, name());
    mine.lock();
    asio::io_context io;
    asio::cancellation_signal stop;
    std::exception_ptr error;
    int calls = 0;
    theirs.async_lock(asio::bind_cancellation_slot(
        stop.slot(), asio::bind_executor(io, [&](std::exception_ptr e, rlock::hold) {
            error = std::move(e);
            ++calls;
        })));
    asio::steady_timer t(io, 200ms);
    t.async_wait([&](std::error_code) { stop.emit(asio::cancellation_type::terminal); });
    io.run();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(code_of(error), rlock::errc::operation_aborted);
    EXPECT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 0; }));
    mine.unlock();
}

// Issue 31, item 3: an io_context and an rlock::client destroyed in either order, with waits
// pending on the io_context and a handler that owns a hold (as a suspended coroutine's frame
// does). Before, an io_context destroyed first left the client's destructor completing those
// waits on the freed context: a heap-use-after-free under ASan (async_waits::fail_all ->
// io_context executor's execute).
TEST_F(asio_tokens, an_io_context_destroyed_before_the_client_drops_its_waits_and_releases_their_holds) {
    rlock::client holder(options());
    auto waiter = std::make_unique<rlock::client>(options());
    rlock::mutex busy(holder, name()), wanted(*waiter, name()), owned(*waiter, name() + ":owned");
    busy.lock();
    int calls = 0;
    {
        asio::io_context io;
        // A frame that holds `owned` and waits for `busy`, as `co_await wanted.async_lock(...)`
        // after taking `owned` would.
        rlock::hold frame = owned.async_lock(rlock::use_future).get();
        wanted.async_lock(asio::bind_executor(io, [&calls, frame = std::move(frame)](std::exception_ptr, rlock::hold) {
            ++calls;
        }));
        wanted.async_try_lock_for(30s, asio::bind_executor(io, [&calls](std::exception_ptr, rlock::hold) { ++calls; }));
        io.poll();
    }  // the io_context goes with both waits pending
    EXPECT_EQ(calls, 0) << "a handler ran after its io_context was destroyed";
    EXPECT_FALSE(owned.is_locked()) << "the hold owned by the destroyed handler was kept";
    // Cancelled: they leave no subscription behind, and the client goes cleanly.
    EXPECT_TRUE(eventually([&] { return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 0; }));
    waiter.reset();
    EXPECT_EQ(calls, 0);
    busy.unlock();
}

// The same with the handler's executor one from before Asio's standard executors (an
// io_context::strand, which answers no context query). Failed before: the handler was not
// dropped with its io_context (the hold it owned stayed taken), and the client's destruction
// dispatched to the freed strand (a heap-use-after-free under ASan).
TEST_F(asio_tokens, a_handler_on_a_legacy_strand_is_dropped_with_its_io_context) {
    rlock::client holder(options());
    auto waiter = std::make_unique<rlock::client>(options());
    rlock::mutex busy(holder, name()), wanted(*waiter, name()), owned(*waiter, name() + ":owned");
    busy.lock();
    int calls = 0;
    {
        asio::io_context io;
        asio::io_context::strand strand(io);
        rlock::hold frame = owned.async_lock(rlock::use_future).get();
        wanted.async_lock(asio::bind_executor(strand, [&calls, frame = std::move(frame)](std::exception_ptr, rlock::hold) {
            ++calls;
        }));
        io.poll();
    }  // the io_context goes with the wait pending
    EXPECT_EQ(calls, 0) << "a handler ran after its io_context was destroyed";
    EXPECT_FALSE(owned.is_locked()) << "the hold owned by the destroyed handler was kept";
    waiter.reset();
    EXPECT_EQ(calls, 0);
    busy.unlock();
}

// A semaphore's asynchronous acquire completes with a plain bool, which owns nothing: its
// handler, dropped unrun with its io_context, could never release the permits taken for it,
// and a semaphore's permits do not expire. They are given back, as a dropped handler's hold is
// released. Before, they stayed taken for good ("the permits ... stayed taken").
TEST_F(asio_tokens, permits_taken_for_a_handler_dropped_with_its_io_context_are_given_back) {
    rlock::client c(options());
    rlock::semaphore s(c, name());
    ASSERT_TRUE(s.try_set_permits(3));
    int calls = 0;
    for (int round = 0; round < 3; ++round) {
        {
            asio::io_context io;
            s.async_acquire(2, asio::bind_executor(io, [&calls](std::exception_ptr, bool) { ++calls; }));
            ASSERT_TRUE(eventually([&] { return s.available_permits() == 1; }));
        }  // the io_context goes with the completion unrun
        EXPECT_EQ(calls, 0) << "a handler ran after its io_context was destroyed";
        ASSERT_TRUE(eventually([&] { return s.available_permits() == 3; }))
            << "the permits taken for the dropped handler stayed taken (round " << round << ")";
    }
    // One that runs keeps them: the handler owns them now.
    asio::io_context io;
    bool taken = false;
    s.async_try_acquire_for(10s, 2, asio::bind_executor(io, [&taken](std::exception_ptr, bool t) { taken = t; }));
    io.run();
    EXPECT_TRUE(taken);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(s.available_permits(), 1) << "permits delivered to a handler were given back";
}

// The other order: the client destroyed first, then the io_context with the completion queued
// unrun. The permits were given back through the destroyed client, which refused (nothing
// sent): they stayed taken for good, a plain semaphore having no leases.
TEST_F(asio_tokens, permits_taken_for_a_handler_dropped_after_its_client_are_given_back) {
    rlock::client watcher(options());
    rlock::semaphore counted(watcher, name());
    ASSERT_TRUE(counted.try_set_permits(3));
    int calls = 0;
    {
        asio::io_context io;
        {
            rlock::client c(options());
            rlock::semaphore s(c, name());
            s.async_acquire(2, asio::bind_executor(io, [&calls](std::exception_ptr, bool) { ++calls; }));
            ASSERT_TRUE(eventually([&] { return counted.available_permits() == 1; }));
        }  // the client goes first, the completion still queued on io
    }  // then the io_context, with the completion unrun
    EXPECT_EQ(calls, 0) << "a handler ran after its io_context was destroyed";
    EXPECT_TRUE(eventually([&] { return counted.available_permits() == 3; }))
        << "the permits taken for the dropped handler stayed taken";
}

// A handler class that names its executor (executor_type, get_executor(): Asio's idiom) runs
// there, and io.run() waits for it, as one bound with bind_executor does.
TEST_F(asio_tokens, a_handler_class_naming_its_executor_runs_there) {
    rlock::client c(options());
    rlock::mutex m(c, name() + ":class");
    asio::io_context io;
    struct handler {
        using executor_type = asio::io_context::executor_type;
        executor_type ex;
        std::thread::id* ran_on;
        executor_type get_executor() const noexcept { return ex; }
        void operator()(std::exception_ptr, rlock::hold) const { *ran_on = std::this_thread::get_id(); }
    };
    std::thread::id ran_on;
    m.async_lock(handler{io.get_executor(), &ran_on});
    io.run();
    EXPECT_EQ(ran_on, std::this_thread::get_id()) << "the handler did not run on its executor";
}

TEST_F(asio_tokens, a_client_destroyed_before_the_io_context_completes_its_waits_there_with_an_error) {
    rlock::client holder(options());
    auto waiter = std::make_unique<rlock::client>(options());
    rlock::mutex busy(holder, name()), wanted(*waiter, name()), owned(*waiter, name() + ":owned");
    busy.lock();
    asio::io_context io;
    std::vector<rlock::errc> ended;
    rlock::hold frame = owned.async_lock(rlock::use_future).get();
    wanted.async_lock(asio::bind_executor(io, [&ended, frame = std::move(frame)](std::exception_ptr e, rlock::hold) {
        ended.push_back(code_of(e));
    }));
    io.poll();
    waiter.reset();  // with the wait pending: it completes on `io` with an error
    io.run();
    ASSERT_EQ(ended.size(), 1u);
    EXPECT_EQ(ended[0], rlock::errc::connection_failed);
    // A second wait on an io_context destroyed without running: its handler goes unrun.
    auto again = std::make_unique<rlock::client>(options());
    rlock::mutex wanted_again(*again, name());
    {
        asio::io_context io2;
        wanted_again.async_lock(asio::bind_executor(io2, [&ended](std::exception_ptr e, rlock::hold) {
            ended.push_back(code_of(e));
        }));
        io2.poll();
        again.reset();
    }
    EXPECT_EQ(ended.size(), 1u);
    busy.unlock();
}
#endif

}  // namespace
