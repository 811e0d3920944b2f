// Deployments around the lock server, against real redis-servers the tests start themselves:
//
//   acl           an ACL user with exactly the rules README.md documents, and ACLs that refuse
//                 a release or a renewal;
//   replica_sync  a master with one replica, client_options::sync_replicas;
//   sentinel      Redis Sentinel failing a master over, client_options::sentinels.
//
// tests/support/redis_sentinel.hpp starts the replicas and sentinels. Each suite is under its
// own heading below. Bounds on time are generous on purpose: the suite runs on small, noisy
// machines.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::keys_left;
using rlock_test::redis_server;
using rlock_test::replicated;
using rlock_test::sentinel_deployment;
using rlock_test::set_acl_user;

namespace {

// ---------------------------------------------------------------------------------------------
// acl: the minimal ACL README.md documents ("ACL") runs every lock kind, and a release or a
// renewal an ACL refuses reaches the owner as that error, not as a lost lock.

/// The rules README.md documents for lock names starting with `app:`, word for word.
const char* const minimal_acl =
    "on >pw resetkeys resetchannels -@all "
    "+ping +select +get +set +del +exists +pttl +pexpire +publish +subscribe +unsubscribe "
    "+eval +evalsha +hexists +hget +hmget +hset +hdel +hlen +hkeys +hincrby +incr "
    "+rpush +lpop +lindex +lrem +lrange +zadd +zrem +zscore +zincrby +zrange +zrevrange "
    "+zrangebyscore +time "
    "~app:* ~{app:* ~rlock_lock__channel:{app:* ~redisson_lock__channel:{app:* "
    "~redisson_rwlock:{app:* ~redisson_lock_token:{app:* ~redisson_lock_queue:{app:* "
    "~redisson_lock_timeout:{app:* "
    "&rlock_lock__channel:{app:* &redisson_lock__channel:{app:* &redisson_rwlock:{app:*";

/// What README.md adds to minimal_acl for the synchronizers, word for word.
const char* const synchronizer_acl =
    "+incrby +decrby +type +zcount &redisson_sc:{app:* &redisson_countdownlatch__channel__{app:*";

std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at < text.size();) {
        const auto end = std::min(text.find(' ', at), text.size());
        if (end > at) out.push_back(text.substr(at, end - at));
        at = end + 1;
    }
    return out;
}

/// Holds `name` from client a with renewals, refuses client b, then hands it to a blocked b:
/// every script, the subscriber and the watchdog run as the ACL user.
template <class Lock>
void hold_renew_and_hand_off(rlock::client& a, rlock::client& b, const std::string& name) {
    SCOPED_TRACE(name);
    Lock held(a, name, rlock::lock_options{true});
    Lock other(b, name, rlock::lock_options{true});
    held.lock();
    EXPECT_GT(held.fencing_token(), 0);
    EXPECT_FALSE(other.try_lock_for(30ms));
    std::this_thread::sleep_for(900ms);  // three renewal periods of the 600 ms watchdog
    EXPECT_TRUE(held.is_locked());
    EXPECT_FALSE(held.lost());
    EXPECT_GT(held.remaining_lease(), 0ms);
    std::atomic<bool> got{false};
    std::thread waiter([&] {
        other.lock();
        got = true;
        other.unlock();
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(got.load());
    held.unlock();
    waiter.join();
    EXPECT_TRUE(got.load());
    // Forced open by the other client: the watchdog reports the hold lost, as the ACL user.
    held.lock();
    EXPECT_TRUE(other.force_unlock());
    EXPECT_FALSE(held.is_locked());
    EXPECT_TRUE(eventually([&] { return held.lost(); }));
    held.unlock();
}

/// Creates the ACL user `locker` (password `pw`) with `rules` on `s`; returns client options
/// that log in as it and report lost holds to `lost`.
rlock::client_options as_locker(const redis_server& s, std::vector<std::string> rules,
                                rlock_test::lost_log& lost) {
    rules.insert(rules.begin(), "locker");
    set_acl_user(s, rules);
    rlock::client_options o = s.options();
    o.username = "locker";
    o.password = "pw";
    o.on_lock_lost = lost.handler();
    return o;
}

TEST(acl, the_documented_minimal_acl_runs_every_lock_kind) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 600ms;
    rlock::client a(o);
    rlock::client b(o);

    hold_renew_and_hand_off<rlock::mutex>(a, b, "app:mutex");
    hold_renew_and_hand_off<rlock::reentrant_lock>(a, b, "app:reentrant");
    hold_renew_and_hand_off<rlock::fair_lock>(a, b, "app:fair");
    hold_renew_and_hand_off<rlock::read_write_lock>(a, b, "app:rw");  // the write side

    {  // read side: two readers at once, a writer waits for both, a downgrade
        rlock::read_write_lock r1(a, "app:rw-read");
        rlock::read_write_lock r2(b, "app:rw-read");
        r1.lock_shared();
        r2.lock_shared();
        std::this_thread::sleep_for(700ms);  // read holds renewed
        std::thread([&] {
            rlock::read_write_lock w(b, "app:rw-read");
            EXPECT_FALSE(w.try_lock_for(30ms)) << "a writer got in past two readers";
        }).join();
        r2.unlock_shared();
        r1.unlock_shared();
        r2.lock();
        r2.lock_shared();  // downgrade
        r2.unlock();
        EXPECT_TRUE(r1.try_lock_shared_for(1s));
        r1.unlock_shared();
        r2.unlock_shared();
    }
    {  // multi_lock on one node (its own script) and a one-node red_lock
        rlock::mutex m1(a, "app:multi-1");
        rlock::reentrant_lock m2(a, "app:multi-2");
        rlock::multi_lock both{m1, m2};
        both.lock();
        std::this_thread::sleep_for(700ms);
        EXPECT_TRUE(m1.is_locked());
        EXPECT_TRUE(m2.is_locked());
        both.unlock();
        rlock::red_lock red({&a}, "app:red");
        red.lock();
        std::this_thread::sleep_for(700ms);
        EXPECT_FALSE(red.lost());
        red.unlock();
    }
    // One report per forced unlock above, and no other: no NOPERM anywhere.
    EXPECT_EQ(lost.calls.load(), 4) << lost.last_lock << ": " << lost.last_message;
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::lock_lost)) << lost.last_message;
    // Fencing counters never expire, by design; nothing else may be left.
    EXPECT_EQ(keys_left(s, "redisson_lock_token:"), "") << "keys left in Redis";
}

