// Contention: W worker processes, each with its own rlock::client, take turns on ONE lock for T
// seconds (issue 5). Each worker loops: ask for the lock (the wait is timed), hold it H ms,
// release, stay away A ms. The parent collects every hold and prints one line per run:
//
//   kind=mutex W=4 H=1 A=1 T=5 acq/s=... busy=... wait_ms_p50/p99/max=... handoff_ms_p50/p99=...
//   violations=0 load=...
//
//   acq/s       acquisitions made in the window of T seconds, per second
//   busy        sum of all holds (clipped to the window) / T: 1.0 means the lock never idled
//               (a semaphore: / (T x permits), 1.0 means no permit ever idled)
//   wait_ms     the worst worker's p50, p99 and max wait for lock() (each the maximum over the
//               workers, so one starved worker shows)
//   handoff_ms  contended hand-overs only (the next holder was already waiting when the holder
//               called unlock()): time from unlock() being called to the next lock() returning
//   violations  acquisitions that found the lock held (a semaphore: all its permits held);
//               non-zero exits 1. steady_clock is
//               CLOCK_MONOTONIC on Linux, one clock for every process on the machine, so holds
//               recorded by different workers can be compared directly
//   load        the 1-minute load average when the run started (the machine is shared)
//
// With --threads N (default 1) each worker process runs N threads, each with its own lock
// object on the process's one client, and a second line says how often a contended hand-over
// stayed in the holder's process and the longest run of one process's holds while a thread of
// another process waited (what local hand-off may cost the other processes):
//
//   threads=4 per process: same_process_handoffs=...% of ... contended, longest run of one
//   process's holds while another process waited: ... holds, ... ms
//
// With --observe the parent also PSUBSCRIBEs to the lock's channel(s) and timestamps each
// unlock message, which splits every hand-over into "unlock() called -> message seen" and
// "message seen -> next lock() returned" (printed as a second line).
//
// With --detail: each worker's waits; for every contended hand-over, which waiter won by age
// (oldest first; a fair race gives each rank the same share), and whether the newest waiter had
// asked less than 0.3 ms before the release (its first attempts still in flight); and the
// server's commands per acquisition (INFO commandstats, reset after the warm-up).
//
//   contention [--kind mutex|reentrant|fair|rw-write|async-mutex|...] [--workers 4] [--threads 1]
//              [--hold-ms 1] [--away-ms 1] [--handoff-passes N (the client's local hand-off; 0: off)]
//              [--seconds 5] [--uri redis://127.0.0.1:PORT] [--name LOCK] [--observe] [--detail]
//
// Without --uri it starts its own redis-server on a free loopback port. Workers are this program
// again (fork + exec of /proc/self/exe with --worker), so no thread or connection of the parent
// is ever inherited; they report through a pipe on fd 3 and wait for the start time on fd 4.
//
// More lock kinds: add one row to `kinds` below. run_worker<Lock> needs only a constructor
// Lock(rlock::client&, std::string) and lock()/unlock(); read_write_lock's lock()/unlock() are
// its write side, so "rw-write" needs no adapter.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "processes.hpp"
#include "arguments.hpp"
#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::nanoseconds;

using bench::go_fd;
using bench::load_average;
using bench::now_ns;
using bench::percentile;
using bench::read_all;
using bench::result_fd;
using bench::write_all;

struct options {
    std::string kind = "mutex";
    int workers = 4;
    int threads = 1;  // threads per worker process, each with its own lock object, one client
    double hold_ms = 1;
    double away_ms = 1;
    double seconds = 5;
    int permits = 1;  // --kind semaphore: the semaphore's permits (holders at once)
    int handoff_passes = -1;  // client_options::local_handoff_passes (-1: the client's default)
    std::string uri;
    std::string name;
    bool observe = false;
    bool detail = false;
    bool worker = false;
};

