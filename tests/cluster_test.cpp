// Redis Cluster (issue 7): real clusters of 3 masters with a replica each, made by the test.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/helpers.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using rlock_test::eventually;
using rlock_test::redis_cluster;
using rlock_test::redis_server;

namespace {

/// A lock name starting with `stem` whose slot `master` serves.
std::string name_on(redis_cluster& c, const redis_server& master, const std::string& stem) {
    for (int i = 0; i < 1000; ++i) {
        std::string n = stem + "." + std::to_string(i);
        if (&c.master_for_slot(redis_cluster::key_slot(n)) == &master) return n;
    }
    throw std::runtime_error("test: no name found on that master");
}

/// Subscribers of `channel` on one node: classic (PUBSUB NUMSUB) or sharded (SHARDNUMSUB).
long long subscribers_on(const redis_server& s, const std::string& channel, bool sharded) {
    if (s.pid() <= 0) return 0;
    auto r = s.cmd({"PUBSUB", sharded ? "SHARDNUMSUB" : "NUMSUB", channel});
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) return r->element[1]->integer;
    return 0;
}

/// Subscribers of `channel` over the whole cluster, classic and sharded (each node counts its
/// own).
long long subscribers(redis_cluster& c, const std::string& channel) {
    long long n = 0;
    for (auto& s : c.nodes()) n += subscribers_on(*s, channel, false) + subscribers_on(*s, channel, true);
    return n;
}

/// A raw connection that SSUBSCRIBEs to one channel on one node, as Redisson's waiters do in a
/// Redis 7 cluster, and reads what it is sent.
class shard_listener {
public:
    shard_listener(const redis_server& node, const std::string& channel)
        : c_(redisConnect("127.0.0.1", node.port())) {
        if (!c_ || c_->err) throw std::runtime_error("test: cannot connect to the node");
        rlock::detail::reply_ptr r(static_cast<redisReply*>(redisCommand(c_.get(), "SSUBSCRIBE %s", channel.c_str())));
        if (!r || r->type != REDIS_REPLY_ARRAY) throw std::runtime_error("test: SSUBSCRIBE refused");
    }
    /// The next smessage's payload within `limit`, or "" when none came.
    std::string next_message(std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        for (;;) {
            void* raw = nullptr;
            if (redisGetReplyFromReader(c_.get(), &raw) != REDIS_OK) return "";
            if (raw) {
                rlock::detail::reply_ptr r(static_cast<redisReply*>(raw));
                if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                    std::string(r->element[0]->str, r->element[0]->len) == "smessage") {
                    return std::string(r->element[2]->str, r->element[2]->len);
                }
                continue;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
            if (left.count() <= 0) return "";
            pollfd p{c_->fd, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
            if (redisBufferRead(c_.get()) != REDIS_OK) return "";
        }
    }

private:
    struct closer {
        void operator()(redisContext* c) const { redisFree(c); }
    };
    std::unique_ptr<redisContext, closer> c_;
};

/// Two clients' locks of kind `Lock` on `name`: the first locks, the key is on `master` and the
/// second is refused; after the unlock the key is gone and the second gets the lock.
template <class Lock>
void lock_excludes_on(rlock::client& first, rlock::client& second, const std::string& name,
                      const redis_server& master) {
    Lock a(first, name), b(second, name);
    a.lock();
    EXPECT_EQ(master.integer({"EXISTS", name}), 1) << name << " is not on its slot's master";
    EXPECT_FALSE(b.try_lock()) << name;
    a.unlock();
    EXPECT_EQ(master.integer({"EXISTS", name}), 0) << name;
    EXPECT_TRUE(b.try_lock()) << name;
    b.unlock();
}

/// Replies built by hand, as hiredis would hand them over, for the parsers.
class reply_tree {
public:
    redisReply* integer(long long v) {
        redisReply* r = make(REDIS_REPLY_INTEGER);
        r->integer = v;
        return r;
    }
    redisReply* text(std::string s) {
        std::string& kept = texts_.emplace_back(std::move(s));
        redisReply* r = make(REDIS_REPLY_STRING);
        r->str = kept.data();
        r->len = kept.size();
        return r;
    }
    redisReply* nil() { return make(REDIS_REPLY_NIL); }
    redisReply* array(std::vector<redisReply*> elements) {
        std::vector<redisReply*>& kept = arrays_.emplace_back(std::move(elements));
        redisReply* r = make(REDIS_REPLY_ARRAY);
        r->element = kept.data();
        r->elements = kept.size();
        return r;
    }
    /// One CLUSTER SLOTS range: [first, last, [host, port, id]].
    redisReply* range(long long first, long long last, redisReply* host, long long port) {
        return array({integer(first), integer(last), array({host, integer(port), text("id")})});
    }

private:
    redisReply* make(int type) {
        redisReply& r = replies_.emplace_back();
        r.type = type;
        return &r;
    }
    std::list<redisReply> replies_;
    std::list<std::string> texts_;
    std::list<std::vector<redisReply*>> arrays_;
};

}  // namespace

TEST(cluster_parse, redirections_name_the_slot_and_node_and_malformed_ones_are_not_followed) {
    using rlock::detail::parse_redirect;
    using rlock::detail::redirect;
    redirect r = parse_redirect("MOVED 3999 127.0.0.1:6381");
    EXPECT_EQ(r.kind, redirect::moved);
    EXPECT_EQ(r.slot, 3999);
    EXPECT_EQ(r.host, "127.0.0.1");
    EXPECT_EQ(r.port, 6381);
    r = parse_redirect("ASK 12 [::1]:7000");
    EXPECT_EQ(r.kind, redirect::ask);
    EXPECT_EQ(r.slot, 12);
    EXPECT_EQ(r.host, "::1");
    EXPECT_EQ(r.port, 7000);
    r = parse_redirect("MOVED 5 :7001");  // the node we asked, on another port
    EXPECT_EQ(r.kind, redirect::moved);
    EXPECT_EQ(r.host, "");
    EXPECT_EQ(r.port, 7001);
    EXPECT_EQ(parse_redirect("TRYAGAIN Multiple keys request during rehashing of slot").kind,
              redirect::try_again);
    EXPECT_EQ(parse_redirect("CLUSTERDOWN The cluster is down").kind, redirect::try_again);
    for (const char* bad : {"MOVED  127.0.0.1:1", "MOVED 3999 127.0.0.1:", "MOVED 16384 h:1",
                            "MOVED 1 h:65536", "MOVED x1 h:1", "ASK 1 h", "ERR MOVED 1 h:1",
                            "NOSCRIPT No matching script", ""}) {
        EXPECT_EQ(parse_redirect(bad).kind, redirect::none) << bad;
    }
}

// The error made from a redirecting reply carries the redirection as data, whatever the lock's
// name says: a name that reads like a redirection is never followed.
TEST(cluster_parse, an_error_carries_the_redirection_of_its_reply_not_of_its_text) {
    using rlock::detail::error_access;
    using rlock::detail::redirect;
    auto from_reply = [](const char* text, const char* lock) {
        redisReply r{};
        r.type = REDIS_REPLY_ERROR;
        r.str = const_cast<char*>(text);
        r.len = std::strlen(text);
        return rlock::detail::make_error(nullptr, &r, lock, "cluster node h:1");
    };
    const rlock::error busy =
        from_reply("TRYAGAIN Multiple keys request during rehashing of slot", "l");
    EXPECT_EQ(error_access::origin(busy).to.kind, redirect::try_again);
    EXPECT_EQ(busy.lock(), "l");
    EXPECT_EQ(busy.server(), "cluster node h:1");
    EXPECT_EQ(busy.cause(), "TRYAGAIN Multiple keys request during rehashing of slot");
    const rlock::error moved = from_reply("MOVED 1 h:2", "l");
    EXPECT_EQ(error_access::origin(moved).to.kind, redirect::moved);
    EXPECT_EQ(error_access::origin(moved).to.host, "h");
    EXPECT_EQ(error_access::origin(moved).to.port, 2);
    const rlock::error named = from_reply("ERR something else", ": TRYAGAIN MOVED 1 h:2");
    EXPECT_EQ(error_access::origin(named).to.kind, redirect::none);
    // Re-addressed to the node that failed, it keeps its redirection.
    EXPECT_EQ(error_access::origin(error_access::on(busy, "cluster node h:3")).to.kind,
              redirect::try_again);
    EXPECT_EQ(error_access::origin(error_access::unredirected(moved)).to.kind, redirect::none);
}

