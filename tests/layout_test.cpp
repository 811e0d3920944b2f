// What each lock kind leaves in Redis (the compatibility contract with redis-py and Redisson),
// and what is particular to each kind: reentry, would_deadlock, wrong types, and that a script
// refused by a key of the wrong type or value leaves Redis exactly as it found it.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::expect_unchanged;
using rlock_test::redis_server;
using rlock_test::snapshot;
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

using rlock_test::server;

using rlock_test::name;

using rlock_test::calls_of;

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
            EXPECT_NE(std::string(e.what()).find("this thread already holds"), std::string::npos) << e.what();
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

// Found by an outside probe: a mutex read a key of another type at its name as a foreign
// holder and waited for it, to its TTL or (a list, a hash without one) for ever, where the
// hash kinds throw wrong_type. Now every acquire path (the script of a client's first try and
// of fencing, and the plain SET NX pipeline after it) answers wrong_type at once, naming the
// lock, and changes nothing.
TEST(mutex, a_key_of_another_type_is_a_clear_wrong_type_error) {
    rlock::client c(server().options());
    {
        // A client's acquires are scripts until one succeeds (scripts may run): after this,
        // the plain forms (SET NX and its pipeline) are what runs.
        rlock::mutex warm(c, name() + ":warm");
        warm.lock();
        warm.unlock();
    }
    rlock::lock_options fenced;
    fenced.fencing = true;
    const std::vector<std::pair<std::string, std::function<void()>>> shapes = {
        {"a list", [&] { server().cmd({"RPUSH", name(), "a"}); }},
        {"a hash", [&] { server().cmd({"HSET", name(), "f", "1"}); }},
        {"a sorted set", [&] { server().cmd({"ZADD", name(), "1", "m"}); }},
    };
    for (const auto& [shape, make] : shapes) {
        server().cmd({"DEL", name()});
        make();
        const std::string before = server().text({"DUMP", name()});
        for (const bool fencing : {false, true}) {
            rlock::mutex m(c, name(), fencing ? fenced : rlock::lock_options{});
            for (int round = 0; round < 2; ++round) {
                try {
                    const bool got = m.try_lock_for(2s);
                    ADD_FAILURE() << shape << ", fencing " << fencing << ": the wait returned " << got;
                } catch (const rlock::error& e) {
                    EXPECT_EQ(e.code(), rlock::errc::wrong_type) << e.what();
                    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
                }
                // A try that does not wait (its plain form sends SET NX, which a key of another
                // type refuses as a held lock would): the same error, not false. Found by an
                // outside probe: try_lock() and async_try_lock() answered "held".
                try {
                    const bool got = m.try_lock();
                    ADD_FAILURE() << shape << ", fencing " << fencing << ": try_lock returned " << got;
                } catch (const rlock::error& e) {
                    EXPECT_EQ(e.code(), rlock::errc::wrong_type) << e.what();
                    EXPECT_NE(std::string(e.what()).find(name()), std::string::npos) << e.what();
                }
                try {
                    const rlock::hold h = m.async_try_lock(rlock::use_future).get();
                    ADD_FAILURE() << shape << ", fencing " << fencing << ": async_try_lock returned "
                                  << static_cast<bool>(h);
                } catch (const rlock::error& e) {
                    EXPECT_EQ(e.code(), rlock::errc::wrong_type) << e.what();
                }
            }
        }
        EXPECT_EQ(server().text({"DUMP", name()}), before) << shape;
        EXPECT_EQ(server().integer({"PTTL", name()}), -1) << shape;
    }
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

namespace {

// ---- Scripts never half-write (issue 16, item 2) ----
//
// Redis does not roll back a script that fails midway: what it wrote before the error stays. So
// every script checks, before its first write, everything a later command could refuse. Each
// case below sets up a key a script must refuse (a type or a value its commands cannot take),
// snapshots every key in the server (type, DUMP, PTTL), makes the call, and checks that it
// failed with a clear rlock::error naming the lock and the server — thrown, or told to
// on_lock_lost for an unlock — and that every key reads back as it was.

redis_server& scratch() {
    static redis_server s;
    return s;
}

struct half_write_ctx {
    rlock::client& c;
    const redis_server& s;
    std::string name;
    std::function<void()> checkpoint;  // call right before the call that must fail

    std::string holder() const {
        return c.id() + ":" + std::to_string(rlock::detail::current_thread_number());
    }
    std::string counter() const { return "redisson_lock_token:{" + name + "}"; }
    std::string queue() const { return "redisson_lock_queue:{" + name + "}"; }
    std::string timeouts() const { return "redisson_lock_timeout:{" + name + "}"; }
    std::string read_hold(int n) const {
        return "{" + name + "}:" + holder() + ":rwlock_timeout:" + std::to_string(n);
    }
    void run(std::initializer_list<std::string_view> command) const { s.cmd(command); }
    /// Every key gets a 10 min TTL: far from the leases, so a PEXPIRE by the call shows.
    void far_ttls() const {
        auto keys = s.cmd({"KEYS", "*"});
        for (std::size_t i = 0; i < keys->elements; ++i) {
            s.cmd({"PEXPIRE", rlock::detail::reply_text(keys->element[i]), "600000"});
        }
    }
};

struct half_write_case {
    std::string label;
    rlock::errc want;
    std::function<void(half_write_ctx&)> run;  // sets up, checkpoints, makes the call
};

const rlock::lock_options fenced{true};

/// A counter INCR refuses: how to make it, and the error it must give.
struct bad_counter {
    const char* label;
    rlock::errc want;
    void (*make)(const half_write_ctx&);
};

const bad_counter bad_counters[] = {
    {"a non-integer", rlock::errc::server_error,
     [](const half_write_ctx& x) { x.run({"SET", x.counter(), "abc"}); }},
    {"a hash", rlock::errc::wrong_type,
     [](const half_write_ctx& x) { x.run({"HSET", x.counter(), "f", "1"}); }},
    {"at the int64 limit", rlock::errc::server_error,
     [](const half_write_ctx& x) { x.run({"SET", x.counter(), "9223372036854775807"}); }},
    // Tokens pass through Lua numbers (doubles): above 2^53 two holders could get the same one.
    {"above 2^53", rlock::errc::server_error,
     [](const half_write_ctx& x) { x.run({"SET", x.counter(), "9007199254740992"}); }},
};

/// Fresh acquire of `Lock` (take(l)) and, for reentrant kinds, re-entry of a leased hold.
template <class Lock>
void add_counter_cases(std::vector<half_write_case>& out, const char* kind, bool reentrant,
                       void (*take)(Lock&)) {
    for (const bad_counter& b : bad_counters) {
        out.push_back({std::string(kind) + ": a fenced acquire whose counter is " + b.label, b.want,
                       [&b, take](half_write_ctx& x) {
                           Lock l(x.c, x.name, fenced);
                           b.make(x);
                           x.far_ttls();
                           x.checkpoint();
                           take(l);
                       }});
        if (!reentrant) continue;
        out.push_back({std::string(kind) + ": a fenced re-entry whose counter is " + b.label,
                       b.want, [&b, take](half_write_ctx& x) {
                           Lock l(x.c, x.name, fenced);
                           take(l);
                           x.run({"DEL", x.counter()});
                           b.make(x);
                           x.far_ttls();
                           x.checkpoint();
                           take(l);
                       }});
    }
}

std::vector<half_write_case> half_write_cases() {
    using rlock::errc;
    std::vector<half_write_case> out;
    add_counter_cases<rlock::mutex>(out, "mutex", false, [](rlock::mutex& l) { l.lock(60s); });
    add_counter_cases<rlock::reentrant_lock>(out, "reentrant_lock", true,
                                             [](rlock::reentrant_lock& l) { l.lock(60s); });
    add_counter_cases<rlock::fair_lock>(out, "fair_lock", true,
                                        [](rlock::fair_lock& l) { l.lock(60s); });
    add_counter_cases<rlock::read_write_lock>(
        out, "read_write_lock read", true, [](rlock::read_write_lock& l) { l.lock_shared(60s); });
    add_counter_cases<rlock::read_write_lock>(out, "read_write_lock write", true,
                                              [](rlock::read_write_lock& l) { l.lock(60s); });

    // A dead waiter (deadline long past) in the fair queue: a script that evicts it writes.
    auto dead_waiter = [](const half_write_ctx& x) {
        x.run({"RPUSH", x.queue(), "dead:1"});
        x.run({"ZADD", x.timeouts(), "1", "dead:1"});
    };
    out.push_back({"fair_lock: an acquire on a string key, with a dead waiter queued",
                   errc::wrong_type, [=](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       x.run({"SET", x.name, "not a hash"});
                       dead_waiter(x);
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});
    out.push_back({"fair_lock: an acquire whose queue is a string", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       x.run({"SET", x.queue(), "not a list"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});
    out.push_back({"fair_lock: an acquire whose deadlines are a hash", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       x.run({"RPUSH", x.queue(), "dead:1"});
                       x.run({"HSET", x.timeouts(), "dead:1", "1"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});
    out.push_back({"fair_lock: a re-entry whose count is not an integer, with a dead waiter queued",
                   errc::server_error, [=](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       l.lock(60s);
                       x.run({"HSET", x.name, x.holder(), "abc"});
                       dead_waiter(x);
                       x.far_ttls();
                       x.checkpoint();
                       l.lock(60s);
                   }});
    out.push_back({"fair_lock: a release whose queue is a string", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       l.lock(60s);
                       x.run({"SET", x.queue(), "not a list"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock();
                   }});
    out.push_back({"fair_lock: a release whose deadlines are a hash", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       l.lock(60s);
                       x.run({"RPUSH", x.queue(), "dead:1"});
                       x.run({"HSET", x.timeouts(), "dead:1", "1"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock();
                   }});

    // Reentry counts HINCRBY refuses, on each hash kind's re-entry.
    const std::pair<const char*, const char*> bad_counts[] = {
        {"not an integer", "abc"},
        {"a fraction", "2.5"},
        {"at the int64 limit", "9223372036854775807"}};
    for (const auto& [what, value] : bad_counts) {
        const std::string v = value;
        out.push_back({std::string("reentrant_lock: a re-entry whose count is ") + what,
                       errc::server_error, [v](half_write_ctx& x) {
                           rlock::reentrant_lock l(x.c, x.name);
                           l.lock(60s);
                           x.run({"HSET", x.name, x.holder(), v});
                           x.far_ttls();
                           x.checkpoint();
                           l.lock(60s);
                       }});
        out.push_back({std::string("read_write_lock read: a re-entry whose count is ") + what,
                       errc::server_error, [v](half_write_ctx& x) {
                           rlock::read_write_lock l(x.c, x.name);
                           l.lock_shared(60s);
                           x.run({"HSET", x.name, x.holder(), v});
                           x.far_ttls();
                           x.checkpoint();
                           l.lock_shared(60s);
                       }});
        out.push_back({std::string("read_write_lock write: a re-entry whose count is ") + what,
                       errc::server_error, [v](half_write_ctx& x) {
                           rlock::read_write_lock l(x.c, x.name);
                           l.lock(60s);
                           x.run({"HSET", x.name, x.holder() + ":write", v});
                           x.far_ttls();
                           x.checkpoint();
                           l.lock(60s);
                       }});
    }

    // Lock keys of another type, on each hash kind's acquire: WRONGTYPE before any write.
    out.push_back({"reentrant_lock: an acquire on a string key", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::reentrant_lock l(x.c, x.name, fenced);
                       x.run({"SET", x.name, "not a hash"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});
    out.push_back({"read_write_lock read: an acquire on a string key", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name, fenced);
                       x.run({"SET", x.name, "not a hash"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock_shared();
                   }});
    out.push_back({"read_write_lock write: an acquire on a string key", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name, fenced);
                       x.run({"SET", x.name, "not a hash"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});

    // Inner releases (two levels held) whose count HINCRBY -1 refuses.
    out.push_back({"reentrant_lock: an inner release whose count is a fraction", errc::server_error,
                   [](half_write_ctx& x) {
                       rlock::reentrant_lock l(x.c, x.name);
                       l.lock(60s);
                       l.lock(60s);
                       x.run({"HSET", x.name, x.holder(), "2.5"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock();
                   }});
    out.push_back({"fair_lock: an inner release whose count is a fraction", errc::server_error,
                   [](half_write_ctx& x) {
                       rlock::fair_lock l(x.c, x.name);
                       l.lock(60s);
                       l.lock(60s);
                       x.run({"HSET", x.name, x.holder(), "2.5"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock();
                   }});
    // The read_write_lock's two sides over counts Lua reads as numbers: "2.0" as 2 (the read
    // side deleted its level-2 key before HINCRBY refused the count), "1.0" as 1 (taken for the
    // last level, the inner release deleted the lock its owner still held: a probe found it).
    for (const char* count : {"2.0", "2.5", "1.0"}) {
        for (const bool write : {false, true}) {
            out.push_back({std::string("read_write_lock ") + (write ? "write" : "read") +
                               ": an inner release whose count is " + count,
                           errc::server_error, [write, v = std::string(count)](half_write_ctx& x) {
                               rlock::read_write_lock l(x.c, x.name);
                               for (int level = 0; level < 2; ++level) {
                                   if (write) {
                                       l.lock(60s);
                                   } else {
                                       l.lock_shared(60s);
                                   }
                               }
                               x.run({"HSET", x.name, write ? x.holder() + ":write" : x.holder(), v});
                               x.far_ttls();
                               x.checkpoint();
                               if (write) {
                                   l.unlock();
                               } else {
                                   l.unlock_shared();
                               }
                           }});
        }
    }

    // A hash that is not a read/write lock: no mode (a Redisson RLock at its name) or a mode
    // that is neither read nor write. Before, the first was taken as free and joined (its
    // holder and ours both held it), the second refused for ever as if held.
    out.push_back({"read_write_lock write: an acquire on a hash without a mode", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name);
                       x.run({"HSET", x.name, "3d04:1", "1"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock();
                   }});
    out.push_back({"read_write_lock read: an acquire on a hash without a mode", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name, fenced);
                       x.run({"HSET", x.name, "3d04:1", "1"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock_shared();
                   }});
    out.push_back({"read_write_lock read: an acquire on a hash whose mode is neither", errc::wrong_type,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name);
                       x.run({"HSET", x.name, "mode", "upgrade"});
                       x.far_ttls();
                       x.checkpoint();
                       (void)l.try_lock_shared();
                   }});

    // Releases of a key replaced by another type: "not held" (lock_lost), nothing touched.
    out.push_back({"mutex: a release of a key that became a hash", errc::lock_lost,
                   [](half_write_ctx& x) {
                       rlock::mutex l(x.c, x.name);
                       l.lock(60s);
                       x.run({"DEL", x.name});
                       x.run({"HSET", x.name, "f", "1"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock();
                   }});
    out.push_back({"read_write_lock read: a release of a key that became a string", errc::lock_lost,
                   [](half_write_ctx& x) {
                       rlock::read_write_lock l(x.c, x.name);
                       l.lock_shared(60s);
                       x.run({"DEL", x.name});
                       x.run({"SET", x.name, "not a hash"});
                       x.far_ttls();
                       x.checkpoint();
                       l.unlock_shared();
                   }});

    // force_unlock deletes whoever holds the lock, never a key that is not a lock of its kind:
    // that is someone else's data. Before, each of these deleted it and answered true.
    using make_key = void (*)(half_write_ctx&);
    const std::pair<const char*, make_key> foreign[] = {
        {"a list", [](half_write_ctx& x) { x.run({"RPUSH", x.name, "a", "b"}); }},
        {"a hash (a Redisson lock at a mutex's name)",
         [](half_write_ctx& x) { x.run({"HSET", x.name, "3d04:1", "1"}); }},
        {"a string", [](half_write_ctx& x) { x.run({"SET", x.name, "not a hash"}); }}};
    for (const auto& [what, make] : foreign) {
        const std::string shape = what;
        auto setup = [make = make](half_write_ctx& x) {
            make(x);
            x.far_ttls();
            x.checkpoint();
        };
        if (shape.rfind("a string", 0) != 0) {
            out.push_back({"mutex: force_unlock of " + shape, errc::wrong_type, [setup](half_write_ctx& x) {
                               setup(x);
                               (void)rlock::mutex(x.c, x.name).force_unlock();
                           }});
        }
        if (shape.rfind("a hash", 0) != 0) {
            out.push_back({"reentrant_lock: force_unlock of " + shape, errc::wrong_type,
                           [setup](half_write_ctx& x) {
                               setup(x);
                               (void)rlock::reentrant_lock(x.c, x.name).force_unlock();
                           }});
            out.push_back({"fair_lock: force_unlock of " + shape, errc::wrong_type, [setup](half_write_ctx& x) {
                               setup(x);
                               (void)rlock::fair_lock(x.c, x.name).force_unlock();
                           }});
            out.push_back({"read_write_lock: force_unlock of " + shape, errc::wrong_type,
                           [setup](half_write_ctx& x) {
                               setup(x);
                               (void)rlock::read_write_lock(x.c, x.name).force_unlock();
                           }});
        }
    }

    // multi_lock's one-script release: a bad count in its second part must not leave the first
    // part released. (Told as that error, as the reentrant_lock's own release above is: a part
    // that answered an error is not a part lost.)
    out.push_back({"multi_lock: a release whose second part's count is not an integer",
                   errc::server_error, [](half_write_ctx& x) {
                       rlock::mutex a(x.c, x.name + "a");
                       rlock::reentrant_lock b(x.c, x.name + "b");
                       rlock::multi_lock both{a, b};
                       both.lock(60s);
                       x.run({"HSET", x.name + "b", x.holder(), "abc"});
                       x.far_ttls();
                       x.checkpoint();
                       both.unlock();
                   }});
    return out;
}

TEST(scripts, a_refused_call_leaves_every_key_as_it_found_it) {
    int i = 0;
    for (const half_write_case& t : half_write_cases()) {
        SCOPED_TRACE(t.label);
        scratch().cmd({"FLUSHALL"});
        rlock_test::lost_log lost;
        rlock::client_options o = scratch().options();
        o.on_lock_lost = lost.handler();
        rlock::client c(o);
        rlock_test::key_states before;
        half_write_ctx x{c, scratch(), "half_write_" + std::to_string(i++), {}};
        bool reached = false;
        x.checkpoint = [&] {
            before = snapshot(scratch());
            reached = true;
        };
        rlock::errc got{};
        std::string what;
        try {
            t.run(x);
        } catch (const rlock::error& e) {
            got = e.value();
            what = e.what();
        }
        if (got == rlock::errc{} && lost.calls.load() > 0) {
            got = static_cast<rlock::errc>(lost.code.load());
            what = lost.last_message;
        }
        EXPECT_EQ(static_cast<int>(got), static_cast<int>(t.want)) << what;
        EXPECT_NE(what.find(x.name), std::string::npos) << what;
        EXPECT_NE(what.find(c.server()), std::string::npos) << what;
        ASSERT_TRUE(reached) << "the setup failed: " << what;
        expect_unchanged(before, snapshot(scratch()));
    }
}

/// The renewal scripts read with pcall: a key of another type is "gone" (0), never an error
/// midway through a batch, and nothing is touched.
TEST(scripts, a_renewal_of_keys_of_another_type_answers_gone_and_touches_nothing) {
    namespace d = rlock::detail;
    const redis_server& s = scratch();
    s.cmd({"FLUSHALL"});
    s.cmd({"SET", "renew:string", "x", "PX", "600000"});
    s.cmd({"HSET", "renew:hash", "holder", "1"});
    s.cmd({"PEXPIRE", "renew:hash", "600000"});
    s.cmd({"RPUSH", "renew:list", "holder"});
    s.cmd({"PEXPIRE", "renew:list", "600000"});
    const std::pair<const d::script*, std::vector<const char*>> calls[] = {
        {&d::mutex_kind::renew_script(), {"renew:hash", "renew:list"}},
        {&d::reentrant_kind::renew_script(), {"renew:string", "renew:list"}},
        {&d::rw_read_kind::renew_script(), {"renew:string", "renew:list"}},
        {&d::rw_write_kind::renew_script(), {"renew:string", "renew:list"}},
    };
    d::context_ptr c(redisConnect("127.0.0.1", s.port()));
    ASSERT_TRUE(c && !c->err);
    for (const auto& [script, keys] : calls) {
        const auto before = snapshot(s);
        d::script_call call(*script, {keys[0], keys[1]}, {"30000", "holder", "holder"});
        d::reply_ptr r = d::run_script(d::connection{c.get()}, call, "renew", "test");
        ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
        ASSERT_EQ(r->elements, 2u);
        EXPECT_EQ(r->element[0]->integer, 0);
        EXPECT_EQ(r->element[1]->integer, 0);
        expect_unchanged(before, snapshot(s));
    }
}

}  // namespace
