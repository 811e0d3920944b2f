// rlock::multi_lock — several locks held as one, all or nothing.
//
//     rlock::mutex a(redis, "account:1"), b(redis, "account:2");
//     rlock::multi_lock both{a, b};
//     std::lock_guard<rlock::multi_lock> guard(both);   // both, or (while waiting) neither
//
// Parts may be any rlock locks (mutex, reentrant_lock, fair_lock, read_write_lock's write side,
// red_lock), on one client or several. TimedLockable, with the lease overloads.
//
// All or nothing: if a part cannot be had within the wait, every part already taken is released
// before the call returns, and refused() names the part that refused.
//
// No deadlock: parts are taken in one canonical order (by server, then name), and the call
// never waits for a part while holding another — as std::lock: it waits for the part that
// refused on its own, then tries the others without waiting, and on a refusal releases all
// and starts over from the refusing part. Two multi_locks naming the same locks in different
// orders therefore both finish.
//
// One node, one round trip: when every part is a mutex or reentrant_lock of the same client
// (and none uses fencing or is already held by this thread), acquire and release each run as
// one atomic script on that node.
//
// Watched parts are renewed in their clients' watchdog batches; losing any part marks the
// whole multi_lock lost (lost()) and tells the owner once (the first part's on_lock_lost),
// under multi_lock::hold_id(). A red_lock part is told as its own red_lock.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "rlock/client.hpp"
#include "rlock/detail/async_lock.hpp"
#include "rlock/detail/basic_lock.hpp"
#include "rlock/detail/fair_kind.hpp"
#include "rlock/detail/lua_checks.hpp"
#include "rlock/detail/mutex_kind.hpp"
#include "rlock/detail/reentrant_kind.hpp"
#include "rlock/detail/timed_lockable.hpp"
#include "rlock/errors.hpp"
#include "rlock/mutex.hpp"
#include "rlock/reentrant_lock.hpp"

