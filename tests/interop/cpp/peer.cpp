// The rlock side of scripts/interop: the same commands and output as the Redisson peer
// (tests/interop/java/.../Peer.java), the python and the node peers, so one orchestrator
// (tests/interop/run.py) can put any of them on one lock name.
//
//   rlock_interop_peer <contend|once|latch|permit> key=value ...
//
// Common keys: port (redis-server on 127.0.0.1; with cluster=host:port,... the locks are in
// that Redis Cluster and only the overlap counters on port), name (the lock), kind (lock =
// reentrant_lock | fair = fair_lock | read / write / rw = read_write_lock | fenced =
// reentrant_lock with lock_options{fencing} | mutex), counter (overlap counter key), watchdog
// (client_options::lock_watchdog_timeout, ms), threads. kind, at, wait and hold may be comma
// lists: thread i takes item i (or the last).
//
// Start: each thread looks at the lock once (so its first real command is warm), prints
// `EV ready`, and waits for the orchestrator's line `go <epoch ms>` on stdin; then it sleeps
// until go + at (ms, default 0). So arrival order across processes is the orchestrator's.
//
// contend: each thread loops until ms have passed: try_lock_for(what is left), INCR the counter
//   (a reply other than 1 is an overlap), hold `hold` ms (reenter=1: lock again, unlock the
//   inner level, hold again: others entering then are overlaps), DECR, unlock, stay away `away`
//   ms. kind=rw: a reader or a writer at random; a writer INCRs <counter>:w and must see 1 and
//   <counter>:r at 0, a reader INCRs <counter>:r and must see <counter>:w at 0. kind=fenced:
//   each token must exceed the last token any peer stored in <counter>:last. kind=semaphore
//   (rlock::semaphore) and kind=permit (rlock::permit_expirable_semaphore, watched permits):
//   one permit per round, the counter may reach `permits`.
//   Prints: RESULT acq=.. overlaps=.. bad=.. maxwait_ms=.. maxshared=..
//   maxwait_ms counts every wait, the last one that ran into the end of the run included.
// once: each thread prints `EV waiting`, waits up to `wait` ms (wait=-1: lock()), then
//   `EV acquired` (or `EV gaveup`), holds `hold` ms, checks that it still holds (not lost(),
//   and Redis agrees), prints `EV releasing`, unlocks, `EV released`. EV lines carry
//   t=<epoch microseconds>.
// latch (rlock::count_down_latch) and permit (rlock::permit_expirable_semaphore: take a permit
//   with or without a lease and release or detach it, or release one by id): see latch() and
//   permit_once() below.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;
using locks_warm_up = std::function<void()>;

std::map<std::string, std::string> args;

std::string arg(const std::string& key, const std::string& otherwise) {
    auto it = args.find(key);
    return it == args.end() ? otherwise : it->second;
}

long long num(const std::string& key, long long otherwise) {
    return std::stoll(arg(key, std::to_string(otherwise)));
}

// Item `thread` of a comma list (the last item for threads beyond it).
std::string item(const std::string& key, int thread, const std::string& otherwise) {
    const std::string list = arg(key, otherwise);
    std::vector<std::string> items;
    std::size_t from = 0;
    while (true) {
        const auto comma = list.find(',', from);
        items.push_back(list.substr(from, comma - from));
        if (comma == std::string::npos) break;
        from = comma + 1;
    }
    return items[std::min(static_cast<std::size_t>(thread), items.size() - 1)];
}

std::mutex go_mutex;
std::condition_variable go_cv;
long long go_ms = -1;  // guarded by go_mutex; set once the go line is read

void event(const std::string& what, int thread, const std::string& extra = "");

// Warm, say ready, wait for the go line, then sleep until go + at.
void start(int thread, locks_warm_up warm) {
    warm();
    event("ready", thread);
    long long go = 0;
    {
        std::unique_lock<std::mutex> guard(go_mutex);
        go_cv.wait(guard, [] { return go_ms >= 0; });
        go = go_ms;
    }
    const long long at = go + std::stoll(item("at", thread, "0"));
    std::this_thread::sleep_until(std::chrono::system_clock::time_point(milliseconds(at)));
}

long long now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::mutex out_mutex;

