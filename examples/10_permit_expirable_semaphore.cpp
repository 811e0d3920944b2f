// 10 — rlock::permit_expirable_semaphore: permits with ids and leases, which come back when
// their holder is gone.
//
//     10_permit_expirable_semaphore <redis uri>
//
// Two services (two clients) share the semaphore "demo-render-slots" of 2 permits:
//   1. A holds a watched permit for a scope: the watchdog renews its lease (1.5 s here) while
//      the scope runs, and the permit handle (rlock::permit) releases it at the scope's end;
//   2. A takes both permits with try_acquire_for(wait, lease) and leaves them (detach(), as a
//      process that died would): B, waiting, gets a permit when the lease ends, with no release
//      message to wake it;
//   3. A detaches a permit and hands its id over; B releases it by that id (Redisson's
//      release(permitId) takes the same ids); the same id a second time is refused;
//   4. B releases a permit A still holds (an operator breaking a stuck holder): A's watchdog
//      finds it gone, on_lock_lost is told once, and lost() turns true.
// At the end both permits are free again.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rlock/rlock.hpp>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

long long ms_since(clock_type::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t).count();
}

/// What on_lock_lost reported.
struct loss_log {
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;
    std::uint64_t hold_id = 0;
    rlock::errc code{};
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    const std::string name = "demo-render-slots";
    try {
        loss_log losses;
        rlock::client_options options = rlock::client_options::from_uri(argv[1]);
        options.lock_watchdog_timeout = 1500ms;  // short, so the example is quick
        // Runs on the watchdog thread: record and return, never throw.
        options.on_lock_lost = [&losses](const rlock::lost_hold& hold, const rlock::error& reason) {
            std::printf("       on_lock_lost(\"%.*s\", hold %llu): %s\n",
                        static_cast<int>(hold.lock.size()), hold.lock.data(),
                        static_cast<unsigned long long>(hold.hold_id), reason.what());
            std::lock_guard<std::mutex> g(losses.mu);
            ++losses.calls;
            losses.hold_id = hold.hold_id;
            losses.code = reason.value();
            losses.cv.notify_all();
        };
        rlock::client service_a(options);
        rlock::client service_b(argv[1]);
        rlock::permit_expirable_semaphore slots_a(service_a, name), slots_b(service_b, name);
        if (slots_a.try_set_permits(2)) {
            std::printf("set %s to 2 permits\n", name.c_str());
        } else if (slots_a.available_permits() != 2) {
            std::fprintf(stderr, "%s is in use (%lld free)\n", name.c_str(),
                         slots_a.available_permits());
            return 1;
        }
        bool ok = true;

        std::printf("1. A holds a watched permit for a scope\n");
        {
            rlock::permit p = slots_a.acquire();
            std::printf("       permit %s\n", p.id().c_str());
            std::this_thread::sleep_for(2s);
            ok &= expect(!p.lost() && slots_b.acquired_permits() == 1,
                         "2 s later (lease 1.5 s) it is still taken: the watchdog renewed it");
        }
        ok &= expect(slots_b.available_permits() == 2, "the scope's end released it");

        std::printf("2. A takes both permits with a 700 ms lease and leaves them\n");
        const auto taken = clock_type::now();
        rlock::permit leased = slots_a.try_acquire_for(1s, 700ms, 2);
        ok &= expect(leased && leased.ids().size() == 2, "try_acquire_for(1s, 700ms, 2) took both");
        for (const std::string& id : leased.detach()) std::printf("       permit %s\n", id.c_str());
        {
            rlock::permit got = slots_b.try_acquire_for(5s);
            const long long after = ms_since(taken);
            std::printf("       B got a permit %lld ms after A took them\n", after);
            ok &= expect(got && after >= 600, "B's waiter got one when the lease ended, no sooner");
        }

        std::printf("3. A hands a permit's id over; B releases it by the id\n");
        std::string id;
        {
            rlock::permit p = slots_a.acquire();
            id = p.detach().front();  // p no longer owns it: its end releases nothing
        }
        ok &= expect(slots_b.acquired_permits() == 1, "the detached permit stays taken");
        slots_b.release(id);
        ok &= expect(slots_b.available_permits() == 2, "B's release(id) returned it");
        ok &= expect(!slots_b.try_release(id), "the same id again is refused (try_release: false)");

        std::printf("4. B releases a permit A still holds\n");
        rlock::permit held = slots_a.acquire();
        slots_b.release(held.id());
        {
            std::unique_lock<std::mutex> g(losses.mu);
            losses.cv.wait_for(g, 5s, [&] { return losses.calls > 0; });
            ok &= expect(losses.calls == 1 && losses.code == rlock::errc::lock_lost &&
                             losses.hold_id == held.hold_id(),
                         "A's watchdog found it gone: on_lock_lost told once, with its hold_id");
        }
        ok &= expect(held.lost(), "held.lost() is true");
        held.release();  // no throw, frees nothing: the permit was returned already
        {
            std::lock_guard<std::mutex> g(losses.mu);
            ok &= expect(losses.calls == 1, "the release did not tell it again");
        }
        ok &= expect(slots_b.available_permits() == 2 && slots_b.acquired_permits() == 0,
                     "both permits are free");
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
