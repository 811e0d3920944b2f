// Small helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rlock/rlock.hpp"
#include "support/redis_server.hpp"

extern char** environ;

namespace rlock_test {

using steady = std::chrono::steady_clock;

/// Polls `done` (a test may poll; the library may not) until true or `limit` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    const auto end = steady::now() + limit;
    while (steady::now() < end) {
        if (done()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done();
}

/// What ThreadSanitizer adds to a wait that rlock's engine thread delivers with an error. The
/// last reference to an asynchronous operation's exception is sometimes released on the engine
/// thread after the waiter has read it; libstdc++'s count is invisible to TSan, which reports a
/// race (tests/tsan.supp suppresses it) and, to match the suppression, first symbolizes the
/// stack on that thread: 0.4-0.8 s for this binary's debug info on a loaded 2-core machine,
/// seen by strace (fault_test's asynchronous pause test, 2026-11-29). Every wait of that client
/// waits behind it. Zero in other builds, whose bounds are the promise.
#if defined(__SANITIZE_THREAD__)
inline constexpr std::chrono::milliseconds tsan_symbolize_slack{1000};
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr std::chrono::milliseconds tsan_symbolize_slack{1000};
#else
inline constexpr std::chrono::milliseconds tsan_symbolize_slack{0};
#endif
#else
inline constexpr std::chrono::milliseconds tsan_symbolize_slack{0};
#endif

/// `d` in whole milliseconds, for messages.
inline long long millis(steady::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

/// The codes a call may end with when the server or the link to it fails.
inline bool connection_error(rlock::errc e) {
    return e == rlock::errc::connection_failed || e == rlock::errc::timeout;
}

/// The PUBSUB CHANNELS pattern of every lock's and synchronizer's channel: each names its key in
/// braces. A client's own subscription to `__redis__:invalidate` (losses told at once) does not
/// match: it lasts as long as the client.
inline constexpr const char* lock_channels = "*{*";

/// A lock name unique to the running test (and type parameter), followed by `suffix`.
inline std::string test_lock_name(const char* suffix = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string n = std::string(info->test_suite_name()) + "." + info->name();
    return n + suffix;
}
/// The same, for the test files' free functions (`name()`, `name("-b")`).
inline std::string name(const char* suffix = "") { return test_lock_name(suffix); }

/// Counts on_lock_lost calls; keeps the last reason.
struct lost_log {
    std::atomic<int> calls{0};
    std::atomic<int> code{0};
    std::string last_lock;
    std::string last_message;
    std::mutex mu;

    std::atomic<std::uint64_t> last_hold_id{0};
    std::atomic<std::uint64_t> last_fencing{0};

    /// The form told which hold was lost (lost_hold); the other keeps the two-argument form.
    rlock::lock_lost_handler hold_handler() {
        return [this](const rlock::lost_hold& hold, const rlock::error& why) {
            {
                std::lock_guard<std::mutex> g(mu);
                last_lock = std::string(hold.lock);
                last_message = why.what();
            }
            last_hold_id = hold.hold_id;
            last_fencing = hold.fencing_token;
            code = static_cast<int>(why.value());
            ++calls;
        };
    }

    rlock::lock_lost_handler handler() {
        return [this](std::string_view lock, const rlock::error& why) {
            {
                std::lock_guard<std::mutex> g(mu);
                last_lock = std::string(lock);
                last_message = why.what();
            }
            code = static_cast<int>(why.value());
            ++calls;
        };
    }
};

/// Starts `path args...` as a child process; returns its pid.
inline pid_t spawn(const std::vector<std::string>& argv_in) {
    std::vector<char*> argv;
    std::vector<std::string> copy = argv_in;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    return pid;
}

inline int wait_exit(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// What "Redis unchanged" compares, per key: its type, value (DUMP) and TTL.
struct key_state {
    std::string type, dump;
    long long pttl = 0;
};
using key_states = std::map<std::string, key_state>;

/// Every key of `s` with its state.

inline key_states snapshot(const redis_server& s) {
    key_states out;
    auto keys = s.cmd({"KEYS", "*"});
    for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string key(rlock::detail::reply_text(keys->element[i]));
        key_state& k = out[key];
        k.type = s.text({"TYPE", key});
        k.dump = s.text({"DUMP", key});
        k.pttl = s.integer({"PTTL", key});
    }
    return out;
}

/// Every key of `before` reads back the same in `after` (a positive TTL may have run down by up
/// to a second), and `after` has no key `before` lacks.
inline void expect_unchanged(const key_states& before, const key_states& after) {
    for (const auto& [key, was] : before) {
        auto it = after.find(key);
        if (it == after.end()) {
            ADD_FAILURE() << key << " was deleted";
            continue;
        }
        EXPECT_EQ(it->second.type, was.type) << key;
        EXPECT_TRUE(it->second.dump == was.dump) << key << " changed value";
        // The keys are set up with TTLs (10 min) far from any lease the call uses, so a PEXPIRE
        // shows; the second of slack is the time between the two snapshots.
        if (was.pttl < 0) {
            EXPECT_EQ(it->second.pttl, was.pttl) << key;
        } else {
            EXPECT_LE(it->second.pttl, was.pttl) << key;
            EXPECT_GT(it->second.pttl, was.pttl - 1000) << key << " expiry changed";
        }
    }
    for (const auto& [key, now] : after) {
        EXPECT_TRUE(before.count(key)) << key << " was created (type " << now.type << ")";
    }
}

/// A raw subscriber on its own connection, to see what the locks publish.
class raw_subscriber {
public:
    raw_subscriber(int port, const std::string& channel) : c_(redisConnect("127.0.0.1", port)) {
        rlock::detail::reply_ptr r = rlock::detail::command(c_.get(), {"SUBSCRIBE", channel});
        EXPECT_TRUE(r && r->type == REDIS_REPLY_ARRAY);
        timeval tv{5, 0};
        redisSetTimeout(c_.get(), tv);
    }
    /// The payload of the next message, or "" after 5 s.
    std::string next() {
        void* raw = nullptr;
        if (redisGetReply(c_.get(), &raw) != REDIS_OK) return "";
        rlock::detail::reply_ptr r(static_cast<redisReply*>(raw));
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 3) return "";
        return std::string(rlock::detail::reply_text(r->element[2]));
    }

private:
    rlock::detail::context_ptr c_;
};


/// A listener that counts the notices saying server-assisted loss detection is off.
struct detection_off_notices : rlock::lock_listener {
    std::atomic<int> off{0};
    void notice(const rlock::notice_event& e) override {
        if (std::string(e.message).find("detection is off") != std::string::npos) ++off;
    }
};

/// A listener (rlock::lock_listener) that keeps every event it is told, for tests to read.
struct event_log : rlock::lock_listener {
    struct entry {
        std::string type;  // "acquired", "released", "renewed", "renewal_refused", "lost", "wait_ended"
        std::string lock, kind;
        std::uint64_t hold_id = 0;
        std::chrono::nanoseconds wait{}, held{}, took{};
        unsigned tries = 0;
        bool local = false;      // acquired: handed_locally; released: handed_on
        bool cancelled = false;  // wait_ended
        std::size_t holds = 0;   // renewed
        int code = 0;            // lost, renewal_refused: the reason's errc
        std::string message;
    };

    void acquired(const rlock::acquired_event& e) override {
        entry x = make("acquired", std::string(e.lock), std::string(e.kind), e.hold_id);
        x.wait = e.wait;
        x.tries = e.tries;
        x.local = e.handed_locally;
        add(std::move(x));
    }
    void released(const rlock::released_event& e) override {
        entry x = make("released", std::string(e.lock), std::string(e.kind), e.hold_id);
        x.held = e.held;
        x.local = e.handed_on;
        add(std::move(x));
    }
    void renewed(const rlock::renewed_event& e) override {
        entry x = make("renewed", "", "", 0);
        x.holds = e.holds;
        x.took = e.took;
        x.message = std::string(e.server);
        add(std::move(x));
    }
    void renewal_refused(const rlock::renewal_refused_event& e) override {
        entry x = make("renewal_refused", std::string(e.lock), "", e.hold_id);
        x.code = static_cast<int>(e.reason.value());
        x.message = e.reason.what();
        add(std::move(x));
    }
    void lost(const rlock::lost_event& e) override {
        entry x = make("lost", std::string(e.lock), "", e.hold_id);
        x.code = static_cast<int>(e.reason.value());
        x.message = e.reason.what();
        add(std::move(x));
    }
    void wait_ended(const rlock::wait_ended_event& e) override {
        entry x = make("wait_ended", std::string(e.lock), std::string(e.kind), 0);
        x.wait = e.wait;
        x.tries = e.tries;
        x.cancelled = e.cancelled;
        add(std::move(x));
    }

    static entry make(const char* type, std::string lock, std::string kind, std::uint64_t hold_id) {
        entry x;
        x.type = type;
        x.lock = std::move(lock);
        x.kind = std::move(kind);
        x.hold_id = hold_id;
        return x;
    }

    /// The events of `type`, in the order told.
    std::vector<entry> of(const std::string& type) {
        std::lock_guard<std::mutex> g(mu);
        std::vector<entry> out;
        for (const entry& e : all) {
            if (e.type == type) out.push_back(e);
        }
        return out;
    }
    std::size_t count(const std::string& type) { return of(type).size(); }
    void clear() {
        std::lock_guard<std::mutex> g(mu);
        all.clear();
    }

    std::mutex mu;
    std::vector<entry> all;

private:
    void add(entry e) {
        std::lock_guard<std::mutex> g(mu);
        all.push_back(std::move(e));
    }
};

/// Every test starts with server() empty, as the typed fixtures' SetUp makes theirs: the plain
/// TESTs share it and name their keys after themselves, so their second pass in one process
/// (`--gtest_repeat=2`) found the first pass's keys and failed. ctest runs each test in a
/// process of its own, where server() starts empty anyway. A server a test left stopped or
/// paused is given up on after 1 s.
class empty_server_per_test : public ::testing::EmptyTestEventListener {
    void OnTestStart(const ::testing::TestInfo&) override {
        if (!started_server()) return;
        const timeval limit{1, 0};
        rlock::detail::context_ptr c(redisConnectWithTimeout("127.0.0.1", server().port(), limit));
        if (!c || c->err || redisSetTimeout(c.get(), limit) != REDIS_OK) return;
        (void)rlock::detail::command(c.get(), {"FLUSHALL"});
    }
};

inline const bool empty_server_per_test_added = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new empty_server_per_test);
    return true;
}();

}  // namespace rlock_test