namespace rlock {

namespace detail {

/// Take every part or none. KEYS[i] lock keys; ARGV[1] lease ms, then per part i
/// ARGV[2i] kind ('m' mutex, 'r' reentrant_lock) and ARGV[2i+1] its value (token or holder id).
/// Returns {1} when all were taken, {0, i, PTTL} when part i is held (nothing is changed).
/// Each part is taken by its kind's own step (mutex_kind / reentrant_kind::lua_take).
inline const script& multi_acquire_script() {
    static const script s(std::string(mutex_kind::lua_take) + std::string(reentrant_kind::lua_take) + R"lua(
for i = 1, #KEYS do
    if redis.call('exists', KEYS[i]) == 1 then
        return {0, i, redis.call('pttl', KEYS[i])}
    end
end
for i = 1, #KEYS do
    if ARGV[2 * i] == 'm' then
        mutex_take(KEYS[i], ARGV[2 * i + 1], ARGV[1])
    else
        reentrant_take(KEYS[i], ARGV[2 * i + 1], ARGV[1])
    end
end
return {1}
)lua");
    return s;
}

/// Release every part. KEYS[2i-1] lock key and KEYS[2i] its channel; ARGV[2i-1] kind ('m' or
/// 'r'), ARGV[2i] value. Per part: 0 released (its kind's release step), -1 not held by that
/// value. Every part is read before any is released: an error reading one (an ACL's refusal),
/// a count HINCRBY would refuse, or a channel this user may not publish on, is the script's
/// error with no part released.
inline const script& multi_release_script() {
    static const script s(with_lua_checks(with_channel_check(mutex_kind::lua_release_steps) +
                        std::string(reentrant_kind::lua_release_steps) + R"lua(
local held = {}
for i = 1, #KEYS / 2 do
    local key, value = KEYS[2 * i - 1], ARGV[2 * i]
    local got, failed
    if ARGV[2 * i - 1] == 'm' then
        got, failed = mutex_read(key)
        got = got == value and got
    else
        got, failed = reentrant_read(key, value)
        if got and not can_step(got, -1) then return bad_count(key, value) end
    end
    if failed then return failed end
    if got and (ARGV[2 * i - 1] == 'm' or reentrant_last(got)) then
        local refused = channel_refused(KEYS[2 * i])
        if refused then return refused end
    end
    held[i] = got
end
local out = {}
for i = 1, #KEYS / 2 do
    local key, channel, value = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i]
    out[i] = -1
    if held[i] then
        if ARGV[2 * i - 1] == 'm' then
            mutex_leave(key, channel)
        else
            reentrant_leave(key, channel, value, held[i])
        end
        out[i] = 0
    end
end
return out
)lua"));
    return s;
}

template <class E, class = void>
struct is_pointer_like : std::false_type {};
template <class E>
struct is_pointer_like<E, std::void_t<decltype(*std::declval<E&>()), typename E::element_type>>
    : std::true_type {};
template <class E>
struct is_reference_wrapper : std::false_type {};
template <class L>
struct is_reference_wrapper<std::reference_wrapper<L>> : std::true_type {};

/// True for one argument that is a range (has begin and end): multi_lock's runtime form.
template <class... T>
struct is_lock_range : std::false_type {};
template <class T>
struct is_lock_range<T> {
    template <class U>
    static auto test(U& u) -> decltype(std::begin(u), std::end(u), std::true_type{});
    static std::false_type test(...);
    static constexpr bool value = decltype(test(std::declval<T&>()))::value;
};
template <class... T>
inline constexpr bool is_lock_range_v = is_lock_range<T...>::value;

/// The lock an element of such a range stands for: the element, or what it points or refers to.
template <class E>
auto& lock_of(E& element) {
    if constexpr (std::is_pointer_v<E> || is_pointer_like<E>::value) {
        return *element;  // T*, unique_ptr, shared_ptr
    } else if constexpr (is_reference_wrapper<E>::value) {
        return element.get();
    } else {
        return element;
    }
}

/// The hold of a multi_lock taken asynchronously: one rlock::hold per part, released together
/// (in reverse canonical order) and lost when any part is.
class multi_held final : public held_site {
public:
    explicit multi_held(std::vector<rlock::hold> parts) : parts_(std::move(parts)) {}

    void unlock_one(const std::shared_ptr<hold>& /*record*/, bool& lost_at_last) const override {
        bool lost = false;
        for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {
            try {
                if (it->owns_lock()) it->unlock();  // a loss is told (on_lock_lost), not thrown
            } catch (...) {
            }
            lost = lost || it->lost();
        }
        lost_at_last = lost;
    }
    registry& holds() const override { return hold_access::site(parts_.front()).holds(); }
    bool is_lost(hold& /*record*/) const override {
        return std::any_of(parts_.begin(), parts_.end(), [](const rlock::hold& p) { return p.lost(); });
    }
    const std::string& lock_name() const override { return parts_.front().name(); }
    const std::string& server_name() const override { return hold_access::site(parts_.front()).server_name(); }
    bool fenced() const override { return false; }
    bool post(unique_callback<> task) const override {
        return hold_access::site(parts_.front()).post(std::move(task));
    }

private:
    mutable std::vector<rlock::hold> parts_;  // unlock_one empties them; only the owner calls it
};

/// One asynchronous multi_lock acquire: the blocking algorithm's rounds, each step a part's own
/// asynchronous acquire. The head part is waited for (with the deadline); the others are tried
/// without waiting, in canonical order; a refusal releases every part taken and makes the
/// refusing part the next head. So no part is waited for while another is held, and the
/// operation needs no thread of its own: each step is started from the last one's completion.
class multi_acquire final : public cancellable, public std::enable_shared_from_this<multi_acquire> {
    using clock = std::chrono::steady_clock;

public:
    /// What the operation knows of a part (it may outlive the part objects).
    struct part_ref {
        async_start start;
        std::string name;
        bool grouped = false;     // its hold is linked to the others' (all but a red_lock)
        lock_lost_handler tell;   // its client's on_lock_lost (grouped parts)
    };

