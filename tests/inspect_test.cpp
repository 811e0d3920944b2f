// rlock::inspect, list_locks and force_unlock, and the `rlock` command, against real
// redis-server processes: each kind's layout made by rlock's own classes (and a Redisson hash and
// a redis-py token written by hand) is read back as its kind, with its holders, counts, leases,
// readers, fair queue in order, permits and fencing counter; a key no lock writes is a clear
// wrong_type; names are listed on every master of a Cluster and read through Sentinel; a forced
// unlock deletes the lock and wakes its waiter, for each lock kind. The command's tests run the
// built binary and check its exit codes, its JSON, what it did in Redis, and what `watch` saw.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rlock/inspect.hpp"
#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_cluster;
using rlock_test::redis_server;
using rlock_test::sentinel_deployment;

namespace {

using rlock_test::server;

using rlock_test::name;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool has_text(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The lease is there and within (0, most].
void expect_lease_within(const rlock::remaining_ttl& lease, std::chrono::milliseconds most) {
    ASSERT_TRUE(lease.has_value()) << "no lease where one was set";
    EXPECT_GT(lease->count(), 0);
    EXPECT_LE(lease->count(), most.count());
}

/// The holder whose id starts with `prefix` (a client id), or null.
const rlock::lock_holder* holder_of(const rlock::lock_info& i, const std::string& prefix) {
    for (const auto& h : i.holders) {
        if (starts_with(h.id, prefix + ":")) return &h;
    }
    return nullptr;
}

}  // namespace

TEST(inspect, a_name_without_keys_is_not_found_and_no_error) {
    rlock::client a(server().options());
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_FALSE(i.found());
    EXPECT_EQ(i.kind, rlock::lock_kind::not_found);
    EXPECT_EQ(i.name, name());
    EXPECT_EQ(i.server, a.server());
    EXPECT_TRUE(i.holders.empty());
    EXPECT_FALSE(i.ttl.has_value());
}

TEST(inspect, a_mutex_is_a_token_marked_as_rlocks_with_its_lease) {
    rlock::client a(server().options());
    rlock::mutex m(a, name());
    m.lock(10s);
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::token);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].id, server().text({"GET", name()}));
    EXPECT_TRUE(starts_with(i.holders[0].id, "rlock:"));
    EXPECT_EQ(i.holders[0].origin, rlock::holder_origin::rlock);
    EXPECT_EQ(i.holders[0].count, 1);
    expect_lease_within(i.holders[0].lease, 10s);
    m.unlock();
    EXPECT_FALSE(rlock::inspect(a, name()).found());
}

TEST(inspect, a_redis_py_token_written_by_hand_is_a_token_of_unknown_origin) {
    rlock::client a(server().options());
    server().cmd({"SET", name(), "0f3c2a9b8e7d4c1fa2b3c4d5e6f70812", "PX", "5000"});
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::token);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].id, "0f3c2a9b8e7d4c1fa2b3c4d5e6f70812");
    EXPECT_EQ(i.holders[0].origin, rlock::holder_origin::unknown);
    expect_lease_within(i.holders[0].lease, 5s);
    // A token of 32 decimal digits (redis-py's hex that happens to hold no letter) is still a
    // token: no count is that long.
    server().cmd({"SET", name(), "40313282917463012345678901234567", "PX", "5000"});
    EXPECT_EQ(rlock::inspect(a, name()).kind, rlock::lock_kind::token);
    server().cmd({"DEL", name()});
}

TEST(inspect, a_reentrant_lock_shows_its_holder_count_and_lease_and_whose_it_is) {
    rlock::client a(server().options()), b(server().options());
    rlock::reentrant_lock l(a, name());
    l.lock();
    l.lock();
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::reentrant);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_TRUE(starts_with(i.holders[0].id, a.id() + ":")) << i.holders[0].id;
    EXPECT_EQ(i.holders[0].count, 2);
    EXPECT_EQ(i.holders[0].origin, rlock::holder_origin::this_client);
    expect_lease_within(i.holders[0].lease, a.options().lock_watchdog_timeout);
    EXPECT_EQ(rlock::inspect(b, name()).holders.at(0).origin, rlock::holder_origin::unknown)
        << "another client's holder was told as the inspecting client's";
    l.unlock();
    EXPECT_EQ(rlock::inspect(a, name()).holders.at(0).count, 1);
    l.unlock();
}

TEST(inspect, a_redisson_hash_written_by_hand_is_a_reentrant_lock) {
    rlock::client a(server().options());
    const std::string holder = "6b0f1a5e-3c2d-4e8f-9a1b-2c3d4e5f6a7b:57";
    server().cmd({"HSET", name(), holder, "3"});
    server().cmd({"PEXPIRE", name(), "20000"});
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::reentrant);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].id, holder);
    EXPECT_EQ(i.holders[0].count, 3);
    expect_lease_within(i.holders[0].lease, 20s);
    EXPECT_GT(i.holders[0].lease->count(), 10000);
    server().cmd({"DEL", name()});
}

TEST(inspect, a_fair_lock_shows_its_holder_and_queue_in_order_with_deadlines) {
    rlock::client a(server().options()), b(server().options()), c(server().options());
    rlock::fair_lock fa(a, name()), fb(b, name()), fc(c, name());
    fa.lock();
    EXPECT_EQ(rlock::inspect(a, name()).kind, rlock::lock_kind::reentrant)
        << "a fair lock with nobody queued has RLock's layout, and reads as it";
    const std::string queue = "redisson_lock_queue:{" + name() + "}";
    auto wb = std::async(std::launch::async, [&] {
        const bool got = fb.try_lock_for(20s);
        if (got) fb.unlock();
        return got;
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue}) == 1; }));
    auto wc = std::async(std::launch::async, [&] {
        const bool got = fc.try_lock_for(20s);
        if (got) fc.unlock();
        return got;
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"LLEN", queue}) == 2; }));

    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::fair);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].origin, rlock::holder_origin::this_client);
    ASSERT_EQ(i.waiters.size(), 2u);
    EXPECT_TRUE(starts_with(i.waiters[0].id, b.id() + ":")) << "the queue is not in arrival order";
    EXPECT_TRUE(starts_with(i.waiters[1].id, c.id() + ":")) << "the queue is not in arrival order";
    // Deadlines are chained (Redisson's arithmetic): the k-th waiter's lies at most k + 1 wait
    // timeouts and the holder's lease ahead.
    const long long wait_timeout = rlock::lock_options{}.fair_lock_wait_timeout.count();
    for (std::size_t k = 0; k < i.waiters.size(); ++k) {
        ASSERT_TRUE(i.waiters[k].deadline_in.has_value());
        EXPECT_GT(i.waiters[k].deadline_in->count(), 0);
        EXPECT_LE(i.waiters[k].deadline_in->count(),
                  static_cast<long long>(k + 2) * wait_timeout + a.options().lock_watchdog_timeout.count());
    }
    EXPECT_LE(i.waiters[0].deadline_in->count(), i.waiters[1].deadline_in->count())
        << "deadlines are chained: a later waiter's is not earlier";
    EXPECT_EQ(rlock::inspect(b, name()).waiters.at(0).origin, rlock::holder_origin::this_client);

    fa.unlock();
    EXPECT_TRUE(wb.get());
    EXPECT_TRUE(wc.get());
}