// The synchronizers as a user with exactly the rules README.md documents for them: a semaphore
// waiter woken by a release, a latch waiter by the last count down, watched permits renewed
// and a permit waiter woken — no NOPERM anywhere.
TEST(acl, the_documented_synchronizer_rules_run_semaphores_latches_and_permits) {
    redis_server s;
    rlock_test::lost_log lost;
    std::vector<std::string> rules = words(minimal_acl);
    for (const std::string& w : words(synchronizer_acl)) rules.push_back(w);
    rlock::client_options o = as_locker(s, rules, lost);
    o.lock_watchdog_timeout = 600ms;
    rlock::client a(o), b(o);

    rlock::semaphore sa(a, "app:sem"), sb(b, "app:sem");
    ASSERT_TRUE(sa.try_set_permits(1));
    sa.acquire();
    auto sem_waiter = std::async(std::launch::async, [&] { return sb.try_acquire_for(10s); });
    std::this_thread::sleep_for(200ms);
    sa.release();
    EXPECT_TRUE(sem_waiter.get());
    sb.release();
    EXPECT_EQ(sa.add_permits(1), 2);
    EXPECT_EQ(sa.drain_permits(), 2);

    rlock::count_down_latch la(a, "app:latch"), lb(b, "app:latch");
    ASSERT_TRUE(la.try_set_count(1));
    auto latch_waiter = std::async(std::launch::async, [&] { return lb.wait_for(10s); });
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(la.count_down(), 0);
    EXPECT_TRUE(latch_waiter.get());

    rlock::permit_expirable_semaphore pa(a, "app:permits"), pb(b, "app:permits");
    ASSERT_TRUE(pa.try_set_permits(1));
    rlock::permit p = pa.acquire();
    auto permit_waiter = std::async(std::launch::async, [&] { return pb.try_acquire_for(10s, 5s); });
    std::this_thread::sleep_for(900ms);  // renewed more than once
    EXPECT_FALSE(p.lost());
    EXPECT_EQ(pa.acquired_permits(), 1);
    p.release();
    rlock::permit q = permit_waiter.get();
    EXPECT_TRUE(q);
    const std::vector<std::string> ids = q.detach();
    EXPECT_TRUE(pb.update_lease_time(ids.front(), 10s));
    pb.release(ids.front());
    EXPECT_EQ(pb.available_permits(), 1);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_lock << ": " << lost.last_message;
}

TEST(acl, a_release_the_acl_forbids_is_reported_as_that_error_not_as_a_lost_lock) {
    // A release the ACL refuses (here GET and HGET, taken away once the locks are held) must
    // reach the owner as that error, once, not as "lost", and claim nothing released. A
    // watchdog tick in between may be the one that tells (a refused renewal): either way, once.
    redis_server s;
    rlock_test::lost_log unused;
    rlock::client_options o = as_locker(s, words(minimal_acl), unused);
    std::mutex mu;
    std::vector<std::pair<std::string, rlock::error>> told;
    o.on_lock_lost = [&](std::string_view lock, const rlock::error& why) {
        std::lock_guard<std::mutex> g(mu);
        told.emplace_back(std::string(lock), why);
    };
    rlock::client c(o);
    rlock::mutex m(c, "app:acl-mutex");
    rlock::reentrant_lock r(c, "app:acl-reentrant");
    m.lock();
    r.lock();
    s.cmd({"ACL", "SETUSER", "locker", "-get", "-hget"});
    EXPECT_NO_THROW(m.unlock());
    EXPECT_NO_THROW(r.unlock());
    std::lock_guard<std::mutex> g(mu);
    ASSERT_EQ(told.size(), 2u);
    for (const char* name : {"app:acl-mutex", "app:acl-reentrant"}) {
        const auto it = std::find_if(told.begin(), told.end(), [&](const auto& t) { return t.first == name; });
        ASSERT_NE(it, told.end()) << name << " was not told";
        EXPECT_EQ(it->second.value(), rlock::errc::auth_failed) << it->second.what();
        EXPECT_NE(std::string(it->second.what()).find(name), std::string::npos) << it->second.what();
    }
    // Nothing was claimed released: both keys still there, for their leases.
    EXPECT_EQ(s.integer({"EXISTS", "app:acl-mutex", "app:acl-reentrant"}), 2);
}

// Found in review: the batch renewal scripts read each hold with pcall and counted any error
// as "gone", so a watched hold whose renewal the ACL refused was told lock_lost while Redis
// still had it. Now the refusal is that hold's answer: its owner is told the ACL's error, once,
// the hold is kept, and renewals resume once the ACL allows them again.
TEST(acl, a_renewal_the_acl_refuses_is_reported_as_that_error_not_as_a_lost_lock) {
    redis_server s;
    std::vector<std::string> rules = words(minimal_acl);
    for (const std::string& w : words(synchronizer_acl)) rules.push_back(w);
    rlock_test::lost_log unused;
    rlock::client_options o = as_locker(s, rules, unused);
    std::mutex mu;
    std::vector<std::pair<std::string, rlock::error>> told;
    o.on_lock_lost = [&](std::string_view lock, const rlock::error& why) {
        std::lock_guard<std::mutex> g(mu);
        told.emplace_back(std::string(lock), why);
    };
    o.lock_watchdog_timeout = 3s;  // a tick every second
    rlock::client c(o);
    rlock::mutex m(c, "app:renew-mutex");
    rlock::reentrant_lock r(c, "app:renew-reentrant");
    rlock::fair_lock f(c, "app:renew-fair");
    rlock::read_write_lock w(c, "app:renew-write");
    rlock::read_write_lock rd(c, "app:renew-read");
    rlock::permit_expirable_semaphore ps(c, "app:renew-permits");
    ASSERT_TRUE(ps.try_set_permits(1));
    m.lock();
    r.lock();
    f.lock();
    w.lock();
    rd.lock_shared();
    rlock::permit p = ps.acquire();
    // What each renewal script reads a hold with (the acquires above needed some of them).
    s.cmd({"ACL", "SETUSER", "locker", "-get", "-hget", "-hexists", "-type"});
    const std::vector<std::string> names = {"app:renew-mutex", "app:renew-reentrant", "app:renew-fair",
                                            "app:renew-write", "app:renew-read", "app:renew-permits"};
    auto told_count = [&] {
        std::lock_guard<std::mutex> g(mu);
        return told.size();
    };
    for (int i = 0; i < 100 && told_count() < names.size(); ++i) std::this_thread::sleep_for(50ms);
    s.cmd({"ACL", "SETUSER", "locker", "+get", "+hget", "+hexists", "+type"});
    {
        std::lock_guard<std::mutex> g(mu);
        ASSERT_EQ(told.size(), names.size());
        for (const std::string& name : names) {
            const auto it = std::find_if(told.begin(), told.end(), [&](const auto& t) { return t.first == name; });
            ASSERT_NE(it, told.end()) << name << " was not told";
            EXPECT_EQ(it->second.value(), rlock::errc::auth_failed) << it->second.what();
            EXPECT_NE(std::string(it->second.what()).find(name), std::string::npos) << it->second.what();
            EXPECT_NE(std::string(it->second.what()).find("NOPERM"), std::string::npos) << it->second.what();
        }
    }
    // The holds were kept: the next tick renews them (every key's TTL back near 3 s), and no
    // one is told anything more.
    auto renewed = [&] {
        return s.integer({"PTTL", "app:renew-mutex"}) > 2500 && s.integer({"PTTL", "app:renew-read"}) > 2500;
    };
    for (int i = 0; i < 100 && !renewed(); ++i) std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(renewed()) << "no renewal after the ACL allowed it again";
    EXPECT_FALSE(m.lost());
    EXPECT_FALSE(p.lost());
    EXPECT_NO_THROW(m.unlock());
    EXPECT_NO_THROW(r.unlock());
    EXPECT_NO_THROW(f.unlock());
    EXPECT_NO_THROW(w.unlock());
    EXPECT_NO_THROW(rd.unlock_shared());
    EXPECT_NO_THROW(p.release());
    EXPECT_EQ(told_count(), names.size());
    EXPECT_EQ(s.integer({"EXISTS", "app:renew-mutex", "app:renew-reentrant", "app:renew-fair",
                         "app:renew-write", "app:renew-read"}),
              0);
}

