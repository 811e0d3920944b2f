// Flash sale (issue 21): P worker processes x T threads buy from K stock keys whose popularity is
// Zipf-distributed (a few very hot). A request locks its key, reads the stock, decrements it
// when it is above 0, and unlocks. Every kind named in --kinds runs in turn against the same
// server, from the same initial stock, and prints one line:
//
//   kind=mutex P=8 T=4 keys=1000 zipf=1.1 s=5 req/s=... p50/p99/max_ms=... sold=... oversell=0 lost=0
//
//   req/s       requests finished in the window, per second (a request that found the stock at 0
//               counts: it still took the lock)
//   p50/p99/max request latency, lock asked to unlock returned, over every request
//   sold        decrements made
//   oversell    sales that should not have happened: a stock value sold twice (two holders read
//               it at once: a mutual-exclusion violation) or a value below 1. Must be 0.
//   lost        keys whose final stock differs from the initial stock minus their sales (an
//               update lost to an overlap). Must be 0.
// and under it what a request cost, which does not move with the machine's load as req/s does:
//   cost per request: client_cpu_us=... server_cpu_us=... context_switches=...
//               the workers' CPU (getrusage of each, through wait4), the server's (INFO cpu,
//               used_cpu_sys + used_cpu_user) and the workers' context switches, per request
//
// Kinds:
//   lua        one script decrements atomically, no lock: the physical limit of this workload
//   setnx      the seed posts' hand-written lock: SET key token NX PX 10000, on refusal sleep
//              --setnx-sleep-ms (10) and try again; unlock by a compare-and-delete script
//   setnx-1ms  the same loop sleeping 1 ms on refusal
//   four-trips what any lock that acquires at Redis costs when waiting costs nothing: the
//              setnx loop's four commands (SET NX PX, GET, SET, compare-and-delete) on a lock
//              key and a scratch key of the thread's own, so never refused (the GET reads the
//              request's stock key; nothing is sold). Its req/s bounds a lock whose every
//              request acquires at Redis; only holds passed within a process (two commands)
//              can go above it
//   queue      a hand-written directed hand-over, the floor of any lock whose release wakes one
//              waiter, not every waiting process: the acquire script takes the lock (SET NX PX)
//              or appends the caller to a list beside it; a waiter blocks in BLPOP on a list of
//              its own; the release script gives the lock to the list's head (SET to its token)
//              and pushes to that head's list, or deletes the key when nobody waits. Waiting
//              costs no CPU and no try is ever refused (a request that waits costs one BLPOP
//              more than four-trips). A floor, not a lock: a waiter that dies in the list
//              stalls the lock until its lease runs out, which a real lock has to prevent
//   wake       a hand-written directed wake-up, between the setnx loop and queue: the acquire
//              script takes the lock (SET NX PX) or registers the caller in a sorted set beside
//              it (its first refusal's time as score, so that it keeps its place); a waiter
//              blocks in BLPOP on a list of its own for at most 100 ms (a paused or dead head
//              must not stall the others: they look again by themselves); the release script
//              deletes the key and wakes the set's oldest (pushes to its list). Newcomers barge
//              in, as in the loop: the woken waiter tries like anyone. What a lock whose release
//              wakes one waiter across processes (instead of one per waiting process) can do
//              while keeping SET NX's semantics
//   mutex, reentrant, fair
//              rlock's kinds, one rlock::client per process, a lock object per request
//   semaphore  rlock::semaphore of one permit per key
//   async-mutex
//              rlock::mutex's async_lock (waited on through a future per request)
//   async-semaphore
//              rlock::semaphore's async_acquire, one permit per key (a future per request)
//
// After the kinds, the ratios against the floors measured in the same run:
//   ratio kind=mutex vs_lua=... vs_setnx=... vs_four-trips=...
// The exit status is 1 when any run oversold or lost an update.
//
//   flash_sale [--kinds lua,setnx,mutex,...] [--procs 8] [--threads 4] [--keys 1000] [--zipf 1.1]
//              [--stock 1000] [--seconds 5] [--setnx-sleep-ms 10] [--handoff-passes 8]
//              [--handoff-ms 10] [--uri redis://127.0.0.1:PORT]
//              [--detail]
//
// --detail adds the server's commands per request (INFO commandstats; GET and SET, the critical
// section's, left out).
//
// Without --uri it starts its own redis-server on a free loopback port.
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "processes.hpp"
#include "arguments.hpp"
#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