TEST(cluster_parse, the_slot_map_reads_every_endpoint_form_of_cluster_slots) {
    rlock::detail::slot_map map;
    reply_tree t;
    // An address; NULL (cluster-preferred-endpoint-type unknown-endpoint) and "" (before Redis
    // 7): the node asked; "?": not known yet, so its slots stay unknown.
    const redisReply* r = t.array({t.range(0, 5460, t.text("10.0.0.1"), 7000),
                                   t.range(5461, 10922, t.nil(), 7001),
                                   t.range(10923, 16000, t.text(""), 7002),
                                   t.range(16001, 16383, t.text("?"), 7003)});
    ASSERT_TRUE(map.load(r, "10.0.0.9"));
    EXPECT_FALSE(map.stale());
    auto at = [&](int slot) {
        const auto m = map.master_of(slot);
        return m ? m->host + ":" + std::to_string(m->port) : std::string("unknown");
    };
    EXPECT_EQ(at(0), "10.0.0.1:7000");
    EXPECT_EQ(at(5460), "10.0.0.1:7000");
    EXPECT_EQ(at(5461), "10.0.0.9:7001");
    EXPECT_EQ(at(16000), "10.0.0.9:7002");
    EXPECT_EQ(at(16001), "unknown");
    EXPECT_EQ(map.masters().size(), 3u);

    // MOVED corrects one slot at once and asks for a full load.
    map.moved(0, {"10.0.0.2", 7004});
    EXPECT_EQ(at(0), "10.0.0.2:7004");
    EXPECT_EQ(at(1), "10.0.0.1:7000");
    EXPECT_TRUE(map.stale());

    // What is not a slot map leaves the map as it was.
    EXPECT_FALSE(map.load(t.array({t.range(0, 16383, t.text("?"), 7000)}), "10.0.0.9"));
    EXPECT_FALSE(map.load(t.array({t.range(0, 16384, t.text("h"), 7000)}), "10.0.0.9"));
    EXPECT_FALSE(map.load(t.array({t.array({t.integer(0), t.integer(1)})}), "10.0.0.9"));
    EXPECT_FALSE(map.load(t.array({t.range(0, 1, t.integer(5), 7000)}), "10.0.0.9"));
    EXPECT_FALSE(map.load(t.text("ERR This instance has cluster support disabled"), "10.0.0.9"));
    EXPECT_FALSE(map.load(t.array({}), "10.0.0.9"));
    EXPECT_EQ(at(0), "10.0.0.2:7004");
    EXPECT_EQ(at(16000), "10.0.0.9:7002");
}

// Every script that publishes has a sharded form that SPUBLISHes instead (Redis Cluster with
// sharded pub/sub), and no other way of publishing that the rewrite would miss.
TEST(cluster_parse, every_publishing_script_has_an_spublish_form_and_the_others_are_unchanged) {
    using namespace rlock::detail;
    const std::vector<std::pair<const char*, const script*>> publishing = {
        {"mutex release", &mutex_kind::release_script()},
        {"reentrant release", &reentrant_kind::release_script()},
        {"fair acquire (wakes a new queue head)", &fair_kind::acquire_script()},
        {"fair leave (wakes a new queue head)", &fair_kind::leave_script()},
        {"fair release", &fair_kind::release_script()},
        {"fair force_unlock", &fair_kind::force_unlock_script()},
        {"read release", &rw_read_kind::release_script()},
        {"read force_unlock", &rw_read_kind::force_unlock_script()},
        {"write release", &rw_write_kind::release_script()},
        {"force_unlock", &force_unlock_script()},
        {"multi release", &multi_release_script()},
        {"semaphore release / add_permits", &semaphore_scripts::add()},
        {"semaphore acquire (a lost count set back to its capacity)", &semaphore_scripts::acquire()},
        {"semaphore / latch try_set", &count_scripts::try_set()},
        {"latch count_down", &latch_scripts::count_down()},
        {"permit acquire (puts ended leases back)", &permit_scripts::acquire()},
        {"permit release by a handle", &permit_scripts::release_packed()},
        {"permit release by id", &permit_scripts::release_ids()},
    };
    for (const auto& [what, s] : publishing) {
        const std::string classic(s->body()), sharded(s->body(true));
        EXPECT_NE(classic.find("'publish'"), std::string::npos) << what;
        EXPECT_EQ(sharded.find("'publish'"), std::string::npos) << what;
        EXPECT_NE(sharded.find("redis.call('spublish'"), std::string::npos) << what;
        EXPECT_NE(s->sha(true), s->sha()) << what;
    }
    const std::vector<const script*> all = {
        &mutex_kind::acquire_fenced_script(), &mutex_kind::renew_script(),
        &reentrant_kind::acquire_script(),
        &rw_read_kind::acquire_script(), &rw_read_kind::renew_script(),
        &rw_write_kind::acquire_script(), &rw_write_kind::renew_script(),
        &semaphore_scripts::drain()};
    for (const script* s : all) {
        EXPECT_EQ(s->body(true), s->body());
        EXPECT_EQ(s->sha(true), s->sha());
    }
    // A publish the rewrite would not see (double quotes, capitals) in any script.
    auto all_scripts = all;
    for (const auto& p : publishing) all_scripts.push_back(p.second);
    for (const script* s : all_scripts) {
        std::string lower(s->body());
        for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        std::size_t n = 0;
        for (std::size_t at = lower.find("publish"); at != std::string::npos; at = lower.find("publish", at + 1)) ++n;
        std::size_t quoted = 0;
        const std::string body(s->body());
        for (std::size_t at = body.find("'publish'"); at != std::string::npos; at = body.find("'publish'", at + 1)) ++quoted;
        EXPECT_EQ(n, quoted) << "a publish not written as 'publish' in:\n" << body;
    }
}

TEST(cluster, key_slot_matches_the_servers) {
    redis_server node({"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"});
    std::vector<std::string> keys = {"", "foo", "{user1000}.following", "{user1000}.followers",
                                     "a{}b", "{}", "a{b}c", "a}b{c", "{{a}}", "x{y",
                                     std::string("\xff\0z{\x80}", 6)};
    for (int i = 0; i < 300; ++i) keys.push_back("lock:" + std::to_string(i * 7919));
    for (const std::string& k : keys) {
        EXPECT_EQ(rlock::detail::key_slot(k), node.integer({"CLUSTER", "KEYSLOT", k})) << k;
    }
}

TEST(cluster, every_lock_kind_runs_on_the_master_of_its_slot_and_excludes_other_clients) {
    redis_cluster c;
    rlock::client a(c.uri()), b(c.uri());
    EXPECT_EQ(a.server().substr(0, 8), "cluster ");
    const auto masters = c.masters();
    ASSERT_EQ(masters.size(), 3u);
    const std::string stem = rlock_test::test_lock_name();
    for (const redis_server* m : masters) {
        lock_excludes_on<rlock::mutex>(a, b, name_on(c, *m, stem + ".mutex"), *m);
        lock_excludes_on<rlock::reentrant_lock>(a, b, name_on(c, *m, stem + ".reentrant"), *m);
        lock_excludes_on<rlock::fair_lock>(a, b, name_on(c, *m, stem + ".fair"), *m);
        const std::string n = name_on(c, *m, stem + ".rw");
        lock_excludes_on<rlock::read_write_lock>(a, b, n, *m);  // the write side
        rlock::read_write_lock x(a, n), y(b, n);
        x.lock_shared();  // a read hold's own key lands in the same slot
        EXPECT_TRUE(y.try_lock_shared());
        y.unlock_shared();
        EXPECT_FALSE(y.try_lock_for(10ms)) << "a writer got in beside a reader";
        x.unlock_shared();
        EXPECT_EQ(m->integer({"EXISTS", n}), 0);
    }
}

// A multi_lock given one key twice through two clients of one cluster seeded differently is
// refused (invalid_argument) after the acquire's first round, blocking or asynchronous,
// whichever master serves it. Before, a client had a connection only to the master it first
// met, so the run_ids of the others were unknown and the check, made once as the acquire
// started, was skipped: the acquire waited for itself (lock() for ever, try_lock_for until
// its deadline) for names on those masters.
TEST(cluster, a_multi_lock_given_one_key_through_two_seedings_of_the_cluster_is_refused) {
    redis_cluster c;
    const auto masters = c.masters();
    ASSERT_EQ(masters.size(), 3u);
    const std::string stem = rlock_test::test_lock_name();
    int i = 0;
    for (const redis_server* m : masters) {
        const std::string n = name_on(c, *m, stem + "." + std::to_string(i++));
        for (const bool async : {false, true}) {
            // Fresh clients each time: no connection yet to the master of the name.
            rlock::client a(c.uri());
            rlock::client b("redis-cluster://127.0.0.1:" + std::to_string(masters.back()->port()));
            rlock::mutex x(a, n), y(b, n);
            rlock::multi_lock both{x, y};
            try {
                if (async) {
                    (void)both.async_try_lock_for(3s, rlock::use_future).get();
                } else {
                    (void)both.try_lock_for(3s);
                }
                ADD_FAILURE() << "one key given twice was waited for (" << n << " on port "
                              << m->port() << (async ? ", asynchronously)" : ")");
            } catch (const rlock::error& e) {
                EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
                EXPECT_NE(std::string(e.what()).find("run_id"), std::string::npos) << e.what();
            }
            EXPECT_EQ(m->integer({"EXISTS", n}), 0);
        }
    }
}

