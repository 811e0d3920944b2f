// rlock::permit_expirable_semaphore — a semaphore whose permits have ids and leases, in
// Redisson's RPermitExpirableSemaphore layout.
//
//     rlock::client redis("redis://127.0.0.1:6380");
//     rlock::permit_expirable_semaphore slots(redis, "render-slots");
//     slots.try_set_permits(4);              // once, by whoever sets it up (no-op when set)
//     {
//         rlock::permit p = slots.acquire();  // blocks until a permit is free; watched
//         ...                                // at most 4 of these at once, across all clients
//     }                                      // released here (or p.release())
//     rlock::permit q = slots.try_acquire_for(2s, 30s);  // wait up to 2 s; a 30 s lease
//     if (q) { ... }
//
// In Redis: key `name` is a string holding the number of free permits (missing: 0); the sorted
// set `{name}:timeout` (`name:timeout` when the name has a '{') holds each taken permit: the
// id's 16 bytes as the member, the Unix millisecond at which its lease ends as the score.
// (Redisson before 3.17 stored the id's hex text: its ids and rlock's do not mix.) Whatever
// frees permits publishes on `redisson_sc:{name}`. The same layout and messages as
// Redisson's RPermitExpirableSemaphore, so rlock and Redisson share one semaphore, wake each
// other's waiters, and either can release a permit by the id the other gave out.
//
// A permit's lease is judged by the server's clock (TIME), one clock for every rlock client.
// A permit whose lease has ended is free again: the next acquire puts it back into the count
// (as Redisson's does), and available_permits() counts it as free already. So the permits of a holder that died come back when
// their lease ends, and a waiter wakes when the earliest lease ends, with no message.
//
// Beyond Redisson:
//   - A permit taken without a lease is watched: its lease is lock_watchdog_timeout, renewed
//     by the client's watchdog every third of it until it is released, like a watched lock's.
//     If the client dies, its permits come back within lock_watchdog_timeout. (Redisson's
//     permits without a lease never end; rlock counts them as taken and never reclaims them.)
//   - A permit found gone before its holder released it — its lease ran out, or another
//     client released or reclaimed it — is told to its owner: on_lock_lost (client_options),
//     once, and `lost()` on the permit.
//   - Releasing several ids is all or nothing: one unknown id and nothing is released
//     (Redisson released the others until its fix of #6343, after 3.35.0).
//   - available_permits() counts permits whose lease has ended as free, and writes nothing
//     (Redisson counted them as taken until a write put them back, #659; it now writes).
//   - A waiter for n permits is served once n are free, and never left waiting for a lease
//     that ended without a message.
//
// Failures: an acquire whose connection broke or timed out is sent again with the same ids
// (after a backoff, until the wait's deadline): if an earlier one ran, the
// next finds them taken and returns them. If the call throws in the end, it first releases
// those ids (the watchdog thread again while the server does not answer; at worst they come
// back with their lease). A
// release by a handle is retried like an unlock (it frees only its own ids); a release by id
// is not. Bad counts and leases throw invalid_argument with nothing sent; keys of another type
// throw wrong_type with Redis unchanged.
//
// Thread-safety: a semaphore object may be used by many threads at once; a permit, like a
// std::unique_lock, by one thread at a time (it may be moved to another thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/permit_kind.hpp"
#include "rlock/detail/protocol/synchronizer_scripts.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/waiting/synchronizer.hpp"
#include "rlock/errors.hpp"

namespace rlock {

/// Permits taken together from a permit_expirable_semaphore (one or several), released
/// together: by release(), or by the destructor, which never throws. Movable, not copyable,
/// like std::unique_lock. An empty permit (default-made, moved from, released, or what a
/// try_acquire that failed returns) owns nothing and is false.
class permit {
public:
    permit() = default;
    permit(permit&& other) noexcept = default;
    permit& operator=(permit&& other) noexcept;
    permit(const permit&) = delete;
    permit& operator=(const permit&) = delete;
    ~permit() { reset(); }