/// Every key with its value (DUMP: type and contents, not the TTL), sorted: what a refused
/// call must leave exactly as it found it.
std::string state_of(const redis_server& s) {
    rlock::detail::reply_ptr keys = s.cmd({"KEYS", "*"});
    std::vector<std::string> out;
    for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string k(rlock::detail::reply_text(keys->element[i]));
        out.push_back(k + "=" + std::string(rlock::detail::reply_text(s.cmd({"DUMP", k}).get())));
    }
    std::sort(out.begin(), out.end());
    std::string all;
    for (const std::string& e : out) all += e + "\n";
    return all;
}

// Found in review: a SUBSCRIBE the server refused (an ACL that does not grant the lock's
// channel; Redis 7 grants none by default) was not read at all. The waiter polled, from 10 ms
// up to once a second, for as long as it waited, and unlock() later failed on the same ACL.
// Now the wait fails at once with the refusal, naming the lock and the channel, and leaves
// nothing behind; a wait after the ACL is fixed is woken by the release as usual.
TEST(acl, a_wait_whose_channel_the_acl_refuses_fails_with_that_refusal_and_leaves_nothing) {
    redis_server s;
    std::vector<std::string> rules;
    for (const std::string& w : words(minimal_acl)) {
        if (w[0] != '&') rules.push_back(w);  // no channel at all
    }
    for (const std::string& w : words(synchronizer_acl)) {
        if (w[0] != '&') rules.push_back(w);
    }
    rlock_test::lost_log lost;
    rlock::client c(as_locker(s, rules, lost));
    rlock::client admin(s.options());
    rlock::mutex held_m(admin, "app:sub-mutex");
    rlock::fair_lock held_f(admin, "app:sub-fair");
    rlock::semaphore sem(admin, "app:sub-sem");
    rlock::red_lock held_r({&admin}, "app:sub-red");
    held_m.lock();
    held_f.lock();
    held_r.lock();
    ASSERT_TRUE(sem.try_set_permits(0));
    const std::string before = state_of(s);

    auto expect_refused = [&](const char* what, const std::string& lock, auto&& wait) {
        try {
            const bool got = wait();
            ADD_FAILURE() << what << ": the wait returned " << got << " instead of failing";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::auth_failed) << what << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(lock), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("refused to subscribe"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
        }
    };
    rlock::mutex m(c, "app:sub-mutex");
    rlock::fair_lock f(c, "app:sub-fair");
    rlock::semaphore sm(c, "app:sub-sem");
    expect_refused("mutex", "app:sub-mutex", [&] { return m.try_lock_for(5s); });
    expect_refused("fair_lock", "app:sub-fair", [&] { return f.try_lock_for(5s); });
    expect_refused("semaphore", "app:sub-sem", [&] { return sm.try_acquire_for(5s); });
    rlock::red_lock r(std::vector<rlock::client*>{&c}, "app:sub-red");
    expect_refused("red_lock", "app:sub-red", [&] { return r.try_lock_for(5s); });
    expect_refused("async mutex", "app:sub-mutex", [&] {
        return static_cast<bool>(m.async_try_lock_for(5s, rlock::use_future).get());
    });
    // Nothing left: no fair queue entry, no permit, no key changed.
    EXPECT_EQ(state_of(s), before);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;

    // The ACL fixed: the next wait subscribes afresh and is woken by the release.
    s.cmd({"ACL", "SETUSER", "locker", "&rlock_lock__channel:{app:*", "&redisson_lock__channel:{app:*"});
    auto waiter = std::async(std::launch::async, [&] {
        const bool got = m.try_lock_for(10s);
        if (got) m.unlock();
        return got;
    });
    std::this_thread::sleep_for(200ms);
    held_m.unlock();
    EXPECT_TRUE(waiter.get());
    held_f.unlock();
    held_r.unlock();
}

