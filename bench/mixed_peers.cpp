// Mixed peers (issue 17, part 2): rlock::mutex workers and workers of a lock that never
// publishes — redis-py's Lock, node-redlock, go-redsync, emulated here with hiredis — take turns
// on ONE lock name for T seconds. Each worker loops: ask for the lock (the wait is timed), INCR
// an overlap counter, hold H ms, DECR it, release, stay away A ms.
//
// The emulated peer does what redis-py's Lock(timeout=30).acquire() does: `SET name <32 hex
// digits> NX PX 30000`, and while refused sleeps --peer-sleep-ms (redis-py's default `sleep` is
// 0.1 s) and tries again; it releases with a compare-and-delete script and publishes nothing.
// rlock's workers use rlock::mutex::lock() (watched, lease 30 s).
//
//   mixed_peers [--rlock 2] [--peers 2] [--hold-ms 1] [--away-ms 1] [--seconds 8]
//               [--peer-sleep-ms 100] [--uri redis://127.0.0.1:PORT] [--name LOCK]
//
// Prints one line:
//
//   rlock=2 peers=2 H=1 A=1 T=8 peer_sleep_ms=100 rlock_acq=... peer_acq=...
//   rlock_wait_ms_p50/p99/max=... rlock_waits_over_250ms=... rlock_idle_ms_max=... overlaps=0
//   load=...
//
//   rlock_acq, peer_acq  acquisitions of each side in the window
//   rlock_wait_ms        rlock's waits for lock() that began in the window (however long they
//                        lasted), all workers together; rlock_waits_over_250ms counts them
//   rlock_idle_ms_max    the longest stretch during which an rlock worker was waiting and
//                        nobody held the lock (holds as the workers saw them: from the acquire's
//                        reply to the release call, so slightly shorter than Redis's): how long
//                        an rlock waiter slept through a free lock
//   overlaps             INCRs of the overlap counter that did not return 1; non-zero exits 1
//
// Without --uri it starts its own redis-server on a free loopback port. Threads, not processes:
// each worker has its own rlock::client or hiredis connection.
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "arguments.hpp"
#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
    int rlock_workers = 2;
    int peers = 2;
    double hold_ms = 1;
    double away_ms = 1;
    double seconds = 8;
    double peer_sleep_ms = 100;
    std::string uri;
    std::string name;
};

struct turn {
    clock_type::time_point asked, acquired, released;
    bool rlock = false;
};

[[noreturn]] void usage(const char* why) {
    bench::usage_exit("mixed_peers",
                      "[--rlock N] [--peers N] [--hold-ms MS] [--away-ms MS] [--seconds S] [--peer-sleep-ms MS] [--uri redis://HOST:PORT] [--name LOCK]",
                      why);
}

options parse(int argc, char** argv) {
    options o;
    bench::arguments args(argc, argv, usage);
    while (args.next()) {
        const std::string_view a = args.name();
        if (a == "--rlock") {
            o.rlock_workers = static_cast<int>(args.number(0));
        } else if (a == "--peers") {
            o.peers = static_cast<int>(args.number(0));
        } else if (a == "--hold-ms") {
            o.hold_ms = args.number(0);
        } else if (a == "--away-ms") {
            o.away_ms = args.number(0);
        } else if (a == "--seconds") {
            o.seconds = args.number(0.001);
        } else if (a == "--peer-sleep-ms") {
            o.peer_sleep_ms = args.number(0);
        } else if (a == "--uri") {
            o.uri = args.value();
        } else if (a == "--name") {
            o.name = args.value();
        } else {
            args.unknown();
        }
    }
    return o;
}

std::chrono::nanoseconds from_ms(double ms) {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(ms * 1e6));
}

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size(), std::max<std::size_t>(rank, 1)) - 1];
}

double load_average() {
    double l = -1;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &l) != 1) l = -1;
        std::fclose(f);
    }
    return l;
}

/// A connection of its own, for a peer's lock or a worker's overlap counter.
class connection {
public:
    explicit connection(const rlock::client_options& co) {
        c_.reset(redisConnect(co.host.c_str(), co.port));
        if (!c_ || c_->err) throw std::runtime_error("mixed_peers: cannot connect");
    }
    rlock::detail::reply_ptr run(std::initializer_list<std::string_view> parts) {
        rlock::detail::reply_ptr r = rlock::detail::command(c_.get(), parts);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            throw std::runtime_error("mixed_peers: command failed: " +
                                     std::string(rlock::detail::reply_text(r.get())));
        }
        return r;
    }

private:
    rlock::detail::context_ptr c_;
};

/// What every worker shares: the names, the window, the records.
struct shared_state {
    options o;
    rlock::client_options co;
    std::string counter;  // the overlap counter's key
    clock_type::time_point start, end;
    std::atomic<long> overlaps{0};
    std::mutex m;
    std::vector<turn> turns;
    std::vector<std::string> failures;
};