    /// True when this handle owns permits.
    [[nodiscard]] bool owns() const noexcept { return hold_ != nullptr; }
    explicit operator bool() const noexcept { return owns(); }

    /// The ids of the permits (Redisson's form: 32 lowercase hex digits each), as
    /// permit_expirable_semaphore::release(id) and Redisson's release(permitId) take them.
    [[nodiscard]] const std::vector<std::string>& ids() const noexcept { return ids_; }
    /// The first id (the only one for a single permit). Throws not_owner when empty.
    [[nodiscard]] const std::string& id() const;
    /// The semaphore's name.
    [[nodiscard]] const std::string& name() const noexcept { return keys_.name; }
    /// What on_lock_lost is told as lost_hold::hold_id when these permits are lost.
    [[nodiscard]] std::uint64_t hold_id() const noexcept { return hold_ ? hold_->id : 0; }

    /// True when these permits are known to be gone (the watchdog found them gone, a release
    /// found them gone), or their lease has ended by this client's clock. Final once true.
    /// Stays as it was at release() after release.
    [[nodiscard]] bool lost() const {
        if (!hold_) return lost_at_release_;
        return core_->reg.is_lost(*hold_);
    }

    /// Returns the permits and wakes the waiters; the handle is empty afterwards. Permits found
    /// gone, or a Redis that cannot be reached, do not throw: the owner is told through
    /// on_lock_lost (once), lost() says so, and any left in Redis come back when their lease
    /// ends. Throws `error` (not_owner) only for an empty handle.
    void release();

    /// Stops managing the permits without releasing them and returns their ids: they are no
    /// longer renewed, and stay taken in Redis until released by id or until their lease ends
    /// (a watched permit's within lock_watchdog_timeout).
    std::vector<std::string> detach();

private:
    friend class permit_expirable_semaphore;
    permit(std::shared_ptr<detail::client_core> core, detail::permit_keys keys,
           std::vector<std::string> ids, detail::registry::hold_ptr hold)
        : core_(std::move(core)), keys_(std::move(keys)), ids_(std::move(ids)), hold_(std::move(hold)) {}

    // Runs the release script: how many of the packed ids were still held. A broken
    // connection gets one more try on a new one; if that finds none held while the first try
    // most likely ran (it reached the same server process, as basic_lock::release judges by
    // run_id), the first try released them: all count as held.
    long long send_release(const std::string& packed);

    void reset() noexcept {
        if (!hold_) return;
        try {
            release();
        } catch (...) {  // release throws only for an empty handle (or bad_alloc)
        }
    }

    std::shared_ptr<detail::client_core> core_;
    detail::permit_keys keys_;
    std::vector<std::string> ids_;
    detail::registry::hold_ptr hold_;
    bool lost_at_release_ = false;
};

class permit_expirable_semaphore : public detail::synchronizer {
    using clock = std::chrono::steady_clock;

public:
    /// The most permits one call takes or releases.
    static constexpr long long max_permits_per_call = 1000;

    /// Names a semaphore on `c`; sends nothing. Throws `error` (invalid_argument) for an empty
    /// name, or (Redis Cluster) a name whose keys and channel would land in different slots.
    permit_expirable_semaphore(client& c, const std::string& name);

    /// Blocks until `permits` are free and takes them, watched: renewed by the client's
    /// watchdog until released.
    [[nodiscard]] permit acquire(long long permits = 1);
    /// As acquire(permits), with a lease: the permits come back by themselves after `lease`.
    template <class Rep, class Period>
    [[nodiscard]] permit acquire(const std::chrono::duration<Rep, Period>& lease, long long permits = 1) {
        return take_until(detail::call_forever(), checked(lease), permits);
    }

