// What a held lock costs besides its lock+unlock round trips (issue 5), against a local
// redis-server started here on a free port:
//
//   watchdog_tick/N    one renewal tick of the watchdog (watchdog::renew_all) with N watched
//                      mutex holds: time per tick, its share of the renewal interval at the
//                      default 30 s timeout (target: <= 10 %), and the script calls per tick,
//                      counted by the server (INFO commandstats). The calls of a tick go out as
//                      one pipeline, so round trips <= calls (target for 10,000 holds: <= 100).
//   hold_memory/K      10,000 held locks of kind K (0 mutex, 1 reentrant_lock): the client's
//                      RSS growth and live heap growth (operator new, counted here) per hold
//                      (lock object + registry record), and the server's bytes per hold
//                      (used_memory growth, its tracking table included: server_keys_tracked,
//                      and MEMORY USAGE of one lock key).
//   hot_path_allocs/K/H  heap allocations (operator new; hiredis's own mallocs not counted) per
//                      lock+unlock of a warm lock object, kind K as above, with H other holds
//                      of the same client (0 or 10,000): the same count and time with both
//                      shows the hot path does no work per held lock.
//
//   renewal_losses/N   N watched mutex holds (10,000) on one client whose watchdog renews them
//                      every 200 ms (a 600 ms lease) for 5 s with loss tracking on: holds told
//                      lost (target: 0 — none is; each renewal's write invalidates the keys,
//                      which must not read as losses), renewal ticks, keys the server tracks.
//
//   async_waiters/N    10,000 pending asynchronous acquires (async_lock with a callback) on one
//                      client, spread over N names (1 or 1,000) that another client holds: the
//                      threads the waiting client added (target: <= 1, its engine) and its live
//                      heap growth per waiter (target: <= 2 KiB). The client is then destroyed,
//                      which completes every waiter (counted: all 10,000 must be).
//
//   build/.../bench/rlock_footprint [google benchmark flags]
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

namespace {

std::atomic<long long> allocations{0};
std::atomic<long long> live_bytes{0};  // heap bytes allocated by operator new and not freed

}  // namespace

// Counts every allocation of this program (rlock is header-only, so its allocations are here).
// Not inlined: GCC would otherwise pair malloc with the inlined delete's free and warn
// (-Wmismatched-new-delete), although the two replacements match.
[[gnu::noinline]] void* operator new(std::size_t n) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) {
        live_bytes.fetch_add(static_cast<long long>(malloc_usable_size(p)), std::memory_order_relaxed);
        return p;
    }
    throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
    if (p) live_bytes.fetch_sub(static_cast<long long>(malloc_usable_size(p)), std::memory_order_relaxed);
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

rlock_test::redis_server* server = nullptr;

long long info_field(const std::string& section, const std::string& field) {
    const std::string text = server->text({"INFO", section});
    const std::size_t at = text.find(field + ":");
    if (at == std::string::npos) return 0;
    return std::atoll(text.c_str() + at + field.size() + 1);
}

// calls=N in INFO commandstats' line for `command`.
long long command_calls(const std::string& command) {
    const std::string text = server->text({"INFO", "commandstats"});
    const std::string key = "cmdstat_" + command + ":calls=";
    const std::size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::atoll(text.c_str() + at + key.size());
}

long long rss_bytes() {
    std::ifstream statm("/proc/self/statm");
    long long size = 0, resident = 0;
    statm >> size >> resident;
    return resident * 4096;
}

template <class Lock>
std::vector<std::unique_ptr<Lock>> hold_many(rlock::client& c, const std::string& stem, int n) {
    std::vector<std::unique_ptr<Lock>> locks;
    locks.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        locks.push_back(std::make_unique<Lock>(c, stem + std::to_string(i)));
        locks.back()->lock();
    }
    return locks;
}

template <class Lock>
void release_all(std::vector<std::unique_ptr<Lock>>& locks) {
    for (auto& l : locks) l->unlock();
}

void bm_watchdog_tick(benchmark::State& state) {
    const int n = static_cast<int>(state.range(0));
    rlock::client c(server->options());  // default lock_watchdog_timeout: 30 s
    auto locks = hold_many<rlock::mutex>(c, "bench:wd:" + std::to_string(n) + ":", n);
    rlock::detail::client_core& core = rlock::detail::client_access::core(c);
    rlock::detail::context_ptr conn;
    std::uint64_t epoch = 0;
    core.watch().renew_all(conn, epoch);  // connects and caches the script
    const long long calls_before = command_calls("evalsha");
    const auto start = std::chrono::steady_clock::now();
    for (auto _ : state) {
        if (!core.watch().renew_all(conn, epoch)) state.SkipWithError("a renewal tick failed");
    }
    const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
    const std::chrono::duration<double> interval = c.options().lock_watchdog_timeout / 3;
    state.counters["percent_of_interval"] =
        100.0 * spent.count() / static_cast<double>(state.iterations()) / interval.count();
    const double ticks = static_cast<double>(state.iterations());
    const double calls = static_cast<double>(command_calls("evalsha") - calls_before) / ticks;
    state.counters["calls_per_tick"] = calls;
    release_all(locks);
}