TEST(inspect, a_read_write_lock_shows_readers_with_their_own_leases_then_the_writer) {
    rlock::client a(server().options()), b(server().options());
    rlock::read_write_lock ra(a, name()), rb(b, name());
    ra.lock_shared(10s);
    rb.lock_shared(20s);
    rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::read_write);
    EXPECT_EQ(i.mode, "read");
    ASSERT_EQ(i.holders.size(), 2u);
    const rlock::lock_holder* ha = holder_of(i, a.id());
    const rlock::lock_holder* hb = holder_of(i, b.id());
    ASSERT_TRUE(ha && hb);
    EXPECT_EQ(ha->role, rlock::holder_role::reader);
    EXPECT_EQ(ha->live_holds, 1);
    EXPECT_EQ(hb->live_holds, 1);
    expect_lease_within(ha->lease, 10s);
    expect_lease_within(hb->lease, 20s);
    EXPECT_GT(hb->lease->count(), 10000) << "a reader's lease is its own hold key's, not the hash's";
    // A reader whose hold key is gone is shown dead (what the next writer drops).
    server().cmd({"DEL", "{" + name() + "}:" + ha->id + ":rwlock_timeout:1"});
    i = rlock::inspect(a, name());
    ASSERT_TRUE(holder_of(i, a.id()));
    EXPECT_EQ(holder_of(i, a.id())->live_holds, 0);
    EXPECT_EQ(holder_of(i, a.id())->lease, std::chrono::milliseconds(0));
    rb.unlock_shared();
    ra.unlock_shared();
    server().cmd({"DEL", name()});

    ra.lock(15s);
    i = rlock::inspect(a, name());
    EXPECT_EQ(i.mode, "write");
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].role, rlock::holder_role::writer);
    EXPECT_TRUE(starts_with(i.holders[0].id, a.id() + ":")) << i.holders[0].id;
    EXPECT_EQ(i.holders[0].id.find(":write"), std::string::npos);
    expect_lease_within(i.holders[0].lease, 15s);
    ra.unlock();
}

TEST(inspect, a_semaphore_and_a_latch_read_as_counts) {
    rlock::client a(server().options());
    rlock::semaphore s(a, name(".semaphore"));
    ASSERT_TRUE(s.try_set_permits(3));
    s.acquire();
    rlock::lock_info i = rlock::inspect(a, name(".semaphore"));
    EXPECT_EQ(i.kind, rlock::lock_kind::count);
    EXPECT_EQ(i.count, 2);
    EXPECT_TRUE(i.holders.empty());
    s.release();
    EXPECT_EQ(rlock::inspect(a, name(".semaphore")).count, 3);

    rlock::count_down_latch l(a, name(".latch"));
    ASSERT_TRUE(l.try_set_count(5));
    l.count_down();
    i = rlock::inspect(a, name(".latch"));
    EXPECT_EQ(i.kind, rlock::lock_kind::count);
    EXPECT_EQ(i.count, 4);

    // A count given a TTL (Redisson's RSemaphore and RCountDownLatch are RExpirable) is still
    // a count, and force_unlock refuses it rather than delete the permits as a lock's token.
    // Before, it read as a token and force_unlock deleted it.
    server().cmd({"PEXPIRE", name(".semaphore"), "600000"});
    i = rlock::inspect(a, name(".semaphore"));
    EXPECT_EQ(i.kind, rlock::lock_kind::count);
    EXPECT_EQ(i.count, 3);
    EXPECT_THROW((void)rlock::force_unlock(a, name(".semaphore")), rlock::error);
    EXPECT_EQ(server().text({"GET", name(".semaphore")}), "3");
}

TEST(inspect, a_permit_expirable_semaphore_lists_its_permits_with_their_leases) {
    rlock::client a(server().options());
    rlock::permit_expirable_semaphore s(a, name());
    ASSERT_TRUE(s.try_set_permits(3));
    rlock::permit p = s.acquire(10s);
    rlock::permit q = s.acquire(40s);
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::permit_expirable);
    EXPECT_EQ(i.count, 1);
    ASSERT_EQ(i.permits.size(), 2u);
    EXPECT_EQ(i.permits[0].id, p.id()) << "permits are listed soonest to end first, by their public id";
    EXPECT_EQ(i.permits[1].id, q.id());
    expect_lease_within(i.permits[0].lease, 10s);
    expect_lease_within(i.permits[1].lease, 40s);
    EXPECT_GT(i.permits[1].lease->count(), 30000);
    p.release();
    q.release();
}

TEST(inspect, the_fencing_counter_is_read_with_the_lock) {
    rlock::client a(server().options());
    rlock::lock_options o;
    o.fencing = true;
    rlock::mutex m(a, name(), o);
    m.lock();
    const rlock::lock_info i = rlock::inspect(a, name());
    ASSERT_TRUE(i.fencing_counter.has_value());
    EXPECT_EQ(static_cast<std::uint64_t>(*i.fencing_counter), m.fencing_token());
    m.unlock();
    const rlock::lock_info after = rlock::inspect(a, name());
    EXPECT_FALSE(after.found()) << "a counter alone is no lock";
    EXPECT_TRUE(after.fencing_counter.has_value());
}