    /// One attempt, no waiting; watched permits, or an empty permit when not enough were free.
    [[nodiscard]] permit try_acquire(long long permits = 1) {
        return take_until(detail::call_no_wait(), detail::lease_request::watched(), permits);
    }
    /// Waits up to `wait` (steady_clock) for `permits`, watched; empty when not taken in time.
    template <class Rep, class Period>
    [[nodiscard]] permit try_acquire_for(const std::chrono::duration<Rep, Period>& wait, long long permits = 1) {
        return take_until(detail::call_for(wait), detail::lease_request::watched(), permits);
    }
    /// As try_acquire_for(wait, permits), with a lease.
    template <class Rep, class Period, class Rep2, class Period2>
    [[nodiscard]] permit try_acquire_for(const std::chrono::duration<Rep, Period>& wait,
                                         const std::chrono::duration<Rep2, Period2>& lease,
                                         long long permits = 1) {
        const auto l = checked(lease);
        return take_until(detail::call_for(wait), l, permits);
    }
    /// Waits until `deadline` (any clock; measured on steady_clock from now), watched.
    template <class Clock, class Duration>
    [[nodiscard]] permit try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                           long long permits = 1) {
        return take_until(detail::call_until(deadline), detail::lease_request::watched(), permits);
    }
    /// As try_acquire_until(deadline, permits), with a lease.
    template <class Clock, class Duration, class Rep, class Period>
    [[nodiscard]] permit try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                           const std::chrono::duration<Rep, Period>& lease,
                                           long long permits = 1) {
        const auto l = checked(lease);
        return take_until(detail::call_until(deadline), l, permits);
    }

    // --- asynchronous forms (docs/api.md, "Asynchronous acquisition") ---------------------
    // Each completes `void(std::exception_ptr, rlock::permit)` — the permits, or an empty
    // permit when the wait ran out — for a callback (the call returns an rlock::pending),
    // rlock::use_future (std::future<rlock::permit>) or, with <rlock/asio.hpp>, an Asio token.
    // They wait as acquire() does (release messages, the earliest lease's end), never inside
    // the call; a cancelled one (operation_aborted) or one that ran out takes nothing (an
    // attempt that may have run is released by its ids). Throws `error` (invalid_argument) for
    // bad permits or lease, from the call.

    /// Completes with `permits` (default 1) watched permits.
    template <class Token>
    auto async_acquire(Token&& token) {
        return async_take(detail::call_forever(), detail::lease_request::watched(), 1, std::forward<Token>(token));
    }
    template <class Token>
    auto async_acquire(long long permits, Token&& token) {
        return async_take(detail::call_forever(), detail::lease_request::watched(), permits,
                          std::forward<Token>(token));
    }
    /// Completes with `permits` leased for `lease`.
    template <class Rep, class Period, class Token>
    auto async_acquire(const std::chrono::duration<Rep, Period>& lease, long long permits, Token&& token) {
        return async_take(detail::call_forever(), checked(lease), permits, std::forward<Token>(token));
    }
    /// Waits up to `wait` for `permits` watched permits; an empty permit when not taken in time.
    template <class Rep, class Period, class Token>
    auto async_try_acquire_for(const std::chrono::duration<Rep, Period>& wait, long long permits, Token&& token) {
        return async_take(detail::call_for(wait), detail::lease_request::watched(), permits,
                          std::forward<Token>(token));
    }
    /// As async_try_acquire_for(wait, permits, token), leased for `lease`.
    template <class Rep, class Period, class Rep2, class Period2, class Token>
    auto async_try_acquire_for(const std::chrono::duration<Rep, Period>& wait,
                               const std::chrono::duration<Rep2, Period2>& lease, long long permits, Token&& token) {
        const auto l = checked(lease);
        return async_take(detail::call_for(wait), l, permits, std::forward<Token>(token));
    }
    /// Waits until `deadline` for `permits` watched permits.
    template <class Clock, class Duration, class Token>
    auto async_try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline, long long permits,
                                 Token&& token) {
        return async_take(detail::call_until(deadline), detail::lease_request::watched(), permits,
                          std::forward<Token>(token));
    }

    /// Releases the permit `id` (taken by any client, rlock or Redisson). Throws `error`
    /// (not_owner) when it is not taken with its lease running — released already, never
    /// taken, or its lease ended — with nothing written; invalid_argument for an id that is
    /// not even-length lowercase hex. A handle that owned it reports it lost at its release.
    void release(const std::string& id) { release(std::vector<std::string>{id}); }

    /// Releases every permit in `ids`, or none: when one is not taken with its lease running,
    /// throws `error` (not_owner, naming it) with nothing written. Throws invalid_argument for
    /// an empty list, a repeated id, more than max_permits_per_call, or a malformed id.
    void release(const std::vector<std::string>& ids);

    /// As release(id), but false instead of not_owner.
    bool try_release(const std::string& id) { return release_ids({id}) == 0; }

    /// Sets the lease of the permit `id` to end `lease` from now; false when it is not taken
    /// with its lease running (nothing written). For ids no handle of this client owns (a
    /// detached permit, another client's, Redisson's): throws invalid_argument for an id a
    /// handle of this client owns, which judges lost() by the lease it was taken with (a
    /// shorter lease in Redis would let another holder in while the handle says it holds).
    template <class Rep, class Period>
    bool update_lease_time(const std::string& id, const std::chrono::duration<Rep, Period>& lease) {
        const std::string ms = std::to_string(checked(lease).fixed_duration().count());
        const std::string raw = id_bytes(id);
        if (owned_by_a_handle(raw)) {
            throw error(errc::invalid_argument, name_, server(),
                        "permit " + id + " is owned by a permit handle of this client, which "
                        "judges lost() by its own lease: detach() it first");
        }
        return run(detail::on_break::retry, [&](const detail::connection& c) {
            return detail::eval_integer(c, detail::permit_scripts::update_lease(), {name_, timeouts_},
                                        {raw, ms}, name_, server()) == 1;
        });
    }

    /// Sets the number of free permits when the semaphore has none set yet (its key is
    /// absent); true when this call set it. `permits` must not be negative.
    bool try_set_permits(long long permits);

    /// Adds `permits` to the free ones (negative: removes them; the count may go below 0, as
    /// in Redisson) and wakes the waiters; returns the new free count (as stored: permits
    /// whose lease ended are put back by the next acquire).
    long long add_permits(long long permits) { return add_to_count(permits).now; }

    /// The free permits now, counting those whose lease has ended as free. Writes nothing.
    [[nodiscard]] long long available_permits() const { return counts().first; }
    /// The permits taken now with their lease running.
    [[nodiscard]] long long acquired_permits() const { return counts().second; }
    /// Free and taken together (Redisson's getPermits).
    [[nodiscard]] long long permits() const {
        const auto [free, taken] = counts();
        return free + taken;
    }

