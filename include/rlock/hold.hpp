// The vocabulary of the asynchronous forms every lock type has (async_lock, async_try_lock,
// async_try_lock_for, async_try_lock_until): rlock::hold, the handle that owns an async hold;
// rlock::owner, who holds a reentrant lock when no thread does; rlock::pending, the cancel
// handle of a callback form; rlock::use_future, the token that asks for a std::future.
//
//     rlock::mutex m(redis, "orders");
//     m.async_lock([](std::exception_ptr e, rlock::hold h) {   // runs on the client's engine
//         if (e) return;                                       // thread, never inside async_lock
//         ...                                                  // h owns the lock
//     });                                                      // released when h is destroyed
//     std::future<rlock::hold> f = m.async_try_lock_for(2s, rlock::use_future);
//     rlock::hold h = co_await m.async_lock(asio::use_awaitable);   // with <rlock/asio.hpp>
//
// docs/api.md, "Asynchronous acquisition", has the whole model.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/errors.hpp"

namespace rlock {

/// Who holds a reentrant lock taken asynchronously: what a thread is to lock(). An owner that
/// asks again re-enters (one more level, Redisson's count); another owner waits. Copies are the
/// same owner. In Redis the holder is "<client id>:<number>", as for a thread, and numbers
/// never collide with threads'. An owner's operations must not overlap (as a thread's cannot):
/// await one before starting the next. Non-reentrant kinds take an owner too, and refuse its
/// second acquire with would_deadlock; without one, each acquire is its own owner.
class owner {
public:
    owner() noexcept : number_(next_number()) {}
    std::uint64_t number() const noexcept { return number_; }
    friend bool operator==(const owner& a, const owner& b) noexcept { return a.number_ == b.number_; }
    friend bool operator!=(const owner& a, const owner& b) noexcept { return !(a == b); }

private:
    // One sequence for owners and threads (a thread's number is drawn as an owner's): never 0,
    // never reused within the process.
    static std::uint64_t next_number() noexcept {
        static std::atomic<std::uint64_t> next{1};
        return next.fetch_add(1, std::memory_order_relaxed);
    }

    std::uint64_t number_;
};

/// One level of a lock held through an asynchronous acquire, owned by this handle rather than by
/// a thread: movable, unlockable from any thread or coroutine, and released when destroyed (a
/// guard). An empty hold (default-made, moved from, or what a try form gives when the wait ran
/// out) is false.
///
/// Watched holds (no lease given) are renewed by the client's watchdog until unlock, like a
/// thread's; a loss is told through on_lock_lost and lost(), never thrown.
class hold {
public:
    /// rlock's own, not for users: what a handle needs of the lock it came from (below), and the
    /// client's record of the hold (rlock/detail/runtime/registry.hpp).
    class site;
    struct record;

    hold() noexcept = default;
    /// rlock's lock types make holds.
    hold(std::shared_ptr<const site> s, std::shared_ptr<record> h) noexcept
        : site_(std::move(s)), h_(std::move(h)) {}
    hold(hold&& other) noexcept
        : site_(std::move(other.site_)), h_(std::move(other.h_)),
          unlocked_(std::exchange(other.unlocked_, false)),
          lost_at_unlock_(std::exchange(other.lost_at_unlock_, false)) {}
    hold& operator=(hold&& other) noexcept;
    hold(const hold&) = delete;
    hold& operator=(const hold&) = delete;
    /// Unlocks if still held (one round trip, on the destroying thread); never throws.
    ~hold() { release_quietly(); }

    /// True while this handle holds its level (taken and not unlocked).
    [[nodiscard]] bool owns_lock() const noexcept { return h_ && !unlocked_; }
    explicit operator bool() const noexcept { return owns_lock(); }

    /// Releases this level (the last level of the lock deletes the key and publishes the
    /// unlock message); one round trip on the calling thread, after which no renewal of it
    /// reaches Redis. Throws `error` (not_owner) only for a handle that holds nothing; a lost
    /// hold or an unreachable Redis is told through on_lock_lost and lost(), never thrown.
    void unlock();

    /// Releases this level on the client's engine thread, without blocking the caller, and
    /// completes `token` with `void(std::exception_ptr)`: a callback (the call returns nothing),
    /// rlock::use_future (a std::future<void>), or with <rlock/asio.hpp> an Asio token. The
    /// level passes to the operation at once: this handle is empty when the call returns (an
    /// Asio deferred operation that is never launched releases it when destroyed). As unlock(),
    /// the completion has no error for a lost hold or an unreachable Redis (told through
    /// on_lock_lost). Throws `error`: not_owner for an empty handle; connection_failed when the
    /// client is destroyed (the level is then released, blocking, before the throw).
    ///
    /// Defined with the asynchronous forms (every lock type's header has it).
    template <class Token>
    auto async_unlock(Token&& token);

    /// True when the hold is lost: the watchdog found it gone, or its lease ran out by this
    /// client's clock; after unlock, whether unlock found it lost. False for an empty handle.
    /// Sends nothing.
    [[nodiscard]] bool lost() const;