/// One turn of one worker, in steady_clock nanoseconds.
struct turn {
    std::int64_t asked;     // before lock()
    std::int64_t acquired;  // lock() returned
    std::int64_t released;  // before unlock()
    std::int64_t unlocked;  // unlock() returned
    std::int32_t proc;      // which worker process (set by the parent)
    std::int32_t thread;    // which thread of it
};

[[noreturn]] void usage(const char* why) {
    bench::usage_exit("contention",
                      "[--kind mutex|reentrant|fair|rw-write|semaphore|permits|async-mutex|async-reentrant|async-fair|async-rw-write|floor] [--workers N] [--threads N] [--permits N] [--hold-ms MS] [--away-ms MS] [--seconds S] [--handoff-passes N] [--uri redis://127.0.0.1:PORT] [--name LOCK] [--observe] [--detail]",
                      why);
}

options parse(int argc, char** argv) {
    options o;
    bench::arguments args(argc, argv, usage);
    while (args.next()) {
        const std::string_view a = args.name();
        if (a == "--kind") {
            o.kind = args.value();
        } else if (a == "--workers") {
            o.workers = static_cast<int>(args.number(1));
        } else if (a == "--threads") {
            o.threads = static_cast<int>(args.number(1));
        } else if (a == "--permits") {
            o.permits = static_cast<int>(args.number(1));
        } else if (a == "--handoff-passes") {
            o.handoff_passes = static_cast<int>(args.number(0));
        } else if (a == "--hold-ms") {
            o.hold_ms = args.number(0);
        } else if (a == "--away-ms") {
            o.away_ms = args.number(0);
        } else if (a == "--seconds") {
            o.seconds = args.number(0.001);
        } else if (a == "--uri") {
            o.uri = args.value();
        } else if (a == "--name") {
            o.name = args.value();
        } else if (a == "--observe") {
            o.observe = true;
        } else if (a == "--detail") {
            o.detail = true;
        } else if (a == "--worker") {
            o.worker = true;
        } else {
            args.unknown();
        }
    }
    return o;
}

clock_type::time_point at(std::int64_t ns) { return clock_type::time_point(nanoseconds(ns)); }

nanoseconds from_ms(double ms) { return nanoseconds(static_cast<std::int64_t>(ms * 1e6)); }

// ---------------------------------------------------------------------------------------------
// Worker side

template <class Lock>
int run_worker(const options& o) {
    rlock::client_options co = rlock::client_options::from_uri(o.uri);
    if (o.handoff_passes >= 0) co.local_handoff_passes = static_cast<unsigned>(o.handoff_passes);
    rlock::client c(co);
    const auto hold = from_ms(o.hold_ms), away = from_ms(o.away_ms);
    const auto n_threads = static_cast<std::size_t>(o.threads);
    std::vector<std::vector<turn>> turns(n_threads);
    std::vector<std::unique_ptr<Lock>> locks;
    for (std::size_t i = 0; i < n_threads; ++i) {
        locks.push_back(std::make_unique<Lock>(c, o.name));
        // Warm-up outside the window: loads the scripts and opens a pooled connection.
        locks.back()->lock();
        locks.back()->unlock();
    }
    const char ready = 'R';
    if (!write_all(result_fd, &ready, 1)) return 1;
    std::int64_t start = 0;
    if (!read_all(go_fd, &start, sizeof start)) return 1;

    const auto end = at(start) + std::chrono::duration_cast<nanoseconds>(
                                     std::chrono::duration<double>(o.seconds));
    std::vector<std::thread> threads;
    std::vector<std::string> errors(n_threads);
    for (std::size_t i = 0; i < n_threads; ++i) {
        threads.emplace_back([&, i] {
            Lock& lock = *locks[i];
            std::vector<turn>& mine = turns[i];
            mine.reserve(static_cast<std::size_t>(o.seconds * 1000 / std::max(0.05, o.hold_ms)) + 16);
            try {
                std::this_thread::sleep_until(at(start));
                while (clock_type::now() < end) {
                    turn t{};
                    t.thread = static_cast<std::int32_t>(i);
                    t.asked = now_ns();
                    lock.lock();
                    t.acquired = now_ns();
                    std::this_thread::sleep_for(hold);
                    t.released = now_ns();
                    lock.unlock();
                    t.unlocked = now_ns();
                    mine.push_back(t);
                    std::this_thread::sleep_for(away);
                }
            } catch (const std::exception& e) {
                errors[i] = e.what();
            }
        });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : errors) {
        if (e.empty()) continue;
        std::fprintf(stderr, "contention worker %d: %s\n", static_cast<int>(::getpid()), e.c_str());
        return 1;
    }
    std::vector<turn> all;
    for (const auto& v : turns) all.insert(all.end(), v.begin(), v.end());
    const std::uint64_t n = all.size();
    if (!write_all(result_fd, &n, sizeof n)) return 1;
    if (!write_all(result_fd, all.data(), all.size() * sizeof(turn))) return 1;
    return 0;
}