private:
    template <class Rep, class Period>
    detail::lease_request checked(const std::chrono::duration<Rep, Period>& lease) const {
        return detail::lease_request::fixed(detail::lease_ms(lease, name_, server()));
    }

    void check_permits(long long permits, std::string_view op) const;

    std::string id_bytes(const std::string& id) const;

    // True when a permit handle of this client owns the permit whose bytes are `raw`.
    bool owned_by_a_handle(const std::string& raw) const;

    // The two integers a script answered ({taken, wait} or {free, taken}).
    static std::pair<long long, long long> two_integers(const redisReply* r, std::string_view name,
                                                        std::string_view server);

    // {free, taken}: the count with the ended leases added (exactly; a sum beyond 64 bits is
    // the largest count), and the permits taken with their lease running.
    std::pair<long long, long long> counts() const;

    // 0 when every id was released; else the index (from 1) of the first not taken.
    long long release_ids(const std::vector<std::string>& ids);

    // One acquisition of `permits` under fresh ids: its attempts, the permit it makes, and its
    // undo. Owns what it uses, so an asynchronous acquire can outlive the semaphore object.
    struct taking {
        std::shared_ptr<detail::client_core> core;
        detail::permit_keys keys;
        std::string n, ms, packed;
        std::chrono::milliseconds term;
        bool watched;
        // Set while the ids may have been taken (undo() then releases them): the start of the
        // first attempt since the last one answered "not taken" (an attempt that failed may
        // have run).
        clock::time_point sent{};
        // When the lease of the ids began, by this client's clock (no later than the script
        // that took them ran): what the hold is judged by.
        clock::time_point taken_at{};
        // The last attempt got no reply in time (a paused or hung server): undo() does not
        // wait for one more.
        bool timed_out = false;
        // For the client's listener (events.hpp): when the acquisition began, its tries.
        detail::wait_story story{};

        const std::string& server() const { return core->ep.name; }
        const char* event_kind() const noexcept { return detail::permit_kind::info.name; }
        unsigned tries() const noexcept { return story.tries; }

        // One attempt; `again` is when the earliest lease ends when not taken. An attempt that
        // failed ambiguously (the connection broke) is made again by the wait with the same
        // ids: if the first ran, the next finds them taken and says so. One the server did not
        // answer in time (paused, hung) is undone on its own connection instead, by a release
        // of its ids written after it (the server runs both, in order, when it runs again; a
        // release on another connection could run first and find nothing), and the next
        // attempt takes new ids: nothing of it is left for undo(), which a client being
        // destroyed could not send to a server that does not answer.
        detail::attempt_result attempt();

        // The permit of an acquisition that is done: its hold recorded (renewed when watched).
        permit finish();

        // Giving up after an attempt that may have run: its permits would stay taken for their
        // whole lease with no handle to release them. Released here once, and by the watchdog
        // thread while the server does not answer: the script frees only these ids, so it is
        // safe whatever happened.
        void undo() noexcept;
    };

    // `began`: when the call began (its story's start, for the listener).
    taking prepare(detail::lease_request lease, long long permits, clock::time_point began) const;

    permit take_until(detail::wait_call call, detail::lease_request lease, long long permits);

    template <class Token>
    auto async_take(detail::wait_call call, detail::lease_request lease, long long permits, Token&& token) {
        return synchronizer::async_wait_until<permit>(call, detail::repeat::safe, prepare(lease, permits, call.began),
                                                      std::forward<Token>(token));
    }

    std::string timeouts_;
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL permit& permit::operator=(permit&& other) noexcept {
    if (this != &other) {
        reset();
        core_ = std::move(other.core_);
        keys_ = std::move(other.keys_);
        ids_ = std::move(other.ids_);
        hold_ = std::move(other.hold_);
        lost_at_release_ = other.lost_at_release_;
    }
    return *this;
}

