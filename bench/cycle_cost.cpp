// The client's cost of one uncontended lock + unlock, in the two measures that do not depend on
// how busy the machine is: heap allocations (counted here, by this program's operator new) and
// instructions (counted by callgrind, which runs this program; see scripts/cycle-cost).
//
//   cycle_cost --kind K [--cycles N]   N cycles (default 2000) of kind K after 200 warm ones;
//                                      prints "K cycles=N allocs_per_cycle=A"
//   cycle_cost --check                 every kind; exits 1 when one allocates more per cycle
//                                      than its budget (issue 21: mutex 6, reentrant_lock 8)
//
// K: floor (hand-written hiredis: a random token, SET key token NX PX, EVALSHA compare-and-
// delete, sent with redisCommandArgv), floor-own-format (the same, its commands formatted as
// rlock formats them), mutex, reentrant, read, write (the two sides of a read_write_lock), fair;
// a lock kind with "+events" (mutex+events) runs with a listener set (client_options::listener)
// that counts what it is told: the kind alone is the cost without one.
// The measured cycles run inside measured_cycles(), which callgrind is told to count alone
// (--toggle-collect), so start-up, the server and the warm-up stay out of the count.
#include <hiredis/hiredis.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <string_view>

#include "arguments.hpp"
#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

namespace {

std::atomic<long long> allocations{0};

}  // namespace

// Every allocation of this program: rlock is header-only, so its allocations are here. hiredis
// allocates with malloc, which is not counted (it is the floor's cost too). Not inlined, as in
// footprint.cpp: GCC would pair malloc with an inlined delete's free and warn.
[[gnu::noinline]] void* operator new(std::size_t n) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

const char* const synopsis =
    "--kind floor|floor-own-format|mutex|reentrant|read|write|fair[+events][+nohandoff] [--cycles N] | --check";

[[noreturn]] void usage(const char* why) { bench::usage_exit("cycle_cost", synopsis, why); }