TEST(inspect, keys_no_lock_writes_are_wrong_type_naming_the_key_and_the_server) {
    rlock::client a(server().options());
    auto expect_wrong_type = [&](const std::string& n, const std::string& key) {
        try {
            (void)rlock::inspect(a, n);
            ADD_FAILURE() << n << ": no error";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::wrong_type) << e.what();
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(a.server()), std::string::npos) << e.what();
        }
    };
    server().cmd({"RPUSH", name(".list"), "x"});
    expect_wrong_type(name(".list"), name(".list"));
    server().cmd({"HSET", name(".hash"), "field", "not a count"});
    expect_wrong_type(name(".hash"), name(".hash"));
    // No lock writes a level count below 1 (a hold of no level is deleted).
    server().cmd({"HSET", name(".zero"), "holder:1", "0"});
    expect_wrong_type(name(".zero"), name(".zero"));
    server().cmd({"HSET", name(".negative"), "holder:1", "-3"});
    expect_wrong_type(name(".negative"), name(".negative"));
    server().cmd({"HSET", name(".mode"), "mode", "sideways"});
    expect_wrong_type(name(".mode"), name(".mode"));
    server().cmd({"SET", "redisson_lock_queue:{" + name(".queue") + "}", "x"});
    expect_wrong_type(name(".queue"), "redisson_lock_queue:{" + name(".queue") + "}");
}

// Found by a probe: a permit set holding a score no lock writes (an infinity, or a time
// 10^300 ms away) was a protocol_error naming no key, and list_locks threw for every name
// rather than leaving that one out; -1e300 was read as a lease of 292 million years.
TEST(inspect, a_permit_score_no_lock_writes_is_wrong_type_and_list_leaves_that_name_out) {
    rlock::client a(server().options());
    rlock::mutex m(a, name(".ok"));
    m.lock(20s);
    const std::vector<std::string> scores = {"+inf", "-inf", "-1e300", "1e300"};
    for (std::size_t i = 0; i < scores.size(); ++i) {
        const std::string n = name() + ".permits" + std::to_string(i);
        const std::string key = "{" + n + "}:timeout";
        server().cmd({"SET", n, "3"});
        server().cmd({"ZADD", key, scores[i], "permit1"});
        try {
            (void)rlock::inspect(a, n);
            ADD_FAILURE() << scores[i] << ": no error";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::wrong_type) << scores[i] << ": " << e.what();
            EXPECT_TRUE(has_text(e.what(), key)) << e.what();
            EXPECT_EQ(e.server(), a.server()) << e.what();
        }
    }
    std::vector<std::string> listed;
    for (const rlock::lock_info& i : rlock::list_locks(a, name() + ".*")) listed.push_back(i.name);
    EXPECT_EQ(listed, std::vector<std::string>{name(".ok")});
    m.unlock();
}