TEST(cluster, an_unlock_on_one_master_wakes_a_waiter_whose_subscriber_is_on_another_node) {
    redis_cluster c;
    rlock::client a(c.uri()), b(c.uri());
    for (const redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, rlock_test::test_lock_name());
        rlock::reentrant_lock holder(a, n);
        holder.lock();  // watched: a 30 s lease, so only the unlock message can end the wait
        auto waiter = std::async(std::launch::async, [&] {
            rlock::reentrant_lock w(b, n);
            if (!w.try_lock_for(10s)) return false;
            w.unlock();
            return true;
        });
        ASSERT_TRUE(eventually([&] { return subscribers(c, "redisson_lock__channel:{" + n + "}") == 1; }, 10s));
        holder.unlock();
        EXPECT_TRUE(waiter.get()) << "the waiter on " << n << " did not get the unlock message";
    }
}

// The synchronizers in a cluster: each object's key and channel in one slot, its scripts on
// that slot's master, and a waiter woken there (sharded pub/sub on Redis 7) by a release or the
// last count down from another client.
TEST(cluster, semaphores_and_latches_run_on_the_master_of_their_slot_and_wake_waiters_there) {
    redis_cluster c;
    rlock::client a(c.uri()), b(c.uri());
    const std::string stem = rlock_test::test_lock_name();
    for (const redis_server* m : c.masters()) {
        const std::string sn = name_on(c, *m, stem + ".semaphore");
        rlock::semaphore sa(a, sn), sb(b, sn);
        ASSERT_TRUE(sa.try_set_permits(1));
        EXPECT_EQ(m->text({"GET", sn}), "1") << "not on the master of its slot";
        sa.acquire();
        auto taker = std::async(std::launch::async, [&] { return sb.try_acquire_for(10s); });
        std::this_thread::sleep_for(200ms);
        sa.release();
        ASSERT_TRUE(taker.get()) << "the semaphore waiter on " << sn << " missed the release";
        sb.release();
        EXPECT_EQ(sb.available_permits(), 1);

        const std::string ln = name_on(c, *m, stem + ".latch");
        rlock::count_down_latch la(a, ln), lb(b, ln);
        ASSERT_TRUE(la.try_set_count(1));
        EXPECT_EQ(m->text({"GET", ln}), "1") << "not on the master of its slot";
        auto waiter = std::async(std::launch::async, [&] { return lb.wait_for(10s); });
        std::this_thread::sleep_for(200ms);
        EXPECT_EQ(la.count_down(), 0);
        ASSERT_TRUE(waiter.get()) << "the latch waiter on " << ln << " missed the zero message";
        EXPECT_EQ(m->integer({"EXISTS", ln}), 0);

        // Both keys of a permit semaphore in the slot of its name; a watched permit renewed there.
        const std::string pn = name_on(c, *m, stem + ".permits");
        rlock::permit_expirable_semaphore pa(a, pn), pb(b, pn);
        ASSERT_TRUE(pa.try_set_permits(1));
        rlock::permit p = pa.acquire();
        EXPECT_EQ(m->integer({"ZCARD", "{" + pn + "}:timeout"}), 1) << "not on the master of its slot";
        auto other = std::async(std::launch::async, [&] { return pb.try_acquire_for(10s, 5s); });
        std::this_thread::sleep_for(200ms);
        p.release();
        rlock::permit q = other.get();
        ASSERT_TRUE(q) << "the permit waiter on " << pn << " missed the release";
        q.release();
        EXPECT_EQ(pb.available_permits(), 1);
    }
}

TEST(cluster, the_watchdog_renews_holds_on_every_master_in_per_node_batches) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.lock_watchdog_timeout = 600ms;
    o.on_lock_lost = lost.handler();
    rlock::client a(o);
    std::vector<std::unique_ptr<rlock::reentrant_lock>> locks;
    std::vector<const redis_server*> where;
    for (const redis_server* m : c.masters()) {
        for (int i = 0; i < 3; ++i) {  // several slots per master
            const std::string n = name_on(c, *m, rlock_test::test_lock_name() + std::to_string(i));
            locks.push_back(std::make_unique<rlock::reentrant_lock>(a, n));
            locks.back()->lock();
            where.push_back(m);
        }
    }
    rlock::read_write_lock rw(a, name_on(c, *c.masters()[1], rlock_test::test_lock_name() + ".rw"));
    rw.lock_shared();
    std::this_thread::sleep_for(2s);  // more than three leases
    for (std::size_t i = 0; i < locks.size(); ++i) {
        EXPECT_GT(where[i]->integer({"PTTL", locks[i]->name()}), 0) << locks[i]->name() << " was not renewed";
        EXPECT_FALSE(locks[i]->lost());
    }
    EXPECT_FALSE(rw.lost());
    EXPECT_GT(c.masters()[1]->integer({"PTTL", rw.name()}), 0);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    for (auto& l : locks) l->unlock();
    rw.unlock_shared();
    for (std::size_t i = 0; i < locks.size(); ++i) EXPECT_EQ(where[i]->integer({"EXISTS", locks[i]->name()}), 0);
}

TEST(cluster, names_with_a_hash_tag_keep_their_keys_in_the_tags_slot_as_redisson_names_them) {
    redis_cluster c;
    rlock::client a(c.uri());
    const std::string x = "{acct-" + rlock_test::test_lock_name() + "}.debit";
    const std::string y = "{acct-" + rlock_test::test_lock_name() + "}.credit";
    const int slot = redis_cluster::key_slot(x);
    ASSERT_EQ(slot, redis_cluster::key_slot(y));
    redis_server& m = c.master_for_slot(slot);
    rlock::lock_options fenced;
    fenced.fencing = true;
    rlock::fair_lock f(a, x, fenced);
    f.lock();
    // Redisson's prefixName: a name with its own '{' is not wrapped in braces again.
    EXPECT_EQ(m.integer({"EXISTS", "redisson_lock_token:" + x}), 1);
    f.unlock();
    rlock::read_write_lock rw(a, y);
    rw.lock_shared();
    const std::string holder = a.id() + ":" + std::to_string(rlock::detail::current_thread_number());
    EXPECT_EQ(m.integer({"EXISTS", y + ":" + holder + ":rwlock_timeout:1"}), 1);
    rw.unlock_shared();

    // Two parts in one slot, and two on different masters: both all-or-nothing.
    rlock::mutex p(a, x), q(a, y);
    rlock::mutex far(a, name_on(c, c.masters()[0] == &m ? *c.masters()[1] : *c.masters()[0],
                                rlock_test::test_lock_name()));
    {
        rlock::multi_lock same{p, q};
        std::lock_guard<rlock::multi_lock> g(same);
        EXPECT_EQ(m.integer({"EXISTS", x}), 1);
        EXPECT_EQ(m.integer({"EXISTS", y}), 1);
    }
    {
        rlock::multi_lock apart{p, far};
        std::lock_guard<rlock::multi_lock> g(apart);
        EXPECT_TRUE(p.is_locked());
        EXPECT_TRUE(far.is_locked());
    }
    EXPECT_FALSE(p.is_locked());
    EXPECT_FALSE(far.is_locked());

    // A '{' without a tag would scatter the lock's keys over slots: refused, nothing sent.
    try {
        rlock::reentrant_lock bad(a, "orders{7");
        FAIL() << "a name without a usable hash tag was accepted in a cluster";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("orders{7"), std::string::npos) << e.what();
    }
    // So does the operator's view (it was CROSSSLOT, a server_error), and listing leaves such a
    // name out.
    for (const char* bad : {"orders{7", "a{}b", "x}{y"}) {
        try {
            (void)rlock::inspect(a, bad);
            ADD_FAILURE() << bad << ": inspected";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
            EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
        }
        try {
            (void)rlock::force_unlock(a, bad);
            ADD_FAILURE() << bad << ": force_unlock returned";
        } catch (const rlock::error& e) {
            EXPECT_EQ(e.value(), rlock::errc::invalid_argument) << e.what();
        }
    }
    const std::string queue = "redisson_lock_queue:{orders{7}";
    c.master_for_slot(redis_cluster::key_slot(queue)).cmd({"RPUSH", queue, "x"});
    EXPECT_NO_THROW((void)rlock::list_locks(a, "orders*"));
}

