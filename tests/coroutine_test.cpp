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

}  // namespace