// list_locks reads a pattern as Redis's MATCH does, odd classes included: a `]` first ends
// the class (an empty one), a `-` before the last character makes a range with it, `\` takes
// the next as it is. Each pattern's names are checked against SCAN MATCH on the same names.
// Before, `[]x]*`, `[a-]*` and `[^]]*` listed other names than Redis finds.
TEST(inspect, list_locks_reads_a_pattern_as_redis_match_does) {
    rlock::client a(server().options());
    const std::string stem = name() + ".";
    std::vector<std::unique_ptr<rlock::mutex>> held;
    for (const char* tail : {"]x", "x", "a", "-", "]", "^", "_", "b", "]]", "x]", "\\", "c"}) {
        held.push_back(std::make_unique<rlock::mutex>(a, stem + tail));
        held.back()->lock(20s);
    }
    auto scan_match = [&](const std::string& pattern) {
        std::set<std::string> found;
        std::string cursor = "0";
        for (int round = 0; round < 1000; ++round) {
            auto r = server().cmd({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
            cursor.assign(r->element[0]->str, r->element[0]->len);
            for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
                const redisReply* k = r->element[1]->element[i];
                found.emplace(k->str, k->len);
            }
            if (cursor == "0") break;
        }
        return found;
    };
    for (const char* tail : {"[]x]*", "[a-]*", "[^]]*", "[^]]]*", "[\\]]*", "[a-c]*", "[ab", "[x-]",
                             "[]]*", "[-a]*", "[\\\\]", "?]*", "[^a-c]", "[]", "[^]"}) {
        const std::string pattern = stem + tail;
        std::set<std::string> listed;
        for (const rlock::lock_info& i : rlock::list_locks(a, pattern)) listed.insert(i.name);
        EXPECT_EQ(listed, scan_match(pattern)) << "pattern " << tail;
    }
    for (auto& m : held) m->unlock();
    // Nor does Redis let a star take an empty text (stringmatchlen): only an empty pattern.
    EXPECT_FALSE(rlock::detail::glob_match("*", ""));
    EXPECT_TRUE(rlock::detail::glob_match("", ""));
}

TEST(inspect, list_locks_finds_every_kind_by_a_pattern_on_names) {
    rlock::client a(server().options()), b(server().options());
    const std::string stem = name();
    rlock::mutex m(a, stem + ".mutex");
    rlock::reentrant_lock r(a, stem + ".reentrant");
    rlock::fair_lock fa(a, stem + ".fair"), fb(b, stem + ".fair");
    rlock::semaphore s(a, stem + ".semaphore");
    m.lock(20s);
    r.lock(20s);
    fa.lock(20s);
    ASSERT_TRUE(s.try_set_permits(2));
    server().cmd({"RPUSH", stem + ".list", "x"});  // no lock: left out
    server().cmd({"SET", "other." + stem, "x"});   // does not match the pattern
    auto waiter = std::async(std::launch::async, [&] {
        const bool got = fb.try_lock_for(20s);
        if (got) fb.unlock();
        return got;
    });
    const std::string fair_queue = "redisson_lock_queue:{" + stem + ".fair}";
    ASSERT_TRUE(eventually([&] { return server().integer({"EXISTS", fair_queue}) == 1; }));
    // A fair lock that is free with a (Redisson) waiter still queued has no hash: it is found by
    // its queue.
    server().cmd({"RPUSH", "redisson_lock_queue:{" + stem + ".queued}", "6b0f1a5e-3c2d-4e8f-9a1b-2c3d4e5f6a7b:9"});
    server().cmd({"PEXPIRE", "redisson_lock_queue:{" + stem + ".queued}", "20000"});

    const std::vector<rlock::lock_info> found = rlock::list_locks(a, stem + ".*");
    std::set<std::string> names;
    for (const auto& i : found) names.insert(i.name);
    EXPECT_EQ(names, (std::set<std::string>{stem + ".mutex", stem + ".reentrant", stem + ".fair", stem + ".queued",
                                            stem + ".semaphore"}));
    for (const auto& i : found) {
        if (i.name == stem + ".fair" || i.name == stem + ".queued") {
            EXPECT_EQ(i.kind, rlock::lock_kind::fair);
        }
        if (i.name == stem + ".semaphore") {
            EXPECT_EQ(i.kind, rlock::lock_kind::count);
        }
    }
    fa.unlock();
    EXPECT_TRUE(waiter.get());
    m.unlock();
    r.unlock();
}

TEST(inspect, names_with_a_hash_tag_of_their_own_are_read_and_listed_by_redissons_key_names) {
    rlock::client a(server().options()), b(server().options());
    const std::string tag = "{" + name() + "}";
    rlock::read_write_lock rw(a, tag + ".rw");
    rw.lock_shared(20s);
    rlock::fair_lock fa(a, tag + ".fair"), fb(b, tag + ".fair");
    fa.lock(20s);
    auto waiter = std::async(std::launch::async, [&] {
        const bool got = fb.try_lock_for(20s);
        if (got) fb.unlock();
        return got;
    });
    ASSERT_TRUE(eventually([&] { return server().integer({"EXISTS", "redisson_lock_queue:" + tag + ".fair"}) == 1; }));
    rlock::permit_expirable_semaphore ps(a, tag + ".permits");
    ASSERT_TRUE(ps.try_set_permits(1));
    rlock::permit p = ps.acquire(20s);
    ASSERT_EQ(server().integer({"EXISTS", tag + ".permits:timeout"}), 1) << "not Redisson's suffix rule";

    const rlock::lock_info r = rlock::inspect(a, tag + ".rw");
    ASSERT_EQ(r.holders.size(), 1u);
    EXPECT_EQ(r.holders[0].live_holds, 1) << "the read hold key `name:<id>:rwlock_timeout:1` was not found";
    const rlock::lock_info f = rlock::inspect(a, tag + ".fair");
    EXPECT_EQ(f.kind, rlock::lock_kind::fair);
    EXPECT_EQ(f.waiters.size(), 1u);
    const rlock::lock_info q = rlock::inspect(a, tag + ".permits");
    EXPECT_EQ(q.kind, rlock::lock_kind::permit_expirable);
    EXPECT_EQ(q.permits.size(), 1u);

    std::set<std::string> listed;
    for (const auto& i : rlock::list_locks(a, tag + ".*")) listed.insert(i.name);
    EXPECT_EQ(listed, (std::set<std::string>{tag + ".rw", tag + ".fair", tag + ".permits"}));
    fa.unlock();
    EXPECT_TRUE(waiter.get());
    rw.unlock_shared();
    p.release();
}

TEST(inspect, force_unlock_deletes_the_lock_and_wakes_a_waiter_of_another_client) {
    rlock::client a(server().options()), b(server().options());
    rlock::reentrant_lock la(a, name()), lb(b, name());
    la.lock();  // watched: without the message the waiter would wait out its 30 s TTL
    std::atomic<bool> waiting{false};
    auto waiter = std::async(std::launch::async, [&] {
        waiting = true;
        const bool got = lb.try_lock_for(20s);
        const auto at = std::chrono::steady_clock::now();
        if (got) lb.unlock();
        return std::make_pair(got, at);
    });
    ASSERT_TRUE(eventually([&] { return waiting.load(); }));
    std::this_thread::sleep_for(200ms);  // the waiter has tried once and sleeps on the channel
    const auto forced_at = std::chrono::steady_clock::now();
    const rlock::forced_unlock done = rlock::force_unlock(a, name());
    EXPECT_TRUE(done.deleted);
    EXPECT_EQ(done.before.kind, rlock::lock_kind::reentrant);
    ASSERT_EQ(done.before.holders.size(), 1u);
    EXPECT_TRUE(starts_with(done.before.holders[0].id, a.id() + ":"));
    const auto [got, at] = waiter.get();
    EXPECT_TRUE(got);
    EXPECT_LT(at - forced_at, 3s) << "the waiter was not woken by the forced unlock";
    EXPECT_FALSE(rlock::force_unlock(a, name()).deleted) << "a free name reported deleted";

    rlock::semaphore s(a, name(".semaphore"));
    ASSERT_TRUE(s.try_set_permits(1));
    try {
        (void)rlock::force_unlock(a, name(".semaphore"));
        ADD_FAILURE() << "a semaphore was force-unlocked";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument);
    }
    EXPECT_EQ(server().text({"GET", name(".semaphore")}), "1");
}

// force_unlock of what an operator was shown: a lock that changed hands since (its holder's key
// expired and a live service took the name, here as another kind) is not deleted; one whose
// holder only renewed it is. Before, `rlock force-unlock` asked about one holder and deleted
// whoever held the lock when the answer came.
TEST(inspect, force_unlock_of_what_was_shown_deletes_nothing_when_the_lock_changed_hands) {
    rlock::client a(server().options());
    server().cmd({"SET", name(), "holder-x", "PX", "60000"});
    const rlock::lock_info shown = rlock::inspect(a, name());
    ASSERT_EQ(shown.kind, rlock::lock_kind::token);

    server().cmd({"DEL", name()});
    server().cmd({"HSET", name(), "svc-y:7", "1"});
    server().cmd({"PEXPIRE", name(), "30000"});
    rlock::forced_unlock done = rlock::force_unlock(a, name(), shown);
    EXPECT_TRUE(done.changed);
    EXPECT_FALSE(done.deleted);
    EXPECT_EQ(done.before.kind, rlock::lock_kind::reentrant);
    EXPECT_EQ(server().text({"HGET", name(), "svc-y:7"}), "1") << "the new holder's lock was deleted";

    server().cmd({"DEL", name()});
    server().cmd({"SET", name(), "holder-z", "PX", "60000"});
    done = rlock::force_unlock(a, name(), shown);  // the same kind, another token
    EXPECT_TRUE(done.changed);
    EXPECT_EQ(server().text({"GET", name()}), "holder-z");

    server().cmd({"SET", name(), "holder-x", "PX", "90000"});  // the one shown, renewed
    done = rlock::force_unlock(a, name(), shown);
    EXPECT_FALSE(done.changed);
    EXPECT_TRUE(done.deleted);
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
}