TEST(cluster, a_lock_whose_slot_migrates_stays_held_and_exclusive_through_ask_and_moved) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.lock_watchdog_timeout = 600ms;
    o.command_timeout = 3s;
    o.on_lock_lost = lost.handler();
    rlock::client a(o), b(o);
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string n = name_on(c, from, rlock_test::test_lock_name());
    const std::string m = name_on(c, from, rlock_test::test_lock_name() + ".mutex");
    const int slot = redis_cluster::key_slot(n), mslot = redis_cluster::key_slot(m);
    rlock::reentrant_lock held(a, n), other(b, n);
    rlock::mutex mheld(a, m), mother(b, m);
    held.lock();
    mheld.lock();

    c.begin_migration(slot, from, to);
    if (mslot != slot) c.begin_migration(mslot, from, to);
    EXPECT_FALSE(other.try_lock()) << "refused on the source, which still has the key";
    c.move_keys(slot, from, to);
    if (mslot != slot) c.move_keys(mslot, from, to);
    ASSERT_TRUE(rlock::detail::reply_is_error(from.cmd({"EXISTS", n}).get(), "ASK"))
        << "the key did not leave the source";
    // The source answers ASK now: each attempt goes to the target with ASKING, where the key
    // moved with its holder, and is refused there.
    EXPECT_FALSE(other.try_lock());
    EXPECT_FALSE(mother.try_lock());
    EXPECT_TRUE(held.is_locked());
    std::this_thread::sleep_for(900ms);  // renewals in the middle of the migration (ASK)
    EXPECT_FALSE(held.lost());
    EXPECT_FALSE(mheld.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    mheld.unlock();  // on the target, through ASK
    ASSERT_TRUE(mother.try_lock()) << "the mutex's unlock did not reach the target";
    mother.unlock();

    c.end_migration(slot, to);
    if (mslot != slot) c.end_migration(mslot, to);
    // After the migration: MOVED, followed to the new owner.
    EXPECT_FALSE(other.try_lock());
    std::this_thread::sleep_for(700ms);  // renewals on the new owner
    EXPECT_GT(to.integer({"PTTL", n}), 0);
    held.unlock();
    EXPECT_EQ(to.integer({"EXISTS", n}), 0) << "the unlock did not reach the new owner";
    ASSERT_TRUE(other.try_lock());
    EXPECT_EQ(to.integer({"EXISTS", n}), 1);
    other.unlock();
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
}

// A fair_lock waiter whose wait ends while its slot is half migrated (the lock's hash moved,
// its queue not: every script of the lock is refused with TRYAGAIN) leaves the queue once the
// migration ends, through the client's watchdog, as after a server that did not answer.
// Before, the refused leave was dropped: the dead entry stood first in the queue until its
// deadline (5 minutes) and kept everyone from the free lock.
TEST(cluster, a_fair_lock_waiter_that_ends_during_a_migration_leaves_the_queue_once_it_ends) {
    redis_cluster c;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 500ms;
    rlock::client holder(c.uri()), waiter(o), fresh(c.uri());
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string n = name_on(c, from, rlock_test::test_lock_name());
    const int slot = redis_cluster::key_slot(n);
    const std::string queue = "redisson_lock_queue:{" + n + "}";
    rlock::fair_lock held(holder, n), waits(waiter, n), later(fresh, n);
    held.lock();
    auto wait = std::async(std::launch::async, [&] {
        try {
            return waits.try_lock_for(1500ms) ? 1 : 0;
        } catch (const rlock::error& e) {
            return e.value() == rlock::errc::server_error ? 2 : 3;
        }
    });
    ASSERT_TRUE(eventually([&] { return from.integer({"LLEN", queue}) == 1; }));
    c.begin_migration(slot, from, to);
    rlock::detail::reply_ptr r =
        from.cmd({"MIGRATE", "127.0.0.1", std::to_string(to.port()), n, "0", "5000"});
    ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << rlock::detail::reply_text(r.get());
    ASSERT_EQ(wait.wait_for(10s), std::future_status::ready);
    const int ended = wait.get();
    EXPECT_TRUE(ended == 0 || ended == 2) << ended;  // false, or the TRYAGAIN as server_error
    std::this_thread::sleep_for(300ms);  // the leave is refused meanwhile
    EXPECT_EQ(from.integer({"LLEN", queue}), 1) << "the queue moved before the test moved it";
    c.move_keys(slot, from, to);
    c.end_migration(slot, to);
    EXPECT_TRUE(eventually([&] { return to.integer({"LLEN", queue}) == 0; }, 10s))
        << "the waiter's entry stayed in the queue";
    held.unlock();
    EXPECT_TRUE(later.try_lock_for(3s)) << "the free lock was kept from a new waiter";
    later.unlock();
}

// A read-write lock's scripts also touch its read holds' keys, which they cannot declare. While
// its slot migrates, some of those keys may be on the new node and some on the old: no script
// may then run half-way on the old node, nor on the new one (via ASK) where it would take a
// reader whose hold keys are still on the old node for dead. Every operation waits for the
// migration to end instead, and then runs where all the keys are.
TEST(cluster, read_write_locks_wait_out_a_migration_that_has_moved_part_of_their_keys) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 10s;
    // Renewals fall in the migration too, and cannot succeed there (b's batch spans both
    // nodes): the lease leaves a loaded machine seconds for the migration's steps.
    o.lock_watchdog_timeout = 6s;
    o.on_lock_lost = lost.handler();
    rlock::client a(o), b(o), w(o);
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string tag = name_on(c, from, rlock_test::test_lock_name());
    const std::string x = "{" + tag + "}.x", y = "{" + tag + "}.y";
    const int slot = redis_cluster::key_slot(x);
    ASSERT_EQ(slot, redis_cluster::key_slot(y));
    rlock::read_write_lock ax(a, x), bx(b, x), wx(w, x), ay(a, y), by(b, y), wy(w, y);
    // a's reads are taken and given back on threads of their own (a hold is its thread's), the
    // give-back once `go` is set, in the middle of the migration.
    std::promise<void> go;
    const std::shared_future<void> released = go.get_future().share();
    // A failed assertion below leaves the test with the readers' threads let go, not hung.
    const std::shared_ptr<void> let_go(nullptr, [&](void*) {
        try {
            go.set_value();
        } catch (const std::future_error&) {  // already let go
        }
    });
    auto read_until_go = [&](rlock::read_write_lock& l, std::promise<void>& held) {
        try {
            l.lock_shared();
        } catch (...) {
            held.set_exception(std::current_exception());
            return;
        }
        held.set_value();
        released.wait();
        l.unlock_shared();
    };
    std::promise<void> held_x, held_y;
    auto unlock_x = std::async(std::launch::async, read_until_go, std::ref(ax), std::ref(held_x));
    auto unlock_y = std::async(std::launch::async, read_until_go, std::ref(ay), std::ref(held_y));
    held_x.get_future().get();
    held_y.get_future().get();
    bx.lock_shared();
    by.lock_shared();

    // x: its hold keys have moved, its hash has not; y: its hash has moved, its hold keys not.
    c.begin_migration(slot, from, to);
    rlock::detail::reply_ptr keys = from.cmd({"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "100"});
    ASSERT_EQ(keys->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(keys->elements, 6u);  // two hashes, four hold keys
    for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string k(keys->element[i]->str, keys->element[i]->len);
        if (k != y && k.compare(0, x.size() + 1, x + ":") != 0) continue;
        rlock::detail::reply_ptr r =
            from.cmd({"MIGRATE", "127.0.0.1", std::to_string(to.port()), k, "0", "5000"});
        ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << k;
    }
    go.set_value();
    auto write_then_unlock = [](rlock::read_write_lock& l) {
        const bool got = l.try_lock_for(9s);
        if (got) l.unlock();
        return got;
    };
    auto write_x = std::async(std::launch::async, write_then_unlock, std::ref(wx));
    auto write_y = std::async(std::launch::async, write_then_unlock, std::ref(wy));
    std::this_thread::sleep_for(400ms);
    EXPECT_EQ(write_x.wait_for(0s), std::future_status::timeout) << "a writer got in beside readers";
    EXPECT_EQ(write_y.wait_for(0s), std::future_status::timeout) << "a writer got in beside readers";
    // Nothing ran half-way on the old node: x's hash still counts both readers.
    EXPECT_EQ(from.integer({"HLEN", x}), 3);

    c.move_keys(slot, from, to);
    c.end_migration(slot, to);
    unlock_x.get();
    unlock_y.get();
    EXPECT_EQ(write_x.wait_for(300ms), std::future_status::timeout) << "x's second reader still holds";
    EXPECT_EQ(write_y.wait_for(0s), std::future_status::timeout) << "y's second reader still holds";
    EXPECT_EQ(to.integer({"HLEN", x}), 2);  // mode and b's hold
    EXPECT_EQ(to.integer({"HLEN", y}), 2);
    bx.unlock_shared();
    by.unlock_shared();
    EXPECT_TRUE(write_x.get());
    EXPECT_TRUE(write_y.get());
    EXPECT_EQ(to.integer({"EXISTS", x}), 0);
    EXPECT_EQ(to.integer({"EXISTS", y}), 0);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
}

// A script with several declared keys, all missing on a migrating slot's source, is sent on by
// ASK, and the target answers TRYAGAIN (it cannot tell whether the keys are still coming). The
// lock waits for the migration to end however many such rounds that takes: command_timeout
// bounds it, not a count of redirections.
TEST(cluster, a_multi_key_script_waits_out_a_migration_through_any_number_of_ask_rounds) {
    redis_cluster c;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 20s;
    rlock::client a(o);
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string tag = name_on(c, from, rlock_test::test_lock_name());
    const std::string x = "{" + tag + "}.x", y = "{" + tag + "}.y";
    const int slot = redis_cluster::key_slot(x);
    rlock::mutex p(a, x), q(a, y);
    rlock::multi_lock both{p, q};  // one slot: one script declaring both keys

    c.begin_migration(slot, from, to);
    auto locked = std::async(std::launch::async, [&] {
        std::lock_guard<rlock::multi_lock> g(both);
        return to.integer({"EXISTS", x}) + to.integer({"EXISTS", y});
    });
    // 16 redirections take well under a second; the migration is still on after 1.5 s.
    EXPECT_EQ(locked.wait_for(1500ms), std::future_status::timeout)
        << "the lock gave up (or got in) while its slot was still migrating";
    c.move_keys(slot, from, to);
    c.end_migration(slot, to);
    EXPECT_EQ(locked.get(), 2) << "both keys on the slot's new master while held";
    EXPECT_FALSE(p.is_locked());
    EXPECT_FALSE(q.is_locked());
}

TEST(cluster, a_master_failover_keeps_holds_renewed_and_waiters_get_the_lock_on_the_new_master) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.lock_watchdog_timeout = 3s;  // longer than a manual failover
    o.command_timeout = 3s;
    o.on_lock_lost = lost.handler();
    rlock::client holder(o), other(o), third(o);
    redis_server& old_master = *c.masters()[0];
    const std::string n = name_on(c, old_master, rlock_test::test_lock_name());
    rlock::reentrant_lock l(holder, n);
    l.lock();
    std::atomic<bool> waiter_got{false};
    auto waiter = std::async(std::launch::async, [&] {
        rlock::reentrant_lock w(other, n);
        if (!w.try_lock_for(30s)) return false;
        waiter_got = true;
        w.unlock();
        return true;
    });
    ASSERT_TRUE(eventually([&] { return subscribers(c, "redisson_lock__channel:{" + n + "}") == 1; }, 10s));

    redis_server& new_master = c.fail_over(old_master);
    ASSERT_NE(&new_master, &old_master);
    EXPECT_EQ(new_master.integer({"EXISTS", n}), 1) << "the hold did not reach the replica";
    rlock::reentrant_lock intruder(third, n);
    EXPECT_FALSE(intruder.try_lock()) << "exclusion broke across the failover";
    std::this_thread::sleep_for(4s);  // more than a lease: only renewals on the new master keep it
    EXPECT_GT(new_master.integer({"PTTL", n}), 0);
    EXPECT_FALSE(l.lost());
    EXPECT_FALSE(waiter_got.load()) << "the waiter got a lock that was still held";
    l.unlock();
    EXPECT_TRUE(waiter.get()) << "the waiter did not get the lock after the failover";
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_EQ(new_master.integer({"EXISTS", n}), 0);
}