    /// The fencing token of this hold (lock_options::fencing). Throws `error`:
    /// invalid_argument when fencing is off for the lock, not_owner for an empty handle.
    [[nodiscard]] std::uint64_t fencing_token() const;

    /// The hold's id, as on_lock_lost is told it (lost_hold::hold_id); shared by the levels of
    /// one owner's hold. Throws `error` (not_owner) for an empty handle.
    [[nodiscard]] std::uint64_t hold_id() const;

    /// The lock's name; empty for an empty handle.
    const std::string& name() const noexcept;

private:
    template <class Done>
    void post_unlock(Done done);

    void check(const char* what) const;
    void release_quietly() noexcept;

    std::shared_ptr<const site> site_;
    std::shared_ptr<record> h_;
    bool unlocked_ = false;
    bool lost_at_unlock_ = false;
};

/// What an rlock::hold needs of the lock it came from. rlock's lock types implement it
/// (rlock/detail/acquisition); it is not for users, and may change in any release.
class hold::site {
public:
    virtual ~site() = default;
    /// Releases one level of `h`; `lost_at_last` is set when the last level found the hold
    /// lost (the owner was told).
    virtual void unlock_one(const std::shared_ptr<record>& h, bool& lost_at_last) const = 0;
    /// Whether `h` is lost. A lock of several keys (red_lock, multi_lock) answers for all of them.
    virtual bool is_lost(record& h) const = 0;
    /// What hold's name(), hold_id() and fencing_token() return for `h`.
    virtual const std::string& name_of(const record& h) const noexcept = 0;
    virtual std::uint64_t id_of(const record& h) const noexcept = 0;
    virtual std::uint64_t fencing_token_of(const record& h) const = 0;
    /// The server as messages name it.
    virtual const std::string& server_name() const = 0;

    /// The site and the record of `h` (rlock's locks of several keys read their parts' holds).
    static const site& of(const hold& h) noexcept { return *h.site_; }
    static const std::shared_ptr<record>& record_of(const hold& h) noexcept { return h.h_; }

protected:
    site() = default;
    site(const site&) = default;
    site& operator=(const site&) = default;
};

/// The cancel handle of an asynchronous call made with a callback. Copyable; outliving the
/// operation is harmless.
class pending {
public:
    /// rlock's own, not for users: an operation that can be cancelled (its asynchronous acquires).
    class operation {
    public:
        virtual ~operation() = default;
        virtual void cancel() noexcept = 0;

    protected:
        operation() = default;
        operation(const operation&) = default;
        operation& operator=(const operation&) = default;
    };

    pending() noexcept = default;
    explicit pending(std::weak_ptr<operation> op) noexcept : op_(std::move(op)) {}

    /// Asks the operation to stop. A pending acquire then completes, once, with `error`
    /// (operation_aborted) and leaves nothing behind: no queue entry, no subscription, no key.
    /// An operation that has completed, or whose completion is under way, is not affected (its
    /// handler gets what it got). Never blocks, never throws.
    void cancel() const noexcept {
        if (std::shared_ptr<operation> op = op_.lock()) op->cancel();
    }

private:
    std::weak_ptr<operation> op_;
};

/// The token that makes an async call return a std::future<rlock::hold> (an empty hold when a
/// try form's wait ran out; the error, rethrown by get(), when it failed).
struct use_future_t {};
inline constexpr use_future_t use_future{};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL hold& hold::operator=(hold&& other) noexcept {
    if (this != &other) {
        release_quietly();
        site_ = std::move(other.site_);
        h_ = std::move(other.h_);
        unlocked_ = std::exchange(other.unlocked_, false);
        lost_at_unlock_ = std::exchange(other.lost_at_unlock_, false);
    }
    return *this;
}

RLOCK_DECL void hold::unlock() {
    if (!owns_lock()) {
        throw error(errc::not_owner, h_ ? site_->name_of(*h_) : "", h_ ? site_->server_name() : "",
                    "unlock of an rlock::hold that holds nothing");
    }
    unlocked_ = true;
    site_->unlock_one(h_, lost_at_unlock_);
}

RLOCK_DECL bool hold::lost() const {
    if (!h_) return false;
    if (unlocked_) return lost_at_unlock_;
    return site_->is_lost(*h_);
}

RLOCK_DECL std::uint64_t hold::fencing_token() const {
    check("fencing_token");
    return site_->fencing_token_of(*h_);
}

RLOCK_DECL std::uint64_t hold::hold_id() const {
    check("hold_id");
    return site_->id_of(*h_);
}

RLOCK_DECL const std::string& hold::name() const noexcept {
    static const std::string none;
    return h_ ? site_->name_of(*h_) : none;
}

RLOCK_DECL void hold::check(const char* what) const {
    if (!h_) throw error(errc::not_owner, "", "", std::string(what) + " of an empty rlock::hold");
}

RLOCK_DECL void hold::release_quietly() noexcept {
    if (!owns_lock()) return;
    try {
        unlock();
    } catch (...) {  // unlock throws only for an empty handle; a loss was told
    }
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
