// multi_lock's pieces below its public class: how a part list is recognised (a range, or locks
// given one by one), the hold of an asynchronous multi_lock and its asynchronous acquire (a
// chain of the parts' own). The scripts of its one-script path are multi_scripts.hpp.
// rlock::multi_lock (multi_lock.hpp) is the public face; its contract is there.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/detail/waiting/async_lock.hpp"
#include "rlock/errors.hpp"
#include "rlock/detail/runtime/held_site.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// What a lock is as a multi_lock part, as the lock itself describes it (each lock type's
/// private `as_part()`, read through part_access): where its hold is registered, its server
/// (the parts are ordered by server and name), and, for a kind with a step in the one-script
/// path (kind_defaults::multi_code), its keys and code.
struct part_view {
    std::string server;           // "" orders it by name alone
    std::vector<std::string> where;  // the servers its key is on (a red_lock: its nodes)
    client_core* core = nullptr;  // where its hold is registered; null: a red_lock, whose node
                                  // holds are a group of their own
    std::vector<client_core*> clients;  // what its acquire goes through (a red_lock: its nodes)
    const kind_info* kind = nullptr;
    char code = 0;  // the one-script path's step (multi_scripts.hpp), 0: none
    const lock_keys* keys = nullptr;
    bool fencing = false;
    lost_at_unlock_owners* lost_at_unlock = nullptr;  // lost() stays true for them
    std::function<async_start()> starter;                      // its own asynchronous acquire
};

/// How multi_lock reads a part's view: each lock type befriends this and defines
/// `detail::part_view as_part()`.
struct part_access {
    template <class L>
    static part_view view(L& lock) {
        return lock.as_part();
    }
    /// The lock's own entry point (timed_lockable's), with the multi_lock's call and lease.
    template <class L>
    static bool acquire(L& lock, wait_call call, lease_request lease) {
        return lock.acquire(call, lease);
    }
};

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

    RLOCK_DECL void unlock_one(const std::shared_ptr<hold>& /*record*/, bool& lost_at_last) const override;
    registry& holds() const override { return hold_access::site(parts_.front()).holds(); }
    RLOCK_DECL bool is_lost(hold& /*record*/) const override;
    const std::string& lock_name() const override { return parts_.front().name(); }
    const std::string& server_name() const override { return hold_access::site(parts_.front()).server_name(); }
    bool fenced() const override { return false; }
    RLOCK_DECL bool post(unique_callback<> task) const override;

private:
    mutable std::vector<rlock::hold> parts_;  // unlock_one empties them; only the owner calls it
};

/// Whether `e`, thrown by a part tried without waiting, is an outage at that part (its server
/// restarting or not answering, a killed connection; a Redis Cluster that could not serve the
/// slot yet; a red_lock part without a majority of nodes it can reach) rather than the
/// acquire's error: that part is then waited for, and its own wait rides the outage until the
/// deadline, as a single lock's does (failure_ride).
inline bool part_outage(const error& e) noexcept {
    return may_run_later(e) || e.value() == errc::quorum_not_reached;
}
RLOCK_DECL bool part_outage(const std::exception_ptr& e) noexcept;

/// The parts of one multi_lock that name one key through two clients of one database: two
/// locks when their servers differ, one key given twice when they are one server whose
/// addresses are spelled differently (127.0.0.1 and localhost, two seed lists of one Redis
/// Cluster), which the acquire would wait for for ever. Told apart by the run_ids of the
/// servers behind idle connections of the two clients to the key's server: sends nothing and
/// never blocks. A pair not known yet (no idle connection: the parts' tries open them) is
/// checked again after each round of the acquire, blocking or asynchronous, and so is one
/// known to differ (a Redis Cluster client's slot map may be out of date until a try follows
/// a MOVED).
struct twin_parts {
    struct pair {
        std::shared_ptr<client_core> a, b;
        std::string name;
    };
    std::vector<pair> pairs;

    /// The invalid_argument error for a pair found on one server; null when none is.
    RLOCK_DECL std::exception_ptr one_server() const;
    /// Throws that error.
    void refuse_one_server() const {
        if (std::exception_ptr e = one_server()) std::rethrow_exception(e);
    }
};