    multi_acquire(std::vector<part_ref> parts, clock::time_point deadline, std::chrono::milliseconds lease,
                  std::uint64_t owner, completion done)
        : parts_(std::move(parts)), taken_(parts_.size()), deadline_(deadline), lease_(lease), owner_(owner),
          done_(std::move(done)) {}

    /// Starts the first step from the initiating call: what that throws (a destroyed client)
    /// is the call's to throw, so no handler runs inside it.
    void begin() {
        rlock::pending p = parts_.front().start(deadline_, lease_, owner_, step(0));
        set_current(std::move(p), 0);
    }

    void cancel() noexcept override {
        rlock::pending current;
        {
            std::lock_guard<std::mutex> g(mu_);
            cancelled_ = true;
            current = current_;
        }
        current.cancel();  // that step completes with operation_aborted, and so does this
    }

private:
    completion step(std::size_t i) {
        return completion([self = shared_from_this(), i](std::exception_ptr e, rlock::hold h) {
            self->on_step(i, std::move(e), std::move(h));
        });
    }

    // Starts the acquire of part `i` (waiting until `deadline`), unless cancelled meanwhile.
    void start_step(std::size_t i, clock::time_point deadline) noexcept {
        try {
            {
                std::lock_guard<std::mutex> g(mu_);
                if (cancelled_) {
                    throw error(errc::operation_aborted, parts_[i].name, "",
                                "the asynchronous acquire was cancelled");
                }
            }
            const std::uint64_t n = ++steps_;
            rlock::pending p = parts_[i].start(deadline, lease_, owner_, step(i));
            if (set_current(p, n)) p.cancel();
        } catch (...) {
            release_taken();
            finish(std::current_exception(), rlock::hold());
        }
    }

    // Records the cancel handle of step `n` (0: the first), unless a later step's is there
    // already (the first step may complete, and the next start, before begin() gets here).
    // Returns whether the operation was cancelled meanwhile.
    bool set_current(rlock::pending p, std::uint64_t n) {
        std::lock_guard<std::mutex> g(mu_);
        if (n >= current_step_) {
            current_ = std::move(p);
            current_step_ = n;
        }
        return cancelled_;
    }

    void on_step(std::size_t i, std::exception_ptr e, rlock::hold h) noexcept {
        if (e) {
            release_taken();
            finish(std::move(e), rlock::hold());
            return;
        }
        if (!h) {  // the head's wait ran out, or another part is held by someone
            release_taken();  // never wait while holding a part
            if (i == head_ || clock::now() >= deadline_) {
                finish(nullptr, rlock::hold());
                return;
            }
            head_ = i;
            start_step(i, deadline_);
            return;
        }
        taken_[i] = std::move(h);
        for (std::size_t j = 0; j < taken_.size(); ++j) {
            if (!taken_[j]) {
                start_step(j, clock::time_point::min());
                return;
            }
        }
        try {
            finish(nullptr, all_held());
        } catch (...) {
            release_taken();
            finish(std::current_exception(), rlock::hold());
        }
    }

    // Every part is held: their holds are linked, so that the loss of any is the loss of all,
    // told once (a red_lock part is told as its own red_lock).
    rlock::hold all_held() {
        auto group = std::make_shared<hold_group>();
        group->name = parts_.front().name;
        group->tolerance = 0;
        bool any = false;
        for (std::size_t i = 0; i < parts_.size(); ++i) {
            if (!parts_[i].grouped) continue;
            if (!any) group->tell = parts_[i].tell;
            any = true;
            const std::shared_ptr<hold>& record = hold_access::record(taken_[i]);
            hold_access::site(taken_[i]).holds().with([&] { record->group = group; });
        }
        const std::shared_ptr<hold>& first = hold_access::record(taken_.front());
        registry::hold_ptr record = make_hold(*first->kind, parts_.front().name, "", owner_,
                                              {lease_, renewal::leased, clock::now()});
        record->id = any ? group->id : taken_.front().hold_id();
        return rlock::hold(std::make_shared<const multi_held>(std::move(taken_)), std::move(record));
    }

