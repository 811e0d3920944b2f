// local_gate: the threads and asynchronous acquires of one client that want the same lock meet
// here before Redis (lock cohorting). One of them at a time, the leader, waits for the lock at
// Redis; the rest wait here, in order (a thread on a condition variable, an asynchronous acquire
// as a ticket told its turn through the client's engine). A local owner's unlock hands its hold to the next of them without a round
// trip — the key, its value and the watchdog's renewals stay as they are — at most
// `max_passes` times in a row and for at most `max_time`, after which the hold is released
// through Redis and other clients have their turn (docs/design.md, "Local hand-off").
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/protocol/kind_info.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// A hold as the registry records it (rlock::hold::record, which registry.hpp defines).
using hold = rlock::hold::record;

/// What a pass hands on: the hold's Redis side, unchanged, and the record it comes from.
struct passed_hold {
    std::string value;
    std::chrono::milliseconds lease{0};
    std::chrono::steady_clock::time_point sent;  // of the acquire or renewal its lease runs from
    std::shared_ptr<hold> from;                  // told too if the key is found gone (hold::handed_from)
};

/// How far the local hand-off of one lock may go before its hold is released through Redis.
struct handoff_bound {
    unsigned max_passes = 0;  // 0: no hand-off
    std::chrono::microseconds max_time{0};
};

/// A place in a gate's queue: a blocking thread's (local_gate::enter) or an asynchronous
/// acquire's (async_lock.hpp). Its turn and pass are the gate's to write, under the gate's lock,
/// while it is queued; once told (notify) it is out of the queue and they are its own.
class gate_waiter {
public:
    enum class turn_state : unsigned char {
        waiting,   // queued
        granted,   // handed the hold (pass is filled in)
        promoted,  // to lead: wait at Redis for the client
        stopped,   // the client is being destroyed
        freed,     // permit_gate only: to wait at Redis on its own (it needs fewer than the leader)
    };

    /// Tells the waiter its turn has come (or the gate stopped), under the gate's lock; must
    /// not block or call the gate. False when it can no longer take a turn (an asynchronous
    /// acquire whose client's engine has stopped): the gate then takes the turn back and moves
    /// on to the next waiter.
    virtual bool notify() noexcept = 0;

    gate_waiter(const gate_waiter&) = delete;
    gate_waiter& operator=(const gate_waiter&) = delete;
    virtual ~gate_waiter() = default;

    turn_state turn = turn_state::waiting;
    passed_hold pass;

protected:
    gate_waiter() = default;
};

/// A queued thread's wait at a gate (`g` holds the gate's lock): until its turn is told or
/// `deadline` passes.
RLOCK_DECL void wait_for_turn(std::unique_lock<std::mutex>& g, std::condition_variable& cv,
                          const gate_waiter::turn_state& turn, std::chrono::steady_clock::time_point deadline);

class local_gate {
public:
    using clock = std::chrono::steady_clock;

    /// How a wait at the gate ended, or an asynchronous acquire's arrival (join).
    enum class entry : unsigned char {
        lead,       // no local thread holds or waits at Redis: this one does, as the leader
        granted,    // a local owner handed its hold over (the pass was filled in)
        timed_out,  // the deadline passed first
        stopped,    // the client is being destroyed
        queued,     // join: it waits in the queue until notified
    };

    explicit local_gate(handoff_bound bound) : bound_(bound) {}

    /// Waits for a turn: to lead (wait at Redis) or to be handed the hold. A deadline already
    /// past does not wait: it leads when the gate is free, and is timed out otherwise (another
    /// thread of this client holds or waits for the lock; no round trip is spent to learn it).
    entry enter(clock::time_point deadline, passed_hold& pass);

    /// An asynchronous acquire arrives: it leads when the gate is free; otherwise, when it may
    /// wait, it is queued and told its turn through w.notify() (and must be taken out with
    /// withdraw() if it ends first), else it is timed out.
    entry join(gate_waiter& w, bool may_wait);