/// Holds `held` (locked by the caller on another client), starts `wait` on a thread, forces the
/// lock by name and checks the waiter got in soon after: the kind's own unlock message woke it.
template <class Wait>
void expect_forced_unlock_wakes(rlock::client& c, const std::string& n, rlock::lock_kind kind, Wait wait) {
    std::atomic<bool> waiting{false};
    auto waiter = std::async(std::launch::async, [&] {
        waiting = true;
        const bool got = wait();
        return std::make_pair(got, std::chrono::steady_clock::now());
    });
    ASSERT_TRUE(eventually([&] { return waiting.load(); }));
    std::this_thread::sleep_for(200ms);  // the waiter has tried once and sleeps on its channel
    const auto forced_at = std::chrono::steady_clock::now();
    const rlock::forced_unlock done = rlock::force_unlock(c, n);
    EXPECT_TRUE(done.deleted);
    EXPECT_EQ(done.before.kind, kind);
    const auto [got, at] = waiter.get();
    EXPECT_TRUE(got);
    EXPECT_LT(at - forced_at, 3s) << "the waiter was not woken by the forced unlock";
}

TEST(inspect, force_unlock_of_a_fair_and_a_read_write_lock_wakes_their_waiters) {
    rlock::client a(server().options()), b(server().options());
    rlock::fair_lock fa(a, name(".fair")), fb(b, name(".fair"));
    fa.lock();
    expect_forced_unlock_wakes(a, name(".fair"), rlock::lock_kind::fair, [&] {
        const bool got = fb.try_lock_for(20s);  // queued: the fair kind shows with its waiter
        if (got) fb.unlock();
        return got;
    });
    rlock::read_write_lock ra(a, name(".rw")), rb(b, name(".rw"));
    ra.lock_shared();
    auto hold_keys = [&] { return server().cmd({"KEYS", "{" + name(".rw") + "}:*:rwlock_timeout:*"})->elements; };
    ASSERT_EQ(hold_keys(), 1u);
    expect_forced_unlock_wakes(a, name(".rw"), rlock::lock_kind::read_write, [&] {
        const bool got = rb.try_lock_for(20s);  // a writer behind a reader
        if (got) rb.unlock();
        return got;
    });
    EXPECT_EQ(hold_keys(), 0u) << "a reader's hold key outlived the forced unlock";
}

TEST(inspect, a_name_is_read_on_the_master_a_sentinel_names) {
    sentinel_deployment d(false);
    rlock::client a(d.uri());
    rlock::reentrant_lock l(a, name());
    l.lock(20s);
    const rlock::lock_info i = rlock::inspect(a, name());
    EXPECT_EQ(i.kind, rlock::lock_kind::reentrant);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].origin, rlock::holder_origin::this_client);
    std::set<std::string> listed;
    for (const auto& x : rlock::list_locks(a, name())) listed.insert(x.name);
    EXPECT_EQ(listed, std::set<std::string>{name()});
    l.unlock();
}

TEST(inspect, a_cluster_name_is_read_on_its_slots_master_and_listed_from_every_master) {
    redis_cluster c(3, 0);
    rlock::client a(c.uri());
    const std::string stem = name();
    std::vector<std::string> names;
    for (int k = 0; k < 12; ++k) names.push_back(stem + "." + std::to_string(k));
    std::set<int> ports;
    for (const std::string& n : names) ports.insert(c.master_for_slot(redis_cluster::key_slot(n)).port());
    ASSERT_EQ(ports.size(), 3u) << "the names do not cover every master";
    std::vector<std::unique_ptr<rlock::read_write_lock>> locks;
    for (const std::string& n : names) {
        locks.push_back(std::make_unique<rlock::read_write_lock>(a, n));
        locks.back()->lock_shared(20s);
    }
    const rlock::lock_info i = rlock::inspect(a, names[0]);
    EXPECT_EQ(i.kind, rlock::lock_kind::read_write);
    ASSERT_EQ(i.holders.size(), 1u);
    EXPECT_EQ(i.holders[0].live_holds, 1) << "the read hold key in the name's slot was not read";
    expect_lease_within(i.holders[0].lease, 20s);

    std::set<std::string> listed;
    for (const auto& l : rlock::list_locks(a, stem + ".*")) listed.insert(l.name);
    EXPECT_EQ(listed, std::set<std::string>(names.begin(), names.end()));
    for (auto& l : locks) l->unlock_shared();
}

// --- the rlock command ------------------------------------------------------------------------

#ifdef RLOCK_TEST_CLI

namespace {

struct cli_result {
    int code = -1;
    std::string out, err;
};

std::string quoted(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

/// Runs the built `rlock` with `args` (each quoted for the shell), `input` on its stdin.
cli_result run_cli(const std::vector<std::string>& args, const std::string& input = "") {
    char err_path[] = "/tmp/rlock_cli_err_XXXXXX";
    const int fd = ::mkstemp(err_path);
    if (fd >= 0) ::close(fd);
    std::string cmd = "printf '%s' " + quoted(input) + " | " + quoted(RLOCK_TEST_CLI);
    for (const auto& a : args) cmd += " " + quoted(a);
    cmd += " 2>" + quoted(err_path);
    cli_result r;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n = 0;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
        const int status = ::pclose(p);
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if (FILE* f = std::fopen(err_path, "r")) {
        char buf[4096];
        std::size_t n = 0;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.err.append(buf, n);
        std::fclose(f);
    }
    std::remove(err_path);
    return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// One line on stderr, naming rlock, and no trace of an uncaught exception.
void expect_one_clear_line(const cli_result& r) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(starts_with(r.err, "rlock: ")) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
    EXPECT_FALSE(has(r.err, "terminate called")) << r.err;
}

}  // namespace

TEST(rlock_command, inspect_json_names_the_kind_holder_count_and_lease_and_exits_0) {
    rlock::client a(server().options());
    rlock::reentrant_lock l(a, name());
    l.lock(20s);
    l.lock(20s);
    const cli_result r = run_cli({"inspect", name(), "--uri", server().uri(), "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, "\"name\":\"" + name() + "\"")) << r.out;
    EXPECT_TRUE(has(r.out, "\"found\":true")) << r.out;
    EXPECT_TRUE(has(r.out, "\"kind\":\"reentrant\"")) << r.out;
    EXPECT_TRUE(has(r.out, "\"id\":\"" + a.id() + ":")) << r.out;
    EXPECT_TRUE(has(r.out, "\"count\":2")) << r.out;
    EXPECT_TRUE(has(r.out, "\"lease_ms\":1")) << "a 20 s lease read as 1xxxx ms: " << r.out;
    EXPECT_TRUE(has(r.out, "\"waiters\":[]")) << r.out;
    const cli_result table = run_cli({"inspect", name(), "--uri", server().uri()});
    EXPECT_EQ(table.code, 0);
    EXPECT_TRUE(has(table.out, "count 2")) << table.out;
    l.unlock();
    l.unlock();
}

TEST(rlock_command, inspect_of_a_name_not_found_exits_1) {
    const cli_result r = run_cli({"inspect", name(), "--uri", server().uri(), "--json"});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.out, "\"found\":false")) << r.out;
    EXPECT_TRUE(has(r.out, "\"kind\":\"not_found\"")) << r.out;
}