// Losses told at once in a cluster (issue 34): the watchdog keeps, per master, a tracked
// connection that renews and reads the holds of its slots and one that the master's
// invalidations go to. With the watchdog at its default 30 s (a tick every 10 s), a hold whose
// key is deleted, flushed or overwritten on any master is told within 2 s — at once against a
// tick, with room for a loaded machine — and a slot's migration or a failover moves the watch
// with the hold without telling a loss.
namespace {

/// How long after `fault()` the owner was told (lost.calls went up), or 20 s.
std::chrono::milliseconds cluster_told_after(rlock_test::lost_log& lost, const std::function<void()>& fault) {
    const int before = lost.calls.load();
    std::this_thread::sleep_for(150ms);  // past the arming delay: the key is read where it is tracked
    const auto start = std::chrono::steady_clock::now();
    fault();
    eventually([&] { return lost.calls.load() > before; }, 20s);
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

/// Options for `c` with the watchdog at its default and losses told to `lost`.
rlock::client_options told_options(redis_cluster& c, rlock_test::lost_log& lost) {
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 3s;
    o.on_lock_lost = lost.handler();
    return o;
}

}  // namespace

TEST(cluster_loss, a_hold_on_any_master_deleted_flushed_or_overwritten_is_told_at_once) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client a(told_options(c, lost));
    const std::string stem = rlock_test::test_lock_name();
    redis_server& m0 = *c.masters()[0];
    redis_server& m1 = *c.masters()[1];
    redis_server& m2 = *c.masters()[2];

    rlock::mutex x(a, name_on(c, m0, stem + ".mutex"));
    x.lock();
    EXPECT_LT(cluster_told_after(lost, [&] { m0.cmd({"DEL", x.name()}); }), 2s);
    EXPECT_TRUE(x.lost());
    x.unlock();

    rlock::reentrant_lock y(a, name_on(c, m1, stem + ".reentrant"));
    y.lock();
    EXPECT_LT(cluster_told_after(lost, [&] { m1.cmd({"FLUSHALL"}); }), 2s);
    EXPECT_TRUE(y.lost());
    y.unlock();

    rlock::fair_lock z(a, name_on(c, m2, stem + ".fair"));
    z.lock();
    EXPECT_LT(cluster_told_after(lost, [&] {
                  m2.cmd({"DEL", z.name()});
                  m2.cmd({"SET", z.name(), "another holder's token", "PX", "30000"});
              }),
              2s);
    EXPECT_TRUE(z.lost());
    z.unlock();

    rlock::read_write_lock rw(a, name_on(c, m0, stem + ".rw"));
    rw.lock_shared();
    EXPECT_LT(cluster_told_after(lost, [&] { m0.cmd({"DEL", rw.name()}); }), 2s);
    rw.unlock_shared();

    rlock::mutex leased(a, name_on(c, m1, stem + ".leased"));
    leased.lock(30s);
    EXPECT_LT(cluster_told_after(lost, [&] { m1.cmd({"DEL", leased.name()}); }), 2s);
    EXPECT_TRUE(leased.lost());
    leased.unlock();
    EXPECT_EQ(lost.calls.load(), 5) << lost.last_message;
}

// The holder's own writes (a re-entry, renewals every 200 ms) and another client refused are
// invalidations too: each is verified by a renewal that finds the hold still there.
TEST(cluster_loss, changes_that_leave_a_hold_in_place_are_not_losses) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = told_options(c, lost);
    o.lock_watchdog_timeout = 600ms;
    rlock::client a(o), other(rlock::client_options::from_uri(c.uri()));
    std::vector<std::unique_ptr<rlock::reentrant_lock>> held;
    for (redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, rlock_test::test_lock_name());
        held.push_back(std::make_unique<rlock::reentrant_lock>(a, n));
        held.back()->lock();
    }
    std::this_thread::sleep_for(150ms);
    for (auto& l : held) {
        l->lock();  // a re-entry: the holder's own write, on a pooled connection
        l->unlock();
        rlock::reentrant_lock rival(other, l->name());
        EXPECT_FALSE(rival.try_lock_for(100ms));
    }
    std::this_thread::sleep_for(900ms);  // renewals on every master's tracked connection
    for (auto& l : held) {
        EXPECT_FALSE(l->lost()) << l->name();
        l->unlock();
    }
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
}

// A slot migrated to another master: the move (MIGRATE deletes the key on the source) is no
// loss, and the hold is watched on its new master from then on.
TEST(cluster_loss, a_hold_whose_slot_migrated_is_no_loss_and_is_told_at_once_on_its_new_master) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client a(told_options(c, lost));
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string n = name_on(c, from, rlock_test::test_lock_name());
    const int slot = redis_cluster::key_slot(n);
    rlock::reentrant_lock held(a, n);
    held.lock();
    std::this_thread::sleep_for(150ms);  // armed on the source
    c.begin_migration(slot, from, to);
    c.move_keys(slot, from, to);
    std::this_thread::sleep_for(300ms);  // the move's invalidation: renewed on the target (ASK)
    c.end_migration(slot, to);
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(held.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_LT(cluster_told_after(lost, [&] { to.cmd({"DEL", n}); }), 2s);
    EXPECT_TRUE(held.lost());
    held.unlock();
}

// A failover: the hold is not lost, and a DEL on the new master is told at once.
TEST(cluster_loss, a_hold_deleted_on_the_new_master_after_a_failover_is_told_at_once) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client a(told_options(c, lost));
    redis_server& old_master = *c.masters()[0];
    const std::string n = name_on(c, old_master, rlock_test::test_lock_name());
    rlock::reentrant_lock held(a, n);
    held.lock();
    std::this_thread::sleep_for(150ms);  // armed on the old master
    redis_server& new_master = c.fail_over(old_master);
    ASSERT_NE(&new_master, &old_master);
    ASSERT_EQ(new_master.integer({"EXISTS", n}), 1) << "the hold did not reach the replica";
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(held.lost());
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    EXPECT_LT(cluster_told_after(lost, [&] { new_master.cmd({"DEL", n}); }), 2s);
    EXPECT_TRUE(held.lost());
    held.unlock();
}