    void release_taken() noexcept {
        for (auto it = taken_.rbegin(); it != taken_.rend(); ++it) *it = rlock::hold();
    }

    void finish(std::exception_ptr e, rlock::hold h) noexcept {
        if (finished_) return;
        finished_ = true;
        try {
            done_(std::move(e), std::move(h));
        } catch (...) {
        }
    }

    const std::vector<part_ref> parts_;
    std::vector<rlock::hold> taken_;
    std::size_t head_ = 0;
    const clock::time_point deadline_;
    const std::chrono::milliseconds lease_;
    const std::uint64_t owner_;
    completion done_;
    bool finished_ = false;
    std::uint64_t steps_ = 0;  // steps started after the first (the chain's own count)
    std::mutex mu_;            // cancel() comes from any thread
    bool cancelled_ = false;
    rlock::pending current_;
    std::uint64_t current_step_ = 0;
};

}  // namespace detail

class read_write_lock;
class red_lock;

/// lock() blocks until every part is held (watched parts: renewed by their clients'
/// watchdogs); with a lease every part is leased and never renewed. It never waits while holding
/// a part: a refused part is waited on alone, then the round starts again in canonical order.
/// try_lock() is one attempt at every part; try_lock_for() and try_lock_until() give up at
/// their deadline (steady_clock; another clock's deadline is converted once). A false return
/// leaves no part held, and refused() names the part that refused last. All of them
/// (timed_lockable) throw what a part's lock() throws (would_deadlock, connection errors, ...),
/// with every part already taken released first, and invalid_argument for a lease not positive
/// or over 100 years (nothing sent).
///
/// The asynchronous forms (async_lockable: async_lock, async_try_lock, async_try_lock_for,
/// async_try_lock_until, with a lease and an rlock::owner) run the same algorithm, each step a
/// part's own asynchronous acquire, and complete with one rlock::hold for every part (lost
/// when any part is; released part by part). The owner is every part's: reentrant parts
/// re-enter. They take the parts one by one, never in one script.
class multi_lock : public detail::timed_lockable<multi_lock>, public detail::async_lockable<multi_lock> {
    using clock = std::chrono::steady_clock;

    struct part {
        void* lock = nullptr;
        std::string server, name;
        bool (*try_until)(void*, clock::time_point, std::chrono::milliseconds) = nullptr;
        void (*release)(void*) = nullptr;
        bool (*is_lost)(void*) = nullptr;
        std::uint64_t (*hold_id)(void*) = nullptr;
        detail::async_start (*starter)(void*) = nullptr;  // the part's own asynchronous acquire
        // Where the part's hold is registered: set for every part but a red_lock (whose node
        // holds are a group of their own). The parts found there are grouped (group_parts).
        detail::client_core* core = nullptr;
        const detail::kind_info* kind = nullptr;
        // For the one-script path: set for mutex and reentrant_lock.
        void (*lost_at_unlock)(void*, std::uint64_t thread) = nullptr;  // lost() stays true
        const detail::lock_keys* keys = nullptr;
        char code = 0;  // 'm' or 'r'
        bool fencing = false;
    };

public:
    /// Names the parts; sends nothing. Throws `error` (invalid_argument) when a lock is given
    /// twice.
    template <class... Locks, std::enable_if_t<!detail::is_lock_range_v<Locks...>, int> = 0>
    multi_lock(Locks&... locks) {  // NOLINT(google-explicit-constructor): brace-init
        static_assert(sizeof...(Locks) > 0, "a multi_lock needs at least one lock");
        (parts_.push_back(make_part(locks)), ...);
        name_parts();
    }
    /// The parts from a range known at run time: its elements are locks, or pointers (plain or
    /// smart) or std::reference_wrappers to locks (a basket of N keys:
    /// `std::vector<std::unique_ptr<rlock::mutex>>`, `std::deque<rlock::mutex>`, ...). The range
    /// may go; the locks must outlive the multi_lock. Sends nothing. Throws `error`
    /// (invalid_argument) for an empty range or a lock given twice.
    template <class Range, std::enable_if_t<detail::is_lock_range_v<Range>, int> = 0>
    explicit multi_lock(Range& locks) {
        for (auto& element : locks) parts_.push_back(make_part(detail::lock_of(element)));
        if (parts_.empty()) {
            throw error(errc::invalid_argument, "", "", "a multi_lock needs at least one lock");
        }
        name_parts();
    }
    multi_lock(const multi_lock&) = delete;
    multi_lock& operator=(const multi_lock&) = delete;