// Found by an outside probe: the scripts asked the ACL only about PUBLISH, so a command the
// ACL refused after a script's first write failed it with that write made (Redis does not
// roll back): -pexpire left a reentrant hash with no TTL at all, -time a fenced lock key no
// one held for a whole lease, -pttl a contended fair_lock's queue entry, which then kept the
// free lock from everyone else. Now every script asks about each command it uses before it
// begins. Each call here either works or fails with auth_failed, changing nothing.
TEST(acl, a_command_the_acl_refuses_fails_the_call_and_changes_nothing) {
    redis_server s;
    rlock::client admin(s.options());
    rlock::client_options o = s.options();
    o.username = "locker";
    o.password = "pw";
    rlock::lock_options fenced;
    fenced.fencing = true;
    for (const char* deny : {"-pexpire", "-time", "-pttl", "-hincrby", "-hset", "-rpush", "-zadd", "-incr",
                             "-lindex", "-exists", "-hget", "-set"}) {
        s.cmd({"ACL", "SETUSER", "locker", "reset", "on", ">pw", "allkeys", "allchannels", "+@all", deny});
        rlock::client c(o);
        // Each case: the admin's hold first (or none), then one call of c's.
        struct one_case {
            const char* what;
            std::function<void()> hold, unhold;  // the admin's, or none
            std::function<bool()> call;          // c's try
            std::function<void()> undo;          // c's unlock after a success
        };
        rlock::mutex am(admin, "app:m");
        rlock::reentrant_lock ar(admin, "app:r");
        rlock::fair_lock af(admin, "app:f");
        rlock::read_write_lock aw(admin, "app:w");
        rlock::mutex m(c, "app:m", fenced);
        rlock::reentrant_lock r(c, "app:r", fenced);
        rlock::fair_lock f(c, "app:f", fenced);
        rlock::read_write_lock w(c, "app:w", fenced);
        const std::vector<one_case> cases = {
            {"fenced mutex, free", nullptr, nullptr, [&] { return m.try_lock(); }, [&] { m.unlock(); }},
            {"fenced reentrant_lock, free", nullptr, nullptr, [&] { return r.try_lock(); }, [&] { r.unlock(); }},
            {"fenced fair_lock, free", nullptr, nullptr, [&] { return f.try_lock(); }, [&] { f.unlock(); }},
            {"fenced write side, free", nullptr, nullptr, [&] { return w.try_lock(); }, [&] { w.unlock(); }},
            {"fenced read side, free", nullptr, nullptr, [&] { return w.try_lock_shared(); },
             [&] { w.unlock_shared(); }},
            {"mutex, held", [&] { am.lock(); }, [&] { am.unlock(); }, [&] { return m.try_lock_for(100ms); },
             [&] { m.unlock(); }},
            {"reentrant_lock, held", [&] { ar.lock(); }, [&] { ar.unlock(); },
             [&] { return r.try_lock_for(100ms); }, [&] { r.unlock(); }},
            {"fair_lock, held", [&] { af.lock(); }, [&] { af.unlock(); }, [&] { return f.try_lock_for(100ms); },
             [&] { f.unlock(); }},
            {"write side, held", [&] { aw.lock(); }, [&] { aw.unlock(); }, [&] { return w.try_lock_for(100ms); },
             [&] { w.unlock(); }},
        };
        for (const one_case& k : cases) {
            s.cmd({"FLUSHALL"});
            if (k.hold) k.hold();
            const std::string before = state_of(s);
            const std::string where = std::string(deny) + ", " + k.what;
            try {
                const bool got = k.call();
                if (got && k.hold) ADD_FAILURE() << where << ": acquired a lock the admin holds";
                if (!got && !k.hold) ADD_FAILURE() << where << ": refused a free lock without an error";
                if (!got) {
                    EXPECT_EQ(state_of(s), before) << where << ": a wait that ran out left something";
                }
                if (got) {
                    try {
                        k.undo();  // may be refused in turn: told as that error, the key ends with its lease
                    } catch (const rlock::error& e) {
                        EXPECT_EQ(e.value(), rlock::errc::auth_failed) << where << ", unlock: " << e.what();
                    }
                }
            } catch (const rlock::error& e) {
                EXPECT_EQ(e.value(), rlock::errc::auth_failed) << where << ": " << e.what();
                EXPECT_EQ(state_of(s), before) << where << ": " << e.what();
            }
            if (k.unhold) k.unhold();
        }
    }
}

// Found in review: a script that publishes did so last, after its writes. A user whose ACL
// covers a lock's keys but not its channel (Redis 7 refuses every channel not granted) got
// NOPERM from that PUBLISH with the lock already deleted: the unlock was told failed although
// it had happened, and its waiters were not woken. Now every script that may publish asks the
// ACL (redis.acl_check_cmd) before its first write: the release is told as NOPERM, naming the
// channel, and Redis is exactly as it was. Before, every kind here left its keys changed.
TEST(acl, a_release_whose_channel_the_acl_forbids_changes_nothing_and_is_told_as_that_error) {
    redis_server s;
    std::vector<std::string> rules;
    for (const std::string& w : words(minimal_acl)) {
        if (w[0] != '&') rules.push_back(w);
    }
    for (const std::string& w : words(synchronizer_acl)) {
        if (w[0] != '&') rules.push_back(w);
    }
    rlock_test::lost_log lost;
    rlock::client c(as_locker(s, rules, lost));

    // A release told through on_lock_lost: one report, NOPERM naming the lock and the
    // channel, and nothing changed.
    auto refused_release = [&](const std::string& lock, const std::string& channel,
                               const std::function<void()>& release) {
        SCOPED_TRACE(lock);
        const std::string before = state_of(s);
        const int told = lost.calls.load();
        EXPECT_NO_THROW(release());
        EXPECT_EQ(lost.calls.load(), told + 1);
        EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::auth_failed)) << lost.last_message;
        EXPECT_NE(lost.last_message.find("NOPERM"), std::string::npos) << lost.last_message;
        EXPECT_NE(lost.last_message.find(lock), std::string::npos) << lost.last_message;
        EXPECT_NE(lost.last_message.find(channel), std::string::npos) << lost.last_message;
        EXPECT_EQ(state_of(s), before) << "the refused release changed Redis";
    };
    // A call that throws: auth_failed naming the channel, nothing changed.
    auto refused_call = [&](const std::string& what, const std::string& channel,
                            const std::function<void()>& call) {
        SCOPED_TRACE(what);
        const std::string before = state_of(s);
        try {
            call();
            ADD_FAILURE() << "not refused";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::auth_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find(channel), std::string::npos) << e.what();
        }
        EXPECT_EQ(state_of(s), before) << "the refused call changed Redis";
    };

    rlock::mutex m(c, "app:m");
    ASSERT_TRUE(m.try_lock());
    refused_release("app:m", "rlock_lock__channel:{app:m}", [&] { m.unlock(); });

    rlock::reentrant_lock r(c, "app:r");
    ASSERT_TRUE(r.try_lock());
    ASSERT_TRUE(r.try_lock());
    const int told = lost.calls.load();
    EXPECT_NO_THROW(r.unlock()) << "an inner level publishes nothing: released";
    EXPECT_EQ(lost.calls.load(), told) << lost.last_message;
    refused_release("app:r", "redisson_lock__channel:{app:r}", [&] { r.unlock(); });

    rlock::fair_lock f(c, "app:f");
    ASSERT_TRUE(f.try_lock());
    refused_release("app:f", "redisson_lock__channel:{app:f}", [&] { f.unlock(); });

    rlock::read_write_lock w(c, "app:w"), rd(c, "app:rd");
    ASSERT_TRUE(w.try_lock());
    refused_release("app:w", "redisson_rwlock:{app:w}", [&] { w.unlock(); });
    ASSERT_TRUE(rd.try_lock_shared());
    refused_release("app:rd", "redisson_rwlock:{app:rd}", [&] { rd.unlock_shared(); });

    rlock::mutex p1(c, "app:p1");
    rlock::reentrant_lock p2(c, "app:p2");
    rlock::multi_lock both{p1, p2};
    ASSERT_TRUE(both.try_lock());
    refused_release("app:p", "{app:p1}", [&] { both.unlock(); });

    rlock::red_lock red({&c}, "app:red");
    ASSERT_TRUE(red.try_lock());
    refused_release("app:red", "{app:red}", [&] { red.unlock(); });

    s.cmd({"SET", "app:forced", "someone"});
    rlock::mutex forced(c, "app:forced");
    refused_call("force_unlock", "{app:forced}", [&] { (void)forced.force_unlock(); });

    rlock::semaphore sem(c, "app:sem");
    refused_call("try_set_permits", "{app:sem}", [&] { (void)sem.try_set_permits(1); });
    s.cmd({"SET", "app:sem", "1"});
    ASSERT_TRUE(sem.try_acquire()) << "taking a permit publishes nothing";
    refused_call("semaphore release", "{app:sem}", [&] { sem.release(); });

    rlock::count_down_latch latch(c, "app:latch");
    s.cmd({"SET", "app:latch", "2"});
    EXPECT_EQ(latch.count_down(), 1) << "a count down above zero publishes nothing";
    refused_call("the last count down", "{app:latch}", [&] { (void)latch.count_down(); });

    rlock::permit_expirable_semaphore permits(c, "app:permits");
    s.cmd({"SET", "app:permits", "1"});
    rlock::permit leased = permits.try_acquire_for(0ms, 100ms);
    ASSERT_TRUE(leased);
    (void)leased.detach();
    std::this_thread::sleep_for(200ms);  // its lease ended: the next acquire reclaims it
    refused_call("an acquire that reclaims", "{app:permits}", [&] { (void)permits.try_acquire(); });
    s.cmd({"DEL", "{app:permits}:timeout"});  // the lease that ended, gone
    s.cmd({"SET", "app:permits", "1"});
    rlock::permit held = permits.try_acquire();
    ASSERT_TRUE(held);
    refused_release("app:permits", "{app:permits}", [&] { held.release(); });
}