/// The floor: what a careful hand-written client does per cycle with hiredis alone.
class floor_lock {
public:
    /// `own_format`: the commands formatted as rlock formats them (detail::append_command)
    /// instead of by redisCommandArgv: the floor for what rlock adds beyond formatting.
    floor_lock(int port, bool own_format) : c_(redisConnect("127.0.0.1", port)), own_format_(own_format) {
        if (!c_ || c_->err) {
            std::fprintf(stderr, "cycle_cost: cannot connect\n");
            std::exit(1);
        }
        const char* load[3] = {"SCRIPT", "LOAD",
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"};
        auto* r = static_cast<redisReply*>(redisCommandArgv(c_.get(), 3, load, nullptr));
        if (!r || r->type != REDIS_REPLY_STRING) {
            std::fprintf(stderr, "cycle_cost: SCRIPT LOAD failed\n");
            std::exit(1);
        }
        sha_.assign(r->str, r->len);
        freeReplyObject(r);
    }
    void lock() {
        static constexpr char hex[] = "0123456789abcdef";
        for (int half = 0; half < 2; ++half) {
            std::uint64_t bits = random_();
            for (int i = 0; i < 16; ++i, bits >>= 4) token_[half * 16 + i] = hex[bits & 15];
        }
        const char* argv[6] = {"SET", "cycle:floor", token_, "NX", "PX", "30000"};
        const std::size_t lens[6] = {3, 11, 32, 2, 2, 5};
        expect(send(6, argv, lens), REDIS_REPLY_STATUS);
    }
    void unlock() {
        const char* argv[5] = {"EVALSHA", sha_.c_str(), "1", "cycle:floor", token_};
        const std::size_t lens[5] = {7, sha_.size(), 1, 11, 32};
        expect(send(5, argv, lens), REDIS_REPLY_INTEGER);
    }

private:
    void* send(int argc, const char** argv, const std::size_t* lens) {
        if (!own_format_) return redisCommandArgv(c_.get(), argc, argv, lens);
        void* raw = nullptr;
        if (rlock::detail::append_command(c_.get(), argc, argv, lens) != REDIS_OK ||
            redisGetReply(c_.get(), &raw) != REDIS_OK) {
            return nullptr;
        }
        return raw;
    }
    static void expect(void* raw, int type) {
        auto* r = static_cast<redisReply*>(raw);
        const bool ok = r && r->type == type;
        freeReplyObject(r);
        if (!ok) {
            std::fprintf(stderr, "cycle_cost: the floor's cycle failed\n");
            std::exit(1);
        }
    }

    rlock::detail::context_ptr c_;
    bool own_format_;
    std::string sha_;
    std::mt19937_64 random_{std::random_device{}()};
    char token_[33] = {};
};

template <class Lock>
struct exclusive {
    Lock& l;
    void lock() { l.lock(); }
    void unlock() { l.unlock(); }
};

struct shared {
    rlock::read_write_lock& l;
    void lock() { l.lock_shared(); }
    void unlock() { l.unlock_shared(); }
};

/// The cycles callgrind counts (scripts/cycle-cost names this function).
template <class Cycle>
[[gnu::noinline]] void measured_cycles(Cycle& c, int n) {
    for (int i = 0; i < n; ++i) {
        c.lock();
        c.unlock();
    }
}

/// Runs 200 warm cycles, then `n` counted ones; returns allocations per counted cycle.
template <class Cycle>
double run(Cycle c, int n) {
    for (int i = 0; i < 200; ++i) {  // connections, scripts loaded, registry buckets
        c.lock();
        c.unlock();
    }
    const long long before = allocations.load();
    measured_cycles(c, n);
    return static_cast<double>(allocations.load() - before) / n;
}

/// A listener that counts what it is told (kind "<kind>+events": the cost of events with one).
struct counting_listener : rlock::lock_listener {
    std::atomic<long long> told{0};
    void acquired(const rlock::acquired_event& e) override { told += e.tries; }
    void released(const rlock::released_event& e) override { told += e.held.count() > 0 ? 1 : 0; }
};

double cycle(std::string_view kind, rlock_test::redis_server& server, int n) {
    if (kind == "floor" || kind == "floor-own-format") return run(floor_lock(server.port(), kind != "floor"), n);
    rlock::client_options options = server.options();
    // Suffixes, in any order: +events (a listener set), +nohandoff (the local hand-off off).
    const auto strip = [&kind](std::string_view suffix) {
        if (kind.size() <= suffix.size() || kind.substr(kind.size() - suffix.size()) != suffix) return false;
        kind.remove_suffix(suffix.size());
        return true;
    };
    for (bool more = true; more;) {
        more = false;
        if (strip("+events")) {
            options.listener = std::make_shared<counting_listener>();
            more = true;
        }
        if (strip("+nohandoff")) {
            options.local_handoff_passes = 0;
            more = true;
        }
    }
    rlock::client c(options);
    const std::string name = "cycle:" + std::string(kind);
    if (kind == "mutex") {
        rlock::mutex l(c, name);
        return run(exclusive<rlock::mutex>{l}, n);
    }
    if (kind == "reentrant") {
        rlock::reentrant_lock l(c, name);
        return run(exclusive<rlock::reentrant_lock>{l}, n);
    }
    if (kind == "read" || kind == "write") {
        rlock::read_write_lock l(c, name);
        return kind == "read" ? run(shared{l}, n) : run(exclusive<rlock::read_write_lock>{l}, n);
    }
    if (kind == "fair") {
        rlock::fair_lock l(c, name);
        return run(exclusive<rlock::fair_lock>{l}, n);
    }
    usage(("unknown kind " + std::string(kind)).c_str());
}

}  // namespace

int main(int argc, char** argv) {
    std::string kind;
    int cycles = 2000;
    bool check = false;
    bench::arguments args(argc, argv, usage);
    while (args.next()) {
        if (args.name() == "--kind") {
            kind = args.value();
        } else if (args.name() == "--cycles") {
            cycles = static_cast<int>(args.number(1));
        } else if (args.name() == "--check") {
            check = true;
        } else {
            args.unknown();
        }
    }
    if (kind.empty() == !check) usage("give --kind or --check");
    rlock_test::redis_server server;
    if (!check) {
        std::printf("%s cycles=%d allocs_per_cycle=%.2f\n", kind.c_str(), cycles, cycle(kind, server, cycles));
        return 0;
    }
    struct budget {
        const char* kind;
        double most;  // 0: no budget, printed only
    };
    int over = 0;
    for (const budget& b : {budget{"floor", 0}, budget{"mutex", 6}, budget{"reentrant", 8}, budget{"read", 0},
                            budget{"write", 0}, budget{"fair", 0}}) {
        const double a = cycle(b.kind, server, 500);
        const bool bad = b.most > 0 && a > b.most;
        over += bad;
        std::printf("%-10s allocs_per_cycle=%.2f%s\n", b.kind, a,
                    b.most > 0 ? (bad ? "  OVER its budget" : "  within its budget") : "");
    }
    return over ? 1 : 0;
}