    /// Takes a queued waiter out before its turn came. False when it was told its turn
    /// already (or was never queued): that turn is then its to take or give back.
    bool withdraw(gate_waiter& w);

    /// The leader's wait at Redis ended: with the lock (the gate is held until its unlock), or
    /// without (the next waiter leads).
    void led(bool acquired);

    /// Whether an unlock now could hand the hold over (hand_over): a waiter is queued and the
    /// bound allows. Asked first, so that an unlock with no one to pass to copies nothing.
    bool can_hand_over() {
        std::lock_guard<std::mutex> g(mu_);
        return may_pass();
    }

    /// A local owner's last unlock, its record already out of the registry: hands `pass` to
    /// the first waiter when there is one and the bound allows. True when handed over (the
    /// caller releases nothing); false when the caller releases through Redis and then calls
    /// released().
    bool hand_over(passed_hold& pass);

    /// The hold was released through Redis (or abandoned: its thread exited): the first waiter
    /// leads, or the gate is free.
    void released() noexcept {
        std::lock_guard<std::mutex> g(mu_);
        next_leads();
    }

    /// A blocking acquire on the client's engine thread (inside a completion handler) waits
    /// at Redis beside the gate, never in it: an asynchronous acquire is told its turn on that
    /// thread, so a hold handed to one queued here would wait for the handler, which waits for
    /// the hold. While one waits beside (began_beside() to ended_beside()), unlocks hand nothing
    /// over: they release through Redis, where it can have the lock.
    void began_beside() noexcept {
        std::lock_guard<std::mutex> g(mu_);
        ++beside_;
    }
    void ended_beside() noexcept {
        std::lock_guard<std::mutex> g(mu_);
        --beside_;
    }

    /// Tells every waiter entry::stopped (the client is being destroyed).
    void stop();

private:
    enum class state : unsigned char { idle, leading, holding };
    using turn_state = gate_waiter::turn_state;
    struct thread_waiter final : gate_waiter {
        std::condition_variable cv;
        bool notify() noexcept override {
            cv.notify_one();
            return true;
        }
    };

    bool may_pass() const;

    void next_leads() noexcept;
    bool dequeue(const gate_waiter& w);

    const handoff_bound bound_;
    std::mutex mu_;
    state state_ = state::idle;
    std::deque<gate_waiter*> queue_;  // blocking threads' (on their stacks) and async acquires'
    unsigned passes_ = 0;             // in a row, since the leader took the lock
    unsigned beside_ = 0;             // blocking acquires on the engine thread (began_beside)
    clock::time_point since_;         // when it did
    bool stopped_ = false;
};

/// A semaphore's local hand-off: the threads of one client that wait for permits of one
/// semaphore. One of them at a time, the leader, waits at Redis; the others wait here, in order.
/// A release by a thread of the client hands its permits to them first — first fit, in order,
/// without a round trip — and releases through Redis only what is left; at most `max_passes`
/// releases in a row, and for at most `max_time` since the first of them, pass anything, after
/// which a release goes through Redis whole and other clients have their turn. A thread that
/// has not been refused yet tries at Redis itself (free), so that acquisitions of a semaphore
/// with permits to spare never queue behind each other; and only a thread that needs at least
/// as many permits as the leader queues behind it: one that needs fewer may be served by a
/// release the leader cannot use, so it waits at Redis itself (free), first fit as before.
class permit_gate {
public:
    using clock = std::chrono::steady_clock;

    enum class entry : unsigned char {
        free,       // no one of this client waits, or only for more permits: try at Redis
        lead,       // wait at Redis for the client
        granted,    // permits were handed over
        timed_out,  // the deadline passed first
        stopped,    // the client is being destroyed
    };

    explicit permit_gate(handoff_bound bound) : bound_(bound) {}

    /// A thread about to try for `need` permits: behind a thread of the client that waits
    /// (at Redis or here) it queues until `deadline`; otherwise it is free to try.
    entry arrive(clock::time_point deadline, long long need);