RLOCK_DECL const std::string& permit::id() const {
    if (ids_.empty()) {
        throw error(errc::not_owner, keys_.name, core_ ? core_->ep.name : std::string(),
                    "this permit handle holds no permits");
    }
    return ids_.front();
}

RLOCK_DECL void permit::release() {
    if (!hold_) {
        throw error(errc::not_owner, keys_.name, core_ ? core_->ep.name : std::string(),
                    "this permit handle holds no permits");
    }
    const detail::registry::hold_ptr h = std::move(hold_);
    detail::registry& reg = core_->reg;
    reg.remove(h);  // no renewal of it reaches Redis after this
    // Told when it returns, after any loss it finds.
    struct tell_released {
        const detail::client_core& core;
        const detail::hold& h;
        ~tell_released() { core.events.released(h.kind->name, h.name, h.id, h.taken); }
    } told{*core_, *h};
    lost_at_release_ = reg.is_lost(*h);  // a lease that ended before release stays lost
    const auto packed = static_cast<long long>(ids_.size());
    ids_.clear();
    long long kept = 0;
    try {
        // Sent after the client is destroyed too, as a lock hold's unlock is: the permits
        // are free at once, not at the end of their lease.
        kept = send_release(h->value);
    } catch (const error& e) {
        lost_at_release_ = true;
        reg.report(*h, e);
        return;
    }
    if (kept < packed && !reg.ended_by_lease(*h)) {
        lost_at_release_ = true;  // before the owner is told: a handler that asks sees it
        reg.report(*h, error(errc::lock_lost, keys_.name, core_->ep.name,
                             "at release " + std::to_string(packed - kept) + " of " +
                                 std::to_string(packed) +
                                 " permits were no longer held (lease ended, or released or "
                                 "reclaimed by another client)"));
    } else if (reg.claim_untold_loss(*h)) {
        // All still there, but lost() has said lost (the lease ran out by this client's
        // clock before a renewal came back): the verdict stands, told once.
        reg.tell_hold(*h, error(errc::lock_lost, keys_.name, core_->ep.name,
                                "the lease ran out before the watchdog could renew it"));
    }
}