// A failover to a replica that never got the holds (paused while they were taken, its link
// cut): a leased hold (lock(lease), which the watchdog does not renew) is told at the same
// tick as the watched holds, the first to reach the new master (guarantees.md, losses told at
// once: leased holds while their lease lasts, in a Redis Cluster after a failover too).
// Before, the ticks that failed while the slot had no master left the watchdog "not
// watching" (failing_) for that first tick: it renewed the watched holds and told them, but
// skipped the leased holds' check, so their owner was told only at the next scheduled tick
// (a retry, about 1 s here, or a whole period, 10 s, later) while another client could take
// the lock at once. A leased hold whose lease ran out before the failover is not told.
TEST(cluster_loss, a_leased_hold_missing_on_the_new_master_after_a_failover_is_told_with_the_watched_ones) {
    using sclock = std::chrono::steady_clock;
    redis_cluster c;
    std::mutex mu;
    std::map<std::string, sclock::time_point> told;  // lock name -> when its owner was told
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 3s;  // the watchdog at its default: a tick every 10 s, a retry every 1 s
    o.on_lock_lost = [&](const rlock::lost_hold& h, const rlock::error&) {
        std::lock_guard<std::mutex> g(mu);
        told.emplace(std::string(h.lock), sclock::now());
    };
    rlock::client a(o), b(rlock::client_options::from_uri(c.uri()));
    redis_server& old_master = *c.masters()[0];
    redis_server& replica = c.replica_of(old_master);
    // One slot (a hash tag) for the three holds.
    const std::string tag = "{" + name_on(c, old_master, rlock_test::test_lock_name()) + "}";
    rlock::mutex watched(a, tag + ".watched"), leased(a, tag + ".leased"), lapsed(a, tag + ".lapsed");

    // Only a manual failover, once the watchdog's ticks have failed for a while.
    replica.cmd({"CONFIG", "SET", "cluster-replica-no-failover", "yes"});
    replica.pause();  // under the cluster's node timeout (2 s): not marked failed
    old_master.cmd({"CLIENT", "KILL", "TYPE", "replica"});
    watched.lock();
    leased.lock(60s);
    lapsed.lock(800ms);
    std::this_thread::sleep_for(1s);  // armed; `lapsed` ran out (the end of its lease: no loss)
    old_master.kill_now();
    replica.resume();
    std::this_thread::sleep_for(3s);  // the watchdog's ticks find the slot without a master
    {
        std::lock_guard<std::mutex> g(mu);
        EXPECT_TRUE(told.empty()) << told.begin()->first;
    }
    redis_server& new_master = c.fail_over(old_master);
    ASSERT_EQ(&new_master, &replica);
    ASSERT_EQ(new_master.integer({"EXISTS", watched.name()}), 0) << "the replica got the holds";
    ASSERT_EQ(new_master.integer({"EXISTS", leased.name()}), 0) << "the replica got the holds";
    rlock::mutex rival(b, leased.name());
    const bool rival_holds = rival.try_lock_for(10s);  // another client takes it at once
    EXPECT_TRUE(rival_holds);

    ASSERT_TRUE(eventually([&] {
        std::lock_guard<std::mutex> g(mu);
        return told.count(watched.name()) == 1;
    }, 10s)) << "the watched hold was not told";
    ASSERT_TRUE(eventually([&] {
        std::lock_guard<std::mutex> g(mu);
        return told.count(leased.name()) == 1;
    }, 15s)) << "the leased hold was not told";
    std::this_thread::sleep_for(1500ms);  // past a retry: `lapsed` would have been told by now
    {
        std::lock_guard<std::mutex> g(mu);
        // Same tick: about 0 ms with the fix; about a retry (0.9 s) or a period (10 s) before.
        const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(
            told[leased.name()] - told[watched.name()]);
        EXPECT_LT(gap.count(), 300) << "the leased hold was told after the watched one (ms)";
        EXPECT_EQ(told.count(lapsed.name()), 0u) << "a lease that ran out was told as a loss";
        EXPECT_EQ(told.size(), 2u);
    }
    EXPECT_TRUE(watched.lost());
    EXPECT_TRUE(leased.lost());
    if (rival_holds) rival.unlock();
    watched.unlock();
    leased.unlock();
    lapsed.unlock();
}

// Masters whose ACL refuses CLIENT TRACKING: told once (not once per master), and losses are
// found by the watchdog's ticks as before.
TEST(cluster_loss, masters_that_refuse_tracking_are_told_once_and_losses_are_still_found) {
    redis_cluster c;
    for (auto& s : c.nodes()) {
        s->cmd({"ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all", "-client|tracking"});
    }
    rlock_test::lost_log lost;
    rlock::client_options o = told_options(c, lost);
    o.username = "locker";
    o.password = "secret";
    o.lock_watchdog_timeout = 600ms;  // renewed every 200 ms
    auto n = std::make_shared<rlock_test::detection_off_notices>();
    o.listener = n;
    rlock::client a(o);
    std::vector<std::unique_ptr<rlock::mutex>> held;
    for (redis_server* m : c.masters()) {
        held.push_back(std::make_unique<rlock::mutex>(a, name_on(c, *m, rlock_test::test_lock_name())));
        held.back()->lock();
    }
    ASSERT_TRUE(eventually([&] { return n->off.load() > 0; }, 3s));
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(n->off.load(), 1);
    EXPECT_EQ(lost.calls.load(), 0) << lost.last_message;
    c.masters()[1]->cmd({"DEL", held[1]->name()});
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 3s));  // the watchdog's tick
    EXPECT_TRUE(held[1]->lost());
    for (auto& l : held) l->unlock();
}

// A paused master (SIGSTOP: connections accepted, nothing answered) delays no other master's
// renewals: every master is sent its renewals before any reply is read, and one that does not
// answer is not asked again through the pool in the same tick. The pause stays under the
// cluster's node timeout (2 s), after which the cluster itself stops serving (CLUSTERDOWN)
// until a replica takes over. Before, each tick waited two command timeouts for the paused
// master before renewing the masters after it, and their holds ran out.
TEST(cluster_loss, a_paused_master_delays_no_other_masters_renewals) {
    redis_cluster c;
    rlock_test::lost_log lost;
    rlock::client_options o = told_options(c, lost);
    o.command_timeout = 1s;
    o.lock_watchdog_timeout = 1600ms;  // a tick that waited 2 s for the paused master would lose them
    rlock::client a(o);
    const std::string stem = rlock_test::test_lock_name();
    redis_server& paused = *c.masters()[0];
    rlock::mutex on_paused(a, name_on(c, paused, stem + ".paused"));
    std::vector<std::unique_ptr<rlock::mutex>> others;
    for (std::size_t i = 1; i < c.masters().size(); ++i) {
        others.push_back(std::make_unique<rlock::mutex>(a, name_on(c, *c.masters()[i], stem + ".other")));
        // Renewed after the paused master's holds in each tick (batches go in slot order).
        ASSERT_LT(redis_cluster::key_slot(on_paused.name()), redis_cluster::key_slot(others.back()->name()));
    }
    on_paused.lock();
    for (auto& l : others) l->lock();
    std::this_thread::sleep_for(300ms);  // armed: the watchdog has its pair on every master
    paused.pause();
    std::this_thread::sleep_for(1500ms);
    paused.resume();
    std::this_thread::sleep_for(1500ms);  // the ticks the pause slowed have told what they found
    for (auto& l : others) {
        EXPECT_FALSE(l->lost()) << l->name() << " was not renewed in time: " << lost.last_message;
        l->unlock();
    }
    on_paused.unlock();  // renewed again or run out: either way not thrown
}

// A Redis Cluster that does not serve (CLUSTERDOWN: a master failed and no replica took its
// slots) for longer than command_timeout is an outage to a wait, as a server that cannot be
// reached is ("Outages", api.md): blocking and asynchronous lock waits and a semaphore's wait
// ride it to their deadline, and take the lock or permit once the cluster serves again. Before,
// the CLUSTERDOWN the pool still met at command_timeout ended each wait with server_error.
TEST(cluster, waits_ride_out_a_cluster_that_does_not_serve_for_longer_than_a_command_timeout) {
    redis_cluster c(3, 0);  // no replica: the cluster stays down while a master is paused
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 500ms;
    rlock::client holder(o), waiter(o);
    redis_server& stopped = *c.masters()[0];
    redis_server& serving = *c.masters()[1];
    const std::string stem = rlock_test::test_lock_name();
    rlock::mutex held(holder, name_on(c, serving, stem + ".blocking"));
    rlock::mutex held_async(holder, name_on(c, serving, stem + ".async"));
    rlock::semaphore held_permit(holder, name_on(c, serving, stem + ".semaphore"));
    held.lock();
    held_async.lock();
    ASSERT_TRUE(held_permit.try_set_permits(1));
    held_permit.acquire();

    stopped.pause();
    // Past the cluster's node timeout (2 s) the other masters mark it failed and stop serving.
    ASSERT_TRUE(eventually([&] {
        return serving.text({"CLUSTER", "INFO"}).find("cluster_state:fail") != std::string::npos;
    }, 15s)) << "the cluster did not go down";
    rlock::mutex want(waiter, held.name()), want_async(waiter, held_async.name());
    rlock::semaphore want_permit(waiter, held_permit.name());
    auto blocking = std::async(std::launch::async, [&] { return want.try_lock_for(30s); });
    std::future<rlock::hold> pending = want_async.async_try_lock_for(30s, rlock::use_future);
    auto permit = std::async(std::launch::async, [&] { return want_permit.try_acquire_for(30s); });
    std::this_thread::sleep_for(2s);  // four command timeouts of CLUSTERDOWN for every wait
    stopped.resume();
    c.wait_healthy();

    held.unlock();
    held_async.unlock();
    held_permit.release();
    // Each wait's outcome, so that one wait's error does not hide the others'.
    auto outcome = [](auto&& get) -> std::string {
        try {
            return get() ? "taken" : "refused";
        } catch (const rlock::error& e) {
            return e.what();
        }
    };
    rlock::hold h;
    EXPECT_EQ(outcome([&] { return blocking.get(); }), "taken");
    EXPECT_EQ(outcome([&] { return (h = pending.get()).owns_lock(); }), "taken");
    const std::string permit_taken = outcome([&] { return permit.get(); });
    EXPECT_EQ(permit_taken, "taken");
    if (want.is_held_by_current_thread()) want.unlock();
    if (h) h.unlock();
    if (permit_taken == "taken") want_permit.release();
}