    /// A thread refused at Redis that will wait: it leads when no thread of the client does,
    /// queues behind the leader when it needs as many permits or more, and is otherwise free
    /// to wait at Redis itself.
    entry refused(clock::time_point deadline, long long need);

    /// The leader's wait at Redis ended, with permits or without: the first queued thread leads,
    /// and those behind it that need fewer permits than it wait at Redis on their own (freed),
    /// as they would arriving now: a release it cannot use may serve them.
    void led() noexcept;

    /// A release of `n` permits by a thread of the client, which holds `held` of them in all
    /// (taken at Redis and not released there, these `n` included): hands them to queued
    /// threads first (first fit, in order) when the bound allows; returns how many are left to
    /// release through Redis.
    ///
    /// When the bound cuts a run of passes, the permits the client's threads hold go back
    /// through Redis once each before passes resume (the drain): another client's waiter may
    /// need more permits than one release frees, and passing the others on would keep the
    /// count at Redis below its need for good. The drain ends when `held` permits went back,
    /// when no release came for as long as the longest gap between two releases of the run (at
    /// least courtesy_time: a permit kept without being passed on is not waited for), or after
    /// drain_cap.
    long long hand_over(long long n, long long held);

    /// Before each try of the leader: after a release the bound sent to Redis, waits out the
    /// rest of a 1 ms courtesy, and while the client drains its permits back to Redis, the end
    /// of the drain (bounded by `deadline` and drain_cap, once per such release, not a poll), so
    /// that the waiters of other clients the releases woke are first.
    void courtesy(clock::time_point deadline);

    /// Tells every queued thread entry::stopped (the client is being destroyed).
    void stop();

private:
    static constexpr std::chrono::microseconds courtesy_time{1000};
    static constexpr std::chrono::milliseconds drain_cap{50};  // or local_handoff_time, if less
    using turn_state = gate_waiter::turn_state;
    struct waiter {
        std::condition_variable cv;
        long long need = 0;
        turn_state turn = turn_state::waiting;
    };

    entry wait_locked(std::unique_lock<std::mutex>& g, clock::time_point deadline, long long need);

    const handoff_bound bound_;
    std::mutex mu_;
    bool leading_ = false;
    long long leader_need_ = 0;  // the permits the leader waits for
    std::deque<waiter*> queue_;  // on their threads' stacks (each needing leader_need_ or more)
    unsigned passes_ = 0;        // releases in a row that went no further than this client
    clock::time_point since_;    // when the first of them did
    clock::time_point courtesy_until_;
    long long drain_ = 0;            // permits to release through Redis before passing again
    clock::time_point drain_until_;  // and not after this
    clock::time_point last_release_;  // the last hand_over
    clock::duration quiet_{};         // the drain ends after no release for this long (the run's
                                      // longest gap between releases, at least courtesy_time)
    std::condition_variable drained_;  // the leader's courtesy, told the drain ended
    bool stopped_ = false;
};

/// A hold's place at its gate: the gate is the next waiter's once the hold goes, however it
/// goes — its unlock releases it through Redis (release()), its thread exits, a multi_lock
/// releases its parts in one script — unless it was handed on (handed()). Owned by the hold
/// record (registry.hpp).
class gate_place {
public:
    gate_place() noexcept = default;
    explicit gate_place(std::shared_ptr<local_gate> gate) noexcept : gate_(std::move(gate)) {}
    gate_place(gate_place&& other) noexcept : gate_(std::move(other.gate_)) {}
    gate_place& operator=(gate_place&& other) noexcept;
    ~gate_place() { release(); }

    explicit operator bool() const noexcept { return gate_ != nullptr; }
    local_gate& gate() const noexcept { return *gate_; }
    /// The hold went through Redis: the first waiter leads.
    void release() noexcept;
    /// The hold was handed on: the next holder has the place now.
    void handed() noexcept { gate_.reset(); }

private:
    std::shared_ptr<local_gate> gate_;
};