template <class Lock>
void hold_memory(benchmark::State& state, const char* stem) {
    constexpr int n = 10000;
    for (auto _ : state) {
        rlock::client c(server->options());
        const long long rss0 = rss_bytes(), heap0 = live_bytes.load();
        const long long redis0 = info_field("memory", "used_memory");
        auto locks = hold_many<Lock>(c, stem, n);
        // Armed (read on the watchdog's tracked connection, 25 ms after each was taken): the
        // server's tracking table is part of what a hold costs it.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        const long long rss1 = rss_bytes(), heap1 = live_bytes.load();
        const long long redis1 = info_field("memory", "used_memory");
        state.counters["server_keys_tracked"] = static_cast<double>(info_field("stats", "tracking_total_keys"));
        const long long key_bytes = server->integer({"MEMORY", "USAGE", std::string(stem) + "0"});
        release_all(locks);
        state.counters["client_rss_per_hold"] = static_cast<double>(rss1 - rss0) / n;
        state.counters["client_heap_per_hold"] = static_cast<double>(heap1 - heap0) / n;
        state.counters["server_bytes_per_hold"] = static_cast<double>(redis1 - redis0) / n;
        state.counters["memory_usage_of_key"] = static_cast<double>(key_bytes);
    }
}

void bm_hold_memory(benchmark::State& state) {
    if (state.range(0) == 0) {
        hold_memory<rlock::mutex>(state, "bench:mem:mutex:");
    } else {
        hold_memory<rlock::reentrant_lock>(state, "bench:mem:reentrant:");
    }
}

template <class Lock>
void hot_path_allocs(benchmark::State& state, const char* name) {
    rlock::client c(server->options());
    auto others = hold_many<rlock::mutex>(c, std::string(name) + ":other:", static_cast<int>(state.range(1)));
    Lock l(c, name);
    for (int i = 0; i < 100; ++i) {  // warm: connections, scripts, registry buckets
        l.lock();
        l.unlock();
    }
    const long long before = allocations.load();
    for (auto _ : state) {
        l.lock();
        l.unlock();
    }
    state.counters["allocs_per_lock_unlock"] =
        static_cast<double>(allocations.load() - before) / static_cast<double>(state.iterations());
    release_all(others);
}

void bm_hot_path_allocs(benchmark::State& state) {
    if (state.range(0) == 0) {
        hot_path_allocs<rlock::mutex>(state, "bench:alloc:mutex");
    } else {
        hot_path_allocs<rlock::reentrant_lock>(state, "bench:alloc:reentrant");
    }
}

int thread_count() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
    }
    return 0;
}

void bm_async_waiters(benchmark::State& state) {
    constexpr int waiters = 10000;
    const int names = static_cast<int>(state.range(0));
    const std::string stem = "bench:async:" + std::to_string(names) + ":";
    rlock::client holder(server->options());
    auto held = hold_many<rlock::mutex>(holder, stem, names);
    for (auto _ : state) {
        auto c = std::make_unique<rlock::client>(server->options());
        std::vector<std::unique_ptr<rlock::mutex>> locks;
        for (int i = 0; i < names; ++i) locks.push_back(std::make_unique<rlock::mutex>(*c, stem + std::to_string(i)));
        rlock::mutex probe(*c, stem + "probe");
        (void)probe.try_lock();  // the lock objects' first use, outside the measure
        probe.unlock();
        std::atomic<int> completed{0};
        const int threads0 = thread_count();
        const long long heap0 = live_bytes.load();
        for (int i = 0; i < waiters; ++i) {
            (void)locks[static_cast<std::size_t>(i % names)]->async_lock(
                [&completed](std::exception_ptr, rlock::hold) { completed.fetch_add(1); });
        }
        // Posted after every waiter: when it completes, each has started (and is queued).
        rlock::hold p = probe.async_try_lock(rlock::use_future).get();
        const long long heap1 = live_bytes.load();
        const int threads1 = thread_count();
        p = rlock::hold();
        c.reset();
        state.counters["threads_added"] = threads1 - threads0;
        state.counters["heap_bytes_per_waiter"] = static_cast<double>(heap1 - heap0) / waiters;
        state.counters["completed_at_destruction"] = completed.load();
    }
    release_all(held);
}

void bm_renewal_losses(benchmark::State& state) {
    const int n = static_cast<int>(state.range(0));
    struct ticks : rlock::lock_listener {
        std::atomic<long> renewals{0};
        void renewed(const rlock::renewed_event&) override { ++renewals; }
    };
    for (auto _ : state) {
        std::atomic<long> lost{0};
        auto listener = std::make_shared<ticks>();
        rlock::client_options o = server->options();
        o.lock_watchdog_timeout = std::chrono::milliseconds(600);
        o.on_lock_lost = [&lost](std::string_view, const rlock::error&) { ++lost; };
        o.listener = listener;
        rlock::client c(o);
        auto locks = hold_many<rlock::mutex>(c, "bench:renew:" + std::to_string(n) + ":", n);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        state.counters["server_keys_tracked"] = static_cast<double>(info_field("stats", "tracking_total_keys"));
        release_all(locks);
        state.counters["lost"] = static_cast<double>(lost.load());
        state.counters["renewal_ticks"] = static_cast<double>(listener->renewals.load());
    }
}

}  // namespace

// hold_memory first: the client's RSS grows only while the process's heap does.
BENCHMARK(bm_hold_memory)->Name("hold_memory")->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_watchdog_tick)->Name("watchdog_tick")->Arg(1)->Arg(100)->Arg(10000)->Unit(benchmark::kMillisecond);
// Args: kind, other holds of the same client (the hot path must not depend on them).
BENCHMARK(bm_hot_path_allocs)
    ->Name("hot_path_allocs")
    ->Args({0, 0})
    ->Args({0, 10000})
    ->Args({1, 0})
    ->Args({1, 10000})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_renewal_losses)->Name("renewal_losses")->Arg(10000)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_async_waiters)->Name("async_waiters")->Arg(1)->Arg(1000)->Iterations(1)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
    rlock_test::redis_server s;
    server = &s;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
