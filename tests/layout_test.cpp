// What each lock kind leaves in Redis (the compatibility contract with redis-py and Redisson),
// and what is particular to each kind: reentry, would_deadlock, wrong types.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <future>
#include <string>
#include <string_view>
#include <thread>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::redis_server;
using rlock_test::steady;

namespace {

/// True when `s` matches `shape` character by character: 'x' is a lowercase hex digit, 'y' one
/// of 8, 9, a, b (a version-4 UUID's variant), anything else itself. (std::regex would do, but
/// GCC 12 warns inside <regex> under -O2 with ASan.)
bool has_shape(std::string_view s, std::string_view shape) {
    if (s.size() != shape.size()) return false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        if (shape[i] == 'x'   ? !hex
            : shape[i] == 'y' ? std::string_view("89ab").find(c) == std::string_view::npos
                              : c != shape[i]) {
            return false;
        }
    }
    return true;
}

redis_server& server() {
    static redis_server s;
    return s;
}

std::string name() { return rlock_test::test_lock_name(); }

/// How many times the server has run `command` (INFO commandstats), e.g. "set".
long long calls_of(std::string_view command) {
    const std::string info = server().text({"INFO", "commandstats"});
    const std::string key = "cmdstat_" + std::string(command) + ":calls=";
    const auto at = info.find(key);
    return at == std::string::npos ? 0 : std::atoll(info.c_str() + at + key.size());
}

TEST(mutex_layout, the_key_holds_a_marked_128_bit_token_with_a_px_expiry) {
    rlock::client c(server().options());
    rlock::mutex m(c, name());
    m.lock();
    const std::string token = server().text({"GET", name()});
    // The mark tells waiters that this holder's release will be published.
    EXPECT_TRUE(has_shape(token, "rlock:" + std::string(32, 'x'))) << token;
    const long long pttl = server().integer({"PTTL", name()});
    EXPECT_GT(pttl, 25000);
    EXPECT_LE(pttl, 30000);
    m.unlock();
    m.lock();
    EXPECT_NE(server().text({"GET", name()}), token) << "a token must not be reused";
    m.unlock();
}