// Issue 16: a renewal the server refuses with an error (here an ACL that stops covering the
// key) is told once as that error (auth_failed, naming NOPERM), not as lock_lost: the key is
// still there. The watchdog keeps trying while the lease lasts, so a refusal that ends in time
// (the ACL restored) costs nothing more, and one that outlasts the lease turns lost() true with
// no second report. Failed before: told lock_lost, "found the hold gone".
TEST(acl, a_renewal_refused_with_an_error_is_told_as_that_error_once) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 1500ms;  // renewed every 500 ms
    // The listener is told a refused renewal as renewal_refused, not as a loss (issue 33.3).
    auto log = std::make_shared<rlock_test::event_log>();
    o.listener = log;
    rlock::client c(o);
    rlock::mutex m(c, "app:renew-refused");
    m.lock();
    set_acl_user(s, {"locker", "resetkeys", "~other:*"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 3s));
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::auth_failed)) << lost.last_message;
    EXPECT_NE(lost.last_message.find("NOPERM"), std::string::npos) << lost.last_message;
    EXPECT_NE(lost.last_message.find("app:renew-refused"), std::string::npos) << lost.last_message;
    EXPECT_EQ(s.integer({"EXISTS", "app:renew-refused"}), 1);
    ASSERT_EQ(log->count("renewal_refused"), 1u);
    EXPECT_EQ(log->of("renewal_refused")[0].code, static_cast<int>(rlock::errc::auth_failed));
    EXPECT_EQ(log->of("renewal_refused")[0].hold_id, m.hold_id());
    EXPECT_EQ(log->count("lost"), 0u);
    // Restored within the lease: the next tick renews it, and the hold goes on.
    std::vector<std::string> back = words(minimal_acl);
    back.insert(back.begin(), "locker");
    set_acl_user(s, back);
    std::this_thread::sleep_for(2500ms);  // past the lease the refused tick did not extend
    EXPECT_FALSE(m.lost());
    EXPECT_EQ(s.integer({"EXISTS", "app:renew-refused"}), 1);
    // Refused again, now for longer than the lease: lost, without a second report.
    const int told = lost.calls.load();
    set_acl_user(s, {"locker", "resetkeys", "~other:*"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() > told; }, 3s));
    EXPECT_EQ(lost.code.load(), static_cast<int>(rlock::errc::auth_failed)) << lost.last_message;
    EXPECT_TRUE(eventually([&] { return m.lost(); }, 4s));
    std::this_thread::sleep_for(600ms);  // a tick after the lease ran out
    EXPECT_EQ(lost.calls.load(), told + 1) << lost.last_message;
    set_acl_user(s, back);
    EXPECT_NO_THROW(m.unlock());
    EXPECT_EQ(lost.calls.load(), told + 1) << lost.last_message;
}

// An on_lock_lost handler may release holds of its client (api.md: it may call into rlock),
// also the one whose refused renewal it is told, on the watchdog's thread. Failed before: the
// report came while the renewal's batch was still in flight, and the release waited for that
// batch to end, which the watchdog, running the handler, never did: the handler never
// returned and the watchdog stopped for good.
TEST(acl, an_on_lock_lost_handler_may_release_the_hold_whose_renewal_was_refused) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 1500ms;  // renewed every 500 ms
    rlock::hold held;
    std::promise<void> released;
    std::atomic<int> calls{0};
    o.on_lock_lost = [&](std::string_view, const rlock::error&) {
        if (calls++ != 0) return;  // the release, refused too, is told again
        held.unlock();
        released.set_value();
    };
    rlock::client c(o);
    rlock::mutex m(c, "app:released-in-handler");
    held = m.async_lock(rlock::use_future).get();
    set_acl_user(s, {"locker", "resetkeys", "~other:*"});
    auto done = released.get_future();
    const bool returned = done.wait_for(5s) == std::future_status::ready;
    std::vector<std::string> back = words(minimal_acl);
    back.insert(back.begin(), "locker");
    set_acl_user(s, back);
    ASSERT_TRUE(returned) << "the handler's release never returned (" << calls.load() << " report(s))";
    // The watchdog goes on: a loss of another hold is told.
    rlock::mutex other(c, "app:after-handler");
    other.lock();
    const int before = calls.load();
    s.cmd({"DEL", "app:after-handler"});
    EXPECT_TRUE(eventually([&] { return calls.load() > before; }, 5s)) << "the watchdog stopped";
    other.unlock();
}

// ---------------------------------------------------------------------------------------------
// replica_sync (client_options::sync_replicas): a master and one real replica. A hold is
// granted and released only once the replica has it, an acquire too few replicas acknowledge is
// undone and reported, and the watchdog waits for replicas after its renewals.

TEST(replica_sync, a_lock_is_granted_only_once_the_replica_has_it_and_released_likewise) {
    replicated r;
    rlock::client c(r.options(1));
    const std::string name = rlock_test::test_lock_name();
    {
        rlock::mutex m(c, name);
        m.lock();
        // No polling: WAIT returned before lock() did, so the replica has the key already.
        const std::string token = r.master.text({"GET", name});
        EXPECT_TRUE(rlock::detail::is_rlock_token(token)) << token;
        EXPECT_EQ(r.replica.text({"GET", name}), token);
        m.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name}), 0);
    }
    {
        rlock::reentrant_lock l(c, name + ":re");
        l.lock();
        l.lock();
        EXPECT_EQ(r.replica.integer({"HLEN", name + ":re"}), 1);
        EXPECT_EQ(r.replica.text({"HGET", name + ":re", c.id() + ":" +
                                                          std::to_string(rlock::detail::current_thread_number())}),
                  "2");
        l.unlock();
        l.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":re"}), 0);
    }
    {
        rlock::fair_lock f(c, name + ":fair");
        f.lock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":fair"}), 1);
        f.unlock();
        rlock::read_write_lock rw(c, name + ":rw");
        rw.lock_shared();
        EXPECT_EQ(r.replica.text({"HGET", name + ":rw", "mode"}), "read");
        rw.unlock_shared();
        rw.lock();
        EXPECT_EQ(r.replica.text({"HGET", name + ":rw", "mode"}), "write");
        rw.unlock();
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":rw"}), 0);
    }
}

