// rlock::client: URIs and options, connecting (errors, AUTH with ACL users, unix sockets, db),
// and what destruction does.
#include <gtest/gtest.h>
#include <locale.h>
#include <signal.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/kinds.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_server;

namespace {

rlock::errc code_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const rlock::error& e) {
        return e.value();
    }
    return rlock::errc{};
}

// hiredis writes with write(2): without this a write to a connection Redis closed would end the
// process with SIGPIPE (seen in CI: fault_test connection_kills_under_load, under TSan).
TEST(client, sets_sigpipe_to_ignored_when_at_its_default_and_leaves_a_program_handler_alone) {
    redis_server s;
    struct sigaction saved {};
    ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &saved), 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ASSERT_EQ(::sigaction(SIGPIPE, &dfl, nullptr), 0);
    {
        rlock::client c(s.options());
        struct sigaction now {};
        ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
        EXPECT_EQ(now.sa_handler, SIG_IGN);
    }
    struct sigaction mine {};
    mine.sa_handler = [](int) {};
    sigemptyset(&mine.sa_mask);
    ASSERT_EQ(::sigaction(SIGPIPE, &mine, nullptr), 0);
    {
        rlock::client c(s.options());
        struct sigaction now {};
        ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
        EXPECT_EQ(now.sa_handler, mine.sa_handler);
    }
    ::sigaction(SIGPIPE, &saved, nullptr);
}

TEST(client_uri, parses_host_port_db_and_credentials) {
    auto o = rlock::client_options::from_uri("redis://alice:s%40cret@cache.internal:6390/3");
    EXPECT_EQ(o.host, "cache.internal");
    EXPECT_EQ(o.port, 6390);
    EXPECT_EQ(o.db, 3);
    EXPECT_EQ(o.username, "alice");
    EXPECT_EQ(o.password, "s@cret");
    EXPECT_TRUE(o.unix_socket.empty());

    o = rlock::client_options::from_uri("redis://secret@10.0.0.5");
    EXPECT_EQ(o.host, "10.0.0.5");
    EXPECT_EQ(o.port, 6379);
    EXPECT_EQ(o.username, "");
    EXPECT_EQ(o.password, "secret");

    o = rlock::client_options::from_uri("redis://[::1]:7000");
    EXPECT_EQ(o.host, "::1");
    EXPECT_EQ(o.port, 7000);

    // A '?' in the password is not a query string.
    o = rlock::client_options::from_uri("redis://:pa%3Fss?word@cache.internal:6390/1");
    EXPECT_EQ(o.password, "pa?ss?word");
    EXPECT_EQ(o.host, "cache.internal");
    EXPECT_EQ(o.db, 1);

    o = rlock::client_options::from_uri("unix:///run/redis/redis.sock?db=2");
    EXPECT_EQ(o.unix_socket, "/run/redis/redis.sock");
    EXPECT_EQ(o.db, 2);
}

TEST(client_uri, parses_a_sentinel_list_and_the_master_name) {
    auto o = rlock::client_options::from_uri(
        "redis-sentinel://alice:pw@10.0.0.1:26380,[::1],s3.internal:26381/orders-master/4");
    ASSERT_EQ(o.sentinels.size(), 3u);
    EXPECT_EQ(o.sentinels[0].host, "10.0.0.1");
    EXPECT_EQ(o.sentinels[0].port, 26380);
    EXPECT_EQ(o.sentinels[1].host, "::1");
    EXPECT_EQ(o.sentinels[1].port, 26379);  // Sentinel's default port
    EXPECT_EQ(o.sentinels[2].host, "s3.internal");
    EXPECT_EQ(o.sentinels[2].port, 26381);
    EXPECT_EQ(o.sentinel_master, "orders-master");
    EXPECT_EQ(o.db, 4);
    EXPECT_EQ(o.username, "alice");  // the master's credentials
    EXPECT_EQ(o.password, "pw");
    // A plain URI parsed over sentinel options leaves no sentinel behind.
    o = rlock::client_options::from_uri("redis://h:1", o);
    EXPECT_TRUE(o.sentinels.empty());
    EXPECT_TRUE(o.sentinel_master.empty());

    for (const char* bad : {"redis-sentinel://h:1", "redis-sentinel://h:1/", "redis-sentinel://h:1,/m",
                            "redis-sentinel://h:0/m", "redis-sentinel:///m", "redis-sentinel://h/m/x"}) {
        EXPECT_EQ(code_of([&] { (void)rlock::client_options::from_uri(bad); }),
                  rlock::errc::invalid_argument)
            << bad;
    }
    rlock::client_options half;
    half.sentinels.push_back({"127.0.0.1", 1});  // no master name: refused before connecting
    EXPECT_EQ(code_of([&] { rlock::client c(half); }), rlock::errc::invalid_argument);
    half.sentinels.clear();
    half.sentinel_master = "m";  // a master name without sentinels: a half-done config
    EXPECT_EQ(code_of([&] { rlock::client c(half); }), rlock::errc::invalid_argument);
}