RLOCK_DECL std::vector<std::string> permit::detach() {
    if (hold_) core_->reg.remove(hold_);
    hold_.reset();
    return std::exchange(ids_, {});
}

RLOCK_DECL long long permit::send_release(const std::string& packed) {
    const auto [kept, first_did_it] = detail::run_release(
        core_->pool, keys_.name, detail::on_break::retry, [&](const detail::connection& c) {
            return detail::eval_integer(c, detail::permit_scripts::release_packed(),
                                        {keys_.name, keys_.timeouts}, {keys_.channel, packed},
                                        keys_.name, core_->ep.name);
        });
    return kept == 0 && first_did_it ? static_cast<long long>(packed.size() / 16) : kept;
}

RLOCK_DECL permit_expirable_semaphore::permit_expirable_semaphore(client& c,
                                                                  const std::string& name)
    : synchronizer(detail::client_access::core(c), name, detail::prefixed_key("redisson_sc", name),
                   "permit_expirable_semaphore"),
      timeouts_(name.find('{') != std::string::npos ? name + ":timeout"
                                                    : "{" + name + "}:timeout") {
    if (core_->ep.slots && detail::key_slot(name_) != detail::key_slot(timeouts_)) {
        throw error(errc::invalid_argument, name_, server(),
                    "in a cluster this name puts its key and " + timeouts_ +
                        " in different slots (a name with '{' needs a non-empty hash tag)");
    }
}

RLOCK_DECL permit permit_expirable_semaphore::acquire(long long permits) {
    return take_until(detail::call_forever(), detail::lease_request::watched(), permits);
}

RLOCK_DECL void permit_expirable_semaphore::release(const std::vector<std::string>& ids) {
    const long long first_missing = release_ids(ids);
    if (first_missing != 0) {
        throw error(errc::not_owner, name_, server(),
                    "permit " + ids[static_cast<std::size_t>(first_missing - 1)] +
                        " is not taken (released already, never taken, or its lease ended); "
                        "nothing was released");
    }
}

RLOCK_DECL bool permit_expirable_semaphore::try_set_permits(long long permits) {
    if (permits < 0) bad_count(permits, "try_set_permits: permits must not be negative");
    return set_count_if_absent(permits, {});
}

RLOCK_DECL void permit_expirable_semaphore::check_permits(long long permits,
                                                          std::string_view op) const {
    if (permits < 1 || permits > max_permits_per_call) {
        bad_count(permits, std::string(op) + ": permits must be from 1 to " +
                               std::to_string(max_permits_per_call));
    }
}

RLOCK_DECL std::string permit_expirable_semaphore::id_bytes(const std::string& id) const {
    std::string raw;
    if (!detail::permit_id_bytes(id, raw)) {
        throw error(errc::invalid_argument, name_, server(),
                    "\"" + id.substr(0, 40) + "\" is not a permit id (lowercase hex, even length)");
    }
    return raw;
}

RLOCK_DECL bool permit_expirable_semaphore::owned_by_a_handle(const std::string& raw) const {
    // A handle's value packs its ids of 16 bytes each: only an id of that size can be one of
    // them (a shorter one matching the start of one is another permit).
    if (raw.size() != 16) return false;
    return core_->reg.any_hold([&](const detail::hold& h) {
        if (h.kind != &detail::permit_kind::info || h.name != name_) return false;
        for (std::size_t at = 0; at + raw.size() <= h.value.size(); at += 16) {
            if (h.value.compare(at, raw.size(), raw) == 0) return true;
        }
        return false;
    });
}

RLOCK_DECL std::pair<long long, long long> permit_expirable_semaphore::two_integers(
    const redisReply* r, std::string_view name, std::string_view server) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        throw error(errc::server_error, name, server, "unexpected reply from a permit script");
    }
    return {r->element[0]->integer, r->element[1]->integer};
}