    /// Releases every part (on one node: one script). Throws not_owner only to a thread that
    /// holds no part; runtime failures go to on_lock_lost, as for the parts.
    void unlock() {
        if (one_node_ && release_in_one_script()) return;
        bool any = false;
        for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {
            try {
                it->release(it->lock);
                any = true;
            } catch (const error& e) {
                if (e.value() != errc::not_owner) throw;
            }
        }
        if (!any) {
            throw error(errc::not_owner, parts_.front().name, parts_.front().server,
                        "unlock by a thread that holds no part of the multi_lock");
        }
    }

    /// Some part of this thread's hold is lost (no round trip).
    [[nodiscard]] bool lost() const {
        return std::any_of(parts_.begin(), parts_.end(), [](const part& p) { return p.is_lost(p.lock); });
    }

    /// The part that refused the calling thread's last failed attempt, as "server/name";
    /// empty when its last attempt succeeded.
    [[nodiscard]] std::string refused() const {
        std::lock_guard<std::mutex> g(mu_);
        return refused_;
    }

    /// The calling thread's hold's id, as on_lock_lost is told it (lost_hold::hold_id): the
    /// parts stand or fall together, and the loss of any is told once, under this id. A red_lock
    /// part is the exception: it is told as its own red_lock, under its own hold_id() (with only
    /// red_lock parts, this is the first one's). Throws `error` (not_owner) when this thread
    /// holds no part. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const {
        const std::uint64_t thread = detail::current_thread_number();
        for (const part& p : parts_) {
            if (!p.core) continue;
            if (auto h = p.core->reg.find(p.kind, p.name, thread)) {
                if (auto group = p.core->reg.with([&] { return h->group; })) return group->id;
            }
        }
        return parts_.front().hold_id(parts_.front().lock);
    }

    /// Number of parts. Never blocks or throws.
    std::size_t size() const noexcept { return parts_.size(); }

private:
    // Canonical order, no lock twice, and whether one script can take them all.
    void name_parts() {
        std::sort(parts_.begin(), parts_.end(), [](const part& a, const part& b) {
            return std::tie(a.server, a.name) < std::tie(b.server, b.name);
        });
        for (std::size_t i = 1; i < parts_.size(); ++i) {
            if (parts_[i].server == parts_[i - 1].server && parts_[i].name == parts_[i - 1].name) {
                throw error(errc::invalid_argument, parts_[i].name, parts_[i].server,
                            "the same lock is given twice to one multi_lock");
            }
        }
        one_node_ = std::all_of(parts_.begin(), parts_.end(), [&](const part& p) {
            // In a cluster one script reaches one slot only.
            return p.code && !p.fencing && p.core == parts_.front().core &&
                   (!p.core->ep.slots || detail::key_slot(p.name) == detail::key_slot(parts_.front().name));
        });
    }