// Issue 18: multi_lock's one-script path (parts of one client) waits for replicas as its parts
// do one by one: an acquire too few replicas acknowledged is undone, every part, and reported.
// Failed before: the one-script acquire sent no WAIT and was granted.
TEST(replica_sync, a_multi_lock_of_one_node_is_synced_and_undone_as_its_parts_are) {
    replicated r;
    const std::string name = rlock_test::test_lock_name();
    rlock::client c(r.options(2));  // one replica exists: always short
    rlock::mutex a(c, name + ":a");
    rlock::reentrant_lock b(c, name + ":b");
    rlock::multi_lock both{a, b};
    try {
        both.lock();
        FAIL() << "lock() succeeded with one replica of the two asked for";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::replica_sync_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("undone"), std::string::npos) << e.what();
    }
    EXPECT_EQ(r.master.integer({"EXISTS", name + ":a", name + ":b"}), 0)
        << "the undone acquire left a part";
}

TEST(replica_sync, an_acquire_too_few_replicas_acknowledge_is_undone_and_reported) {
    replicated r;
    const std::string name = rlock_test::test_lock_name();
    {  // more replicas asked for than exist
        rlock::client c(r.options(2));
        rlock::mutex m(c, name);
        try {
            m.lock();
            FAIL() << "lock() succeeded with one replica of the two asked for";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::replica_sync_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("undone"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(m.is_held_by_current_thread());
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0) << "the undone acquire left its key";
        rlock::reentrant_lock l(c, name);
        EXPECT_THROW((void)l.try_lock_for(100ms), rlock::error);
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0);
    }
    {  // the one replica stops answering: nothing is granted while it is away
        rlock::client c(r.options(1));
        rlock::reentrant_lock l(c, name);
        l.lock();  // replica up: granted
        r.replica.pause();
        // A re-entry that is not acknowledged is undone one level: the first level stays.
        EXPECT_THROW(l.lock(), rlock::error);
        EXPECT_TRUE(l.is_held_by_current_thread());
        l.unlock();  // WAIT falls short here too: not an error, the key is gone on the master
        EXPECT_EQ(r.master.integer({"EXISTS", name}), 0);
        rlock::mutex m(c, name + ":m");
        EXPECT_THROW(m.lock(), rlock::error);
        EXPECT_EQ(r.master.integer({"EXISTS", name + ":m"}), 0);
        r.replica.resume();
        ASSERT_TRUE(eventually([&] { return r.replica.integer({"EXISTS", name}) == 0; }, 5s));
        m.lock();  // back: granted again
        EXPECT_EQ(r.replica.integer({"EXISTS", name + ":m"}), 1);
        m.unlock();
    }
}

TEST(replica_sync, the_watchdog_waits_for_replicas_after_each_renewal_batch) {
    replicated r;
    rlock::client_options o = r.options(1);
    o.lock_watchdog_timeout = 600ms;  // a tick every 200 ms
    rlock::client c(o);
    rlock::mutex m(c, rlock_test::test_lock_name());
    m.lock();
    const long long before = r.waits();
    std::this_thread::sleep_for(700ms);
    EXPECT_GE(r.waits() - before, 2) << "renewal ticks without WAIT";
    EXPECT_GT(r.replica.integer({"PTTL", m.name()}), 0);
    m.unlock();
}

TEST(replica_sync, bad_sync_options_are_refused_before_connecting) {
    rlock::client_options o;
    o.port = 1;  // never reached: validation comes first
    o.sync_replicas = -1;
    try {
        rlock::client c(o);
        FAIL() << "a negative sync_replicas was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("sync_replicas"), std::string::npos) << e.what();
    }
    o.sync_replicas = 1;
    o.sync_timeout = o.command_timeout;
    try {
        rlock::client c(o);
        FAIL() << "a sync_timeout as long as command_timeout was accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("sync_timeout"), std::string::npos) << e.what();
    }
}

// ---------------------------------------------------------------------------------------------
// sentinel (client_options::sentinels): a failover moves holds, waiters and new commands to the
// new master; a replica refuses an acquire with READONLY; an unknown master and a refused
// sentinel password are clear errors.