/// One asynchronous multi_lock acquire: the blocking algorithm's rounds, each step a part's own
/// asynchronous acquire. The head part is waited for (with the deadline); the others are tried
/// without waiting, in canonical order; a refusal releases every part taken and makes the
/// refusing part the next head. So no part is waited for while another is held, and the
/// operation needs no thread of its own: each step is started from the last one's completion.
/// It listens to every part's client: the destruction of one completes it (connection_failed)
/// whichever part it is waiting for.
class multi_acquire final : public cancellable,
                            public stop_listener,
                            public std::enable_shared_from_this<multi_acquire> {
    using clock = std::chrono::steady_clock;

public:
    /// What the operation knows of a part (it may outlive the part objects).
    struct part_ref {
        async_start start;
        std::string name;
        bool grouped = false;     // its hold is linked to the others' (all but a red_lock)
        lock_lost_handler tell;   // its client's on_lock_lost (grouped parts)
        std::vector<std::weak_ptr<client_core>> clients;  // part_view::clients
    };

    multi_acquire(std::vector<part_ref> parts, std::shared_ptr<const twin_parts> twins,
                  wait_call call, lease_request lease, std::uint64_t owner, completion done)
        : parts_(std::move(parts)), twins_(std::move(twins)), taken_(parts_.size()), call_(call),
          lease_(lease), owner_(owner), done_(std::move(done)) {}

    /// Starts the first step from the initiating call: what that throws (a part's client
    /// destroyed) is the call's to throw, so no handler runs inside it.
    void begin();

    RLOCK_DECL void cancel() noexcept override;

    /// A part's client is being destroyed: the step in progress is cancelled, and the
    /// operation completes with connection_failed naming that part and its server.
    RLOCK_DECL void client_stopping(const client_core& core) noexcept override;

private:
    completion step(std::size_t i);

    // Starts the acquire of part `i`, unless cancelled meanwhile: waiting until the deadline
    // (`wait`), or one attempt. Either is told to the listener from the multi_lock's call.
    void start_step(std::size_t i, bool wait) noexcept;

    // Records the cancel handle of step `n` (0: the first), unless a later step's is there
    // already (the first step may complete, and the next start, before begin() gets here).
    // Returns whether the operation was cancelled meanwhile.
    bool set_current(rlock::pending p, std::uint64_t n);

    void on_step(std::size_t i, std::exception_ptr e, rlock::hold h) noexcept;

    // Every part is held: their holds are linked, so that the loss of any is the loss of all,
    // told once (a red_lock part is told as its own red_lock).
    rlock::hold all_held();

    void release_taken() noexcept;

    // The error to complete with once a part's client is being destroyed; with `step` (the
    // name of the part about to be started), also once the operation is cancelled. Both are
    // read under one lock, the stop first: a client that goes cancels too, and the acquire
    // completes with its connection_failed, not operation_aborted. Null otherwise.
    std::exception_ptr ended_error(const std::string* step = nullptr);

    // Stops listening to the parts' clients.
    void forget_clients() noexcept;

    void finish(std::exception_ptr e, rlock::hold h) noexcept;

    const std::vector<part_ref> parts_;
    const std::shared_ptr<const twin_parts> twins_;  // null: no name twice
    std::vector<rlock::hold> taken_;
    std::size_t head_ = 0;
    const wait_call call_;
    const lease_request lease_;
    const std::uint64_t owner_;
    completion done_;
    bool finished_ = false;
    std::uint64_t steps_ = 0;  // steps started after the first (the chain's own count)
    std::mutex mu_;            // cancel() comes from any thread
    bool cancelled_ = false;
    const std::string* stopped_part_ = nullptr;  // a part whose client is being destroyed
    std::string stopped_server_;                 // and that client's server
    rlock::pending current_;
    std::uint64_t current_step_ = 0;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void multi_held::unlock_one(const std::shared_ptr<hold>&, bool& lost_at_last) const {
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

RLOCK_DECL bool multi_held::is_lost(hold&) const {
    return std::any_of(parts_.begin(), parts_.end(), [](const rlock::hold& p) { return p.lost(); });
}

RLOCK_DECL bool multi_held::post(unique_callback<> task) const {
    return hold_access::site(parts_.front()).post(std::move(task));
}

RLOCK_DECL void multi_acquire::begin() {
    const std::shared_ptr<stop_listener> self = shared_from_this();
    for (const part_ref& part : parts_) {
        for (const std::weak_ptr<client_core>& weak : part.clients) {
            std::shared_ptr<client_core> c = weak.lock();
            if (c && c->listen_for_stop(self)) continue;
            forget_clients();
            throw error(errc::connection_failed, part.name, c ? c->ep.name : std::string(),
                        "the client of this multi_lock part has been destroyed");
        }
    }
    try {
        rlock::pending p = parts_.front().start(call_, lease_, owner_, step(0));
        if (set_current(p, 0)) p.cancel();  // a part's client went meanwhile
    } catch (...) {
        forget_clients();
        throw;
    }
}

RLOCK_DECL void multi_acquire::client_stopping(const client_core& core) noexcept {
    rlock::pending current;
    try {
        std::lock_guard<std::mutex> g(mu_);
        if (stopped_part_ == nullptr) {
            for (const part_ref& part : parts_) {
                for (const std::weak_ptr<client_core>& weak : part.clients) {
                    if (stopped_part_ == nullptr && weak.lock().get() == &core) {
                        stopped_server_ = core.ep.name;
                        stopped_part_ = &part.name;
                    }
                }
            }
        }
        cancelled_ = true;
        current = current_;
    } catch (...) {  // bad_alloc copying the server's name: the step still ends
        std::lock_guard<std::mutex> g(mu_);
        cancelled_ = true;
        current = current_;
    }
    current.cancel();  // that step completes (aborted), and on_step ends the operation
}

RLOCK_DECL std::exception_ptr multi_acquire::ended_error(const std::string* step) {
    std::lock_guard<std::mutex> g(mu_);
    if (stopped_part_ != nullptr) {
        return std::make_exception_ptr(
            error(errc::connection_failed, *stopped_part_, stopped_server_,
                  "the client of this multi_lock part was destroyed while the asynchronous "
                  "acquire waited"));
    }
    if (step != nullptr && cancelled_) {
        return std::make_exception_ptr(
            error(errc::operation_aborted, *step, "", "the asynchronous acquire was cancelled"));
    }
    return nullptr;
}

RLOCK_DECL void multi_acquire::forget_clients() noexcept {
    for (const part_ref& part : parts_) {
        for (const std::weak_ptr<client_core>& weak : part.clients) {
            if (std::shared_ptr<client_core> c = weak.lock()) c->forget_stop_listener(this);
        }
    }
}

RLOCK_DECL void multi_acquire::cancel() noexcept {
    rlock::pending current;
    {
        std::lock_guard<std::mutex> g(mu_);
        cancelled_ = true;
        current = current_;
    }
    current.cancel();  // that step completes with operation_aborted, and so does this
}

RLOCK_DECL completion multi_acquire::step(std::size_t i) {
    return completion([self = shared_from_this(), i](std::exception_ptr e, rlock::hold h) {
        self->on_step(i, std::move(e), std::move(h));
    });
}

RLOCK_DECL void multi_acquire::start_step(std::size_t i, bool wait) noexcept {
    std::exception_ptr failure;
    try {
        failure = ended_error(&parts_[i].name);  // a part's client is going, or cancelled
        if (!failure) {
            const std::uint64_t n = ++steps_;
            const wait_call call = wait ? call_ : wait_call{clock::time_point::min(), call_.began};
            rlock::pending p = parts_[i].start(call, lease_, owner_, step(i));
            if (set_current(p, n)) p.cancel();
        }
    } catch (...) {
        failure = std::current_exception();
    }
    // Finished outside the handler: the thrown object's own reference is gone by then, so
    // the receiver's thread releases the last one (TSan cannot see libstdc++'s count).
    if (failure) {
        release_taken();
        finish(std::move(failure), rlock::hold());
    }
}

RLOCK_DECL std::exception_ptr twin_parts::one_server() const {
    // The run_id behind an idle connection of `c` to the server of `name` (0: unknown now).
    auto identity = [](client_core& c, const std::string& name) -> std::uint64_t {
        std::optional<pool::handle> h = c.pool.try_checkout(name);
        return h ? h->server_id() : 0;
    };
    for (const pair& p : pairs) {
        const std::uint64_t ia = identity(*p.a, p.name), ib = identity(*p.b, p.name);
        if (ia == 0 || ia != ib) continue;
        const std::string& at = p.a->ep.name;
        return std::make_exception_ptr(
            error(errc::invalid_argument, p.name, at,
                  "the same lock is given twice to one multi_lock: " + at + " and " +
                      p.b->ep.name + " are one server (the same run_id)"));
    }
    return nullptr;
}

RLOCK_DECL bool part_outage(const std::exception_ptr& e) noexcept {
    try {
        if (e) std::rethrow_exception(e);
    } catch (const error& x) {
        return part_outage(x);
    } catch (...) {
    }
    return false;
}

RLOCK_DECL bool multi_acquire::set_current(rlock::pending p, std::uint64_t n) {
    std::lock_guard<std::mutex> g(mu_);
    if (n >= current_step_) {
        current_ = std::move(p);
        current_step_ = n;
    }
    return cancelled_;
}

RLOCK_DECL void multi_acquire::on_step(std::size_t i, std::exception_ptr e,
                                       rlock::hold h) noexcept {
    std::exception_ptr stopped;
    try {
        stopped = ended_error();
    } catch (...) {
        stopped = std::current_exception();
    }
    if (stopped) {  // whatever the step brought: a part's client is going
        h = rlock::hold();
        release_taken();
        finish(std::move(stopped), rlock::hold());
        return;
    }
    if (e && i != head_ && part_outage(e) && clock::now() < call_.deadline) {
        // A part tried without waiting is out of reach: waited for next (see part_outage).
        release_taken();
        head_ = i;
        start_step(i, /*wait=*/true);
        return;
    }
    if (e) {
        release_taken();
        finish(std::move(e), rlock::hold());
        return;
    }
    if (!h) {             // the head's wait ran out, or another part is held by someone
        release_taken();  // never wait while holding a part
        if (i == head_ || clock::now() >= call_.deadline) {
            finish(nullptr, rlock::hold());
            return;
        }
        if (twins_) {  // the refusal may be the other half of one key given twice
            // Made, not thrown and caught here: the engine thread's catch would end the
            // exception's life where ThreadSanitizer cannot see the reference count.
            std::exception_ptr twice;
            try {
                twice = twins_->one_server();
            } catch (...) {
                twice = std::current_exception();
            }
            if (twice) {
                finish(std::move(twice), rlock::hold());
                return;
            }
        }
        head_ = i;
        start_step(i, /*wait=*/true);
        return;
    }
    taken_[i] = std::move(h);
    for (std::size_t j = 0; j < taken_.size(); ++j) {
        if (!taken_[j]) {
            start_step(j, /*wait=*/false);
            return;
        }
    }
    std::exception_ptr failure;
    try {
        finish(nullptr, all_held());
    } catch (...) {
        release_taken();
        failure = std::current_exception();
    }
    // Outside the handler, as above.
    if (failure) finish(std::move(failure), rlock::hold());
}

RLOCK_DECL rlock::hold multi_acquire::all_held() {
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
                                          {lease_.fixed_duration(), renewal::leased, clock::now()});
    record->id = any ? group->id : taken_.front().hold_id();
    return rlock::hold(std::make_shared<const multi_held>(std::move(taken_)), std::move(record));
}

RLOCK_DECL void multi_acquire::release_taken() noexcept {
    for (auto it = taken_.rbegin(); it != taken_.rend(); ++it) *it = rlock::hold();
}

RLOCK_DECL void multi_acquire::finish(std::exception_ptr e, rlock::hold h) noexcept {
    if (finished_) return;
    finished_ = true;
    forget_clients();
    try {
        done_(std::move(e), std::move(h));
    } catch (...) {
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