    template <class L>
    static part make_part(L& l) {
        part p;
        p.lock = &l;
        p.name = l.name();
        p.try_until = [](void* o, clock::time_point t, std::chrono::milliseconds lease) {
            L& x = *static_cast<L*>(o);
            return lease.count() == 0 ? x.try_lock_until(t) : x.try_lock_until(t, lease);
        };
        p.release = [](void* o) { static_cast<L*>(o)->unlock(); };
        p.is_lost = [](void* o) { return static_cast<L*>(o)->lost(); };
        p.hold_id = [](void* o) { return static_cast<const L*>(o)->hold_id(); };
        p.starter = [](void* o) -> detail::async_start {
            L& x = *static_cast<L*>(o);
            if constexpr (std::is_base_of_v<read_write_lock, L>) {
                return x.writer().async_starter();
            } else {
                return x.async_starter();
            }
        };
        if constexpr (std::is_base_of_v<read_write_lock, L>) {
            registered_in(p, l.writer());  // a read_write_lock part takes its write side
        } else if constexpr (!std::is_base_of_v<red_lock, L>) {
            registered_in(p, l);
        }
        if constexpr (std::is_base_of_v<detail::basic_lock<detail::mutex_kind>, L> ||
                      std::is_base_of_v<detail::basic_lock<detail::reentrant_kind>, L>) {
            p.keys = &l.keys_;
            p.lost_at_unlock = [](void* o, std::uint64_t thread) {
                static_cast<L*>(o)->mark_lost_at_unlock(thread);
            };
            p.fencing = l.options_.fencing;
            p.server = l.core_->ep.name;
            p.code = std::is_base_of_v<detail::basic_lock<detail::mutex_kind>, L> ? 'm' : 'r';
        } else {
            p.server = server_of(l);
        }
        return p;
    }

    template <class Kind>
    static void registered_in(part& p, const detail::basic_lock<Kind>& l) {
        p.core = l.core_.get();
        p.kind = &Kind::info;
    }

    template <class L>
    static std::string server_of(L& l) {
        if constexpr (std::is_base_of_v<detail::basic_lock<detail::fair_kind>, L>) {
            return l.core_->ep.name;
        } else {
            return "";  // read_write_lock, red_lock: ordered by name
        }
    }

    void set_refused(std::string what) {
        std::lock_guard<std::mutex> g(mu_);
        refused_ = std::move(what);
    }

    friend class detail::timed_lockable<multi_lock>;
    friend class detail::async_lockable<multi_lock>;
    const std::string& name() const noexcept { return parts_.front().name; }  // in lease errors
    std::string_view server() const noexcept { return ""; }

    // timed_lockable's entry point (see there).
    bool acquire(clock::time_point deadline, std::chrono::milliseconds lease) {
        std::size_t first = 0;
        if (one_node_) {
            std::size_t refusing = 0;
            if (acquire_in_one_script(lease, refusing)) {
                set_refused("");
                return true;
            }
            first = refusing;  // wait for that one first
        }
        for (;;) {
            part& head = parts_[first];
            if (!head.try_until(head.lock, deadline, lease)) {
                set_refused(head.server + "/" + head.name);
                return false;
            }
            std::size_t refusing = parts_.size();
            std::vector<std::size_t> taken{first};
            for (std::size_t i = 0; i < parts_.size(); ++i) {
                if (i == first) continue;
                bool ok = false;
                try {
                    ok = parts_[i].try_until(parts_[i].lock, clock::now(), lease);
                } catch (...) {
                    release(taken);
                    throw;
                }
                if (!ok) {
                    refusing = i;
                    break;
                }
                taken.push_back(i);
            }
            if (refusing == parts_.size()) {
                group_parts();
                set_refused("");
                return true;
            }
            release(taken);  // never wait while holding a part
            first = refusing;
            if (clock::now() >= deadline) {
                set_refused(parts_[refusing].server + "/" + parts_[refusing].name);
                return false;
            }
        }
    }

    // async_lockable's entry point (async_lock.hpp).
    template <class Token>
    auto start_async(clock::time_point deadline, std::chrono::milliseconds lease, std::uint64_t owner,
                     Token&& token) {
        return detail::start_with(async_starter(), deadline, lease, owner, std::forward<Token>(token));
    }