/// One worker's loop around `acquire` and `release`.
template <class Acquire, class Release>
void work(shared_state& s, bool is_rlock, Acquire acquire, Release release) {
    connection counter(s.co);
    std::vector<turn> mine;
    std::this_thread::sleep_until(s.start);
    while (clock_type::now() < s.end) {
        turn t;
        t.rlock = is_rlock;
        t.asked = clock_type::now();
        acquire();
        t.acquired = clock_type::now();
        if (counter.run({"INCR", s.counter})->integer != 1) ++s.overlaps;
        std::this_thread::sleep_for(from_ms(s.o.hold_ms));
        counter.run({"DECR", s.counter});
        t.released = clock_type::now();
        release();
        mine.push_back(t);
        std::this_thread::sleep_for(from_ms(s.o.away_ms));
    }
    std::lock_guard<std::mutex> g(s.m);
    s.turns.insert(s.turns.end(), mine.begin(), mine.end());
}

void rlock_worker(shared_state& s) {
    rlock::client c(s.co);
    rlock::mutex m(c, s.o.name);
    m.lock();  // warm-up before the window: scripts loaded, a pooled connection open
    m.unlock();
    work(s, true, [&] { m.lock(); }, [&] { m.unlock(); });
}

// redis-py's Lock.release(): LUA_RELEASE_SCRIPT.
constexpr const char* peer_release =
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('del', KEYS[1]) return 1";

void peer_worker(shared_state& s) {
    connection lock(s.co);
    std::string token;
    work(
        s, false,
        [&] {
            const std::string random = rlock::detail::random_token();
            token = random.substr(random.size() - 32);  // 32 hex digits, like uuid1().hex
            while (lock.run({"SET", s.o.name, token, "NX", "PX", "30000"})->type !=
                   REDIS_REPLY_STATUS) {
                std::this_thread::sleep_for(from_ms(s.o.peer_sleep_ms));
            }
        },
        [&] { lock.run({"EVAL", peer_release, "1", s.o.name, token}); });
}

int run(options o) {
    if (o.name.empty()) o.name = "bench:mixed_peers:" + std::to_string(::getpid());
    std::optional<rlock_test::redis_server> own;
    if (o.uri.empty()) {
        own.emplace();
        o.uri = own->uri();
    }
    shared_state s;
    s.co = rlock::client_options::from_uri(o.uri);
    s.o = o;
    s.counter = o.name + ":overlap";
    const double load = load_average();
    s.start = clock_type::now() + std::chrono::milliseconds(300);
    s.end = s.start + std::chrono::duration_cast<clock_type::duration>(
                          std::chrono::duration<double>(o.seconds));
    std::vector<std::thread> threads;
    auto guarded = [&s](void (*fn)(shared_state&)) {
        return [&s, fn] {
            try {
                fn(s);
            } catch (const std::exception& e) {
                std::lock_guard<std::mutex> g(s.m);
                s.failures.emplace_back(e.what());
            }
        };
    };
    for (int i = 0; i < o.rlock_workers; ++i) threads.emplace_back(guarded(rlock_worker));
    for (int i = 0; i < o.peers; ++i) threads.emplace_back(guarded(peer_worker));
    for (std::thread& t : threads) t.join();
    for (const std::string& f : s.failures) std::fprintf(stderr, "mixed_peers: %s\n", f.c_str());
    if (!s.failures.empty()) return 2;

    std::sort(s.turns.begin(), s.turns.end(),
              [](const turn& a, const turn& b) { return a.acquired < b.acquired; });
    long rlock_acq = 0, peer_acq = 0, slow = 0;
    std::vector<double> waits;  // every rlock wait that began in the window, however it ended
    for (const turn& t : s.turns) {
        if (t.acquired < s.end) (t.rlock ? rlock_acq : peer_acq) += 1;
        if (!t.rlock || t.asked >= s.end) continue;
        waits.push_back(ms_between(t.asked, t.acquired));
        if (waits.back() > 250) ++slow;
    }
    // Free stretches (between one hold's release and the next hold's acquisition) that lie
    // inside some rlock wait: the longest part of one such stretch within one wait.
    double idle_max = 0;
    clock_type::time_point free_since = s.start;
    for (const turn& next : s.turns) {
        if (next.acquired > free_since) {
            for (const turn& w : s.turns) {
                if (!w.rlock) continue;
                const auto from = std::max(free_since, w.asked);
                const auto to = std::min(next.acquired, w.acquired);
                if (to > from) idle_max = std::max(idle_max, ms_between(from, to));
            }
        }
        free_since = std::max(free_since, next.released);
    }
    std::printf(
        "rlock=%d peers=%d H=%g A=%g T=%g peer_sleep_ms=%g rlock_acq=%ld peer_acq=%ld "
        "rlock_wait_ms_p50/p99/max=%.2f/%.2f/%.2f rlock_waits_over_250ms=%ld "
        "rlock_idle_ms_max=%.2f overlaps=%ld load=%.2f\n",
        o.rlock_workers, o.peers, o.hold_ms, o.away_ms, o.seconds, o.peer_sleep_ms, rlock_acq,
        peer_acq, percentile(waits, 0.5), percentile(waits, 0.99), percentile(waits, 1.0), slow,
        idle_max, s.overlaps.load(), load);
    return s.overlaps.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse(argc, argv));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "mixed_peers: %s\n", e.what());
        return 2;
    }
}