TEST(rlock_command, bad_input_and_non_lock_keys_exit_2_with_one_clear_line) {
    expect_one_clear_line(run_cli({"inspect", name(), "--uri", server().uri(), "--bogus"}));
    expect_one_clear_line(run_cli({"inspect", name(), "--uri", "bogus://nowhere"}));
    expect_one_clear_line(run_cli({"inspect", "--uri", server().uri()}));
    expect_one_clear_line(run_cli({"frobnicate", "--uri", server().uri()}));
    expect_one_clear_line(run_cli({"inspect", name(), "--uri", "redis://127.0.0.1:1"}));
    server().cmd({"RPUSH", name(".list"), "x"});
    const cli_result r = run_cli({"inspect", name(".list"), "--uri", server().uri()});
    expect_one_clear_line(r);
    EXPECT_TRUE(has(r.err, name(".list"))) << r.err;
    EXPECT_TRUE(has(r.err, "list")) << r.err;
    const cli_result help = run_cli({"--help"});
    EXPECT_EQ(help.code, 0);
    EXPECT_TRUE(has(help.out, "force-unlock NAME")) << help.out;
    // A name with a newline: still one line (the probe saw three).
    server().cmd({"RPUSH", name(".a\nb"), "x"});
    expect_one_clear_line(run_cli({"inspect", name(".a\nb"), "--uri", server().uri()}));
}

// Found by a probe: a malformed URI's password was shown when it held a '/' (the whole
// password) or an '@' (what came after the first one); the URI parser reads the userinfo up to
// the last '@'.
TEST(rlock_command, a_malformed_uri_never_shows_its_password) {
    for (const std::string uri : {"redis://u:hun/ter2@127.0.0.1:6379x", "redis://:zz@qq9@127.0.0.1:bad",
                                  "redis://:xyzzy@127.0.0.1:bad"}) {
        const cli_result r = run_cli({"inspect", "x", "--uri", uri});
        expect_one_clear_line(r);
        EXPECT_TRUE(has(r.err, "(--uri: ")) << r.err;
        EXPECT_FALSE(has(r.err, "hun")) << r.err;
        EXPECT_FALSE(has(r.err, "ter2")) << r.err;
        EXPECT_FALSE(has(r.err, "qq9")) << r.err;
        EXPECT_FALSE(has(r.err, "zz")) << r.err;
        EXPECT_FALSE(has(r.err, "xyzzy")) << r.err;
        EXPECT_TRUE(has(r.err, "***@127.0.0.1")) << r.err;
    }
}

// Found by a probe: a fair lock's force-unlock named the channel of the queue's head as seen
// before it, a dead waiter the unlock evicts, not the live one it woke.
TEST(rlock_command, force_unlock_of_a_fair_lock_names_the_live_waiter_it_woke) {
    const std::string n = name();
    server().cmd({"HSET", n, "someone:1", "1"});
    server().cmd({"PEXPIRE", n, "30000"});
    const std::string queue = "redisson_lock_queue:{" + n + "}", deadlines = "redisson_lock_timeout:{" + n + "}";
    const long long now = server().integer({"EVAL",
                                            "local t = redis.call('time') return t[1] * 1000 + math.floor(t[2] / 1000)",
                                            "0"});
    server().cmd({"RPUSH", queue, "dead:1", "live:2"});
    server().cmd({"ZADD", deadlines, std::to_string(now - 1000), "dead:1", std::to_string(now + 60000), "live:2"});
    const cli_result r = run_cli({"force-unlock", n, "--uri", server().uri(), "--yes"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, "redisson_lock__channel:{" + n + "}:live:2")) << r.out;
    EXPECT_FALSE(has(r.out, "dead:1")) << r.out;
}

TEST(rlock_command, list_prints_one_line_per_lock_and_json) {
    rlock::client a(server().options());
    const std::string stem = name();
    rlock::mutex m(a, stem + ".one");
    rlock::reentrant_lock r(a, stem + ".two");
    m.lock(20s);
    r.lock(20s);
    const cli_result table = run_cli({"list", stem + ".*", "--uri", server().uri()});
    EXPECT_EQ(table.code, 0) << table.err;
    std::size_t lines = 0;
    for (char ch : table.out) lines += ch == '\n';
    EXPECT_EQ(lines, 3u) << "a header and one line per lock: " << table.out;
    EXPECT_TRUE(has(table.out, stem + ".one")) << table.out;
    EXPECT_TRUE(has(table.out, "reentrant")) << table.out;
    const cli_result json = run_cli({"list", stem + ".*", "--uri", server().uri(), "--json"});
    EXPECT_EQ(json.code, 0);
    EXPECT_TRUE(starts_with(json.out, "[{")) << json.out;
    EXPECT_TRUE(has(json.out, "\"kind\":\"token\"")) << json.out;
    EXPECT_TRUE(has(json.out, "\"kind\":\"reentrant\"")) << json.out;
    EXPECT_EQ(run_cli({"list", stem + ".none*", "--uri", server().uri()}).code, 1);
    m.unlock();
    r.unlock();
}