TEST(sentinel, a_failover_moves_holds_waiters_and_new_commands_to_the_new_master) {
    sentinel_deployment d(true);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.sync_replicas = 1;  // the hold is on the replica before lock() returns
    o.sync_timeout = 300ms;
    // Longer than a failover takes: the key the replica got must outlive the switch (the
    // client renews on the new master only once the sentinel has named it).
    o.lock_watchdog_timeout = 5s;
    std::atomic<int> told{0};
    o.on_lock_lost = [&](std::string_view, const rlock::error&) { ++told; };
    rlock::client holder(o);
    rlock::client_options unsynced = o;  // after the failover the new master has no replica
    unsynced.sync_replicas = 0;
    rlock::client other(unsynced);
    EXPECT_EQ(holder.server(), "master m via sentinel");

    const std::string name = rlock_test::test_lock_name();
    const std::string channel = "redisson_lock__channel:{" + name + "}";
    rlock::reentrant_lock l(holder, name);
    l.lock();
    const std::string field = holder.id() + ":" + std::to_string(rlock::detail::current_thread_number());
    ASSERT_EQ(d.r.master.text({"HGET", name, field}), "1") << "the lock is not on the master";
    ASSERT_EQ(d.r.replica.text({"HGET", name, field}), "1") << "WAIT returned before the replica had it";

    std::string waiter_field;  // the waiter's count on the new master while it holds the lock
    auto waiter = std::async(std::launch::async, [&] {
        rlock::reentrant_lock w(other, name);
        if (!w.try_lock_for(60s)) return false;
        waiter_field = d.r.replica.text(
            {"HGET", name, other.id() + ":" + std::to_string(rlock::detail::current_thread_number())});
        w.unlock();
        return true;
    });
    ASSERT_TRUE(eventually([&] { return d.subscribers(d.r.master, channel) == 1; }, 10s));

    d.fail_over();
    // The old master stays a master for a while (the sentinel converts it later), so nothing
    // but the switch tells the clients to leave it. The waiter's subscription moves...
    EXPECT_TRUE(eventually([&] { return d.subscribers(d.r.replica, channel) == 1; }, 10s))
        << "the waiter's subscription did not move to the new master";
    // ... and the watchdog renews on the new master: a lease on, the key would be gone.
    std::this_thread::sleep_for(o.lock_watchdog_timeout + 1s);
    EXPECT_GT(d.r.replica.integer({"PTTL", name}), 0) << "not renewed on the new master";
    EXPECT_FALSE(l.lost());
    EXPECT_EQ(told.load(), 0) << "a hold that moved with the failover was reported lost";

    l.unlock();  // on the new master (too few replicas there now: not an error at release)
    EXPECT_EQ(d.r.replica.text({"HGET", name, field}), "") << "unlock did not reach the new master";
    ASSERT_EQ(waiter.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(waiter.get());
    EXPECT_EQ(waiter_field, "1") << "the waiter's lock is not on the new master";
    EXPECT_EQ(told.load(), 0);
}

// Losses told at once survive a failover (issue 34): the watchdog's connection to the new master
// is tracked again and the hold armed there, so a hold deleted on the new master is told within
// moments — with the watchdog at its default, whose next tick is up to 10 s away — and the
// failover itself is no loss.
TEST(sentinel, a_hold_deleted_on_the_new_master_after_a_failover_is_told_at_once) {
    sentinel_deployment d(true);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.sync_replicas = 1;  // the hold is on the replica before lock() returns
    o.sync_timeout = 300ms;
    std::atomic<int> told{0};
    o.on_lock_lost = [&](std::string_view, const rlock::error&) { ++told; };
    rlock::client holder(o);
    const std::string name = rlock_test::test_lock_name();
    rlock::mutex m(holder, name);
    m.lock();
    ASSERT_EQ(d.r.replica.integer({"EXISTS", name}), 1) << "WAIT returned before the replica had it";
    // Tracked connections that are not subscribed: the watchdog's (the subscriber's own
    // connection tracks too, for flushes alone: CLIENT LIST flags P and t).
    auto tracking_clients = [](const redis_server& s) {
        const std::string list = s.text({"CLIENT", "LIST"});
        int n = 0;
        for (std::size_t at = list.find(" flags="); at != std::string::npos; at = list.find(" flags=", at + 1)) {
            const std::string flags = list.substr(at + 7, list.find(' ', at + 7) - at - 7);
            if (flags.find('t') != std::string::npos && flags.find('P') == std::string::npos) ++n;
        }
        return n;
    };
    ASSERT_TRUE(eventually([&] { return tracking_clients(d.r.master) == 1; }, 10s));

    d.fail_over();
    ASSERT_TRUE(eventually([&] { return tracking_clients(d.r.replica) == 1; }, 20s))
        << "the watchdog's connection to the new master is not tracked";
    std::this_thread::sleep_for(200ms);  // armed: read on the tracked connection
    EXPECT_EQ(told.load(), 0) << "the failover was told as a loss";
    EXPECT_FALSE(m.lost());

    const auto start = std::chrono::steady_clock::now();
    d.r.replica.cmd({"DEL", name});
    ASSERT_TRUE(eventually([&] { return told.load() == 1; }, 20s));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, 2s) << rlock_test::millis(took) << " ms: told by the watchdog's tick, not at once";
    EXPECT_TRUE(m.lost());
    m.unlock();  // told already: nothing thrown
}