TEST(client_uri, parses_cluster_seed_nodes) {
    auto o = rlock::client_options::from_uri("redis-cluster://bob:s%40cret@10.0.0.1:7000,[::1],n3:7002");
    EXPECT_TRUE(o.cluster);
    ASSERT_EQ(o.cluster_nodes.size(), 3u);
    EXPECT_EQ(o.cluster_nodes[0].host, "10.0.0.1");
    EXPECT_EQ(o.cluster_nodes[0].port, 7000);
    EXPECT_EQ(o.cluster_nodes[1].host, "::1");
    EXPECT_EQ(o.cluster_nodes[1].port, 6379);  // a Redis server's default port
    EXPECT_EQ(o.cluster_nodes[2].host, "n3");
    EXPECT_EQ(o.cluster_nodes[2].port, 7002);
    EXPECT_EQ(o.username, "bob");
    EXPECT_EQ(o.password, "s@cret");
    EXPECT_EQ(o.db, 0);
    o = rlock::client_options::from_uri("redis://h:1", o);  // nothing of the cluster is left
    EXPECT_FALSE(o.cluster);
    EXPECT_TRUE(o.cluster_nodes.empty());

    for (const char* bad : {"redis-cluster://", "redis-cluster://h:1,", "redis-cluster://h:1/2",
                            "redis-cluster://h:0"}) {
        EXPECT_EQ(code_of([&] { (void)rlock::client_options::from_uri(bad); }),
                  rlock::errc::invalid_argument)
            << bad;
    }
    // Options that cannot describe a cluster are refused before anything is sent.
    rlock::client_options c;
    c.cluster = true;
    c.db = 1;
    EXPECT_EQ(code_of([&] { rlock::client x(c); }), rlock::errc::invalid_argument);
    c.db = 0;
    c.sentinels.push_back({"127.0.0.1", 1});
    c.sentinel_master = "m";
    EXPECT_EQ(code_of([&] { rlock::client x(c); }), rlock::errc::invalid_argument);
    c.sentinels.clear();
    c.sentinel_master.clear();
    c.cluster_nodes.push_back({"", 7000});
    EXPECT_EQ(code_of([&] { rlock::client x(c); }), rlock::errc::invalid_argument);
    c.cluster = false;
    c.cluster_nodes = {{"127.0.0.1", 7000}};  // seeds without cluster: a half-done config
    EXPECT_EQ(code_of([&] { rlock::client x(c); }), rlock::errc::invalid_argument);
}

TEST(client_uri, keeps_the_other_fields_of_the_base_options) {
    rlock::client_options base;
    base.lock_watchdog_timeout = 5s;
    base.pool_size = 3;
    auto o = rlock::client_options::from_uri("redis://h:1", base);
    EXPECT_EQ(o.lock_watchdog_timeout, 5s);
    EXPECT_EQ(o.pool_size, 3u);
}

TEST(client_uri, rejects_malformed_uris_without_echoing_the_password) {
    for (const char* bad : {"http://h:1", "redis://", "redis://h:99999", "redis://h:x",
                            "redis://h:1/db", "redis://[::1", "unix://relative.sock",
                            "unix:///s.sock?db=x", "redis://u:p%4@h", "redis://h:"}) {
        try {
            (void)rlock::client_options::from_uri(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), rlock::errc::invalid_argument) << bad;
        }
    }
    try {
        (void)rlock::client_options::from_uri("redis://user:hunter2@h:notaport");
    } catch (const rlock::error& e) {
        EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
    }
}

// What is wrong is said in the user's terms, not as the parser stumbled on it.
TEST(client_uri, a_query_string_or_tls_scheme_is_refused_saying_so) {
    auto message_of = [](const char* uri) {
        try {
            (void)rlock::client_options::from_uri(uri);
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.code(), rlock::errc::invalid_argument) << uri;
            return std::string(e.what());
        }
        ADD_FAILURE() << uri << " was accepted";
        return std::string();
    };
    for (const char* uri : {"redis://h:1?db=2", "redis://h?db=2", "redis-sentinel://s:1/m?x=1",
                            "redis-cluster://h:1?timeout=3"}) {
        const std::string what = message_of(uri);
        EXPECT_NE(what.find("query parameters"), std::string::npos) << what;
        EXPECT_EQ(what.find("not a number"), std::string::npos) << what;
    }
    EXPECT_NE(message_of("redis://h:1?db=2").find("redis://host:port/2"), std::string::npos);
    for (const char* uri : {"rediss://h:1", "rediss://user:hunter2@h:1/2"}) {
        const std::string what = message_of(uri);
        EXPECT_NE(what.find("TLS"), std::string::npos) << what;
        EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
    }
}