void say(const std::string& line) {
    std::lock_guard<std::mutex> guard(out_mutex);
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

void event(const std::string& what, int thread, const std::string& extra) {
    say("EV " + what + " t=" + std::to_string(now_us()) + " lib=rlock thread=" +
        std::to_string(thread) + (extra.empty() ? "" : " " + extra));
}

void update_max(std::atomic<long long>& max, long long value) {
    long long seen = max.load();
    while (value > seen && !max.compare_exchange_weak(seen, value)) {
    }
}

std::atomic<long long> acquisitions{0}, overlaps{0}, bad{0}, max_wait_us{0}, max_shared{0};

void fail(const std::string& why) {
    say("ERROR " + why);
    ++bad;
}

// One plain hiredis connection for the counters, separate from rlock's.
class counters {
public:
    explicit counters(int port) : c_(redisConnect("127.0.0.1", port), &redisFree) {
        if (!c_ || c_->err) throw std::runtime_error("peer: cannot connect for the counters");
    }
    long long incr(const std::string& key, long long by) {
        return integer(redisCommand(c_.get(), "INCRBY %b %lld", key.data(), key.size(), by));
    }
    long long get(const std::string& key) {
        return integer(redisCommand(c_.get(), "INCRBY %b 0", key.data(), key.size()));
    }
    void set(const std::string& key, long long value) {
        const std::string v = std::to_string(value);
        freeReplyObject(
            redisCommand(c_.get(), "SET %b %b", key.data(), key.size(), v.data(), v.size()));
    }

private:
    static long long integer(void* r) {
        std::unique_ptr<redisReply, decltype(&freeReplyObject)> reply(static_cast<redisReply*>(r),
                                                                       &freeReplyObject);
        if (!reply || reply->type != REDIS_REPLY_INTEGER) {
            throw std::runtime_error("peer: counter reply");
        }
        return reply->integer;
    }
    std::unique_ptr<redisContext, decltype(&redisFree)> c_;
};

// The lock kinds behind one interface, so contend/once are written once.
struct any_lock {
    virtual ~any_lock() = default;
    virtual bool try_lock_for(milliseconds wait) = 0;
    virtual void unlock() = 0;
    virtual bool holds() = 0;  // not lost and Redis agrees
    virtual void lock() = 0;
    virtual std::uint64_t token() { return 0; }
};

template <class Lock>
struct exclusive : any_lock {
    exclusive(rlock::client& c, const std::string& name, rlock::lock_options o) : l(c, name, o) {}
    bool try_lock_for(milliseconds wait) override { return l.try_lock_for(wait); }
    void unlock() override { l.unlock(); }
    bool holds() override { return !l.lost() && l.is_held_by_current_thread(); }
    void lock() override { l.lock(); }
    std::uint64_t token() override { return l.fencing_token(); }
    Lock l;
};

struct read_side : any_lock {
    explicit read_side(rlock::read_write_lock& rw) : l(rw) {}
    bool try_lock_for(milliseconds wait) override { return l.try_lock_shared_for(wait); }
    void unlock() override { l.unlock_shared(); }
    bool holds() override { return !l.lost_shared() && l.is_held_shared_by_current_thread(); }
    void lock() override { l.lock_shared(); }
    rlock::read_write_lock& l;
};

struct write_side : any_lock {
    explicit write_side(rlock::read_write_lock& rw) : l(rw) {}
    bool try_lock_for(milliseconds wait) override { return l.try_lock_for(wait); }
    void unlock() override { l.unlock(); }
    bool holds() override { return !l.lost() && l.is_held_by_current_thread(); }
    void lock() override { l.lock(); }
    rlock::read_write_lock& l;
};

struct locks {
    locks(rlock::client& c, const std::string& name)
        : rw(c, name), reader(rw), writer(rw) {
        const std::string kind = item("kind", 0, "lock");
        if (kind == "lock") {
            one = std::make_unique<exclusive<rlock::reentrant_lock>>(c, name,
                                                                     rlock::lock_options{});
        } else if (kind == "fenced") {
            one = std::make_unique<exclusive<rlock::reentrant_lock>>(c, name,
                                                                     rlock::lock_options{true});
        } else if (kind == "fair") {
            rlock::lock_options o;  // fairwait=ms: fair_lock_wait_timeout (default 5 min)
            if (num("fairwait", 0) > 0) o.fair_lock_wait_timeout = milliseconds(num("fairwait", 0));
            one = std::make_unique<exclusive<rlock::fair_lock>>(c, name, o);
        } else if (kind == "mutex") {
            one = std::make_unique<exclusive<rlock::mutex>>(c, name, rlock::lock_options{});
        } else if (kind != "read" && kind != "write" && kind != "rw" && kind != "semaphore" &&
                   kind != "permit") {
            throw std::invalid_argument("unknown kind " + kind);
        }
    }
    any_lock& pick(const std::string& kind) {
        if (kind == "read") return reader;
        if (kind == "write") return writer;
        if (!one) {
            throw std::invalid_argument("kind " + kind + " after a read/write kind in one process");
        }
        return *one;
    }
    rlock::read_write_lock rw;
    read_side reader;
    write_side writer;
    std::unique_ptr<any_lock> one;
};

// contend with kind=semaphore: rlock::semaphore `name`, one permit per round; the counter may
// reach `permits`, never more.
void contend_semaphore(rlock::client& c, int port, int thread) {
    const std::string counter = arg("counter", "interop:counter");
    const milliseconds hold(num("hold", 1)), away(num("away", 1));
    const long long permits = num("permits", 1);
    rlock::semaphore s(c, arg("name", "interop"));
    start(thread, [&] { (void)s.available_permits(); });
    const auto end = steady::now() + milliseconds(num("ms", 3000));
    counters redis(port);
    while (true) {
        const auto left = std::chrono::duration_cast<milliseconds>(end - steady::now());
        if (left <= milliseconds(0)) break;
        const auto t0 = steady::now();
        const bool got = s.try_acquire_for(left);
        update_max(max_wait_us,
                   std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - t0).count());
        if (!got) break;
        ++acquisitions;
        const long long in = redis.incr(counter, 1);
        update_max(max_shared, in);
        if (in > permits) ++overlaps;
        std::this_thread::sleep_for(hold);
        redis.incr(counter, -1);
        s.release();
        std::this_thread::sleep_for(away);
    }
}