/// A client's gates (local_gate, permit_gate), one per lock its threads have wanted (made on
/// first use, kept while idle so that an uncontended lock() allocates nothing for it, and swept
/// when they pile up).
template <class Gate>
class basic_gate_table {
public:
    explicit basic_gate_table(handoff_bound bound) : bound_(bound) {}

    bool enabled() const noexcept { return bound_.max_passes > 0; }

    std::shared_ptr<Gate> get(const kind_info& kind, std::string_view name) {
        std::lock_guard<std::mutex> g(mu_);
        auto it = gates_.find(key_view{&kind, name});
        if (it != gates_.end()) return it->second;
        if (gates_.size() >= 2 * swept_size_ + 64) sweep();
        auto gate = std::make_shared<Gate>(bound_);
        if (stopped_) gate->stop();
        gates_.emplace(key{&kind, std::string(name)}, gate);
        return gate;
    }

    /// The gate for `name` when one was made (null otherwise): nothing is made.
    std::shared_ptr<Gate> find(const kind_info& kind, std::string_view name) {
        std::lock_guard<std::mutex> g(mu_);
        auto it = gates_.find(key_view{&kind, name});
        return it == gates_.end() ? nullptr : it->second;
    }

    /// Wakes every waiter of every gate (the client is being destroyed); gates made later are
    /// stopped from the start.
    void stop() {
        std::lock_guard<std::mutex> g(mu_);
        stopped_ = true;
        for (auto& entry : gates_) entry.second->stop();
    }

private:
    struct key {
        const kind_info* kind = nullptr;
        std::string name;
    };
    struct key_view {
        const kind_info* kind = nullptr;
        std::string_view name;
    };
    // Ordered by kind, then name; a lookup by key_view allocates nothing.
    struct order {
        using is_transparent = void;
        template <class A, class B>
        bool operator()(const A& a, const B& b) const noexcept {
            if (a.kind != b.kind) return std::less<>()(a.kind, b.kind);
            return std::string_view(a.name) < std::string_view(b.name);
        }
    };

    // Drops the gates no thread holds or waits at: only the table refers to them, and no one
    // can take a new reference without its lock.
    void sweep() {
        for (auto it = gates_.begin(); it != gates_.end();) {
            it = it->second.use_count() == 1 ? gates_.erase(it) : std::next(it);
        }
        swept_size_ = gates_.size();
    }

    const handoff_bound bound_;
    std::mutex mu_;
    std::map<key, std::shared_ptr<Gate>, order> gates_;
    std::size_t swept_size_ = 0;
    bool stopped_ = false;
};

using gate_table = basic_gate_table<local_gate>;
using permit_gate_table = basic_gate_table<permit_gate>;

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void wait_for_turn(std::unique_lock<std::mutex>& g, std::condition_variable& cv,
                              const gate_waiter::turn_state& turn,
                              std::chrono::steady_clock::time_point deadline) {
    while (turn == gate_waiter::turn_state::waiting) {
        if (deadline == std::chrono::steady_clock::time_point::max()) {
            cv.wait(g);
        } else if (cv.wait_until(g, deadline) == std::cv_status::timeout) {
            return;
        }
    }
}

RLOCK_DECL auto local_gate::enter(clock::time_point deadline, passed_hold& pass) -> entry {
    std::unique_lock<std::mutex> g(mu_);
    if (stopped_) return entry::stopped;
    if (state_ == state::idle) {
        state_ = state::leading;
        return entry::lead;
    }
    if (clock::now() >= deadline) return entry::timed_out;
    thread_waiter me;
    queue_.push_back(&me);
    wait_for_turn(g, me.cv, me.turn, deadline);
    switch (me.turn) {
        case turn_state::granted:
            pass = std::move(me.pass);
            return entry::granted;
        case turn_state::promoted:
        case turn_state::freed:  // never told here
            return entry::lead;
        case turn_state::stopped:
            return entry::stopped;
        case turn_state::waiting:
            break;
    }
    dequeue(me);
    return entry::timed_out;
}