// The synchronizers follow a failover as the locks do: a watched permit is renewed on the new
// master and not reported lost; a semaphore waiter and a latch waiter, subscribed on the old
// master, are woken by a release and a count down on the new one.
TEST(sentinel, semaphores_latches_and_watched_permits_follow_a_failover) {
    sentinel_deployment d(true);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.lock_watchdog_timeout = 5s;  // longer than a failover takes, as above
    std::atomic<int> told{0};
    o.on_lock_lost = [&](std::string_view, const rlock::error&) { ++told; };
    rlock::client a(o), b(o);
    const std::string stem = rlock_test::test_lock_name();
    rlock::permit_expirable_semaphore pa(a, stem + ".permits");
    ASSERT_TRUE(pa.try_set_permits(1));
    rlock::permit p = pa.acquire();
    rlock::semaphore sa(a, stem + ".sem"), sb(b, stem + ".sem");
    ASSERT_TRUE(sa.try_set_permits(0));
    rlock::count_down_latch la(a, stem + ".latch"), lb(b, stem + ".latch");
    ASSERT_TRUE(la.try_set_count(1));
    auto sem_waiter = std::async(std::launch::async, [&] { return sb.try_acquire_for(60s); });
    auto latch_waiter = std::async(std::launch::async, [&] { return lb.wait_for(60s); });
    const std::string sem_channel = "redisson_sc:{" + stem + ".sem}";
    const std::string latch_channel = "redisson_countdownlatch__channel__{" + stem + ".latch}";
    ASSERT_TRUE(eventually([&] {
        return d.subscribers(d.r.master, sem_channel) == 1 && d.subscribers(d.r.master, latch_channel) == 1;
    }, 10s)) << "the waiters never subscribed";
    // No WAIT here: the switch must not come before the replica has the keys.
    ASSERT_TRUE(eventually([&] {
        return d.r.replica.text({"GET", stem + ".latch"}) == "1" &&
               d.r.replica.integer({"ZCARD", "{" + stem + ".permits}:timeout"}) == 1;
    }, 10s)) << "the replica never got the keys";

    d.fail_over();
    EXPECT_TRUE(eventually([&] {
        return d.subscribers(d.r.replica, sem_channel) == 1 && d.subscribers(d.r.replica, latch_channel) == 1;
    }, 10s)) << "the waiters' subscriptions did not move to the new master";
    std::this_thread::sleep_for(o.lock_watchdog_timeout + 1s);  // a lease on: renewed there or gone
    EXPECT_FALSE(p.lost());
    EXPECT_EQ(told.load(), 0) << "a permit that moved with the failover was reported lost";
    EXPECT_EQ(pa.acquired_permits(), 1);

    sa.release();
    EXPECT_EQ(la.count_down(), 0);
    ASSERT_EQ(sem_waiter.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(sem_waiter.get()) << "the semaphore waiter missed the release on the new master";
    ASSERT_EQ(latch_waiter.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(latch_waiter.get()) << "the latch waiter missed the zero message on the new master";
    p.release();
    EXPECT_EQ(pa.available_permits(), 1);
    EXPECT_EQ(told.load(), 0);
}

// What a client still connected to a demoted master sees: READONLY, reported as
// connection_failed (the connection is replaced; with Sentinel the new one goes to the new
// master), carrying Redis's text, with nothing written.
TEST(sentinel, a_replica_refuses_an_acquire_as_a_connection_error_naming_readonly) {
    replicated r;
    rlock::client c(r.replica.options());
    rlock::mutex m(c, rlock_test::test_lock_name());
    rlock::reentrant_lock l(c, rlock_test::test_lock_name(":r"));
    auto refused = [&](const std::function<void()>& f) {
        try {
            f();
            ADD_FAILURE() << "a replica granted a lock";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
            EXPECT_NE(std::string(e.what()).find("READONLY"), std::string::npos) << e.what();
        }
    };
    refused([&] { m.lock(); });
    refused([&] { l.lock(); });
    EXPECT_EQ(r.replica.integer({"EXISTS", m.name(), l.name()}), 0);
    EXPECT_EQ(r.master.integer({"EXISTS", m.name(), l.name()}), 0);
}

// With every sentinel gone and the master well, a client unlocks through the connection it
// has. Before, the client's first contact with a sentinel made every connection opened before
// it stale, also when the sentinel named the master they were opened to; the unlock then had
// to ask a sentinel for a new one, failed, and left the key to its lease (a probe: 2 runs of
// 4). The uri's first sentinel is down, so that first contact comes after the lock's
// connection opened.
TEST(sentinel, with_the_sentinels_gone_a_client_unlocks_through_the_connection_it_has) {
    sentinel_deployment d(false);
    for (int round = 0; round < 4; ++round) {
        rlock_test::lost_log lost;
        rlock::client_options o = rlock::client_options::from_uri(d.uri());
        o.connect_timeout = 500ms;
        o.on_lock_lost = lost.handler();
        rlock::client c(o);
        rlock::mutex m(c, rlock_test::test_lock_name());
        m.lock();
        std::this_thread::sleep_for(400ms);  // the sentinel watch has named the master
        d.sentinel->pause();
        m.unlock();
        const long long left = d.r.master.integer({"EXISTS", m.name()});
        d.sentinel->resume();
        EXPECT_EQ(left, 0) << "round " << round << ": the unlock did not reach the master";
        EXPECT_EQ(lost.calls.load(), 0) << "round " << round << ": " << lost.last_message;
    }
}

// With every sentinel gone (the uri's first down, the other paused), a client whose
// connections were cut opens new ones to the master it last connected to, once that answers
// ROLE as a master: the sentinels' silence is no news of a failover. Before, each new
// connection had to ask a sentinel, and the lock's tries failed until the wait's deadline.
TEST(sentinel, with_the_sentinels_gone_a_client_opens_new_connections_to_the_master_it_knows) {
    sentinel_deployment d(false);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.connect_timeout = 500ms;
    rlock::client c(o);
    rlock::mutex m(c, rlock_test::test_lock_name());
    m.lock();
    m.unlock();
    std::this_thread::sleep_for(400ms);  // the sentinel watch has named the master
    d.sentinel->pause();
    // Every connection of the client to the master: its pool's and its watchdog's.
    d.r.master.cmd({"CLIENT", "KILL", "TYPE", "normal"});
    bool got = false;
    try {
        got = m.try_lock_for(5s);
    } catch (const rlock::error& e) {
        ADD_FAILURE() << e.what();
    }
    const long long held = d.r.master.integer({"EXISTS", m.name()});
    if (got) m.unlock();
    const long long left = d.r.master.integer({"EXISTS", m.name()});
    d.sentinel->resume();
    EXPECT_TRUE(got);
    EXPECT_EQ(held, 1);
    EXPECT_EQ(left, 0);
}

TEST(sentinel, an_unknown_master_a_refused_sentinel_password_or_a_missing_db_is_a_clear_error) {
    sentinel_deployment d(false);
    rlock::client_options o = rlock::client_options::from_uri(d.uri());
    o.sentinel_master = "nope";
    o.connect_timeout = 300ms;
    try {
        rlock::client c(o);
        FAIL() << "a client of an unknown master connected";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::connection_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("master nope via sentinel"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("does not know a master named nope"), std::string::npos)
            << e.what();
    }

    sentinel_deployment guarded(false, "requirepass sentinel-secret\n");
    o = rlock::client_options::from_uri(guarded.uri());
    try {
        rlock::client c(o);
        FAIL() << "a sentinel with a password answered without one";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::auth_failed) << e.what();
        EXPECT_NE(std::string(e.what()).find("sentinel 127.0.0.1:" +
                                             std::to_string(guarded.sentinel->port())),
                  std::string::npos)
            << e.what();
    }
    o.sentinel_password = "sentinel-secret";
    {
        rlock::client c(o);
        rlock::mutex m(c, rlock_test::test_lock_name());
        m.lock();
        EXPECT_EQ(guarded.r.master.integer({"EXISTS", m.name()}), 1);
        m.unlock();
    }

    // A db the master lacks is the client's setting, not a failover under way: the SELECT's
    // refusal itself, not "no master found ... within connect_timeout".
    o.db = 99;
    try {
        rlock::client c(o);
        FAIL() << "SELECT 99 accepted";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::server_error) << e.what();
        EXPECT_NE(e.cause().find("SELECT 99 (client_options::db) refused"), std::string::npos)
            << e.what();
        EXPECT_EQ(e.cause().find("connect_timeout"), std::string::npos) << e.what();
    }
}


// Issue 34: a user the ACL does not let track keys (the minimal ACL has no CLIENT and no
// __redis__:invalidate channel) works as before — losses found by the watchdog's renewals —
// and the listener is told so once, not at every connection.
TEST(acl, a_user_who_may_not_track_keys_is_told_once_and_losses_are_still_found) {
    redis_server s;
    rlock_test::lost_log lost;
    rlock::client_options o = as_locker(s, words(minimal_acl), lost);
    o.lock_watchdog_timeout = 600ms;  // renewed every 200 ms
    auto n = std::make_shared<rlock_test::detection_off_notices>();
    o.listener = n;
    rlock::client c(o);
    rlock::mutex m(c, "app:no-tracking");
    m.lock();
    ASSERT_TRUE(eventually([&] { return n->off.load() > 0; }, 3s));
    s.cmd({"CLIENT", "KILL", "TYPE", "pubsub"});  // a reconnect: asked again, not told again
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(n->off.load(), 1);
    s.cmd({"DEL", "app:no-tracking"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 3s));  // the watchdog's tick
    EXPECT_TRUE(m.lost());
    m.unlock();

    // With what README.md says to add for it, the user's holds are told at once.
    std::vector<std::string> rules = words(minimal_acl);
    for (const char* more : {"+client|id", "+client|tracking", "&__redis__:invalidate"}) rules.emplace_back(more);
    rlock::client_options t = as_locker(s, rules, lost);  // the watchdog at its default 30 s
    t.listener = n;
    rlock::client tracked(t);
    rlock::mutex m2(tracked, "app:tracking");
    m2.lock();
    std::this_thread::sleep_for(300ms);  // armed
    const auto start = std::chrono::steady_clock::now();
    s.cmd({"DEL", "app:tracking"});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 2; }, 15s));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    EXPECT_EQ(n->off.load(), 1);
    m2.unlock();
}

}  // namespace