// Asynchronous waits share their client's engine thread. A master killed (its slots served by
// nobody until a failover) made each try for its slots spend a whole command_timeout failing to
// connect, one try after another: 12 waits of 1.5 s ended seconds past their deadlines, and an
// asynchronous try of a free lock on a live master waited behind them. A master that served
// nothing for a whole command_timeout is now left alone by the engine's tries for the next one,
// as a paused server is: the waits end about one command_timeout past their deadlines, and the
// other masters' locks go on.
TEST(cluster, async_waits_on_a_master_that_is_down_end_near_their_deadlines_and_other_masters_go_on) {
    redis_cluster c(3, 0, {"--cluster-require-full-coverage", "no"});
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.command_timeout = 300ms;
    o.on_lock_lost = [](const rlock::lost_hold&, const rlock::error&) {};  // the holder's, on the dead master
    rlock::client holder(o), waiter(o);
    redis_server& dying = *c.masters()[0];
    redis_server& serving = *c.masters()[1];
    const std::string stem = rlock_test::test_lock_name();
    constexpr int waits = 12;
    std::vector<std::unique_ptr<rlock::mutex>> held, wanted;
    for (int i = 0; i < waits; ++i) {
        const std::string n = name_on(c, dying, stem + ".w" + std::to_string(i));
        held.push_back(std::make_unique<rlock::mutex>(holder, n));
        held.back()->lock();
        wanted.push_back(std::make_unique<rlock::mutex>(waiter, n));
    }
    rlock::mutex free_lock(waiter, name_on(c, serving, stem + ".free"));
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::future<rlock::hold>> pending;
    for (auto& m : wanted) pending.push_back(m->async_try_lock_for(1500ms, rlock::use_future));
    dying.kill_now();
    std::this_thread::sleep_for(500ms);
    const auto asked = std::chrono::steady_clock::now();
    rlock::hold free_hold = free_lock.async_try_lock(rlock::use_future).get();
    const auto free_took = std::chrono::steady_clock::now() - asked;
    EXPECT_TRUE(free_hold.owns_lock());
    EXPECT_LT(free_took, 3 * o.command_timeout) << "a free lock on a live master waited behind the dead one's";
    int ended = 0;
    for (auto& f : pending) {
        try {
            EXPECT_FALSE(f.get());
            ++ended;
        } catch (const rlock::error& e) {
            // The outage the wait rode, at its deadline: the master could not be reached.
            EXPECT_TRUE(e.code() == rlock::errc::connection_failed || e.code() == rlock::errc::timeout) << e.what();
            ++ended;
        }
    }
    const auto last_ended = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(ended, waits);
    EXPECT_LT(last_ended, 1500ms + 4 * o.command_timeout) << "the waits queued behind each other's tries";
    if (free_hold) free_hold.unlock();
}

// A cluster node given to a client as a plain server (cluster mode off) answers MOVED for a
// slot another master serves: that is the client's settings, not an outage, and a wait ends
// with it at once (server_error naming MOVED) instead of riding it to its deadline.
TEST(cluster, a_wait_of_a_client_not_in_cluster_mode_ends_at_once_on_a_redirection) {
    redis_cluster c(3, 0);
    rlock::client plain(c.masters()[0]->options());
    rlock::mutex m(plain, name_on(c, *c.masters()[1], rlock_test::test_lock_name()));
    const auto start = std::chrono::steady_clock::now();
    try {
        (void)m.try_lock_for(10s);
        FAIL() << "a MOVED answer was taken for the lock";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::server_error) << e.what();
        EXPECT_NE(std::string(e.what()).find("MOVED"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s) << "the wait rode a MOVED of its settings as an outage";
}

TEST(cluster, an_error_a_node_answers_names_that_node) {
    redis_cluster c;
    rlock::client client(rlock::client_options::from_uri(c.uri()));
    const redis_server& master = *c.masters()[1];
    const std::string n = name_on(c, master, rlock_test::test_lock_name());
    master.cmd({"SET", n, "not a hash"});
    rlock::reentrant_lock l(client, n);
    try {
        l.lock();
        FAIL() << "locking a string key did not throw";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::wrong_type);
        const std::string what = e.what();
        EXPECT_NE(what.find(n), std::string::npos) << what;
        EXPECT_NE(what.find("on cluster node 127.0.0.1:" + std::to_string(master.port()) + ": "),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("WRONGTYPE"), std::string::npos) << what;
    }
    EXPECT_EQ(master.text({"GET", n}), "not a hash");
}

TEST(cluster, a_server_without_cluster_support_is_a_clear_error) {
    redis_server plain;
    rlock::client_options o = plain.options();
    o.cluster = true;
    try {
        rlock::client c(o);
        FAIL() << "a client in cluster mode connected to a server without cluster support";
    } catch (const rlock::error& e) {
        EXPECT_EQ(e.value(), rlock::errc::server_error);
        EXPECT_NE(std::string(e.what()).find("cluster support disabled"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::to_string(plain.port())), std::string::npos) << e.what();
    }
}

// Redis 7 cluster, sharded pub/sub (issue 17, F5): Redisson (3.22+, shardedSubscriptionMode
// AUTO) waits with SSUBSCRIBE and releases with SPUBLISH there; sharded and classic channels
// are separate namespaces, so rlock must do the same for either library's unlock to wake the
// other's waiters.

/// A waiter of `Lock` on client `b` is woken by a release that SPUBLISHes on the slot's master
/// (as Redisson's unlock does): `hold` takes the lock as a foreign holder would, `release`
/// deletes it and SPUBLISHes. The holder's 30 s TTL must not be what ends the wait.
template <class Lock>
void woken_by_a_sharded_release(redis_cluster& c, rlock::client& b, const std::string& stem,
                                const std::string& channel_prefix,
                                const std::function<void(const redis_server&, const std::string&)>& hold) {
    for (const redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, stem);
        const std::string channel = channel_prefix + ":{" + n + "}";
        hold(*m, n);
        std::atomic<long long> woken_at_ms{-1};
        const auto t0 = std::chrono::steady_clock::now();
        auto waiter = std::async(std::launch::async, [&] {
            Lock w(b, n);
            if (!w.try_lock_for(10s)) return false;
            woken_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
            w.unlock();
            return true;
        });
        ASSERT_TRUE(eventually([&] { return subscribers_on(*m, channel, true) == 1; }, 10s))
            << "no sharded subscriber for " << channel << " on its slot's master";
        EXPECT_EQ(subscribers(c, channel), 1) << "also subscribed elsewhere, or classic";
        std::this_thread::sleep_for(100ms);  // the waiter is in its wait
        const auto released = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(m->integer({"DEL", n}), 1);
        EXPECT_EQ(m->integer({"SPUBLISH", channel, "0"}), 1) << "SPUBLISH reached no subscriber";
        ASSERT_TRUE(waiter.get()) << n;
        EXPECT_LT(woken_at_ms.load() - released, 2000) << "woken by the TTL, not by SPUBLISH";
    }
}

TEST(cluster_sharded, a_mutex_waiter_is_woken_by_an_spublish_release) {
    redis_cluster c;
    rlock::client b(c.uri());
    woken_by_a_sharded_release<rlock::mutex>(
        c, b, rlock_test::test_lock_name(), "rlock_lock__channel",
        [](const redis_server& m, const std::string& n) {
            // A holder that publishes (an rlock token), leased for 30 s.
            m.cmd({"SET", n, std::string(rlock::detail::token_prefix) + "00ff00ff00ff00ff", "PX", "30000"});
        });
}