// contend with kind=permit: rlock::permit_expirable_semaphore `name`, one watched permit per
// round (try_acquire_for(what is left), no lease: renewed by the watchdog), released by its
// handle; the counter may reach `permits`, never more, and the permit must not be lost.
void contend_permit(rlock::client& c, int port, int thread) {
    const std::string counter = arg("counter", "interop:counter");
    const milliseconds hold(num("hold", 1)), away(num("away", 1));
    const long long permits = num("permits", 1);
    rlock::permit_expirable_semaphore s(c, arg("name", "interop"));
    start(thread, [&] { (void)s.available_permits(); });
    const auto end = steady::now() + milliseconds(num("ms", 3000));
    counters redis(port);
    while (true) {
        const auto left = std::chrono::duration_cast<milliseconds>(end - steady::now());
        if (left <= milliseconds(0)) break;
        const auto t0 = steady::now();
        rlock::permit p = s.try_acquire_for(left);
        const auto waited = steady::now() - t0;
        update_max(max_wait_us,
                   std::chrono::duration_cast<std::chrono::microseconds>(waited).count());
        if (!p) break;
        ++acquisitions;
        const long long in = redis.incr(counter, 1);
        update_max(max_shared, in);
        if (in > permits) ++overlaps;
        std::this_thread::sleep_for(hold);
        if (p.lost()) fail("permit " + p.id() + " lost while held");
        redis.incr(counter, -1);
        p.release();
        std::this_thread::sleep_for(away);
    }
}

// permit: rlock::permit_expirable_semaphore `name`, one permit per thread; role, wait, lease,
// after and hold are comma lists.
//   role=take: waits up to `wait` ms for a permit, leased `lease` ms (lease=0: watched), with
//     events waiting, then acquired id=<hex> (or gaveup). after=release: holds `hold` ms,
//     checks it still holds, releases it by the handle (releasing, released). after=detach:
//     gives the permit up without releasing it (detached id=<hex>), so that the process exits
//     with it taken.
//   role=release: releases the permit `id` (given out by any client) by id (releasing,
//     released), then checks that the id is refused from then on: try_release false, release
//     not_owner.
void permit_once(rlock::client& c, int thread) {
    rlock::permit_expirable_semaphore s(c, arg("name", "interop"));
    const std::string role = item("role", thread, "take");
    start(thread, [&] { (void)s.available_permits(); });
    if (role == "release") {
        const std::string id = arg("id", "");
        event("releasing", thread, "id=" + id);
        s.release(id);
        event("released", thread, "id=" + id);
        if (s.try_release(id)) fail("try_release(" + id + ") true after the permit was released");
        try {
            s.release(id);
            fail("a second release(" + id + ") did not throw");
        } catch (const rlock::error& e) {
            if (e.value() != rlock::errc::not_owner) {
                fail(std::string("a second release threw other than not_owner: ") + e.what());
            }
        }
        return;
    }
    const milliseconds wait(std::stoll(item("wait", thread, "10000")));
    const milliseconds lease(std::stoll(item("lease", thread, "0")));
    event("waiting", thread);
    rlock::permit p = lease.count() > 0 ? s.try_acquire_for(wait, lease) : s.try_acquire_for(wait);
    if (!p) {
        event("gaveup", thread);
        return;
    }
    const std::string id = p.id();
    event("acquired", thread, "id=" + id);
    ++acquisitions;
    if (item("after", thread, "release") == "detach") {
        (void)p.detach();
        event("detached", thread, "id=" + id);
        return;
    }
    std::this_thread::sleep_for(milliseconds(std::stoll(item("hold", thread, "100"))));
    if (p.lost()) fail("permit " + id + " lost while held");
    event("releasing", thread, "id=" + id);
    p.release();
    event("released", thread, "id=" + id);
}