TEST(mutex_layout, unlock_publishes_0_on_the_rlock_channel) {
    rlock::client c(server().options());
    rlock::mutex m(c, name());
    rlock_test::raw_subscriber sub(server().port(), "rlock_lock__channel:{" + name() + "}");
    m.lock();
    m.unlock();
    EXPECT_EQ(sub.next(), "0");
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

TEST(mutex_layout, a_redis_py_style_holder_excludes_and_its_expiry_frees) {
    // redis-py's Lock: SET name <token> NX PX, no publish on expiry.
    server().cmd({"SET", name(), "foreign-token", "PX", "400"});
    rlock::client c(server().options());
    rlock::mutex m(c, name());
    EXPECT_FALSE(m.try_lock());
    const auto start = steady::now();
    ASSERT_TRUE(m.try_lock_for(5s));  // it looks again by itself: no message will come
    EXPECT_LT(steady::now() - start, 2s);
    m.unlock();
}

TEST(mutex_layout, a_waiter_behind_a_holder_that_never_publishes_gets_the_lock_soon_after_it_frees) {
    // redis-py's Lock, node-redlock and go-redsync: a random token set with SET NX PX, released
    // by a compare-and-delete that publishes nothing. Emulated here from a second connection.
    // With fencing the waiter's attempts are the acquire script, without it SET NX PX.
    for (const bool fencing : {false, true}) {
        SCOPED_TRACE(fencing ? "with fencing" : "without fencing");
        const std::string n = name() + (fencing ? ":fenced" : "");
        const std::string token = "9f3c2a8e4b1d4f0a8c7e6d5b4a3f2e1d";  // like uuid1().hex
        ASSERT_EQ(server().text({"SET", n, token, "NX", "PX", "30000"}), "OK");
        rlock::client c(server().options());
        rlock::mutex m(c, n, rlock::lock_options{fencing});
        std::promise<steady::time_point> acquired;
        std::thread waiter([&] {
            if (!m.try_lock_for(10s)) {
                acquired.set_value(steady::time_point::max());
                return;
            }
            acquired.set_value(steady::now());
            m.unlock();
        });
        // While the holder holds, the waiter looks now and then, not in a tight loop.
        std::this_thread::sleep_for(300ms);
        const long long sets_before = calls_of("set");
        std::this_thread::sleep_for(1s);
        EXPECT_LT(calls_of("set") - sets_before, 40) << "a capped backoff, not a spin";
        const auto released = steady::now();
        ASSERT_EQ(server().integer({"EVAL",
                                    "if redis.call('get', KEYS[1]) == ARGV[1] then "
                                    "return redis.call('del', KEYS[1]) end return 0",
                                    "1", n, token}),
                  1);
        auto got = acquired.get_future();
        const bool ready = got.wait_for(15s) == std::future_status::ready;
        waiter.join();
        ASSERT_TRUE(ready);
        const auto at = got.get();
        ASSERT_NE(at, steady::time_point::max()) << "the waiter gave up after 10 s (the TTL is 30 s)";
        const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(at - released);
        EXPECT_LT(late.count(), 2000) << "ms after the holder's delete (its TTL was 30 s)";
        server().cmd({"DEL", "redisson_lock_token:{" + n + "}"});
    }
}

TEST(mutex_layout, a_waiter_behind_an_rlock_holder_sends_nothing_until_the_unlock_message) {
    // With fencing the waiter learns who holds from the acquire script, without it from GET.
    for (const bool fencing : {false, true}) {
        SCOPED_TRACE(fencing ? "with fencing" : "without fencing");
        const std::string n = name() + (fencing ? ":fenced" : "");
        rlock::client holder(server().options()), other(server().options());
        rlock::mutex mine(holder, n, rlock::lock_options{fencing});
        rlock::mutex theirs(other, n, rlock::lock_options{fencing});
        mine.lock(30s);
        std::promise<steady::time_point> acquired;
        std::thread waiter([&] {
            theirs.lock();
            acquired.set_value(steady::now());
            theirs.unlock();
        });
        std::this_thread::sleep_for(300ms);  // subscribed and waiting
        const long long sets_before = calls_of("set"), pttls_before = calls_of("pttl");
        std::this_thread::sleep_for(1s);
        EXPECT_EQ(calls_of("set") - sets_before, 0) << "the waiter polled an rlock holder";
        EXPECT_EQ(calls_of("pttl") - pttls_before, 0) << "the waiter polled an rlock holder";
        const auto released = steady::now();
        mine.unlock();
        auto got = acquired.get_future();
        const bool ready = got.wait_for(5s) == std::future_status::ready;
        if (!ready) theirs.force_unlock();
        waiter.join();
        ASSERT_TRUE(ready);
        const auto late =
            std::chrono::duration_cast<std::chrono::milliseconds>(got.get() - released);
        EXPECT_LT(late.count(), 500) << "ms after the unlock";
        server().cmd({"DEL", "redisson_lock_token:{" + n + "}"});
    }
}

TEST(mutex, locking_it_again_on_the_holding_thread_is_would_deadlock_not_a_hang) {
    rlock::client c(server().options());
    rlock::mutex m(c, name());
    m.lock();
    for (int i = 0; i < 2; ++i) {
        try {
            if (i == 0) {
                m.lock();
            } else {
                (void)m.try_lock_for(10s);
            }
            FAIL() << "re-locking a held mutex did not throw";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), rlock::errc::would_deadlock);
            EXPECT_NE(std::string(e.what()).find(name()), std::string::npos);
        }
    }
    // A second object with the same name on the same client is the same lock.
    rlock::mutex twin(c, name());
    EXPECT_THROW(twin.lock(), rlock::error);
    m.unlock();
    EXPECT_FALSE(m.is_locked());
}

