// detail::held_site: rlock::hold::site (hold.hpp) as the client runtime provides it — the
// client's registry and engine behind a hold handle — and rlock::hold's asynchronous unlock,
// which completes through the engine (completion.hpp).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/detail/runtime/completion.hpp"
#include "rlock/detail/runtime/engine.hpp"
#include "rlock/detail/runtime/registry.hpp"
#include "rlock/errors.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// An unlock's signature.
using unlock_signature = void(std::exception_ptr);

/// An operation a pending handle can cancel.
using cancellable = rlock::pending::operation;

/// What a hold handle needs of the lock it came from (lock_site<Kind> is one), with the
/// client's registry and engine behind it.
class held_site : public rlock::hold::site {
public:
    virtual registry& holds() const = 0;
    /// A lock of several keys (red_lock, multi_lock) answers for all of them.
    bool is_lost(hold& h) const override { return holds().is_lost(h); }
    virtual const std::string& lock_name() const = 0;
    virtual bool fenced() const = 0;
    /// Runs `task` on the client's engine thread; false once the client is destroyed.
    virtual bool post(unique_callback<> task) const = 0;

    const std::string& name_of(const hold& h) const noexcept final { return h.name; }
    std::uint64_t id_of(const hold& h) const noexcept final { return h.id; }
    std::uint64_t fencing_token_of(const hold& h) const final {
        if (!fenced()) {
            throw error(errc::invalid_argument, h.name, server_name(),
                        "fencing is off for this lock (lock_options::fencing)");
        }
        return holds().with([&] { return h.fencing; });
    }
};

/// What a lock of several keys (multi_lock) reads of the holds of its parts.
struct hold_access {
    static const held_site& site(const rlock::hold& h) noexcept {
        return static_cast<const held_site&>(rlock::hold::site::of(h));  // rlock's sites all are
    }
    static const std::shared_ptr<hold>& record(const rlock::hold& h) noexcept {
        return rlock::hold::site::record_of(h);
    }
};

}  // namespace rlock::detail

namespace rlock {

template <class Token>
auto hold::async_unlock(Token&& token) {
    if (!owns_lock()) {
        throw error(errc::not_owner, h_ ? site_->name_of(*h_) : "", h_ ? site_->server_name() : "",
                    "unlock of an rlock::hold that holds nothing");
    }
    return detail::initiate<detail::unlock_signature>(
        std::forward<Token>(token),
        [held = std::move(*this)](detail::completion_t<detail::unlock_signature> done) mutable {
            held.post_unlock(std::move(done));
        });
}

template <class Done>
void hold::post_unlock(Done done) {
    if (!owns_lock()) return;
    unlocked_ = true;  // the task's from here
    const auto& runtime = static_cast<const detail::held_site&>(*site_);
    const bool posted = runtime.post([site = site_, h = h_, done = std::move(done)]() mutable {
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

}  // namespace rlock