// latch: rlock::count_down_latch `name`. Thread i's role (role=wait|down, a comma list) waits
// up to `wait` ms for the count to reach 0 (events waiting, then passed or gaveup) or counts
// down once at go + at (events counting, counted).
void latch(rlock::client& c, int thread) {
    rlock::count_down_latch l(c, arg("name", "interop"));
    const std::string role = item("role", thread, "wait");
    start(thread, [&] { (void)l.count(); });
    if (role == "down") {
        event("counting", thread);
        (void)l.count_down();
        event("counted", thread);
        return;
    }
    event("waiting", thread);
    const bool passed = l.wait_for(milliseconds(std::stoll(item("wait", thread, "10000"))));
    event(passed ? "passed" : "gaveup", thread);
    if (passed) ++acquisitions;
}

void contend(locks& all, int port, int thread) {
    const std::string kind = arg("kind", "lock");
    const std::string counter = arg("counter", "interop:counter");
    const milliseconds hold(num("hold", 1)), away(num("away", 1));
    const bool reenter = num("reenter", 0) != 0;
    start(thread, [&] { (void)all.rw.is_locked(); });
    const auto end = steady::now() + milliseconds(num("ms", 3000));
    counters redis(port);
    std::mt19937 random(std::random_device{}());
    while (true) {
        const auto left = std::chrono::duration_cast<milliseconds>(end - steady::now());
        if (left <= milliseconds(0)) break;
        std::string k = kind;
        if (kind == "rw") k = random() % 3 == 0 ? "write" : "read";
        any_lock& l = all.pick(k);
        const auto t0 = steady::now();
        const bool got = l.try_lock_for(left);
        const auto waited = steady::now() - t0;
        update_max(max_wait_us,
                   std::chrono::duration_cast<std::chrono::microseconds>(waited).count());
        if (!got) break;
        ++acquisitions;
        if (k == "read") {
            update_max(max_shared, redis.incr(counter + ":r", 1));
            if (redis.get(counter + ":w") != 0) ++overlaps;
            std::this_thread::sleep_for(hold);
            redis.incr(counter + ":r", -1);
        } else {
            const std::string key = k == "write" ? counter + ":w" : counter;
            if (redis.incr(key, 1) != 1) ++overlaps;
            if (k == "write" && redis.get(counter + ":r") != 0) ++overlaps;
            if (k == "fenced") {
                const long long last = redis.get(counter + ":last");
                const auto token = static_cast<long long>(l.token());
                if (token <= last) {
                    fail("fencing token " + std::to_string(token) + " after " +
                         std::to_string(last));
                }
                redis.set(counter + ":last", token);
            }
            std::this_thread::sleep_for(hold);
            if (reenter) {
                l.lock();
                l.unlock();
                std::this_thread::sleep_for(hold);  // still held: others entering are overlaps
            }
            redis.incr(key, -1);
        }
        l.unlock();
        std::this_thread::sleep_for(away);
    }
}