/// rlock::semaphore as a lock of one permit each: lock() = acquire(), unlock() = release().
struct semaphore_permit {
    semaphore_permit(rlock::client& c, const std::string& name) : s(c, name) {}
    void lock() { s.acquire(); }
    void unlock() { s.release(); }
    rlock::semaphore s;
};

/// rlock::permit_expirable_semaphore as a lock of one watched permit each.
struct expirable_permit {
    expirable_permit(rlock::client& c, const std::string& name) : s(c, name) {}
    void lock() { p = s.acquire(); }
    void unlock() { p.release(); }
    rlock::permit_expirable_semaphore s;
    rlock::permit p;
};

/// A lock's asynchronous form (issue 19): lock() = async_lock(rlock::use_future).get(), so each
/// wait is the engine's (wait group, subscriber listener, completion), measured the same way.
template <class Lock>
struct async_form {
    async_form(rlock::client& c, const std::string& name) : l(c, name) {}
    void lock() { h = l.async_lock(rlock::use_future).get(); }
    void unlock() { h.unlock(); }
    Lock l;
    rlock::hold h;
};

/// The floor (--kind floor): a hand-over at the protocol's minimum, written by hand on hiredis
/// for this benchmark and for nothing else. `SET NX PX` takes the lock; one script deletes the
/// key when it holds the worker's token and publishes; each worker is subscribed for the whole
/// run, and a waiting worker's own thread reads its subscription socket. So a hand-over is one
/// release round trip, the message and one `SET` round trip, with no subscriber thread, no
/// `SUBSCRIBE` per wait and no pacing. Not a lock to copy: every release wakes every worker, a
/// stale message costs a refused `SET`, and the race goes to whoever is first.
class floor_lock {
public:
    floor_lock(rlock::client& c, const std::string& name)
        : name_(name), channel_("bench:floor:{" + name + "}"),
          token_(std::to_string(::getpid()) + ":" + std::to_string(next_token_++)) {
        const rlock::client_options& o = c.options();
        cmd_.reset(redisConnect(o.host.c_str(), o.port));
        sub_.reset(redisConnect(o.host.c_str(), o.port));
        if (!cmd_ || cmd_->err || !sub_ || sub_->err) throw std::runtime_error("floor: cannot connect");
        rlock::detail::reply_ptr r = rlock::detail::command(
            cmd_.get(), {"SCRIPT", "LOAD",
                         "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) "
                         "return redis.call('publish', ARGV[2], '0') end return -1"});
        if (!r || r->type != REDIS_REPLY_STRING) throw std::runtime_error("floor: SCRIPT LOAD failed");
        sha_ = std::string(rlock::detail::reply_text(r.get()));
        r = rlock::detail::command(sub_.get(), {"SUBSCRIBE", channel_});
        if (!r || r->type != REDIS_REPLY_ARRAY) throw std::runtime_error("floor: SUBSCRIBE failed");
        const timeval bound{0, 100'000};  // never needed: every release publishes
        redisSetTimeout(sub_.get(), bound);
    }
    void lock() {
        for (;;) {
            rlock::detail::reply_ptr r =
                rlock::detail::command(cmd_.get(), {"SET", name_, token_, "NX", "PX", "30000"});
            if (!r) throw std::runtime_error("floor: SET failed");
            if (r->type == REDIS_REPLY_STATUS) return;
            void* raw = nullptr;
            if (redisGetReply(sub_.get(), &raw) != REDIS_OK) {
                if (sub_->err != REDIS_ERR_IO || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                    throw std::runtime_error(std::string("floor: ") + sub_->errstr);
                }
                sub_->err = 0;  // timed out: hiredis marks the context failed; go on
                sub_->errstr[0] = '\0';
            }
            rlock::detail::reply_ptr message(static_cast<redisReply*>(raw));
        }
    }
    void unlock() {
        rlock::detail::reply_ptr r =
            rlock::detail::command(cmd_.get(), {"EVALSHA", sha_, "1", name_, token_, channel_});
        if (!r || r->type != REDIS_REPLY_INTEGER || r->integer < 0) {
            throw std::runtime_error("floor: release failed");
        }
    }

private:
    rlock::detail::context_ptr cmd_, sub_;
    std::string name_, channel_, token_, sha_;
    static inline std::atomic<int> next_token_{0};  // one token per thread's lock object
};

using worker_fn = int (*)(const options&);

// One row per lock kind.
constexpr std::pair<std::string_view, worker_fn> kinds[] = {
    {"mutex", run_worker<rlock::mutex>},
    {"reentrant", run_worker<rlock::reentrant_lock>},
    {"fair", run_worker<rlock::fair_lock>},
    {"rw-write", run_worker<rlock::read_write_lock>},  // the write side: lock() / unlock()
    {"semaphore", run_worker<semaphore_permit>},      // --permits holders at once
    {"permits", run_worker<expirable_permit>},        // the same with ids and leases
    {"async-mutex", run_worker<async_form<rlock::mutex>>},  // the asynchronous forms
    {"async-reentrant", run_worker<async_form<rlock::reentrant_lock>>},
    {"async-fair", run_worker<async_form<rlock::fair_lock>>},
    {"async-rw-write", run_worker<async_form<rlock::read_write_lock>>},
    {"floor", run_worker<floor_lock>},  // the hand-written hand-over at the protocol's minimum
};

worker_fn find_kind(std::string_view name) {
    for (const auto& [k, fn] : kinds) {
        if (k == name) return fn;
    }
    return nullptr;
}

int worker_main(const options& o) {
    try {
        return find_kind(o.kind)(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "contention worker %d: %s\n", static_cast<int>(::getpid()), e.what());
        return 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Parent side

struct worker_proc {
    pid_t pid = -1;
    int results = -1;  // read end of the worker's result pipe
    std::vector<turn> turns;
};

worker_proc spawn(const options& o, int go_read) {
    std::vector<std::string> args = {"contention",           "--worker",
                                     "--kind",               o.kind,
                                     "--uri",                o.uri,
                                     "--name",               o.name,
                                     "--hold-ms",            bench::fmt_double(o.hold_ms),
                                     "--away-ms",            bench::fmt_double(o.away_ms),
                                     "--seconds",            bench::fmt_double(o.seconds),
                                     "--threads",            std::to_string(o.threads),
                                     "--permits",            std::to_string(o.permits)};
    if (o.handoff_passes >= 0) {
        args.emplace_back("--handoff-passes");
        args.emplace_back(std::to_string(o.handoff_passes));
    }
    worker_proc w;
    w.pid = bench::spawn_self(std::move(args), go_read, w.results);
    return w;
}

/// PSUBSCRIBEs to every channel of the lock and timestamps the messages until `until`.
class observer {
public:
    observer(const rlock::client_options& co, const std::string& name) {
        conn_.reset(redisConnect(co.host.c_str(), co.port));
        if (!conn_ || conn_->err) throw std::runtime_error("observer: cannot connect");
        const std::string pattern = "*{" + name + "}*";
        rlock::detail::reply_ptr r = rlock::detail::command(conn_.get(), {"PSUBSCRIBE", pattern});
        if (!r) throw std::runtime_error("observer: PSUBSCRIBE failed");
    }
    void run_until(clock_type::time_point until) {
        const timeval tv{0, 20000};
        redisSetTimeout(conn_.get(), tv);
        while (clock_type::now() < until) {
            void* raw = nullptr;
            if (redisGetReply(conn_.get(), &raw) != REDIS_OK) {
                if (conn_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                    // hiredis marks a timed-out context as failed; clear it and go on.
                    conn_->err = 0;
                    conn_->errstr[0] = '\0';
                    continue;
                }
                throw std::runtime_error(std::string("observer: ") + conn_->errstr);
            }
            rlock::detail::reply_ptr r(static_cast<redisReply*>(raw));
            if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                rlock::detail::reply_text(r->element[0]) == "pmessage") {
                seen.push_back(now_ns());
            }
        }
    }
    std::vector<std::int64_t> seen;

private:
    rlock::detail::context_ptr conn_;
};

std::string server_command(const rlock::client_options& co,
                           std::initializer_list<std::string_view> parts) {
    rlock::detail::context_ptr c(redisConnect(co.host.c_str(), co.port));
    if (!c || c->err) throw std::runtime_error("cannot connect to " + co.host);
    rlock::detail::reply_ptr r = rlock::detail::command(c.get(), parts);
    return r ? std::string(rlock::detail::reply_text(r.get())) : std::string();
}

/// The server's side of the run (stats reset after the warm-up): commands per acquisition and
/// the server's CPU use, from INFO. `acquisitions` is approximate (turns in the window plus the
/// ones around it).
void print_server_stats(const rlock::client_options& co, long acquisitions, double seconds) {
    const std::string info = server_command(co, {"INFO", "commandstats"});
    std::printf("  server, per acquisition:");
    std::size_t at_pos = 0;
    while ((at_pos = info.find("cmdstat_", at_pos)) != std::string::npos) {
        const std::size_t eol = info.find('\n', at_pos);
        const std::string line = info.substr(at_pos + 8, eol - at_pos - 8);
        long calls = 0;
        double usec_per_call = 0;
        const std::size_t colon = line.find(':');
        std::sscanf(line.c_str() + colon, ":calls=%ld,%*[^,],usec_per_call=%lf", &calls,
                    &usec_per_call);
        if (calls > 0 && line.rfind("config", 0) != 0 && line.rfind("info", 0) != 0) {
            std::printf(" %s=%.2f(%.1fus)", line.substr(0, colon).c_str(),
                        static_cast<double>(calls) / static_cast<double>(acquisitions),
                        usec_per_call);
        }
        at_pos = eol;
    }
    const std::string cpu = server_command(co, {"INFO", "cpu"});
    double sys = 0, user = 0;
    if (const auto p = cpu.find("used_cpu_sys:"); p != std::string::npos) {
        sys = std::atof(cpu.c_str() + p + 13);
    }
    if (const auto p = cpu.find("used_cpu_user:"); p != std::string::npos) {
        user = std::atof(cpu.c_str() + p + 14);
    }
    std::printf("\n  server cpu (whole life, incl. start-up): sys=%.2fs user=%.2fs over a %.0fs run\n",
                sys, user, seconds);
}

/// Per worker: turns and wait percentiles. Then, for every contended hand-over, which of the
/// waiters won by age: rank 0 = the one that had waited longest. A fair race among k waiters
/// gives each rank 1/k of the wins.
void print_detail(const std::vector<worker_proc>& workers, const std::vector<turn>& all) {
    for (std::size_t i = 0; i < workers.size(); ++i) {
        std::vector<double> waits;
        for (const turn& t : workers[i].turns) {
            waits.push_back(static_cast<double>(t.acquired - t.asked) / 1e6);
        }
        std::printf("  worker %zu: turns=%zu wait_ms_p50/p90/p99/max=%.2f/%.2f/%.2f/%.2f\n", i,
                    workers[i].turns.size(), percentile(waits, 0.5), percentile(waits, 0.9),
                    percentile(waits, 0.99), percentile(waits, 1.0));
    }
    // wins[k][r]: hand-overs with k waiters won by the waiter of age rank r.
    std::vector<std::vector<long>> wins(workers.size() + 1,
                                        std::vector<long>(workers.size() + 1, 0));
    long newest[2][2] = {{0, 0}, {0, 0}};  // [asked < 0.3 ms before the release][it won]
    for (std::size_t i = 0; i + 1 < all.size(); ++i) {
        const std::int64_t release = all[i].released;
        std::vector<std::int64_t> waiting;  // when each waiter asked
        for (std::size_t j = i + 1; j < all.size(); ++j) {
            if (all[j].asked <= release) waiting.push_back(all[j].asked);
        }
        if (waiting.size() < 2) continue;
        const std::int64_t winner = all[i + 1].asked;
        std::sort(waiting.begin(), waiting.end());
        const auto rank = static_cast<std::size_t>(
            std::lower_bound(waiting.begin(), waiting.end(), winner) - waiting.begin());
        if (waiting.size() < wins.size() && rank < waiting.size()) ++wins[waiting.size()][rank];
        // The newest waiter: had it asked so recently that its first attempts were still in
        // flight when the lock was released (it can win without ever waiting for the message)?
        const bool fresh = release - waiting.back() < 300'000;
        ++newest[fresh][rank + 1 == waiting.size()];
    }
    for (int fresh = 1; fresh >= 0; --fresh) {
        const long n = newest[fresh][0] + newest[fresh][1];
        if (n == 0) continue;
        std::printf("  newest waiter asked %s 0.3 ms before the release: %ld hand-overs, it won %.0f%%\n",
                    fresh ? "less than" : "more than", n,
                    100.0 * static_cast<double>(newest[fresh][1]) / static_cast<double>(n));
    }
    for (std::size_t k = 2; k < wins.size(); ++k) {
        long total = 0;
        for (long w : wins[k]) total += w;
        if (total == 0) continue;
        std::printf("  %zu waiters (%ld hand-overs): wins by age rank, oldest first:", k, total);
        for (std::size_t r = 0; r < k; ++r) {
            std::printf(" %.0f%%", 100.0 * static_cast<double>(wins[k][r]) / static_cast<double>(total));
        }
        std::printf("\n");
    }
}

int parent_main(options o) {
    if (!find_kind(o.kind)) {
        std::string known;
        for (const auto& k : kinds) known += " " + std::string(k.first);
        usage(("unknown --kind " + o.kind + " (known:" + known + ")").c_str());
    }
    ::signal(SIGPIPE, SIG_IGN);  // a worker that died shows as a failed write, not a kill
    if (o.name.empty()) o.name = "bench:contention:" + std::to_string(::getpid());
    std::optional<rlock_test::redis_server> own;
    if (o.uri.empty()) {
        own.emplace();
        o.uri = own->uri();
    }
    const rlock::client_options co = rlock::client_options::from_uri(o.uri);
    const double load = load_average();
    if (o.kind == "semaphore" || o.kind == "permits") {
        rlock::client setup(co);
        rlock::semaphore s(setup, o.name);  // the count key is the same in both layouts
        (void)s.drain_permits();
        (void)s.add_permits(o.permits);
    } else if (o.permits != 1) {
        usage("--permits is for --kind semaphore or permits");
    }

    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<worker_proc> workers;
    for (int i = 0; i < o.workers; ++i) workers.push_back(spawn(o, go[0]));
    ::close(go[0]);
    bool failed = false;
    bench::read_deadline_ns = now_ns() + 60'000'000'000;  // ready: connected and set up
    for (worker_proc& w : workers) {
        char ready = 0;
        if (!read_all(w.results, &ready, 1) || ready != 'R') failed = true;
    }
    std::unique_ptr<observer> obs;
    if (!failed && o.observe) obs = std::make_unique<observer>(co, o.name);
    if (!failed && o.detail) server_command(co, {"CONFIG", "RESETSTAT"});
    // Every worker sleeps until the same instant; 20 ms is ample for them to read it.
    const std::int64_t start = now_ns() + 20'000'000;
    const auto window = std::chrono::duration_cast<nanoseconds>(
        std::chrono::duration<double>(o.seconds));
    const std::int64_t end = start + window.count();
    bench::read_deadline_ns = end + 60'000'000'000;
    if (!failed) {
        for (int i = 0; i < o.workers; ++i) write_all(go[1], &start, sizeof start);
    }
    ::close(go[1]);  // a worker still waiting for the start sees EOF and gives up
    if (obs) obs->run_until(at(end) + from_ms(o.hold_ms + 1000));

    for (worker_proc& w : workers) {
        std::uint64_t n = 0;
        if (!failed && read_all(w.results, &n, sizeof n)) {
            w.turns.resize(n);
            if (!read_all(w.results, w.turns.data(), n * sizeof(turn))) failed = true;
        } else {
            failed = true;
        }
        for (turn& t : w.turns) t.proc = static_cast<std::int32_t>(&w - workers.data());
        ::close(w.results);
        if (failed) ::kill(w.pid, SIGKILL);  // it may be stuck: its report is not awaited
        int status = 0;
        ::waitpid(w.pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
    }
    if (failed) {
        std::fprintf(stderr, "contention: a worker failed (see above)\n");
        return 2;
    }

    // Every hold, by when it began.
    std::vector<turn> all;
    for (const worker_proc& w : workers) all.insert(all.end(), w.turns.begin(), w.turns.end());
    std::sort(all.begin(), all.end(),
              [](const turn& a, const turn& b) { return a.acquired < b.acquired; });

    // An acquisition that finds `permits` holds still running (1 for a lock) is a violation.
    // At equal times a release comes first.
    std::vector<std::pair<std::int64_t, int>> edges;  // (time, -1 release / +1 acquire)
    for (const turn& t : all) {
        edges.emplace_back(t.acquired, +1);
        edges.emplace_back(t.released, -1);
    }
    std::sort(edges.begin(), edges.end());
    long violations = 0;
    int holding = 0;
    for (const auto& [when, step] : edges) {
        holding += step;
        if (step > 0 && holding > o.permits) ++violations;
    }

    long acquisitions = 0;
    double busy_ns = 0;
    for (const turn& t : all) {
        if (t.acquired >= start && t.acquired < end) ++acquisitions;
        const std::int64_t a = std::max(t.acquired, start), b = std::min(t.released, end);
        if (b > a) busy_ns += static_cast<double>(b - a);
    }
    const double wall_ns = static_cast<double>(window.count());

    double p50 = 0, p99 = 0, max = 0;
    for (const worker_proc& w : workers) {
        std::vector<double> waits;
        for (const turn& t : w.turns) waits.push_back(static_cast<double>(t.acquired - t.asked) / 1e6);
        p50 = std::max(p50, percentile(waits, 0.50));
        p99 = std::max(p99, percentile(waits, 0.99));
        max = std::max(max, percentile(waits, 1.0));
    }

    // Contended hand-overs: the next holder asked before this one called unlock().
    std::vector<double> handoffs, to_message, from_message, unlock_calls;
    std::size_t m = 0;
    for (std::size_t i = 0; i + 1 < all.size(); ++i) {
        const turn& prev = all[i];
        const turn& next = all[i + 1];
        unlock_calls.push_back(static_cast<double>(prev.unlocked - prev.released) / 1e6);
        if (next.asked > prev.released || next.acquired < prev.released) continue;
        handoffs.push_back(static_cast<double>(next.acquired - prev.released) / 1e6);
        if (!obs) continue;
        while (m < obs->seen.size() && obs->seen[m] < prev.released) ++m;
        if (m < obs->seen.size() && obs->seen[m] <= next.acquired) {
            to_message.push_back(static_cast<double>(obs->seen[m] - prev.released) / 1e6);
            from_message.push_back(static_cast<double>(next.acquired - obs->seen[m]) / 1e6);
        }
    }

    // With threads: how often a contended hand-over stayed in the holder's process, and the
    // longest run of one process's holds while a thread of another process waited (the time
    // that process's passes kept the others out: local hand-off's fairness bound).
    long same_process = 0, contended = 0;
    std::size_t streak = 0, longest = 0;
    std::int64_t streak_from = 0, longest_ns = 0;
    for (std::size_t i = 0; i + 1 < all.size(); ++i) {
        const turn& prev = all[i];
        const turn& next = all[i + 1];
        bool other_waits = false;  // a thread of another process asked before prev released
        for (std::size_t j = i + 1; j < all.size() && !other_waits; ++j) {
            other_waits = all[j].proc != prev.proc && all[j].asked <= prev.released;
        }
        if (next.asked <= prev.released && next.acquired >= prev.released) {
            ++contended;
            if (next.proc == prev.proc) ++same_process;
        }
        if (next.proc == prev.proc && other_waits) {
            if (streak == 0) streak_from = prev.acquired;
            ++streak;
            if (streak > longest) {
                longest = streak;
                longest_ns = next.released - streak_from;
            }
        } else {
            streak = 0;
        }
    }

    const std::string label =
        o.kind == "semaphore" || o.kind == "permits" ? o.kind + " P=" + std::to_string(o.permits) : o.kind;
    std::printf(
        "kind=%s W=%d H=%g A=%g T=%g acq/s=%.1f busy=%.3f wait_ms_p50/p99/max=%.2f/%.2f/%.2f "
        "handoff_ms_p50/p99=%.3f/%.3f violations=%ld load=%.2f\n",
        label.c_str(), o.workers, o.hold_ms, o.away_ms, o.seconds,
        static_cast<double>(acquisitions) / o.seconds, busy_ns / (wall_ns * o.permits), p50, p99, max,
        percentile(handoffs, 0.5), percentile(handoffs, 0.99), violations, load);
    if (o.threads > 1) {
        std::printf(
            "  threads=%d per process: same_process_handoffs=%.0f%% of %ld contended, longest run "
            "of one process's holds while another process waited: %zu holds, %.2f ms\n",
            o.threads, contended ? 100.0 * static_cast<double>(same_process) / static_cast<double>(contended) : 0.0,
            contended, longest + (longest ? 1 : 0), static_cast<double>(longest_ns) / 1e6);
    }
    if (obs) {
        std::printf(
            "  observe: handoffs=%zu/%zu contended, unlock_call_ms_p50=%.3f, "
            "unlock->message_ms_p50/p99=%.3f/%.3f message->acquired_ms_p50/p99=%.3f/%.3f "
            "(%zu messages)\n",
            handoffs.size(), all.size(), percentile(unlock_calls, 0.5),
            percentile(to_message, 0.5), percentile(to_message, 0.99),
            percentile(from_message, 0.5), percentile(from_message, 0.99), obs->seen.size());
    }
    if (o.detail) {
        print_detail(workers, all);
        print_server_stats(co, acquisitions + 4L * o.workers, o.seconds);
    }
    return violations == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    if (o.worker) return worker_main(o);
    try {
        return parent_main(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "contention: %s\n", e.what());
        return 2;
    }
}
