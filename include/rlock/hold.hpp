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

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/redis/random.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/engine.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/errors.hpp"

namespace rlock {

namespace detail {

/// What a hold handle needs of the lock it came from (lock_site<Kind> is one).
class held_site {
public:
    virtual ~held_site() = default;
    /// Releases one level of `h` (lock_site::unlock_hold); `lost_at_last` is set when the last
    /// level found the hold lost (the owner was told).
    virtual void unlock_one(const std::shared_ptr<hold>& h, bool& lost_at_last) const = 0;
    virtual registry& holds() const = 0;
    /// Whether `h` (this site's hold record for the handle) is lost. A lock of several keys
    /// (red_lock, multi_lock) answers for all of them.
    virtual bool is_lost(hold& h) const { return holds().is_lost(h); }
    virtual const std::string& lock_name() const = 0;
    virtual const std::string& server_name() const = 0;
    virtual bool fenced() const = 0;
    /// Runs `task` on the client's engine thread; false once the client is destroyed.
    virtual bool post(unique_callback<> task) const = 0;
};

/// What a lock of several keys (multi_lock) reads of the holds of its parts.
struct hold_access;

/// An unlock's signature.
using unlock_signature = void(std::exception_ptr);

/// An operation a pending handle can cancel.
class cancellable {
public:
    virtual ~cancellable() = default;
    virtual void cancel() noexcept = 0;
};

}  // namespace detail

/// Who holds a reentrant lock taken asynchronously: what a thread is to lock(). An owner that
/// asks again re-enters (one more level, Redisson's count); another owner waits. Copies are the
/// same owner. In Redis the holder is "<client id>:<number>", as for a thread, and numbers
/// never collide with threads'. An owner's operations must not overlap (as a thread's cannot):
/// await one before starting the next. Non-reentrant kinds take an owner too, and refuse its
/// second acquire with would_deadlock; without one, each acquire is its own owner.
class owner {
public:
    owner() noexcept : number_(detail::next_owner_number()) {}
    std::uint64_t number() const noexcept { return number_; }
    friend bool operator==(const owner& a, const owner& b) noexcept { return a.number_ == b.number_; }
    friend bool operator!=(const owner& a, const owner& b) noexcept { return !(a == b); }

private:
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
    hold() noexcept = default;
    hold(std::shared_ptr<const detail::held_site> site, std::shared_ptr<detail::hold> h) noexcept
        : site_(std::move(site)), h_(std::move(h)) {}
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
    template <class Token>
    auto async_unlock(Token&& token) {
        if (!owns_lock()) {
            throw error(errc::not_owner, h_ ? h_->name : "", h_ ? site_->server_name() : "",
                        "unlock of an rlock::hold that holds nothing");
        }
        return detail::initiate<detail::unlock_signature>(
            std::forward<Token>(token),
            [held = std::move(*this)](detail::completion_t<detail::unlock_signature> done) mutable {
                held.post_unlock(std::move(done));
            });
    }

    /// True when the hold is lost: the watchdog found it gone, or its lease ran out by this
    /// client's clock; after unlock, whether unlock found it lost. False for an empty handle.
    /// Sends nothing.
    [[nodiscard]] bool lost() const;

    /// The fencing token of this hold (lock_options::fencing). Throws `error`:
    /// invalid_argument when fencing is off for the lock, not_owner for an empty handle.
    [[nodiscard]] std::uint64_t fencing_token() const;

    /// The hold's id, as on_lock_lost is told it (lost_hold::hold_id); shared by the levels of
    /// one owner's hold. Throws `error` (not_owner) for an empty handle.
    [[nodiscard]] std::uint64_t hold_id() const {
        check("hold_id");
        return h_->id;
    }

    /// The lock's name; empty for an empty handle.
    const std::string& name() const noexcept {
        static const std::string none;
        return h_ ? h_->name : none;
    }

private:
    void post_unlock(detail::completion_t<detail::unlock_signature> done);

    void check(const char* what) const;
    void release_quietly() noexcept;

    friend struct detail::hold_access;
    std::shared_ptr<const detail::held_site> site_;
    std::shared_ptr<detail::hold> h_;
    bool unlocked_ = false;
    bool lost_at_unlock_ = false;
};

namespace detail {
struct hold_access {
    static const held_site& site(const rlock::hold& h) { return *h.site_; }
    static const std::shared_ptr<hold>& record(const rlock::hold& h) { return h.h_; }
};
}  // namespace detail

/// The cancel handle of an asynchronous call made with a callback. Copyable; outliving the
/// operation is harmless.
class pending {
public:
    pending() noexcept = default;
    explicit pending(std::weak_ptr<detail::cancellable> op) noexcept : op_(std::move(op)) {}

    /// Asks the operation to stop. A pending acquire then completes, once, with `error`
    /// (operation_aborted) and leaves nothing behind: no queue entry, no subscription, no key.
    /// An operation that has completed, or whose completion is under way, is not affected (its
    /// handler gets what it got). Never blocks, never throws.
    void cancel() const noexcept;

private:
    std::weak_ptr<detail::cancellable> op_;
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
        throw error(errc::not_owner, h_ ? h_->name : "", h_ ? site_->server_name() : "",
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
    if (!site_->fenced()) {
        throw error(errc::invalid_argument, h_->name, site_->server_name(),
                    "fencing is off for this lock (lock_options::fencing)");
    }
    return site_->holds().with([&] { return h_->fencing; });
}

RLOCK_DECL void hold::post_unlock(detail::completion_t<detail::unlock_signature> done) {
    if (!owns_lock()) return;
    unlocked_ = true;  // the task's from here
    const bool posted = site_->post([site = site_, h = h_, done = std::move(done)]() mutable {
        bool lost = false;
        site->unlock_one(h, lost);  // throws only for an empty handle
        done(nullptr);
    });
    if (!posted) {
        unlocked_ = false;
        release_quietly();
        throw error(errc::connection_failed, h_->name, site_->server_name(),
                    "async_unlock after the client was destroyed (the level was released here)");
    }
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

RLOCK_DECL void pending::cancel() const noexcept {
    if (std::shared_ptr<detail::cancellable> op = op_.lock()) op->cancel();
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