RLOCK_DECL auto local_gate::join(gate_waiter& w, bool may_wait) -> entry {
    std::lock_guard<std::mutex> g(mu_);
    if (stopped_) return entry::stopped;
    if (state_ == state::idle) {
        state_ = state::leading;
        return entry::lead;
    }
    if (!may_wait) return entry::timed_out;
    w.turn = turn_state::waiting;
    queue_.push_back(&w);
    return entry::queued;
}

RLOCK_DECL bool local_gate::withdraw(gate_waiter& w) {
    std::lock_guard<std::mutex> g(mu_);
    if (w.turn != turn_state::waiting) return false;
    return dequeue(w);
}

RLOCK_DECL void local_gate::led(bool acquired) {
    std::lock_guard<std::mutex> g(mu_);
    if (acquired) {
        state_ = state::holding;
        passes_ = 0;
        since_ = clock::now();
        return;
    }
    next_leads();
}

RLOCK_DECL bool local_gate::hand_over(passed_hold& pass) {
    std::lock_guard<std::mutex> g(mu_);
    while (may_pass()) {
        gate_waiter* next = queue_.front();
        queue_.pop_front();
        next->pass = std::move(pass);
        next->turn = turn_state::granted;
        if (next->notify()) {
            ++passes_;
            return true;
        }
        pass = std::move(next->pass);  // its client's engine has stopped: the next one
        next->turn = turn_state::stopped;
    }
    return false;
}

RLOCK_DECL void local_gate::stop() {
    std::lock_guard<std::mutex> g(mu_);
    stopped_ = true;
    for (gate_waiter* w : queue_) {
        w->turn = turn_state::stopped;
        (void)w->notify();
    }
    queue_.clear();
}

RLOCK_DECL bool local_gate::may_pass() const {
    return !queue_.empty() && !stopped_ && beside_ == 0 && passes_ < bound_.max_passes &&
           clock::now() - since_ < bound_.max_time;
}

RLOCK_DECL void local_gate::next_leads() noexcept {
    while (!queue_.empty()) {
        gate_waiter* next = queue_.front();
        queue_.pop_front();
        next->turn = turn_state::promoted;
        if (next->notify()) {
            state_ = state::leading;
            return;
        }
        next->turn = turn_state::stopped;  // its client's engine has stopped: the next one
    }
    state_ = state::idle;
}

RLOCK_DECL bool local_gate::dequeue(const gate_waiter& w) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (*it == &w) {
            queue_.erase(it);
            return true;
        }
    }
    return false;
}

RLOCK_DECL auto permit_gate::arrive(clock::time_point deadline, long long need) -> entry {
    std::unique_lock<std::mutex> g(mu_);
    if (stopped_) return entry::stopped;
    if (!leading_ || need < leader_need_) return entry::free;
    return wait_locked(g, deadline, need);
}

RLOCK_DECL auto permit_gate::refused(clock::time_point deadline, long long need) -> entry {
    std::unique_lock<std::mutex> g(mu_);
    if (stopped_) return entry::stopped;
    if (!leading_) {
        leading_ = true;
        leader_need_ = need;
        return entry::lead;
    }
    if (need < leader_need_) return entry::free;
    return wait_locked(g, deadline, need);
}

RLOCK_DECL void permit_gate::led() noexcept {
    std::lock_guard<std::mutex> g(mu_);
    leading_ = false;
    if (queue_.empty()) return;
    waiter* next = queue_.front();
    queue_.pop_front();
    leading_ = true;
    leader_need_ = next->need;
    next->turn = turn_state::promoted;
    next->cv.notify_one();
    for (auto it = queue_.begin(); it != queue_.end();) {
        waiter* w = *it;
        if (w->need >= leader_need_) {
            ++it;
            continue;
        }
        w->turn = turn_state::freed;
        w->cv.notify_one();
        it = queue_.erase(it);
    }
}