TEST(rlock_command, force_unlock_deletes_the_key_says_what_and_wakes_a_waiter) {
    rlock::client a(server().options()), b(server().options());
    rlock::mutex ma(a, name()), mb(b, name());
    ma.lock();  // watched: without the message the waiter would wait out the 30 s TTL
    const std::string token = server().text({"GET", name()});
    std::atomic<bool> waiting{false};
    auto waiter = std::async(std::launch::async, [&] {
        waiting = true;
        const bool got = mb.try_lock_for(20s);
        const auto at = std::chrono::steady_clock::now();
        if (got) mb.unlock();
        return std::make_pair(got, at);
    });
    ASSERT_TRUE(eventually([&] { return waiting.load(); }));
    std::this_thread::sleep_for(200ms);

    // Not confirmed: nothing deleted.
    const cli_result no = run_cli({"force-unlock", name(), "--uri", server().uri()}, "n\n");
    EXPECT_EQ(no.code, 3) << no.err;
    EXPECT_EQ(server().text({"GET", name()}), token) << "deleted without confirmation";

    const auto forced_at = std::chrono::steady_clock::now();
    const cli_result r = run_cli({"force-unlock", name(), "--uri", server().uri(), "--yes"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, "deleted")) << r.out;
    EXPECT_TRUE(has(r.out, token)) << "the holder deleted is not named: " << r.out;
    const auto [got, at] = waiter.get();
    EXPECT_TRUE(got);
    EXPECT_LT(at - forced_at, 3s) << "the waiter was not woken by the forced unlock";
    EXPECT_EQ(server().integer({"EXISTS", name()}), 0);
    EXPECT_EQ(run_cli({"force-unlock", name(), "--uri", server().uri(), "--yes"}).code, 1);

    const cli_result yes = run_cli({"force-unlock", name(".two"), "--uri", server().uri()}, "y\n");
    EXPECT_EQ(yes.code, 1) << "a name not found was reported deleted";

    // A semaphore is refused at once (exit 2), without asking first, whatever the answer.
    server().cmd({"SET", name(".sem"), "3"});
    for (const char* answer : {"y\n", "n\n", ""}) {
        const cli_result sem = run_cli({"force-unlock", name(".sem"), "--uri", server().uri()}, answer);
        EXPECT_EQ(sem.code, 2) << sem.err;
        EXPECT_FALSE(has(sem.err, "[y/N]")) << "asked before refusing: " << sem.err;
    }
    EXPECT_EQ(server().text({"GET", name(".sem")}), "3");
}

/// `rlock watch NAME --uri URI --interval 60000` running in the background, its stdout and
/// stderr in a file of its own: a read every minute only, so what it prints within seconds
/// came from a message.
class watch_run {
public:
    watch_run(const std::string& lock, const std::string& uri) {
        const int fd = ::mkstemp(path_);
        if (fd >= 0) ::close(fd);
        pid_ = rlock_test::spawn({"/bin/sh", "-c",
                                  "exec " + quoted(RLOCK_TEST_CLI) + " watch " + quoted(lock) + " --uri " +
                                      quoted(uri) + " --interval 60000 >" + quoted(path_) + " 2>&1"});
    }
    watch_run(const watch_run&) = delete;
    watch_run& operator=(const watch_run&) = delete;
    ~watch_run() {
        if (pid_ > 0 && !stopped_) {
            ::kill(pid_, SIGKILL);
            (void)rlock_test::wait_exit(pid_);
        }
        std::remove(path_);
    }
    bool started() const { return pid_ > 0; }
    /// What it printed so far.
    std::string output() const {
        std::string text;
        if (FILE* f = std::fopen(path_, "r")) {
            char buf[4096];
            std::size_t n = 0;
            while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
            std::fclose(f);
        }
        return text;
    }
    /// SIGINT, and its exit status.
    int interrupt() {
        ::kill(pid_, SIGINT);
        stopped_ = true;
        return rlock_test::wait_exit(pid_);
    }

private:
    char path_[32] = "/tmp/rlock_watch_XXXXXX";
    pid_t pid_ = -1;
    bool stopped_ = false;
};

TEST(rlock_command, watch_follows_a_lock_by_its_unlock_message_and_leaves_at_sigint) {
    rlock::client a(server().options());
    rlock::reentrant_lock l(a, name());
    l.lock(20s);
    watch_run w(name(), server().uri());
    ASSERT_TRUE(w.started());
    EXPECT_TRUE(eventually([&] { return has(w.output(), "watching"); })) << w.output();
    // Printed right after "watching", line by line: looked for until it is there.
    EXPECT_TRUE(eventually([&] { return has(w.output(), "+ exclusive " + a.id() + ":"); }))
        << "the holder at the start: " << w.output();
    l.unlock();
    EXPECT_TRUE(eventually([&] { return has(w.output(), "released"); }, 3000ms))
        << "the unlock message did not make it read again: " << w.output();
    EXPECT_TRUE(has(w.output(), "message \"0\" on redisson_lock__channel:{" + name() + "}")) << w.output();
    EXPECT_EQ(w.interrupt(), 0) << w.output();
}

// Found by a probe: under an ACL whose channel rules allow the channels but not the pattern
// PSUBSCRIBE reads literally, watch exited 2 (NOPERM). It now watches without a fair lock's
// wake-ups, saying so, and still follows the unlock messages.
TEST(rlock_command, watch_goes_on_without_the_pattern_an_acl_refuses) {
    redis_server own;
    own.cmd({"ACL", "SETUSER", "watcher", "on", ">pw", "~*", "&*", "+@all", "-psubscribe"});
    rlock::client a(own.options());
    rlock::reentrant_lock l(a, name());
    l.lock(20s);
    watch_run w(name(), "redis://watcher:pw@127.0.0.1:" + std::to_string(own.port()));
    ASSERT_TRUE(w.started());
    EXPECT_TRUE(eventually([&] { return has(w.output(), "watching"); })) << w.output();
    EXPECT_TRUE(has(w.output(), "PSUBSCRIBE refused")) << w.output();
    EXPECT_TRUE(eventually([&] { return has(w.output(), "+ exclusive " + a.id() + ":"); })) << w.output();
    l.unlock();
    EXPECT_TRUE(eventually([&] { return has(w.output(), "released"); }, 3000ms))
        << "the unlock message did not make it read again: " << w.output();
    EXPECT_EQ(w.interrupt(), 0) << w.output();
}