void once(locks& all, int port, int thread) {
    const std::string kind = item("kind", thread, "lock");
    const std::string counter = arg("counter", "interop:counter");
    counters redis(port);
    any_lock& l = all.pick(kind);
    start(thread, [&] { (void)all.rw.is_locked(); });
    event("waiting", thread, "kind=" + kind);
    const long long wait = std::stoll(item("wait", thread, "10000"));
    if (wait < 0) {
        l.lock();  // no wait bound
    } else if (!l.try_lock_for(milliseconds(wait))) {
        event("gaveup", thread);
        return;
    }
    event("acquired", thread,
          "kind=" + kind + (kind == "fenced" ? " token=" + std::to_string(l.token()) : ""));
    ++acquisitions;
    const bool shared = kind == "read";
    const long long in = redis.incr(shared ? counter + ":r" : counter, 1);
    if (shared) {
        update_max(max_shared, in);
    } else if (in != 1) {
        ++overlaps;
    }
    if (num("reenter", 0) != 0) {
        l.lock();
        l.unlock();
    }
    std::this_thread::sleep_for(milliseconds(std::stoll(item("hold", thread, "100"))));
    if (!l.holds()) fail("lost the hold on " + arg("name", "") + " while holding it");
    redis.incr(shared ? counter + ":r" : counter, -1);
    event("releasing", thread);
    l.unlock();
    event("released", thread);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: rlock_interop_peer <contend|once|latch|permit> key=value ...\n");
        return 2;
    }
    const std::string command = argv[1];
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        const auto eq = a.find('=');
        if (eq == std::string::npos) {
            std::fprintf(stderr, "not key=value: %s\n", a.c_str());
            return 2;
        }
        args[a.substr(0, eq)] = a.substr(eq + 1);
    }
    try {
        const int port = static_cast<int>(num("port", 6379));
        rlock::client_options options;
        options.port = port;
        // cluster=host:port,...: the locks live in that Redis Cluster, the counters stay on port.
        const std::string nodes = arg("cluster", "");
        options.cluster = !nodes.empty();
        for (std::size_t from = 0; options.cluster && from < nodes.size();) {
            const auto comma = std::min(nodes.find(',', from), nodes.size());
            const std::string node = nodes.substr(from, comma - from);
            const auto colon = node.rfind(':');
            options.cluster_nodes.push_back(
                {node.substr(0, colon), std::stoi(node.substr(colon + 1))});
            from = comma + 1;
        }
        // sharded=off: classic pub/sub in the cluster, as Redisson's shardedSubscriptionMode OFF.
        if (arg("sharded", "auto") == "off") options.cluster_pubsub = rlock::client_options::pubsub::classic;
        options.lock_watchdog_timeout = milliseconds(num("watchdog", 30000));
        options.on_lock_lost = [](std::string_view name, const rlock::error& why) {
            say("ERROR on_lock_lost " + std::string(name) + ": " + why.what());
        };
        rlock::client client(options);
        locks all(client, arg("name", "interop"));
        const int threads = static_cast<int>(num("threads", 1));
        std::vector<std::thread> workers;
        for (int i = 0; i < threads; ++i) {
            workers.emplace_back([&, i] {
                try {
                    if (command == "contend" && arg("kind", "lock") == "semaphore") {
                        contend_semaphore(client, port, i);
                    } else if (command == "contend" && arg("kind", "lock") == "permit") {
                        contend_permit(client, port, i);
                    } else if (command == "contend") {
                        contend(all, port, i);
                    } else if (command == "latch") {
                        latch(client, i);
                    } else if (command == "permit") {
                        permit_once(client, i);
                    } else if (command == "once") {
                        once(all, port, i);
                    } else {
                        fail("unknown command " + command);
                    }
                } catch (const std::exception& e) {
                    fail("thread " + std::to_string(i) + ": " + e.what());
                }
            });
        }
        char line[64] = {};
        long long go = -1;
        if (std::fgets(line, sizeof line, stdin) == nullptr ||
            std::sscanf(line, "go %lld", &go) != 1) {
            fail("no go line on stdin");
            go = 0;  // let the threads run out rather than hang
        }
        {
            std::lock_guard<std::mutex> guard(go_mutex);
            go_ms = go;
        }
        go_cv.notify_all();
        for (std::thread& w : workers) w.join();
    } catch (const std::exception& e) {
        fail(e.what());
    }
    char wait_ms[32];
    std::snprintf(wait_ms, sizeof wait_ms, "%.1f",
                  static_cast<double>(max_wait_us.load()) / 1000.0);
    say("RESULT lib=rlock version=" + std::to_string(RLOCK_VERSION_MAJOR) + "." +
        std::to_string(RLOCK_VERSION_MINOR) + "." + std::to_string(RLOCK_VERSION_PATCH) +
        " acq=" + std::to_string(acquisitions.load()) +
        " overlaps=" + std::to_string(overlaps.load()) + " bad=" + std::to_string(bad.load()) +
        " maxwait_ms=" + wait_ms + " maxshared=" + std::to_string(max_shared.load()));
    return overlaps.load() == 0 && bad.load() == 0 ? 0 : 1;
}
