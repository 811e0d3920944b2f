// C++20 coroutines on Asio (issue 31, item 3): an rlock::client and an asio::io_context destroyed
// in either order while a coroutine is suspended in `co_await m.async_lock(asio::use_awaitable)`
// holding another lock in its frame. Its own executable: the rest of the suite is C++17, and
// this is the one place a real coroutine frame (not a handler standing in for one) is what the
// client's waits hold. Run under ASan and TSan with the suite (scripts/test --all).
#include <gtest/gtest.h>

#include <asio.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "rlock/asio.hpp"
#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_server;

/// One server for the file's tests, started at the first use.
using rlock_test::server;

std::string name() { return rlock_test::test_lock_name(); }

/// Where the coroutine got to.
struct progress {
    bool took_owned = false;
    bool resumed = false;
    rlock::errc ended_with{};
};

/// Takes `owned`, then waits for `wanted` (held by another client) with `owned` in its frame.
asio::awaitable<void> take_both(rlock::mutex& owned, rlock::mutex& wanted, progress& p) {
    rlock::hold mine = co_await owned.async_lock(asio::use_awaitable);
    p.took_owned = true;
    try {
        rlock::hold h = co_await wanted.async_lock(asio::use_awaitable);  // suspended here
        p.resumed = true;
    } catch (const rlock::error& e) {
        p.resumed = true;
        p.ended_with = e.value();
    }
}

/// Runs `io` until the coroutine holds `owned` and waits for `wanted` (bounded).
void until_waiting(asio::io_context& io, const progress& p) {
    for (int i = 0; i < 500 && !p.took_owned; ++i) io.run_for(10ms);
    ASSERT_TRUE(p.took_owned) << "the coroutine never took its first lock";
    io.run_for(100ms);  // it asks for the second and suspends
    ASSERT_FALSE(p.resumed);
}

// The io_context goes first: the suspended coroutine's frame is destroyed with it, which
// releases the hold in it, and the client's pending wait is dropped without running anything on
// the freed context (before: a heap-use-after-free in ~client under ASan). The client then goes
// cleanly, leaving no subscription.
TEST(coroutine, an_io_context_destroyed_first_destroys_the_suspended_frame_and_releases_its_hold) {
    const std::string n = name();
    rlock::client holder(server().options());
    auto waiter = std::make_unique<rlock::client>(server().options());
    rlock::mutex busy(holder, n), wanted(*waiter, n), owned(*waiter, n + ":owned");
    busy.lock();
    progress p;
    {
        asio::io_context io;
        asio::co_spawn(io, take_both(owned, wanted, p), asio::detached);
        until_waiting(io, p);
        ASSERT_TRUE(owned.is_locked());
    }  // the io_context, and the coroutine's frame with it
    EXPECT_FALSE(p.resumed) << "the coroutine ran after its io_context was destroyed";
    EXPECT_TRUE(eventually([&] { return !owned.is_locked(); })) << "the frame's hold was kept";
    EXPECT_TRUE(eventually([&] {
        return server().cmd({"PUBSUB", "CHANNELS", rlock_test::lock_channels})->elements == 0;
    })) << "the dropped wait left its subscription";
    waiter.reset();
    EXPECT_FALSE(p.resumed);
    busy.unlock();
}

// The client goes first: the suspended coroutine is resumed on its io_context with
// connection_failed, and its frame (and the hold in it) ends there, after the client.
TEST(coroutine, a_client_destroyed_first_resumes_the_suspended_coroutine_with_an_error) {
    const std::string n = name();
    rlock::client holder(server().options());
    auto waiter = std::make_unique<rlock::client>(server().options());
    rlock::mutex busy(holder, n), wanted(*waiter, n), owned(*waiter, n + ":owned");
    busy.lock();
    progress p;
    asio::io_context io;
    asio::co_spawn(io, take_both(owned, wanted, p), asio::detached);
    until_waiting(io, p);
    waiter.reset();  // with the coroutine suspended in its wait
    io.run_for(5s);
    EXPECT_TRUE(p.resumed) << "the coroutine was never resumed";
    EXPECT_EQ(p.ended_with, rlock::errc::connection_failed);
    EXPECT_EQ(server().integer({"EXISTS", n + ":owned"}), 0) << "the frame's hold outlived its client";
    busy.unlock();
}

/// Awaits `op()` and records the error it ended with (errc{} when none).
template <class Op>
asio::awaitable<void> record_error(Op op, rlock::errc& ended_with, bool& done) {
    try {
        (void)co_await op();
    } catch (const rlock::error& e) {
        ended_with = e.value();
    }
    done = true;
}

// Found by a probe: use_awaitable starts an operation inside the coroutine's suspension, and
// what the start threw there (a red_lock's lease too short for its drift, a hold's unlock
// after its client was destroyed, an acquire awaited after its client was destroyed) escaped
// a noexcept function: std::terminate, the process gone. Each now ends the co_await with the
// error, which the coroutine catches.
TEST(coroutine, errors_at_the_start_of_an_awaited_operation_are_thrown_by_the_co_await) {
    const std::string n = name();
    asio::io_context io;
    auto run = [&](auto op) {
        rlock::errc ended_with{};
        bool done = false;
        io.restart();  // the last run ran out of work, which stopped it
        asio::co_spawn(io, record_error(op, ended_with, done), asio::detached);
        for (int i = 0; i < 500 && !done; ++i) io.run_for(10ms);
        EXPECT_TRUE(done) << "the coroutine never ended";
        return ended_with;
    };
    redis_server a, b, c;
    std::vector<std::unique_ptr<rlock::client>> nodes;
    for (redis_server* s : {&a, &b, &c}) nodes.push_back(std::make_unique<rlock::client>(s->options()));
    rlock::red_lock red({nodes[0].get(), nodes[1].get(), nodes[2].get()}, n + ":red");
    EXPECT_EQ(run([&] { return red.async_lock(2ms, asio::use_awaitable); }), rlock::errc::invalid_argument);

    auto client = std::make_unique<rlock::client>(server().options());
    rlock::mutex m(*client, n);
    rlock::hold h = m.async_lock(rlock::use_future).get();
    auto later = m.async_lock(asio::use_awaitable);  // made now, awaited after the client is gone
    client.reset();
    EXPECT_EQ(run([&] { return h.async_unlock(asio::use_awaitable); }), rlock::errc::connection_failed);
    EXPECT_EQ(run([&]() mutable { return std::move(later); }), rlock::errc::connection_failed);
    nodes[0].reset();  // the first node's client: its engine runs the rounds
    EXPECT_EQ(run([&] { return red.async_lock(asio::use_awaitable); }), rlock::errc::connection_failed);
    EXPECT_EQ(server().integer({"EXISTS", n}), 0) << "the hold outlived its unlock";
}

}  // namespace