RLOCK_DECL std::pair<long long, long long> permit_expirable_semaphore::counts() const {
    return run(detail::on_break::retry, [&](const detail::connection& c) {
        detail::script_call call(detail::permit_scripts::counts(), {name_, timeouts_}, {});
        const detail::reply_ptr r = detail::run_script(c, call, name_, server());
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
            r->element[1]->type != REDIS_REPLY_INTEGER ||
            r->element[2]->type != REDIS_REPLY_INTEGER) {
            if (r->type == REDIS_REPLY_ERROR) (void)detail::count_from(r.get(), name_, server());
            throw error(errc::server_error, name_, server(),
                        "unexpected reply from a permit script");
        }
        const long long have = detail::count_from(r->element[0], name_, server());
        const long long ended = r->element[1]->integer;  // >= 0
        constexpr long long most = std::numeric_limits<long long>::max();
        const long long free = have > most - ended ? most : have + ended;
        return std::pair<long long, long long>{free, r->element[2]->integer};
    });
}

RLOCK_DECL long long permit_expirable_semaphore::release_ids(const std::vector<std::string>& ids) {
    check_permits(static_cast<long long>(ids.size()), "release");
    std::vector<std::string> raw;
    raw.reserve(ids.size());
    for (const std::string& id : ids) raw.push_back(id_bytes(id));
    std::vector<std::string> sorted = raw;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        throw error(errc::invalid_argument, name_, server(), "release: an id is repeated");
    }
    return run(detail::on_break::fail, [&](const detail::connection& c) {
        detail::script_call call;
        call.start(detail::permit_scripts::release_ids(), 2);
        call.push(name_);
        call.push(timeouts_);
        call.push(channel_);
        for (const std::string& r : raw) call.push(r);
        return detail::reply_integer(detail::run_script(c, call, name_, server()).get(), name_,
                                     server());
    });
}

RLOCK_DECL detail::attempt_result permit_expirable_semaphore::taking::attempt() {
    ++story.tries;
    // Nothing would renew or release permits taken through a destroyed client.
    core->throw_if_destroyed(keys.name, "the client this semaphore was made from has been destroyed");
    const clock::time_point before = sent;
    const clock::time_point start = clock::now();
    timed_out = false;
    if (sent == clock::time_point{}) sent = start;
    clock::time_point again = clock::time_point::max();
    bool taken = false;
    long long left = -1;  // ms of lease the ids had left when an earlier try had taken them
    bool asked = false;  // a connection was had: the script may have been sent
    bool undone_after = false;  // a release of the ids was written after the unanswered try
    try {
        // Once: the wait makes an attempt that failed in an outage again, with the same ids.
        taken = core->pool.run(keys.name, detail::on_break::fail, [&](const detail::connection& c) {
            asked = true;
            detail::script_call call;
            call.start(detail::permit_scripts::acquire(), 2);
            call.push(keys.name);
            call.push(keys.timeouts);
            call.push(n);
            call.push(ms);
            call.push(keys.channel);
            for (std::size_t at = 0; at < packed.size(); at += 16) {
                call.push(std::string_view(packed).substr(at, 16));
            }
            detail::reply_ptr r;
            try {
                r = detail::run_script(c, call, keys.name, server());
            } catch (const error& e) {
                if (e.value() == errc::timeout) {
                    detail::script_call release(detail::permit_scripts::release_packed(),
                                                {keys.name, keys.timeouts}, {keys.channel, packed});
                    undone_after = detail::write_after(c, release);
                }
                throw;
            }
            const auto [got, wait_ms] = two_integers(r.get(), keys.name, server());
            if (got == 1) return true;
            if (got == 2) {
                left = wait_ms;
                return true;
            }
            again = wait_ms < 0 ? clock::time_point::max()
                                : clock::now() + std::chrono::milliseconds(wait_ms + 1);
            return false;
        });
    } catch (const error& e) {
        timed_out = e.value() == errc::timeout;
        if (undone_after) {
            // Released after it on its connection. An earlier try that may have run with
            // these ids (a connection broke) is covered too: the release frees them all.
            // New ids for the next try; none is owed an undo.
            detail::random_bytes(reinterpret_cast<unsigned char*>(packed.data()), packed.size());
            sent = {};
            timed_out = false;
            throw detail::error_access::undone(e);
        }
        // Not sent (no connection could be had: a restart, say): it cannot have run, so the
        // lease of the ids begins no earlier than a later try. Kept at an earlier one, or at
        // this one once it had a connection: they may have run.
        if (!asked) sent = before;
        throw;
    }
    if (taken) {
        // The lease runs from the script that took the ids: this try's, sent after `start`;
        // or an earlier one's, whose reply was lost (a try that timed out while the server was
        // paused may run when it resumes, long after it was sent), with `left` ms to run.
        taken_at = left < 0 ? start : start + std::chrono::milliseconds(left) - term;
        return true;
    }
    sent = {};
    return {false, again};
}