// Found by a probe: a channel the ACL refuses ended watch with NOPERM "one of the channels",
// not saying which; it is named now.
TEST(rlock_command, watch_names_the_channel_an_acl_refuses) {
    redis_server own;
    own.cmd({"ACL", "SETUSER", "watcher", "on", ">pw", "~*", "&rlock_lock__channel:*", "+@all"});
    const cli_result r = run_cli({"watch", name(), "--uri", "redis://watcher:pw@127.0.0.1:" + std::to_string(own.port())});
    expect_one_clear_line(r);
    EXPECT_TRUE(has(r.err, "SUBSCRIBE redisson_lock__channel:{" + name() + "}")) << r.err;
}

std::string file_text(const std::string& path) {
    std::string text;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
        char buf[4096];
        std::size_t n = 0;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
        std::fclose(f);
    }
    return text;
}

// Found by a probe: force-unlock asked about one holder and deleted whoever held the lock when
// the answer came. Here the holder shown goes (its key expired) and a live service takes the
// name, as another kind, while the question waits: nothing is deleted, and it says why.
TEST(rlock_command, force_unlock_deletes_only_the_holder_it_asked_about) {
    const std::string n = name();
    server().cmd({"SET", n, "holder-x", "PX", "60000"});
    char out_path[] = "/tmp/rlock_cli_out_XXXXXX", err_path[] = "/tmp/rlock_cli_err_XXXXXX";
    ::close(::mkstemp(out_path));
    ::close(::mkstemp(err_path));
    const std::string cmd = quoted(RLOCK_TEST_CLI) + " force-unlock " + quoted(n) + " --uri " +
                            quoted(server().uri()) + " >" + quoted(out_path) + " 2>" + quoted(err_path);
    FILE* answer = ::popen(cmd.c_str(), "w");
    ASSERT_NE(answer, nullptr);
    const bool asked = eventually([&] { return has(file_text(err_path), "[y/N]"); }, 20s);
    server().cmd({"DEL", n});
    server().cmd({"HSET", n, "svc-y:7", "1"});
    server().cmd({"PEXPIRE", n, "30000"});
    std::fputs("y\n", answer);
    const int status = ::pclose(answer);
    const std::string out = file_text(out_path), err = file_text(err_path);
    std::remove(out_path);
    std::remove(err_path);
    ASSERT_TRUE(asked) << err;
    EXPECT_TRUE(has(err, "holder-x")) << err;
    EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1) << out << err;
    EXPECT_TRUE(has(out, "changed since it was shown")) << out;
    EXPECT_TRUE(has(out, "svc-y:7")) << "what holds it now is not said: " << out;
    EXPECT_EQ(server().text({"HGET", n, "svc-y:7"}), "1") << "the new holder's lock was deleted";
}

// Found by a probe: a user whose ACL covers only its own keys (`~app:*`, as the README's rules
// do) could not list: SCAN names every key, and the first name outside the rules ended the
// listing with NOPERM (exit 2). Such names are left out now.
TEST(rlock_command, list_leaves_out_the_names_an_acl_keeps_the_user_from) {
    redis_server own;
    own.cmd({"ACL", "SETUSER", "lister", "on", ">pw", "~app:*", "~redisson_lock_*:{app:*", "~{app:*", "&*",
             "+@all"});
    own.cmd({"SET", "app:one", "tok-1", "PX", "60000"});
    own.cmd({"SET", "zzz:other", "tok-2", "PX", "60000"});
    own.cmd({"SET", "aaa:other", "tok-3", "PX", "60000"});
    const cli_result r = run_cli({"list", "--uri", "redis://lister:pw@127.0.0.1:" + std::to_string(own.port())});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, "app:one")) << r.out;
    EXPECT_FALSE(has(r.out, "other")) << r.out;
    // Refused for a whole command, not for keys, it is still an error.
    own.cmd({"ACL", "SETUSER", "lister", "-evalsha", "-eval"});
    expect_one_clear_line(run_cli({"list", "--uri", "redis://lister:pw@127.0.0.1:" + std::to_string(own.port())}));
}

// Found by a probe: names' control bytes went to the terminal as they were (a newline split a
// row of `list`), a name that is not UTF-8 made `--json` output that is not JSON, a name
// containing ":rwlock_timeout:" was never listed, and a failure to connect did not name the
// lock (a bad URI did not say which).
TEST(rlock_command, odd_names_print_on_one_line_as_valid_json_and_are_listed) {
    const std::string stem = name(), nl = stem + ".a\nb", bin = stem + ".\xff\x02", rw = stem + ":rwlock_timeout:1";
    for (const std::string& n : {nl, bin, rw}) server().cmd({"SET", n, "tok", "PX", "60000"});
    const cli_result table = run_cli({"list", stem + "*", "--uri", server().uri()});
    EXPECT_EQ(table.code, 0) << table.err;
    std::size_t lines = 0;
    for (char ch : table.out) lines += ch == '\n';
    EXPECT_EQ(lines, 4u) << "a header and one line per name: " << table.out;
    EXPECT_TRUE(has(table.out, stem + ".a\\nb")) << table.out;
    EXPECT_TRUE(has(table.out, rw)) << table.out;
    const cli_result json = run_cli({"inspect", bin, "--uri", server().uri(), "--json"});
    EXPECT_EQ(json.code, 0) << json.err;
    EXPECT_FALSE(has(json.out, "\xff")) << "a byte that is not UTF-8 in JSON";
    EXPECT_TRUE(has(json.out, "\\ufffd")) << json.out;
    std::string hex;
    for (const char c : bin) {
        char b[3];
        std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(c));
        hex += b;
    }
    EXPECT_TRUE(has(json.out, "\"name_hex\":\"" + hex + "\"")) << json.out;
    for (const std::string& n : {nl, bin, rw}) server().cmd({"DEL", n});

    const cli_result refused = run_cli({"inspect", stem, "--uri", "redis://127.0.0.1:" + std::to_string(rlock_test::free_port())});
    expect_one_clear_line(refused);
    EXPECT_TRUE(has(refused.err, "lock \"" + stem + "\"")) << refused.err;
    const cli_result bad = run_cli({"inspect", stem, "--uri", "redis://user:secret@127.0.0.1:port"});
    expect_one_clear_line(bad);
    EXPECT_TRUE(has(bad.err, "--uri")) << bad.err;
    EXPECT_FALSE(has(bad.err, "secret")) << bad.err;
}

#endif  // RLOCK_TEST_CLI