TEST(reentrant_layout, the_hash_has_one_holder_field_with_the_reentry_count) {
    rlock::client c(server().options());
    rlock::reentrant_lock l(c, name());
    l.lock();
    auto all = server().cmd({"HGETALL", name()});
    ASSERT_EQ(all->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(all->elements, 2u);
    const std::string field(rlock::detail::reply_text(all->element[0]));
    EXPECT_TRUE(field.size() > c.id().size() + 1 &&
                field.compare(0, c.id().size() + 1, c.id() + ":") == 0 &&
                field.find_first_not_of("0123456789", c.id().size() + 1) == std::string::npos)
        << field;
    EXPECT_TRUE(has_shape(c.id(), "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx")) << c.id();
    EXPECT_EQ(rlock::detail::reply_text(all->element[1]), "1");
    l.lock();
    EXPECT_EQ(server().text({"HGET", name(), field}), "2");
    l.unlock();
    EXPECT_EQ(server().text({"HGET", name(), field}), "1");
    EXPECT_TRUE(l.is_held_by_current_thread());
    EXPECT_GT(server().integer({"PTTL", name()}), 0);
    rlock_test::raw_subscriber sub(server().port(), "redisson_lock__channel:{" + name() + "}");
    l.unlock();
    EXPECT_EQ(sub.next(), "0");
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    EXPECT_THROW(l.unlock(), rlock::error);
}

TEST(reentrant_layout, each_thread_is_its_own_holder) {
    rlock::client c(server().options());
    rlock::reentrant_lock l(c, name());
    l.lock();
    const std::string mine = server().text({"HKEYS", name()});
    std::string theirs;
    bool refused_while_held = false;
    std::thread other([&] {
        refused_while_held = !l.try_lock();
        if (!l.try_lock_for(5s)) return;
        theirs = rlock::detail::reply_text(server().cmd({"HKEYS", name()})->element[0]);
        l.unlock();
    });
    std::this_thread::sleep_for(200ms);
    l.unlock();
    other.join();
    EXPECT_TRUE(refused_while_held);
    ASSERT_FALSE(theirs.empty());
    EXPECT_NE(mine, theirs);
}

TEST(reentrant_layout, a_redisson_holder_excludes_and_its_unlock_message_wakes_us) {
    // What Redisson leaves for a held RLock: hash {"<uuid>:<thread>": 1} with a 30 s lease.
    server().cmd({"HSET", name(), "6f1c0e5a-0000-4000-8000-000000000001:1", "1"});
    server().cmd({"PEXPIRE", name(), "30000"});
    rlock::client c(server().options());
    rlock::reentrant_lock l(c, name());
    EXPECT_FALSE(l.try_lock());
    std::promise<steady::time_point> got;
    std::thread waiter([&] {
        l.lock();
        got.set_value(steady::now());
        l.unlock();
    });
    std::this_thread::sleep_for(300ms);
    // Redisson's unlock: delete, publish 0.
    const auto released = steady::now();
    server().cmd({"DEL", name()});
    server().cmd({"PUBLISH", "redisson_lock__channel:{" + name() + "}", "0"});
    auto f = got.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_LT(f.get() - released, 1s);
    waiter.join();
}

TEST(reentrant_lock, a_key_of_another_type_is_a_clear_wrong_type_error) {
    server().cmd({"SET", name(), "not a hash"});
    rlock::client c(server().options());
    rlock::reentrant_lock l(c, name());
    try {
        l.lock();
        FAIL() << "locking a string key did not throw";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::wrong_type);
        const std::string what = e.what();
        EXPECT_NE(what.find(name()), std::string::npos) << what;
        EXPECT_NE(what.find(c.server()), std::string::npos) << what;
        EXPECT_NE(what.find("WRONGTYPE"), std::string::npos) << what;
    }
    EXPECT_EQ(server().text({"GET", name()}), "not a hash");
}

TEST(reentrant_lock, a_lost_hold_cannot_be_re_entered) {
    rlock::client c(server().options());
    rlock::reentrant_lock l(c, name());
    l.lock();
    server().cmd({"DEL", name()});
    try {
        l.lock();
        FAIL() << "re-entry of a lost hold did not throw";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::lock_lost);
    }
    EXPECT_TRUE(l.lost());
    EXPECT_NO_THROW(l.unlock());
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0) << "re-entry re-created a lost lock";
}

}  // namespace

TEST(name_layout, a_name_with_a_brace_of_its_own_is_not_wrapped_in_braces_again_as_redisson_does) {
    // Redisson's prefixName / suffixName: `prefix:name` and `name:suffix` when the name has a
    // '{', so the name's own hash tag keeps every key of the lock in one cluster slot.
    rlock::client c(server().options());
    const std::string n = "{" + name() + "}.cart";
    rlock::lock_options fenced;
    fenced.fencing = true;
    {
        rlock::mutex m(c, n, fenced);
        rlock_test::raw_subscriber sub(server().port(), "rlock_lock__channel:" + n);
        m.lock();
        EXPECT_EQ(server().integer({"EXISTS", "redisson_lock_token:" + n}), 1);
        m.unlock();
        EXPECT_EQ(sub.next(), "0");
    }
    {
        rlock::fair_lock holder(c, n + ".fair");
        rlock::client other(server().options());
        rlock::fair_lock waiter(other, n + ".fair");
        holder.lock();
        EXPECT_FALSE(waiter.try_lock_for(50ms));  // queued, then left: no queue keys behind
        auto queued = std::async(std::launch::async, [&] {
            if (!waiter.try_lock_for(10s)) return false;
            waiter.unlock();
            return true;
        });
        ASSERT_TRUE(rlock_test::eventually(
            [&] { return server().integer({"LLEN", "redisson_lock_queue:" + n + ".fair"}) == 1; }));
        EXPECT_EQ(server().integer({"ZCARD", "redisson_lock_timeout:" + n + ".fair"}), 1);
        holder.unlock();
        EXPECT_TRUE(queued.get());
        EXPECT_EQ(server().integer({"EXISTS", "redisson_lock_queue:" + n + ".fair"}), 0);
    }
    {
        rlock::read_write_lock rw(c, n + ".rw");
        rw.lock_shared();
        const std::string holder = c.id() + ":" + std::to_string(rlock::detail::current_thread_number());
        EXPECT_EQ(server().integer({"EXISTS", n + ".rw:" + holder + ":rwlock_timeout:1"}), 1);
        rw.unlock_shared();
        EXPECT_EQ(server().integer({"EXISTS", n + ".rw:" + holder + ":rwlock_timeout:1"}), 0);
    }
}