    // What starts an asynchronous acquire of every part, sharing their sites.
    detail::async_start async_starter() {
        std::vector<detail::multi_acquire::part_ref> refs;
        refs.reserve(parts_.size());
        for (part& p : parts_) {
            refs.push_back({p.starter(p.lock), p.name, p.core != nullptr,
                            p.core ? p.core->ep.options.on_lock_lost : lock_lost_handler()});
        }
        return [refs = std::move(refs)](clock::time_point deadline, std::chrono::milliseconds lease,
                                        std::uint64_t owner, detail::completion done) {
            auto op = std::make_shared<detail::multi_acquire>(
                refs, deadline, lease, owner != 0 ? owner : detail::next_owner_number(), std::move(done));
            op->begin();
            return rlock::pending(op);
        };
    }

    void release(const std::vector<std::size_t>& taken) noexcept {
        for (std::size_t i : taken) {
            try {
                parts_[i].release(parts_[i].lock);
            } catch (...) {
            }
        }
    }

    // Links the parts' holds so that the loss of any one is the loss of all, told once.
    void group_parts() {
        auto group = std::make_shared<detail::hold_group>();
        group->name = parts_.front().name;
        group->tolerance = 0;
        const std::uint64_t thread = detail::current_thread_number();
        for (part& p : parts_) {
            if (!p.core) continue;
            if (!group->tell) group->tell = p.core->ep.options.on_lock_lost;
            if (auto h = p.core->reg.find(p.kind, p.name, thread)) {
                p.core->reg.with([&] { h->group = group; });
            }
        }
    }