namespace {

struct options {
    std::vector<std::string> kinds{"lua", "setnx", "setnx-1ms", "four-trips", "mutex", "reentrant", "fair", "semaphore"};
    int procs = 8;
    int threads = 4;
    int keys = 1000;
    double zipf = 1.1;
    long long stock = 1000;
    double seconds = 5;
    double setnx_sleep_ms = 10;
    rlock::client_options client;  // the rlock kinds' local hand-off bound
    std::string uri;
    bool detail = false;  // the server's commands per request, by command
    bool worker = false;
    std::string kind;  // the worker's
    int index = 0;     // the worker's
};

/// One sale: which key, and the stock value it read (and decremented).
struct sale {
    std::uint32_t key;
    std::int32_t value;
};

[[noreturn]] void usage(const char* why) {
    bench::usage_exit("flash_sale",
                      "[--kinds lua,setnx,setnx-1ms,four-trips,queue,wake,mutex,reentrant,fair,semaphore,async-mutex,async-semaphore] [--procs N] [--threads N] [--keys N] [--zipf S] [--stock N] [--seconds S] [--setnx-sleep-ms MS] [--handoff-passes N] [--handoff-ms MS] [--uri redis://127.0.0.1:PORT] [--detail]",
                      why);
}

options parse(int argc, char** argv) {
    options o;
    bench::arguments args(argc, argv, usage);
    while (args.next()) {
        const std::string_view a = args.name();
        if (a == "--kinds") {
            o.kinds.clear();
            const std::string list = args.value();
            for (std::size_t at = 0; at <= list.size();) {
                const std::size_t comma = std::min(list.find(',', at), list.size());
                if (comma > at) o.kinds.push_back(list.substr(at, comma - at));
                at = comma + 1;
            }
        } else if (a == "--procs") {
            o.procs = static_cast<int>(args.number(1));
        } else if (a == "--threads") {
            o.threads = static_cast<int>(args.number(1));
        } else if (a == "--keys") {
            o.keys = static_cast<int>(args.number(1));
        } else if (a == "--zipf") {
            o.zipf = args.number(0);
        } else if (a == "--stock") {
            o.stock = static_cast<long long>(args.number(1));
        } else if (a == "--seconds") {
            o.seconds = args.number(0.001);
        } else if (a == "--setnx-sleep-ms") {
            o.setnx_sleep_ms = args.number(0);
        } else if (a == "--handoff-passes") {
            o.client.local_handoff_passes = static_cast<unsigned>(args.number(0));
        } else if (a == "--handoff-ms") {
            o.client.local_handoff_time = std::chrono::milliseconds(static_cast<long long>(args.number(0)));
        } else if (a == "--uri") {
            o.uri = args.value();
        } else if (a == "--detail") {
            o.detail = true;
        } else if (a == "--worker") {
            o.worker = true;
        } else if (a == "--kind") {
            o.kind = args.value();
        } else if (a == "--index") {
            o.index = static_cast<int>(args.number(0));
        } else {
            args.unknown();
        }
    }
    return o;
}

std::string stock_key(std::uint32_t k) { return "fs:stock:" + std::to_string(k); }
std::string lock_name(std::uint32_t k) { return "fs:lock:" + std::to_string(k); }

/// Key k (0-based) with probability proportional to 1 / (k + 1)^s.
class zipf {
public:
    zipf(int n, double s) {
        cdf_.reserve(static_cast<std::size_t>(n));
        double sum = 0;
        for (int k = 1; k <= n; ++k) cdf_.push_back(sum += 1.0 / std::pow(k, s));
        for (double& c : cdf_) c /= sum;
    }
    template <class Rng>
    std::uint32_t operator()(Rng& rng) const {
        const double u = std::uniform_real_distribution<double>(0, 1)(rng);
        const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
        return static_cast<std::uint32_t>(std::min<std::ptrdiff_t>(it - cdf_.begin(), static_cast<std::ptrdiff_t>(cdf_.size()) - 1));
    }

private:
    std::vector<double> cdf_;
};

// The floors: kinds written by hand on hiredis, without an rlock::client, that the ratios of
// rlock's kinds are taken against.
constexpr std::string_view floor_kinds[] = {"lua", "setnx", "setnx-1ms", "four-trips", "queue", "wake"};

bool is_floor(std::string_view kind) {
    return std::find(std::begin(floor_kinds), std::end(floor_kinds), kind) != std::end(floor_kinds);
}

using reply_ptr = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

reply_ptr command(redisContext* c, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (!r) throw std::runtime_error(std::string("flash_sale: redis: ") + (c->errstr[0] ? c->errstr : "no reply"));
    return reply_ptr(r, freeReplyObject);
}

long long integer_of(const redisReply& r) {
    if (r.type == REDIS_REPLY_INTEGER) return r.integer;
    if (r.type == REDIS_REPLY_STRING) return std::strtoll(r.str, nullptr, 10);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Worker side

/// What one thread of a worker does per request: buy from key k, reporting the value sold (0:
/// none left). Made per thread (its own connection for the stock).
class buyer {
public:
    buyer(const options& o, const rlock::client_options& co, rlock::client* c)
        : o_(o), c_(c), conn_(redisConnect(co.host.c_str(), co.port), redisFree) {
        if (!conn_ || conn_->err) throw std::runtime_error("flash_sale: cannot connect");
        token_ = "fs-" + std::to_string(::getpid()) + "-" + std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
    }

    long long buy(std::uint32_t k) {
        const std::string& kind = o_.kind;
        if (kind == "lua") return lua(k);
        if (kind == "setnx") return setnx(k, o_.setnx_sleep_ms);
        if (kind == "setnx-1ms") return setnx(k, 1);
        if (kind == "four-trips") return four_trips(k);
        if (kind == "queue") return queue(k);
        if (kind == "wake") return wake(k);
        if (kind == "mutex") return locked<rlock::mutex>(k);
        if (kind == "reentrant") return locked<rlock::reentrant_lock>(k);
        if (kind == "fair") return locked<rlock::fair_lock>(k);
        if (kind == "semaphore") {
            rlock::semaphore s(*c_, lock_name(k));
            s.acquire();
            const long long v = read_and_take(k);
            s.release();
            return v;
        }
        if (kind == "async-semaphore") {
            rlock::semaphore s(*c_, lock_name(k));
            if (!s.async_acquire(rlock::use_future).get())
                throw std::runtime_error("flash_sale: async_acquire without a deadline returned false");
            const long long v = read_and_take(k);
            s.release();
            return v;
        }
        if (kind == "async-mutex") {
            rlock::mutex m(*c_, lock_name(k));
            rlock::hold h = m.async_lock(rlock::use_future).get();
            const long long v = read_and_take(k);
            h.unlock();
            return v;
        }
        throw std::runtime_error("flash_sale: unknown kind " + kind);
    }

private:
    // The critical section: GET, and SET to one less when above 0.
    long long read_and_take(std::uint32_t k) {
        const std::string key = stock_key(k);
        const long long v = integer_of(*command(conn_.get(), {"GET", key}));
        if (v > 0) (void)command(conn_.get(), {"SET", key, std::to_string(v - 1)});
        return v;
    }

    template <class Lock>
    long long locked(std::uint32_t k) {
        Lock l(*c_, lock_name(k));
        l.lock();
        const long long v = read_and_take(k);
        l.unlock();
        return v;
    }

    long long lua(std::uint32_t k) {
        static const std::string script =
            "local s = tonumber(redis.call('get', KEYS[1]) or '0') "
            "if s > 0 then redis.call('set', KEYS[1], s - 1) end return s";
        return integer_of(*command(conn_.get(), {"EVAL", script, "1", stock_key(k)}));
    }

    long long setnx(std::uint32_t k, double sleep_ms) {
        static const std::string unlock =
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
        const std::string key = "fs:setnx:" + std::to_string(k);
        const std::string token = token_ + ":" + std::to_string(++n_);
        const auto pause = std::chrono::microseconds(static_cast<long long>(sleep_ms * 1000));
        for (;;) {
            reply_ptr r = command(conn_.get(), {"SET", key, token, "NX", "PX", "10000"});
            if (r->type == REDIS_REPLY_STATUS) break;
            std::this_thread::sleep_for(pause);
        }
        const long long v = read_and_take(k);
        (void)command(conn_.get(), {"EVAL", unlock, "1", key, token});
        return v;
    }

    // The setnx loop's commands, never refused, nothing sold (four-trips above).
    long long four_trips(std::uint32_t k) {
        static const std::string unlock =
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
        const std::string key = "fs:four:" + token_;
        const std::string token = token_ + ":" + std::to_string(++n_);
        reply_ptr r = command(conn_.get(), {"SET", key, token, "NX", "PX", "10000"});
        if (r->type != REDIS_REPLY_STATUS) throw std::runtime_error("flash_sale: four-trips refused");
        const long long v = integer_of(*command(conn_.get(), {"GET", stock_key(k)}));
        (void)command(conn_.get(), {"SET", key + ":scratch", std::to_string(v)});
        (void)command(conn_.get(), {"EVAL", unlock, "1", key, token});
        return 0;
    }

    // The directed hand-over floor (queue above): KEYS lock, its waiters' list; ARGV the token.
    long long queue(std::uint32_t k) {
        static const std::string acquire =
            "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', 10000) then return 1 end "
            "redis.call('rpush', KEYS[2], ARGV[1]) return 0";
        static const std::string release =
            "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
            "local next = redis.call('lpop', KEYS[2]) "
            "if next then redis.call('set', KEYS[1], next, 'PX', 10000) "
            "redis.call('rpush', 'fs:q:wake:' .. next, 1) else redis.call('del', KEYS[1]) end return 1";
        const std::string key = "fs:q:{" + std::to_string(k) + "}";
        const std::string waiters = key + ":waiters";
        const std::string token = token_ + ":" + std::to_string(++n_);
        if (integer_of(*command(conn_.get(), {"EVAL", acquire, "2", key, waiters, token})) != 1) {
            reply_ptr r = command(conn_.get(), {"BLPOP", "fs:q:wake:" + token, "10"});
            if (r->type != REDIS_REPLY_ARRAY) throw std::runtime_error("flash_sale: queue: no hand-over in 10 s");
        }
        const long long v = read_and_take(k);
        (void)command(conn_.get(), {"EVAL", release, "2", key, waiters, token});
        return v;
    }

    // The directed wake-up floor (wake above): KEYS lock, its waiters (a sorted set); ARGV the
    // token, the waiter's first refusal (ms, its score).
    long long wake(std::uint32_t k) {
        static const std::string acquire =
            "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', 10000) then "
            "redis.call('zrem', KEYS[2], ARGV[1]) return 1 end "
            "redis.call('zadd', KEYS[2], 'NX', ARGV[2], ARGV[1]) redis.call('pexpire', KEYS[2], 10000) return 0";
        static const std::string release =
            "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
            "redis.call('del', KEYS[1]) "
            "local head = redis.call('zrange', KEYS[2], 0, 0)[1] "
            "if head then redis.call('zrem', KEYS[2], head) "
            "redis.call('rpush', 'fs:w:wake:' .. head, 1) redis.call('pexpire', 'fs:w:wake:' .. head, 10000) end "
            "return 1";
        const std::string key = "fs:w:{" + std::to_string(k) + "}";
        const std::string waiters = key + ":waiters";
        const std::string token = token_ + ":" + std::to_string(++n_);
        const std::string since = std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (integer_of(*command(conn_.get(), {"EVAL", acquire, "2", key, waiters, token, since})) != 1) {
            if (std::chrono::steady_clock::now() > give_up) throw std::runtime_error("flash_sale: wake: not held in 10 s");
            (void)command(conn_.get(), {"BLPOP", "fs:w:wake:" + token, "0.1"});
        }
        const long long v = read_and_take(k);
        (void)command(conn_.get(), {"EVAL", release, "2", key, waiters, token});
        return v;
    }

    const options& o_;
    rlock::client* c_;
    std::unique_ptr<redisContext, decltype(&redisFree)> conn_;
    std::string token_;
    std::uint64_t n_ = 0;
};

struct thread_result {
    std::vector<float> latency_us;
    std::vector<sale> sales;
    std::string error;
};

int worker_main(const options& o) {
    const rlock::client_options co = rlock::client_options::from_uri(o.uri, o.client);
    std::optional<rlock::client> c;
    if (!is_floor(o.kind)) c.emplace(co);
    const zipf pick(o.keys, o.zipf);
    std::vector<thread_result> results(static_cast<std::size_t>(o.threads));
    std::atomic<int> ready{0};
    std::promise<std::int64_t> go;
    std::shared_future<std::int64_t> start = go.get_future().share();
    auto body = [&](int t) {
        thread_result& out = results[static_cast<std::size_t>(t)];
        try {
            buyer b(o, co, c ? &*c : nullptr);
            (void)b.buy(static_cast<std::uint32_t>(o.keys));  // warm-up (scripts, connections): a key with no stock
            ++ready;
            const std::int64_t begin = start.get();
            const std::int64_t end = begin + static_cast<std::int64_t>(o.seconds * 1e9);
            std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(begin)));
            std::mt19937_64 rng(static_cast<std::uint64_t>(o.index) * 7919U + static_cast<std::uint64_t>(t));
            out.latency_us.reserve(1 << 16);
            for (std::int64_t now = bench::now_ns(); now < end; now = bench::now_ns()) {
                const std::uint32_t k = pick(rng);
                const long long v = b.buy(k);
                const std::int64_t done = bench::now_ns();
                out.latency_us.push_back(static_cast<float>(static_cast<double>(done - now) / 1e3));
                if (v > 0) out.sales.push_back({k, static_cast<std::int32_t>(v)});
            }
        } catch (const std::exception& e) {
            out.error = e.what();
            ++ready;
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < o.threads; ++t) threads.emplace_back(body, t);
    while (ready.load() < o.threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const char r = 'R';
    std::int64_t begin = 0;
    const bool started = bench::write_all(bench::result_fd, &r, 1) && bench::read_all(bench::go_fd, &begin, sizeof begin);
    go.set_value(started ? begin : 0);
    for (auto& t : threads) t.join();
    std::vector<float> latency;
    std::vector<sale> sales;
    int failed = 0;
    for (auto& tr : results) {
        if (!tr.error.empty()) {
            std::fprintf(stderr, "flash_sale worker %d (%s): %s\n", o.index, o.kind.c_str(), tr.error.c_str());
            ++failed;
        }
        latency.insert(latency.end(), tr.latency_us.begin(), tr.latency_us.end());
        sales.insert(sales.end(), tr.sales.begin(), tr.sales.end());
    }
    if (!started || !bench::write_vector(bench::result_fd, latency) || !bench::write_vector(bench::result_fd, sales)) return 1;
    return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Parent side

struct run_result {
    double rps = 0;
    bool ok = false;
};

bool semaphore_kind(const std::string& kind) { return kind == "semaphore" || kind == "async-semaphore"; }

// The initial state of a run: every key's stock, no lock left, a semaphore's permit.
void set_up(const options& o, const rlock::client_options& co, const std::string& kind) {
    std::unique_ptr<redisContext, decltype(&redisFree)> c(redisConnect(co.host.c_str(), co.port), redisFree);
    if (!c || c->err) throw std::runtime_error("flash_sale: cannot connect");
    (void)command(c.get(), {"FLUSHALL"});
    (void)command(c.get(), {"CONFIG", "RESETSTAT"});
    // Key `keys` is the warm-up's: no stock, but a semaphore's permit.
    for (int k = 0; k <= o.keys; ++k) {
        if (k < o.keys) {
            redisAppendCommand(c.get(), "SET %s %lld", stock_key(static_cast<std::uint32_t>(k)).c_str(), o.stock);
        }
        if (semaphore_kind(kind)) {
            redisAppendCommand(c.get(), "SET %s 1", lock_name(static_cast<std::uint32_t>(k)).c_str());
        }
    }
    const int replies = semaphore_kind(kind) ? 2 * o.keys + 1 : o.keys;
    for (int i = 0; i < replies; ++i) {
        void* r = nullptr;
        if (redisGetReply(c.get(), &r) != REDIS_OK) throw std::runtime_error("flash_sale: set-up failed");
        freeReplyObject(r);
    }
}

// The server's commands per request (INFO commandstats since the set-up's CONFIG RESETSTAT).
void print_commands(redisContext* c, double requests) {
    reply_ptr r = command(c, {"INFO", "commandstats"});
    std::string text(r->str ? r->str : "", r->len);
    std::printf("  commands per request:");
    for (std::size_t at = 0; (at = text.find("cmdstat_", at)) != std::string::npos;) {
        const std::size_t colon = text.find(':', at), calls = text.find("calls=", at);
        if (colon == std::string::npos || calls == std::string::npos) break;
        const std::string name = text.substr(at + 8, colon - at - 8);
        const double n = std::strtod(text.c_str() + calls + 6, nullptr);
        if (name != "info" && name != "get" && name != "set" && name != "flushall" && name != "config") {
            std::printf(" %s=%.2f", name.c_str(), n / std::max(requests, 1.0));
        }
        at = colon;
    }
    std::printf("\n");
}

/// The server's CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user), in seconds.
double server_cpu_s(redisContext* c) {
    reply_ptr r = command(c, {"INFO", "cpu"});
    const std::string text(r->str ? r->str : "", r->len);
    double total = 0;
    for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
        const std::size_t at = text.find(field);
        if (at != std::string::npos) total += std::strtod(text.c_str() + at + std::strlen(field), nullptr);
    }
    return total;
}

run_result run_kind(const options& o, const rlock::client_options& co, const std::string& kind) {
    set_up(o, co, kind);
    std::unique_ptr<redisContext, decltype(&redisFree)> info(redisConnect(co.host.c_str(), co.port), redisFree);
    if (!info || info->err) throw std::runtime_error("flash_sale: cannot connect");
    const double server_before = server_cpu_s(info.get());
    double client_cpu_s = 0, switches = 0;  // the workers' (getrusage through wait4)
    const double load = bench::load_average();
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    struct proc {
        pid_t pid;
        int results;
    };
    std::vector<proc> procs;
    for (int i = 0; i < o.procs; ++i) {
        std::vector<std::string> args = {"flash_sale", "--worker", "--kind", kind, "--index", std::to_string(i),
                                         "--uri", o.uri, "--threads", std::to_string(o.threads),
                                         "--keys", std::to_string(o.keys), "--zipf", bench::fmt_double(o.zipf),
                                         "--seconds", bench::fmt_double(o.seconds),
                                         "--setnx-sleep-ms", bench::fmt_double(o.setnx_sleep_ms),
                                         "--handoff-passes", std::to_string(o.client.local_handoff_passes),
                                         "--handoff-ms", std::to_string(o.client.local_handoff_time.count())};
        proc p{};
        p.pid = bench::spawn_self(std::move(args), go[0], p.results);
        procs.push_back(p);
    }
    ::close(go[0]);
    bool failed = false;
    bench::read_deadline_ns = bench::now_ns() + 60'000'000'000;  // ready: connected and set up
    for (const proc& p : procs) {
        char ready = 0;
        if (!bench::read_all(p.results, &ready, 1) || ready != 'R') failed = true;
    }
    const std::int64_t start = bench::now_ns() + 50'000'000;
    bench::read_deadline_ns = start + static_cast<std::int64_t>(o.seconds * 1e9) + 60'000'000'000;
    if (!failed) {
        for (int i = 0; i < o.procs; ++i) bench::write_all(go[1], &start, sizeof start);
    }
    ::close(go[1]);
    std::vector<double> latency_ms;
    std::vector<sale> sales;
    for (const proc& p : procs) {
        std::vector<float> l;
        std::vector<sale> s;
        if (failed || !bench::read_vector(p.results, l) || !bench::read_vector(p.results, s)) failed = true;
        for (float x : l) latency_ms.push_back(static_cast<double>(x) / 1e3);
        sales.insert(sales.end(), s.begin(), s.end());
        ::close(p.results);
        if (failed) ::kill(p.pid, SIGKILL);  // it may be stuck: its report is not awaited
        int status = 0;
        struct rusage ru {};
        ::wait4(p.pid, &status, 0, &ru);
        client_cpu_s += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                        static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
        switches += static_cast<double>(ru.ru_nvcsw + ru.ru_nivcsw);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
    }
    if (failed) {
        std::fprintf(stderr, "flash_sale: a worker of kind %s failed (see above)\n", kind.c_str());
        return {};
    }
    // Oversell: a value sold twice for one key (two holders at once), or one below 1; lost:
    // a key whose final stock is not the initial one minus its sales.
    std::map<std::uint32_t, std::vector<std::int32_t>> by_key;
    for (const sale& s : sales) by_key[s.key].push_back(s.value);
    long long oversell = 0, lost = 0;
    std::unique_ptr<redisContext, decltype(&redisFree)> c(redisConnect(co.host.c_str(), co.port), redisFree);
    for (int k = 0; k < o.keys; ++k) {
        std::vector<std::int32_t>& v = by_key[static_cast<std::uint32_t>(k)];
        std::sort(v.begin(), v.end());
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (v[i] < 1 || (i > 0 && v[i] == v[i - 1])) ++oversell;
        }
        const long long final_stock = integer_of(*command(c.get(), {"GET", stock_key(static_cast<std::uint32_t>(k))}));
        if (final_stock != o.stock - static_cast<long long>(v.size())) ++lost;
    }
    run_result r;
    r.rps = static_cast<double>(latency_ms.size()) / o.seconds;
    r.ok = oversell == 0 && lost == 0;
    std::printf("kind=%s P=%d T=%d keys=%d zipf=%g s=%g req/s=%.0f p50/p99/max_ms=%.2f/%.2f/%.2f sold=%zu oversell=%lld lost=%lld load=%.2f\n",
                kind.c_str(), o.procs, o.threads, o.keys, o.zipf, o.seconds, r.rps,
                bench::percentile(latency_ms, 0.5), bench::percentile(latency_ms, 0.99),
                latency_ms.empty() ? 0.0 : *std::max_element(latency_ms.begin(), latency_ms.end()),
                sales.size(), oversell, lost, load);
    // What a request costs, whatever the machine's load: the workers' CPU (warm-up and set-up
    // of their clients included), the server's, and the workers' context switches.
    const double requests = std::max<double>(1.0, static_cast<double>(latency_ms.size()));
    std::printf("  cost per request: client_cpu_us=%.1f server_cpu_us=%.1f context_switches=%.1f\n",
                client_cpu_s * 1e6 / requests, (server_cpu_s(info.get()) - server_before) * 1e6 / requests,
                switches / requests);
    if (o.detail) print_commands(c.get(), static_cast<double>(latency_ms.size()));
    std::fflush(stdout);
    return r;
}

int parent_main(options o) {
    ::signal(SIGPIPE, SIG_IGN);
    std::optional<rlock_test::redis_server> own;
    if (o.uri.empty()) {
        own.emplace();
        o.uri = own->uri();
    }
    const rlock::client_options co = rlock::client_options::from_uri(o.uri);
    std::map<std::string, run_result> got;
    bool ok = true;
    for (const std::string& kind : o.kinds) {
        got[kind] = run_kind(o, co, kind);
        ok = ok && got[kind].ok;
    }
    for (const std::string& kind : o.kinds) {
        if (is_floor(kind)) continue;
        std::printf("ratio kind=%s", kind.c_str());
        for (const std::string_view floor : floor_kinds) {
            auto it = got.find(std::string(floor));
            if (it != got.end() && it->second.rps > 0) {
                std::printf(" vs_%.*s=%.2f", static_cast<int>(floor.size()), floor.data(), got[kind].rps / it->second.rps);
            }
        }
        std::printf("\n");
    }
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const options o = parse(argc, argv);
        return o.worker ? worker_main(o) : parent_main(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "flash_sale: %s\n", e.what());
        return 2;
    }
}