TEST(cluster_sharded, a_reentrant_lock_waiter_is_woken_by_an_spublish_release) {
    redis_cluster c;
    rlock::client b(c.uri());
    woken_by_a_sharded_release<rlock::reentrant_lock>(
        c, b, rlock_test::test_lock_name(), "redisson_lock__channel",
        [](const redis_server& m, const std::string& n) {
            // As Redisson's RLock holds it (a watchdog lease of 30 s).
            m.cmd({"HSET", n, "6f1d1e8a-1111-4222-8333-944455556666:1", "1"});
            m.cmd({"PEXPIRE", n, "30000"});
        });
}

// Issue 31, item 6: a deployment whose Redisson clients set shardedSubscriptionMode OFF waits
// and releases on classic channels in a Redis 7 cluster. client_options::cluster_pubsub
// classic does the same: a waiter is woken by a classic PUBLISH (as such a Redisson's unlock
// sends), and rlock's own release wakes a classic waiter, with no sharded channel in use.
// Before, rlock only used sharded channels there: a waiter waited out the holder's lease.
TEST(cluster_sharded, with_classic_pubsub_waiters_and_releases_use_classic_channels_as_redissons_off_does) {
    redis_cluster c;
    rlock::client_options o = rlock::client_options::from_uri(c.uri());
    o.cluster_pubsub = rlock::client_options::pubsub::classic;
    rlock::client a(o), b(o);
    const std::string stem = rlock_test::test_lock_name();
    for (const redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, stem);
        const std::string channel = "rlock_lock__channel:{" + n + "}";
        for (const bool foreign : {true, false}) {
            rlock::mutex holder(a, n);
            if (foreign) {
                m->cmd({"SET", n, std::string(rlock::detail::token_prefix) + "00ff00ff00ff00ff", "PX", "30000"});
            } else {
                holder.lock();
            }
            const auto t0 = std::chrono::steady_clock::now();
            std::atomic<long long> woken_at_ms{-1};
            auto waiter = std::async(std::launch::async, [&] {
                rlock::mutex w(b, n);
                if (!w.try_lock_for(10s)) return false;
                woken_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
                w.unlock();
                return true;
            });
            ASSERT_TRUE(eventually([&] {
                long long classic = 0;
                for (auto& s : c.nodes()) classic += subscribers_on(*s, channel, false);
                return classic == 1;
            }, 10s)) << "no classic subscriber for " << channel;
            for (auto& s : c.nodes()) EXPECT_EQ(subscribers_on(*s, channel, true), 0) << "a sharded subscriber";
            std::this_thread::sleep_for(100ms);  // the waiter is in its wait
            const auto released = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
            if (foreign) {
                EXPECT_EQ(m->integer({"DEL", n}), 1);
                m->cmd({"PUBLISH", channel, "0"});
            } else {
                holder.unlock();
            }
            ASSERT_TRUE(waiter.get()) << n;
            EXPECT_LT(woken_at_ms.load() - released, 2000)
                << (foreign ? "a classic PUBLISH" : "rlock's classic release") << " did not wake the waiter";
        }
    }
}

TEST(cluster_sharded, rlock_waiters_are_woken_by_rlock_releases_long_before_the_lease) {
    redis_cluster c;
    rlock::client a(c.uri()), b(c.uri());
    const std::string stem = rlock_test::test_lock_name();
    for (const redis_server* m : c.masters()) {
        for (int kind = 0; kind < 3; ++kind) {
            const std::string n = name_on(c, *m, stem + "." + std::to_string(kind));
            std::unique_ptr<rlock::mutex> mh;
            std::unique_ptr<rlock::reentrant_lock> rh;
            std::unique_ptr<rlock::fair_lock> fh;
            if (kind == 0) (mh = std::make_unique<rlock::mutex>(a, n))->lock();
            if (kind == 1) (rh = std::make_unique<rlock::reentrant_lock>(a, n))->lock();
            if (kind == 2) (fh = std::make_unique<rlock::fair_lock>(a, n))->lock();
            auto waiter = std::async(std::launch::async, [&] {
                auto got = [](auto& l) {
                    if (!l.try_lock_for(10s)) return false;
                    l.unlock();
                    return true;
                };
                if (kind == 0) { rlock::mutex w(b, n); return got(w); }
                if (kind == 1) { rlock::reentrant_lock w(b, n); return got(w); }
                rlock::fair_lock w(b, n);
                return got(w);
            });
            long long shard_subs = 0;
            ASSERT_TRUE(eventually([&] {
                shard_subs = 0;
                auto r = m->cmd({"PUBSUB", "SHARDCHANNELS", "*" + n + "*"});
                if (r && r->type == REDIS_REPLY_ARRAY) shard_subs = static_cast<long long>(r->elements);
                return shard_subs == 1;
            }, 10s)) << "kind " << kind << ": no sharded subscription on " << n << "'s master";
            std::this_thread::sleep_for(100ms);
            const auto t0 = std::chrono::steady_clock::now();
            if (mh) mh->unlock();
            if (rh) rh->unlock();
            if (fh) fh->unlock();
            ASSERT_TRUE(waiter.get());
            EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "kind " << kind << " on " << n;
        }
    }
}

TEST(cluster_sharded, redissons_waiters_ssubscribed_on_the_slots_master_get_rlocks_unlock_message) {
    redis_cluster c;
    rlock::client a(c.uri());
    for (const redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, rlock_test::test_lock_name());
        shard_listener reentrant(*m, "redisson_lock__channel:{" + n + "}");
        shard_listener mutex(*m, "rlock_lock__channel:{" + n + "}");
        rlock::reentrant_lock r(a, n);
        r.lock();
        r.unlock();
        EXPECT_EQ(reentrant.next_message(2000ms), "0") << "reentrant_lock's unlock on " << n;
        rlock::mutex mx(a, n);
        mx.lock();
        mx.unlock();
        EXPECT_EQ(mutex.next_message(2000ms), "0") << "mutex's unlock on " << n;
        rlock::reentrant_lock f(a, n);
        f.lock();
        f.force_unlock();
        EXPECT_EQ(reentrant.next_message(2000ms), "0") << "force_unlock on " << n;
    }
}

TEST(cluster_sharded, a_waiter_follows_its_channels_slot_to_its_new_master) {
    redis_cluster c;
    rlock::client a(c.uri()), b(c.uri());
    redis_server& from = *c.masters()[0];
    redis_server& to = *c.masters()[1];
    const std::string n = name_on(c, from, rlock_test::test_lock_name());
    const std::string channel = "redisson_lock__channel:{" + n + "}";
    const int slot = redis_cluster::key_slot(n);
    rlock::reentrant_lock holder(a, n);
    holder.lock();  // watched: a 30 s lease, so only the unlock message can end the wait
    auto waiter = std::async(std::launch::async, [&] {
        rlock::reentrant_lock w(b, n);
        if (!w.try_lock_for(20s)) return false;
        w.unlock();
        return true;
    });
    ASSERT_TRUE(eventually([&] { return subscribers_on(from, channel, true) == 1; }, 10s));
    c.begin_migration(slot, from, to);
    c.move_keys(slot, from, to);
    c.end_migration(slot, to);
    EXPECT_TRUE(eventually([&] { return subscribers_on(to, channel, true) == 1; }, 10s))
        << "the waiter did not subscribe again on the slot's new master";
    EXPECT_EQ(subscribers_on(from, channel, true), 0);
    std::this_thread::sleep_for(100ms);
    const auto t0 = std::chrono::steady_clock::now();
    holder.unlock();  // SPUBLISH on the new master
    ASSERT_TRUE(waiter.get());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "woken by the lease, not the message";
}

// A cluster that refuses the probe (here PUBSUB is renamed, as an ACL or an older Redis would
// refuse it): classic pub/sub, as Redisson falls back to it, and wake-ups still work.
TEST(cluster_sharded, a_cluster_that_refuses_the_probe_gets_classic_pub_sub) {
    redis_cluster c(3, 1, {"--rename-command", "PUBSUB", "PUBSUBX"});
    rlock::client a(c.uri()), b(c.uri());
    for (const redis_server* m : c.masters()) {
        const std::string n = name_on(c, *m, rlock_test::test_lock_name());
        const std::string channel = "redisson_lock__channel:{" + n + "}";
        rlock::reentrant_lock holder(a, n);
        holder.lock();
        auto waiter = std::async(std::launch::async, [&] {
            rlock::reentrant_lock w(b, n);
            if (!w.try_lock_for(10s)) return false;
            w.unlock();
            return true;
        });
        auto count = [&](const char* sub) {
            long long k = 0;
            for (auto& s : c.nodes()) {
                if (s->pid() <= 0) continue;
                auto r = s->cmd({"PUBSUBX", sub, channel});
                if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) k += r->element[1]->integer;
            }
            return k;
        };
        ASSERT_TRUE(eventually([&] { return count("NUMSUB") == 1; }, 10s)) << "no classic subscriber";
        EXPECT_EQ(count("SHARDNUMSUB"), 0);
        std::this_thread::sleep_for(100ms);
        const auto t0 = std::chrono::steady_clock::now();
        holder.unlock();
        ASSERT_TRUE(waiter.get());
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    }
}