RLOCK_DECL long long permit_gate::hand_over(long long n, long long held) {
    std::lock_guard<std::mutex> g(mu_);
    long long left = n;
    const auto now = clock::now();
    bool draining = drain_ > 0 && now < drain_until_ && now - last_release_ < quiet_;
    if (passes_ > 0 || draining) {
        quiet_ = std::max<clock::duration>(
            quiet_, std::min<clock::duration>(now - last_release_, drain_cap));
    } else {
        quiet_ = courtesy_time;  // a run starts
    }
    last_release_ = now;
    const bool within = !draining && passes_ < bound_.max_passes &&
                        (passes_ == 0 || now - since_ < bound_.max_time);
    if (!within && !draining && !queue_.empty()) {
        // The bound cut a run of passes: the permits go to Redis, every one the client holds
        // once, where this client's leader lets other clients' waiters have the first go
        // (courtesy()).
        drain_ = std::max(held, n);
        drain_until_ = now + std::min<clock::duration>(
                                 drain_cap, std::max<clock::duration>(bound_.max_time, courtesy_time));
        draining = true;
    }
    if (draining) {
        drain_ = std::max(0LL, drain_ - n);
        courtesy_until_ = now + courtesy_time;
        drained_.notify_all();  // drained, or the quiet gap starts again
    }
    if (!stopped_ && within) {
        for (auto it = queue_.begin(); it != queue_.end() && left > 0;) {
            waiter* w = *it;
            if (w->need > left) {
                ++it;
                continue;
            }
            left -= w->need;
            w->turn = turn_state::granted;
            w->cv.notify_one();
            it = queue_.erase(it);
        }
    }
    if (left > 0) {
        passes_ = 0;  // through Redis: the next run of passes starts afresh
    } else {
        if (passes_++ == 0) since_ = now;
    }
    return left;
}

RLOCK_DECL void permit_gate::courtesy(clock::time_point deadline) {
    std::unique_lock<std::mutex> g(mu_);
    // Until drained, the releases stop coming (quiet_), drain_cap, or the deadline: each
    // release during the drain starts the quiet gap again.
    for (;;) {
        if (drain_ == 0 || stopped_) break;
        const clock::time_point until =
            std::min({drain_until_, last_release_ + quiet_, deadline});
        if (clock::now() >= until) break;
        (void)drained_.wait_until(g, until);
    }
    const clock::time_point until = std::min(courtesy_until_, deadline);
    g.unlock();
    if (clock::now() < until) std::this_thread::sleep_until(until);
}

RLOCK_DECL void permit_gate::stop() {
    std::lock_guard<std::mutex> g(mu_);
    stopped_ = true;
    drained_.notify_all();
    for (waiter* w : queue_) {
        w->turn = turn_state::stopped;
        w->cv.notify_one();
    }
    queue_.clear();
}

RLOCK_DECL auto permit_gate::wait_locked(std::unique_lock<std::mutex>& g,
                                         clock::time_point deadline, long long need) -> entry {
    if (clock::now() >= deadline) return entry::timed_out;
    waiter me;
    me.need = need;
    queue_.push_back(&me);
    wait_for_turn(g, me.cv, me.turn, deadline);
    switch (me.turn) {
        case turn_state::granted:
            return entry::granted;
        case turn_state::promoted:
            return entry::lead;
        case turn_state::freed:
            return entry::free;
        case turn_state::stopped:
            return entry::stopped;
        case turn_state::waiting:
            break;
    }
    queue_.erase(std::find(queue_.begin(), queue_.end(), &me));
    return entry::timed_out;
}

RLOCK_DECL gate_place& gate_place::operator=(gate_place&& other) noexcept {
    if (this != &other) {
        release();
        gate_ = std::move(other.gate_);
    }
    return *this;
}

RLOCK_DECL void gate_place::release() noexcept {
    if (std::shared_ptr<local_gate> gate = std::move(gate_)) gate->released();
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