    bool acquire_in_one_script(std::chrono::milliseconds lease, std::size_t& refusing) {
        detail::client_core& core = *parts_.front().core;
        const std::uint64_t thread = detail::current_thread_number();
        core.throw_if_destroyed(parts_.front().name,
                                "the client this lock was made from has been destroyed");
        for (part& p : parts_) {
            if (core.reg.find(p.kind, p.name, thread)) {
                refusing = 0;
                return false;  // a re-entry or would_deadlock: the parts decide, one by one
            }
        }
        const bool watched = lease.count() == 0;
        if (watched) lease = core.ep.options.lock_watchdog_timeout;
        const std::string lease_text = std::to_string(lease.count());
        const std::string token = detail::random_token(), holder = core.holder_id(thread);
        std::vector<std::string_view> values;
        values.reserve(parts_.size());
        for (part& p : parts_) values.push_back(p.code == 'm' ? std::string_view(token) : holder);
        detail::script_call call;
        call.start(detail::multi_acquire_script(), parts_.size());
        for (part& p : parts_) call.push(p.keys->name);
        call.push(lease_text);
        for (std::size_t i = 0; i < parts_.size(); ++i) {
            call.push(parts_[i].code == 'm' ? "m" : "r");
            call.push(values[i]);
        }
        const std::string& name = parts_.front().name;
        const auto sent = clock::now();
        detail::reply_ptr r;
        try {
            r = core.pool.run(name, detail::on_break::fail, [&](const detail::connection& c) {
                detail::reply_ptr got = detail::run_script(c, call, name, core.ep.name);
                if (got && got->type == REDIS_REPLY_ARRAY && got->elements >= 1 &&
                    got->element[0]->integer == 1) {
                    sync_or_undo(core, c, values);
                }
                return got;
            });
        } catch (const error& e) {
            // A connection that broke or timed out may have run the script: undo it, as
            // basic_lock's attempt does, so nothing of ours outlives the failure.
            if (detail::is_ambiguous(e)) {
                try {
                    detail::script_call undo = release_call(values);
                    (void)core.pool.run(name, detail::on_break::retry, [&](const detail::connection& c) {
                        return detail::run_script(c, undo, name, core.ep.name);
                    });
                } catch (const error&) {  // unreachable still: the parts expire with the lease
                }
            }
            throw;
        }
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
            throw error(errc::protocol_error, name, core.ep.name,
                        "unexpected reply from the multi-lock script");
        }
        if (r->element[0]->integer != 1) {
            refusing = r->elements > 1 ? static_cast<std::size_t>(r->element[1]->integer - 1) : 0;
            return false;
        }
        auto group = std::make_shared<detail::hold_group>();
        group->name = parts_.front().name;
        group->tell = core.ep.options.on_lock_lost;
        const detail::hold_terms terms{
            lease, watched ? detail::renewal::watched : detail::renewal::leased, sent};
        for (part& p : parts_) {
            core.add_hold(*p.kind, p.name, p.code == 'm' ? token : holder, thread, terms, 0, group);
        }
        return true;
    }

    // The one-script release of every part, each with its value (parts_ order).
    detail::script_call release_call(const std::vector<std::string_view>& values) const {
        detail::script_call call;
        call.start(detail::multi_release_script(), 2 * parts_.size());
        for (const part& p : parts_) {
            call.push(p.keys->name);
            call.push(p.keys->channel);
        }
        for (std::size_t i = 0; i < parts_.size(); ++i) {
            call.push(parts_[i].code == 'm' ? "m" : "r");
            call.push(values[i]);
        }
        return call;
    }

    // Replica sync after the one-script acquire on `c`, as basic_lock's sync_or_undo for each
    // part: too few acknowledgements release every part and throw replica_sync_failed.
    void sync_or_undo(detail::client_core& core, const detail::connection& c,
                      const std::vector<std::string_view>& values) const {
        const int wanted = core.ep.options.sync_replicas;
        if (wanted <= 0) return;
        const std::string& name = parts_.front().name;
        const long long acked = core.wait_for_replicas(c, name);
        if (acked >= wanted) return;
        try {
            detail::script_call undo = release_call(values);
            (void)detail::run_script(c, undo, name, core.ep.name);
        } catch (const error& e) {
            // Not a redirection for the pool to follow: that would run the acquire again.
            throw detail::error_access::unredirected(e);
        }
        throw error(errc::replica_sync_failed, name, core.ep.name,
                    std::to_string(acked) + " of the " + std::to_string(wanted) +
                        " replicas asked for acknowledged the acquire of the multi_lock's " +
                        std::to_string(parts_.size()) + " parts within " +
                        std::to_string(core.ep.options.sync_timeout.count()) +
                        " ms; it was undone");
    }

    bool release_in_one_script() {
        detail::client_core& core = *parts_.front().core;
        const std::uint64_t thread = detail::current_thread_number();
        std::vector<detail::registry::hold_ptr> holds;
        for (part& p : parts_) {
            auto h = core.reg.find(p.kind, p.name, thread);
            if (!h || core.reg.with([&] { return h->count; }) != 1) return false;  // part by part
            holds.push_back(std::move(h));
        }
        for (auto& h : holds) core.reg.remove(h);
        std::vector<std::string_view> values;
        values.reserve(holds.size());
        for (const auto& h : holds) values.push_back(h->value);
        detail::script_call call = release_call(values);
        try {
            detail::reply_ptr r = core.pool.run(parts_.front().name, detail::on_break::retry, [&](const detail::connection& c) {
                return detail::run_script(c, call, parts_.front().name, core.ep.name);
            });
            for (std::size_t i = 0; i < holds.size() && r && i < r->elements; ++i) {
                if (r->element[i]->integer >= 0 || core.reg.ended_by_lease(*holds[i])) continue;
                parts_[i].lost_at_unlock(parts_[i].lock, thread);  // first, as basic_lock
                core.reg.report(*holds[i], error(errc::lock_lost, holds[i]->name, core.ep.name,
                                                 "at unlock the part was no longer held"));
            }
        } catch (const error& e) {
            for (part& p : parts_) p.lost_at_unlock(p.lock, thread);
            core.reg.report(*holds.front(), e);
        }
        return true;
    }

    std::vector<part> parts_;
    bool one_node_ = false;
    mutable std::mutex mu_;
    std::string refused_;
};

}  // namespace rlock