RLOCK_DECL permit permit_expirable_semaphore::taking::finish() {
    std::vector<std::string> ids;
    for (std::size_t at = 0; at < packed.size(); at += 16) {
        ids.push_back(detail::hex(std::string_view(packed).substr(at, 16)));
    }
    detail::registry::hold_ptr hold = core->add_handle_hold(
        detail::permit_kind::info, keys.name, keys.timeouts, packed,
        detail::hold_terms{term, watched ? detail::renewal::watched : detail::renewal::leased,
                           taken_at});
    core->events.acquired(event_kind(), keys.name, hold->id, story);
    return permit(core, keys, std::move(ids), std::move(hold));
}

RLOCK_DECL void permit_expirable_semaphore::taking::undo() noexcept {
    if (sent == clock::time_point{}) return;
    // Once, then (the server not answering) by the watchdog thread until it does or the lease
    // has ended them anyway; straight to it when the last attempt timed out: the caller, whose
    // wait is over, does not wait for a server that did not answer.
    try {
        auto release = [core = core.get(), keys = keys, packed = packed] {
            (void)core->pool.run(keys.name, detail::on_break::fail,
                                 [&](const detail::connection& c) {
                                     return detail::eval_integer(
                                         c, detail::permit_scripts::release_packed(),
                                         {keys.name, keys.timeouts}, {keys.channel, packed},
                                         keys.name, core->ep.name);
                                 });
        };
        if (!timed_out) {
            try {
                release();
                return;
            } catch (const error& e) {
                if (!detail::is_ambiguous(e)) return;
            }
        }
        core->defer_undo(keys.name + '\n' + detail::hex(packed), release, clock::now() + term);
    } catch (...) {  // unreachable still, or out of memory: the lease ends them
    }
}

RLOCK_DECL auto permit_expirable_semaphore::prepare(detail::lease_request lease, long long permits,
                                                    clock::time_point began) const -> taking {
    check_permits(permits, "acquire");
    const bool watched = lease.is_watched();
    const std::chrono::milliseconds term = lease.duration(core_->ep.options.lock_watchdog_timeout);
    std::string packed(static_cast<std::size_t>(permits) * 16, '\0');
    detail::random_bytes(reinterpret_cast<unsigned char*>(packed.data()), packed.size());
    taking t{core_,
             detail::permit_keys{name_, timeouts_, channel_},
             std::to_string(permits),
             std::to_string(term.count()),
             std::move(packed),
             term,
             watched};
    t.story = core_->events.begin(began);
    return t;
}

RLOCK_DECL permit permit_expirable_semaphore::take_until(detail::wait_call call,
                                                         detail::lease_request lease,
                                                         long long permits) {
    taking t = prepare(lease, permits, call.began);
    bool got = false;
    try {
        got = wait_until(call.deadline, detail::repeat::safe, [&] { return t.attempt(); });
    } catch (const error& e) {
        if (detail::is_ambiguous(e)) t.undo();
        throw;
    }
    if (!got) {
        core_->events.wait_ended(t.event_kind(), name_, t.story, /*cancelled=*/false);
        return {};
    }
    return t.finish();
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