TEST(client_options, nonsense_is_invalid_argument_before_connecting) {
    rlock::client_options o;
    o.port = 1;  // nothing listens; must not even be tried
    auto with = [&](auto change) {
        rlock::client_options copy = o;
        change(copy);
        return code_of([&] { rlock::client c(copy); });
    };
    EXPECT_EQ(with([](auto& x) { x.pool_size = 0; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([](auto& x) { x.command_timeout = 0ms; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([](auto& x) { x.lock_watchdog_timeout = 1ms; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([](auto& x) { x.port = 70000; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([](auto& x) { x.host = ""; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([](auto& x) { x.local_handoff_time = -5ms; }), rlock::errc::invalid_argument);
    // Past 100 years (a lease's limit) a duration overflows the client's clock arithmetic: with
    // a watchdog timeout of 400 years every watched hold was told lost as it was taken.
    const std::chrono::milliseconds centuries = std::chrono::hours(24 * 365 * 400);
    EXPECT_EQ(with([&](auto& x) { x.lock_watchdog_timeout = centuries; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([&](auto& x) { x.command_timeout = centuries; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([&](auto& x) { x.connect_timeout = centuries; }), rlock::errc::invalid_argument);
    EXPECT_EQ(with([&](auto& x) { x.local_handoff_time = centuries; }), rlock::errc::invalid_argument);
    // 50 years is allowed: the client goes on to connect (nothing listens on port 1).
    EXPECT_EQ(with([](auto& x) { x.lock_watchdog_timeout = std::chrono::hours(24 * 365 * 50); }),
              rlock::errc::connection_failed);
}

TEST(lock_options, a_fair_lock_wait_timeout_not_positive_or_over_100_years_is_invalid_argument) {
    rlock::client c(rlock_test::server().options());
    rlock::lock_options lo;
    auto code = [&](std::chrono::milliseconds t) {
        lo.fair_lock_wait_timeout = t;
        return code_of([&] { rlock::fair_lock f(c, rlock_test::name(), lo); });
    };
    EXPECT_EQ(code(0ms), rlock::errc::invalid_argument);
    EXPECT_EQ(code(std::chrono::hours(24 * 365 * 400)), rlock::errc::invalid_argument);
    EXPECT_EQ(code(std::chrono::hours(24 * 365 * 50)), rlock::errc{});
}

TEST(client_connect, an_unreachable_server_is_connection_failed_naming_it) {
    const int port = rlock_test::free_port();
    try {
        rlock::client c("redis://127.0.0.1:" + std::to_string(port));
        FAIL() << "connected to nothing";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::connection_failed);
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)),
                  std::string::npos)
            << e.what();
    }
}

TEST(client_connect, password_and_acl_user_are_sent_on_every_connection) {
    redis_server s({"--requirepass", "top-secret"});
    // An ACL user that may only do what locks need, on keys and channels of its prefix. The
    // channels appear as key patterns too: scripts declare them in KEYS (as Redisson does).
    rlock::detail::context_ptr admin(redisConnect("127.0.0.1", s.port()));
    rlock::detail::command(admin.get(), {"AUTH", "top-secret"});
    auto r = rlock::detail::command(
        admin.get(), {"ACL", "SETUSER", "locker", "on", ">pw", "~app:*", "~redisson_lock_token:{app:*",
                      "~rlock_lock__channel:{app:*", "~redisson_lock__channel:{app:*",
                      "&rlock_lock__channel:{app:*", "&redisson_lock__channel:{app:*", "+@connection",
                      "+set", "+get", "+del", "+exists", "+pttl", "+pexpire", "+publish",
                      "+subscribe", "+unsubscribe", "+evalsha", "+eval", "+hexists", "+hget", "+hincrby",
                      "+incr"});
    ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << rlock::detail::reply_text(r.get());

    EXPECT_EQ(code_of([&] { rlock::client c("redis://wrong@127.0.0.1:" + std::to_string(s.port())); }),
              rlock::errc::auth_failed);
    EXPECT_EQ(code_of([&] { rlock::client c("redis://127.0.0.1:" + std::to_string(s.port())); }),
              rlock::errc::auth_failed);

    rlock::client c("redis://locker:pw@127.0.0.1:" + std::to_string(s.port()));
    rlock::mutex m(c, "app:orders");
    rlock::reentrant_lock l(c, "app:stock");
    m.lock();
    l.lock();
    // A waiter on another thread: its wake-up comes through the subscriber, which AUTHs too.
    bool waiter_got_it = false;
    std::thread waiter([&] {
        waiter_got_it = m.try_lock_for(3s);
        if (waiter_got_it) m.unlock();
    });
    std::this_thread::sleep_for(200ms);
    m.unlock();
    l.unlock();
    waiter.join();
    EXPECT_TRUE(waiter_got_it);
    EXPECT_EQ(rlock::detail::command(admin.get(), {"EXISTS", "app:stock"})->integer, 0);
}

TEST(client_connect, unix_socket_and_db_are_honoured) {
    redis_server s;
    rlock::client c("unix://" + s.socket_path() + "?db=5");
    EXPECT_EQ(c.server(), s.socket_path());
    rlock::mutex m(c, "in-db-5");
    m.lock();
    EXPECT_EQ(s.integer({"EXISTS", "in-db-5"}), 0);  // not in db 0
    rlock::detail::context_ptr raw(redisConnect("127.0.0.1", s.port()));
    rlock::detail::command(raw.get(), {"SELECT", "5"});
    auto r = rlock::detail::command(raw.get(), {"EXISTS", "in-db-5"});
    EXPECT_EQ(r->integer, 1);
    m.unlock();
}

// A database the server does not have is not an authentication failure.
TEST(client_connect, a_db_the_server_lacks_is_a_server_error_naming_select_and_the_option) {
    redis_server s;  // 16 databases
    try {
        rlock::client c("redis://127.0.0.1:" + std::to_string(s.port()) + "/99");
        FAIL() << "db 99 accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.code(), rlock::errc::server_error) << e.what();
        EXPECT_NE(e.cause().find("SELECT 99"), std::string::npos) << e.what();
        EXPECT_NE(e.cause().find("client_options::db"), std::string::npos) << e.what();
        EXPECT_EQ(e.server(), "127.0.0.1:" + std::to_string(s.port()));
    }
}

TEST(client_lifetime, destruction_leaves_held_locks_to_expire_and_stops_renewing) {
    redis_server s;
    {
        rlock::client_options o = s.options();
        o.lock_watchdog_timeout = 600ms;
        rlock::client c(o);
        rlock::reentrant_lock l(c, "left-held");
        l.lock();
    }  // destroyed while held
    EXPECT_EQ(s.integer({"EXISTS", "left-held"}), 1) << "destruction must not release";
    EXPECT_TRUE(eventually([&] { return s.integer({"EXISTS", "left-held"}) == 0; }, 3s))
        << "renewal went on after the client was destroyed";
}

TEST(client_lifetime, destroying_the_client_inside_on_lock_lost_is_safe) {
    redis_server s;
    std::unique_ptr<rlock::client> c;
    std::atomic<bool> destroyed{false};
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 300ms;
    o.on_lock_lost = [&](std::string_view, const rlock::error&) {
        c.reset();  // on the watchdog thread: must not join itself
        destroyed = true;
    };
    c = std::make_unique<rlock::client>(o);
    {
        rlock::mutex m(*c, "doomed");
        m.lock();
        s.cmd({"DEL", "doomed"});
        ASSERT_TRUE(eventually([&] { return destroyed.load(); }));
    }
    EXPECT_EQ(c, nullptr);
}

// A stopped server: try_lock() fails at once with a clear error; a wait rides the outage out to
// its deadline and then fails with the same clear error (issue 31: never false, which would say
// the lock was held); lock(), which has no deadline, waits until the server is back.
TEST(client_lifetime, a_stopped_server_fails_bounded_lock_calls_with_a_clear_error_and_lock_waits_for_it) {
    auto s = std::make_unique<redis_server>();
    rlock::client_options o = s->options();
    o.connect_timeout = 200ms;
    o.command_timeout = 200ms;
    rlock::client c(o);
    rlock::mutex m(c, "gone");
    const std::string where = c.server();
    s->kill_now();
    auto clear = [&](const rlock::error& e) {
        EXPECT_TRUE(e.code() == rlock::errc::connection_failed || e.code() == rlock::errc::timeout)
            << e.what();
        EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("gone"), std::string::npos) << e.what();
        EXPECT_EQ(e.lock(), "gone") << e.what();
        EXPECT_EQ(e.server(), where) << e.what();
    };
    try {
        (void)m.try_lock();
        FAIL() << "try_lock answered on a dead server";
    } catch (const rlock::error& e) {
        clear(e);
    }
    const auto start = std::chrono::steady_clock::now();
    try {
        (void)m.try_lock_for(600ms);
        FAIL() << "try_lock_for answered on a dead server";
    } catch (const rlock::error& e) {
        clear(e);
        EXPECT_GE(std::chrono::steady_clock::now() - start, 550ms) << "gave up before its deadline";
    }
    auto locked = std::async(std::launch::async, [&] {
        m.lock();
        m.unlock();
        return true;
    });
    EXPECT_EQ(locked.wait_for(500ms), std::future_status::timeout) << "lock() returned on a dead server";
    s->restart();
    ASSERT_EQ(locked.wait_for(10s), std::future_status::ready) << "lock() still waits after the server came back";
    EXPECT_TRUE(locked.get());
}

// The reason on_lock_lost is given names the lock and the server once, with the cause of the
// failed renewal inside it, not a second composed message.
TEST(client_lifetime, a_loss_to_an_unreachable_server_is_told_naming_the_lock_once) {
    auto s = std::make_unique<redis_server>();
    rlock_test::lost_log lost;
    rlock::client_options o = s->options();
    o.connect_timeout = 100ms;
    o.command_timeout = 100ms;
    o.lock_watchdog_timeout = 300ms;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "unreachable-hold");
    m.lock();
    const std::string where = c.server();
    s.reset();
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 5s));
    std::lock_guard<std::mutex> g(lost.mu);
    EXPECT_EQ(lost.last_lock, "unreachable-hold");
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost));
    const std::string& what = lost.last_message;
    EXPECT_EQ(what.rfind("rlock: lock \"unreachable-hold\" on " + where + ": ", 0), 0u) << what;
    EXPECT_EQ(what.find("rlock:"), what.rfind("rlock:")) << "a message inside a message: " << what;
    m.unlock();  // unreachable still: told already, does not throw
}

}  // namespace

namespace {

long long evalsha_calls(redis_server& s) {
    const std::string info = s.text({"INFO", "commandstats"});
    const auto at = info.find("cmdstat_evalsha:calls=");
    if (at == std::string::npos) return 0;
    return std::atoll(info.c_str() + at + std::string("cmdstat_evalsha:calls=").size());
}

TEST(client_watchdog, renews_a_thousand_holds_with_ten_script_calls_per_tick) {
    redis_server s;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 3s;  // a tick every second
    rlock_test::lost_log lost;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    std::vector<std::unique_ptr<rlock::mutex>> locks;
    for (int i = 0; i < 1000; ++i) {
        locks.push_back(std::make_unique<rlock::mutex>(c, "many:" + std::to_string(i)));
        locks.back()->lock();
    }
    s.cmd({"CONFIG", "RESETSTAT"});
    std::this_thread::sleep_for(3500ms);  // three ticks at least, past the first lease
    const long long calls = evalsha_calls(s);
    EXPECT_GE(calls, 30);
    EXPECT_LE(calls, 40);  // 10 per tick (100 holds per call), 3 or 4 ticks
    EXPECT_EQ(lost.calls, 0) << lost.last_message;
    for (auto& l : locks) {
        ASSERT_FALSE(l->lost());
        ASSERT_GT(s.integer({"PTTL", l->name()}), 0);
    }
    for (auto& l : locks) l->unlock();
    EXPECT_EQ(s.integer({"DBSIZE"}), 0);
}

TEST(client_watchdog, no_renewal_reaches_redis_after_unlock_returns) {
    // A renewal in flight when a reentrant hold is unlocked, and the same thread (same holder
    // id) takes a short lease right after, would stretch that lease to the watchdog timeout.
    redis_server s;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 300ms;  // ticks every 100 ms
    rlock::client c(o);
    rlock::reentrant_lock l(c, "churn");
    const auto end = std::chrono::steady_clock::now() + 2s;
    int rounds = 0;
    while (std::chrono::steady_clock::now() < end) {
        l.lock();     // watched: in the next tick's batch
        l.unlock();   // must wait out a batch that carries it
        l.lock(60ms);  // leased: must keep its 60 ms
        const long long pttl = s.integer({"PTTL", "churn"});
        l.unlock();
        ASSERT_LE(pttl, 60) << "a renewal outlived unlock, round " << rounds;
        ++rounds;
    }
    EXPECT_GT(rounds, 100);
}

}  // namespace

namespace {

TEST(client_errors, the_error_type_keeps_its_parts_through_copies_and_moves) {
    const rlock::error e(rlock::errc::lock_lost, "orders", "127.0.0.1:7000", "expired");
    EXPECT_STREQ(e.what(), "rlock: lock \"orders\" on 127.0.0.1:7000: expired: lock lost");
    rlock::error moved_from = e;
    const rlock::error moved = std::move(moved_from);
    rlock::error assigned(rlock::errc::timeout, "x");
    assigned = std::move(moved_from);
    const std::vector<const rlock::error*> all = {&moved, &assigned, &moved_from};  // NOLINT(bugprone-use-after-move)
    for (const rlock::error* x : all) {
        EXPECT_EQ(x->value(), rlock::errc::lock_lost);
        EXPECT_EQ(x->lock(), "orders");
        EXPECT_EQ(x->server(), "127.0.0.1:7000");
        EXPECT_EQ(x->cause(), "expired");
        EXPECT_STREQ(x->what(), e.what());
    }
    // A bare message reads as std::system_error's: "<message>: <code's message>".
    const rlock::error bare(rlock::errc::invalid_argument, "pool_size must be at least 1");
    EXPECT_STREQ(bare.what(), "pool_size must be at least 1: invalid argument");
    EXPECT_EQ(bare.cause(), "pool_size must be at least 1");
    EXPECT_TRUE(bare.lock().empty());
    EXPECT_TRUE(bare.server().empty());
    // Empty parts are left out, as api.md says, with no empty field between two colons.
    EXPECT_STREQ(rlock::error(rlock::errc::timeout, "", "h:1", "").what(), "rlock: on h:1: timed out");
    EXPECT_STREQ(rlock::error(rlock::errc::timeout, "x", "", "").what(), "rlock: lock \"x\": timed out");
    EXPECT_STREQ(rlock::error(rlock::errc::timeout, "", "", "").what(), "rlock: timed out");
}

// hiredis writes an I/O error's text with strerror_r, in the program's locale: a program that
// calls setlocale under a German one read a paused server's timeout as "Die Ressource ist zur
// Zeit nicht verfügbar", which rlock took for a broken connection (connection_failed, and a
// semaphore's acquire sent again). The locale is built here (scripts/lib.sh installs locales
// and libc-l10n) and used on this thread only.
TEST(client_errors, a_timeout_is_a_timeout_in_any_locale) {
    redis_server own;
    const std::string sock = own.socket_path();  // in the server's own temporary directory
    const std::string dir = sock.substr(0, sock.rfind('/')) + "/locales";
    const std::string build = "mkdir -p " + dir + " && localedef -i de_DE -f UTF-8 " + dir +
                              "/de_DE.UTF-8 > /dev/null 2>&1";
    ASSERT_EQ(std::system(build.c_str()), 0) << "localedef failed: " << build;
    ASSERT_EQ(::setenv("LOCPATH", dir.c_str(), 1), 0);
    locale_t german = nullptr;
    {
#if defined(__SANITIZE_ADDRESS__)
        // glibc keeps what it allocates to load a locale for the process's life (LeakSanitizer
        // reports its LOCPATH list from __argz_add_sep): not rlock's.
        const __lsan::ScopedDisabler glibc_keeps_it;
#endif
        german = ::newlocale(LC_ALL_MASK, "de_DE.UTF-8", nullptr);
    }
    ::unsetenv("LOCPATH");
    ASSERT_NE(german, nullptr) << "the locale built in " << dir << " did not load";
    const std::string english = "Resource temporarily unavailable";
    ASSERT_NE(std::string(::strerror_l(EAGAIN, german)), english)
        << "no German text for EAGAIN: libc-l10n is missing";
    rlock::client_options o = own.options();
    o.command_timeout = std::chrono::milliseconds(300);
    rlock::client c(o);
    rlock::semaphore s(c, "german");
    ASSERT_TRUE(s.try_set_permits(1));
    own.pause();
    const locale_t before = ::uselocale(german);
    try {
        (void)s.try_acquire();
        ADD_FAILURE() << "an acquire on a paused server returned";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::timeout) << e.what();
    }
    ::uselocale(before);
    own.resume();
    ::freelocale(german);
}

TEST(client_errors, messages_name_the_server_and_the_cause_once) {
    redis_server s({"--requirepass", "pw"});
    try {
        rlock::client c("redis://wrong@127.0.0.1:" + std::to_string(s.port()));
        FAIL() << "wrong password accepted";
    } catch (const rlock::error& e) {
        const std::string what = e.what();
        EXPECT_EQ(what.rfind("rlock: on 127.0.0.1:" + std::to_string(s.port()) + ": AUTH: ", 0), 0u)
            << what;
        EXPECT_EQ(what.find("WRONGPASS"), what.rfind("WRONGPASS")) << "cause repeated: " << what;
    }
    try {
        (void)rlock::client_options::from_uri("http://x");
    } catch (const rlock::error& e) {
        EXPECT_EQ(std::string(e.what()).find("rlock::"), std::string::npos) << e.what();
    }
}


// ---- Events (client_options::listener, events.hpp) -----------------------------------------

template <class Lock>
class events : public rlock_test::kind_fixture<events<Lock>> {
protected:
    /// The kind a listener is told for Lock (read_write_lock: its write side).
    static std::string told_kind() {
        if constexpr (std::is_same_v<Lock, rlock::mutex>) return "mutex";
        if constexpr (std::is_same_v<Lock, rlock::reentrant_lock>) return "reentrant_lock";
        if constexpr (std::is_same_v<Lock, rlock::fair_lock>) return "fair_lock";
        return "read_write_lock.write";
    }
};
TYPED_TEST_SUITE(events, rlock_test::lock_kinds, rlock_test::kind_names);

// Issue 33.3: each kind tells the listener its acquisition (kind, hold id, wait, tries), its
// release (hold duration), a try that ran out and an asynchronous acquire cancelled — blocking
// and asynchronous alike; a client without a listener is told nothing.
TYPED_TEST(events, a_lock_tells_its_acquisition_wait_release_and_cancellation) {
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = this->options();
    o.listener = log;
    rlock::client mine(o), theirs(this->options());
    const std::string name = this->name();
    TypeParam m(mine, name), other(theirs, name);

    m.lock();
    const std::uint64_t id = m.hold_id();
    std::this_thread::sleep_for(30ms);
    m.unlock();
    auto acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 1u);
    EXPECT_EQ(acquired[0].lock, name);
    EXPECT_EQ(acquired[0].kind, this->told_kind());
    EXPECT_EQ(acquired[0].hold_id, id);
    EXPECT_GE(acquired[0].tries, 1u);
    EXPECT_FALSE(acquired[0].local);
    auto released = log->of("released");
    ASSERT_EQ(released.size(), 1u);
    EXPECT_EQ(released[0].hold_id, id);
    EXPECT_EQ(released[0].kind, this->told_kind());
    EXPECT_GE(released[0].held, 30ms);

    // Held by another client: a try that runs out is told with its wait and tries.
    other.lock();
    EXPECT_FALSE(m.try_lock_for(150ms));
    auto ended = log->of("wait_ended");
    ASSERT_EQ(ended.size(), 1u);
    EXPECT_EQ(ended[0].lock, name);
    EXPECT_EQ(ended[0].kind, this->told_kind());
    EXPECT_GE(ended[0].wait, 150ms);
    EXPECT_GE(ended[0].tries, 1u);
    EXPECT_FALSE(ended[0].cancelled);

    // Asynchronous: a cancelled acquire, then one that waits for the other's unlock.
    std::promise<void> settled;
    rlock::pending p = m.async_lock([&](std::exception_ptr, rlock::hold) { settled.set_value(); });
    std::this_thread::sleep_for(50ms);
    p.cancel();
    ASSERT_EQ(settled.get_future().wait_for(5s), std::future_status::ready);
    ended = log->of("wait_ended");
    ASSERT_EQ(ended.size(), 2u);
    EXPECT_TRUE(ended[1].cancelled);
    EXPECT_GE(ended[1].wait, 50ms);
    std::future<rlock::hold> f = m.async_lock(rlock::use_future);
    std::this_thread::sleep_for(100ms);
    other.unlock();
    rlock::hold h = f.get();
    acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 2u);
    EXPECT_EQ(acquired[1].hold_id, h.hold_id());
    EXPECT_GE(acquired[1].wait, 100ms);
    h.unlock();
    released = log->of("released");
    ASSERT_EQ(released.size(), 2u);
    EXPECT_EQ(released[1].hold_id, acquired[1].hold_id);
    EXPECT_EQ(log->count("lost"), 0u);
}

// The watchdog's ticks are told (holds renewed, how long), and a hold deleted under its owner
// is told lost — to the listener and still to on_lock_lost.
TEST(events_watchdog, renewals_are_told_and_a_deleted_hold_is_told_lost_to_both) {
    redis_server s;
    auto log = std::make_shared<rlock_test::event_log>();
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 300ms;  // a tick every 100 ms
    o.listener = log;
    o.on_lock_lost = lost.hold_handler();
    rlock::client c(o);
    rlock::mutex m(c, "events:renewed");
    m.lock();
    ASSERT_TRUE(eventually([&] { return log->count("renewed") >= 2; }, 3s));
    const auto renewed = log->of("renewed");
    EXPECT_EQ(renewed[0].holds, 1u);
    EXPECT_FALSE(renewed[0].message.empty());  // the server
    s.cmd({"DEL", "events:renewed"});
    ASSERT_TRUE(eventually([&] { return log->count("lost") == 1; }, 3s));
    const auto lost_events = log->of("lost");
    EXPECT_EQ(lost_events[0].lock, "events:renewed");
    EXPECT_EQ(lost_events[0].hold_id, m.hold_id());
    EXPECT_EQ(lost_events[0].code, static_cast<int>(rlock::errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(lost.last_hold_id.load(), m.hold_id());
    m.unlock();
    EXPECT_EQ(log->count("lost"), 1u);  // told once
    EXPECT_EQ(log->count("renewal_refused"), 0u);
}

// Local hand-off: a hold passed between two threads of the client is told as such — released
// handed on, acquired handed locally with no try.
TEST(events_watchdog, a_hold_handed_on_within_the_client_is_told_so) {
    redis_server s;
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = s.options();
    o.listener = log;
    o.local_handoff_time = 5s;  // the pass below comes 100 ms after the acquisition at Redis
    rlock::client c(o);
    rlock::mutex a(c, "events:handoff");
    a.lock();
    const std::uint64_t first = a.hold_id();
    std::atomic<bool> got{false};
    std::thread t([&] {
        rlock::mutex b(c, "events:handoff");
        got = b.try_lock_for(5s);
        if (got) b.unlock();
    });
    std::this_thread::sleep_for(100ms);  // b waits at the client's gate
    a.unlock();
    t.join();
    ASSERT_TRUE(got.load());
    const auto acquired = log->of("acquired"), released = log->of("released");
    ASSERT_EQ(acquired.size(), 2u);
    ASSERT_EQ(released.size(), 2u);
    // The unlocking thread tells its release after the pass, so b's events may come first:
    // matched by hold id, not by order.
    ASSERT_EQ(acquired[0].hold_id, first);
    const bool first_told_first = released[0].hold_id == first;
    const auto& handed_on = released[first_told_first ? 0 : 1];
    const auto& last = released[first_told_first ? 1 : 0];
    EXPECT_EQ(handed_on.hold_id, first);
    EXPECT_TRUE(handed_on.local) << "the first hold was handed on";
    EXPECT_TRUE(acquired[1].local) << "the second was handed locally";
    EXPECT_EQ(acquired[1].tries, 0u);
    EXPECT_GE(acquired[1].wait, 50ms);  // from b's call, made as the 100 ms began
    EXPECT_EQ(last.hold_id, acquired[1].hold_id);
    EXPECT_FALSE(last.local);
}

// A wait is told from its call, with the deadline counted from the same reading of the clock:
// one that ran out is never told shorter than the wait asked for, however late the acquisition
// got to its wait. Here a multi_lock's first attempt (one script for both parts) is held up 80 ms
// by the server; its head part's wait then ran out, and was told from the multi_lock's call.
TEST(events_watchdog, a_wait_that_ran_out_is_told_from_its_call_however_late_its_wait_began) {
    redis_server s;
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = s.options();
    o.listener = log;
    rlock::client mine(o), theirs(s.options());
    rlock::mutex a(mine, "events:late:a"), b(mine, "events:late:b"), held(theirs, "events:late:b");
    rlock::multi_lock both{a, b};
    both.lock();  // connected, scripts loaded: the pause below delays only the next attempt
    both.unlock();
    held.lock();
    log->clear();
    ASSERT_EQ(s.text({"CLIENT", "PAUSE", "80"}), "OK");
    EXPECT_FALSE(both.try_lock_for(150ms));
    const auto ended = log->of("wait_ended");
    ASSERT_EQ(ended.size(), 1u);
    EXPECT_EQ(ended[0].lock, "events:late:b");
    EXPECT_GE(ended[0].wait, 150ms);
    EXPECT_EQ(log->count("acquired"), 0u);
    held.unlock();
}

// Semaphores: permits taken and released are told (a semaphore's without a hold id, a permit's
// with its own), and waits that run out — blocking and asynchronous.
TEST(events_watchdog, semaphores_tell_their_permits_and_waits) {
    redis_server s;
    auto log = std::make_shared<rlock_test::event_log>();
    rlock::client_options o = s.options();
    o.listener = log;
    rlock::client c(o);
    rlock::semaphore sem(c, "events:sem");
    ASSERT_TRUE(sem.try_set_permits(1));
    sem.acquire();
    EXPECT_FALSE(sem.try_acquire_for(100ms));
    EXPECT_FALSE(sem.async_try_acquire_for(100ms, rlock::use_future).get());
    sem.release();
    auto acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 1u);
    EXPECT_EQ(acquired[0].kind, "semaphore");
    EXPECT_EQ(acquired[0].lock, "events:sem");
    EXPECT_EQ(acquired[0].tries, 1u);
    auto ended = log->of("wait_ended");
    ASSERT_EQ(ended.size(), 2u);
    EXPECT_EQ(ended[0].kind, "semaphore");
    EXPECT_GE(ended[0].wait, 100ms);
    EXPECT_GE(ended[1].wait, 100ms);
    EXPECT_GE(ended[1].tries, 1u);
    ASSERT_EQ(log->count("released"), 1u);

    log->clear();
    rlock::permit_expirable_semaphore permits(c, "events:permits");
    ASSERT_TRUE(permits.try_set_permits(1));
    rlock::permit p = permits.acquire();
    const std::uint64_t id = p.hold_id();
    rlock::permit q = permits.async_try_acquire_for(100ms, 1, rlock::use_future).get();
    EXPECT_FALSE(q);
    p.release();
    acquired = log->of("acquired");
    ASSERT_EQ(acquired.size(), 1u);
    EXPECT_EQ(acquired[0].kind, "permit");
    EXPECT_EQ(acquired[0].hold_id, id);
    ASSERT_EQ(log->count("wait_ended"), 1u);
    const auto released = log->of("released");
    ASSERT_EQ(released.size(), 1u);
    EXPECT_EQ(released[0].hold_id, id);
}

// A listener that throws from every event changes nothing the locks do, nor on_lock_lost.
TEST(events_watchdog, a_listener_that_throws_changes_nothing) {
    struct throwing : rlock::lock_listener {
        std::atomic<int> calls{0};
        void acquired(const rlock::acquired_event&) override { fail(); }
        void released(const rlock::released_event&) override { fail(); }
        void renewed(const rlock::renewed_event&) override { fail(); }
        void lost(const rlock::lost_event&) override { fail(); }
        void wait_ended(const rlock::wait_ended_event&) override { fail(); }
        void fail() {
            ++calls;
            throw std::runtime_error("listener");
        }
    };
    redis_server s;
    auto l = std::make_shared<throwing>();
    rlock_test::lost_log lost;
    rlock::client_options o = s.options();
    o.lock_watchdog_timeout = 300ms;
    o.listener = l;
    o.on_lock_lost = lost.handler();
    rlock::client c(o);
    rlock::mutex m(c, "events:throwing");
    m.lock();
    s.cmd({"DEL", "events:throwing"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 3s));
    EXPECT_TRUE(m.lost());
    m.unlock();
    m.lock();
    EXPECT_TRUE(m.is_held_by_current_thread());
    m.unlock();
    EXPECT_GE(l->calls.load(), 4);
}

}  // namespace
