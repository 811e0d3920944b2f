// event_sink: where the core tells a client's listener (client_options::listener, events.hpp)
// what its locks do. Without a listener each call is one test of a null pointer: no clock is
// read and no event is made. What a listener throws is dropped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "rlock/config.hpp"
#include "rlock/errors.hpp"
#include "rlock/events.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

/// A wait as its call set it: its deadline on steady_clock (time_point::max(): for ever), and
/// when the call began, read once with the deadline counted from it. A listener's `wait` is
/// measured from `began`, so a wait that ran out is never told shorter than the one asked for,
/// however late the acquisition got to its start (a preempted thread).
struct wait_call {
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::time_point began;
};

/// What an acquisition has to tell when it ends: when it began (only stamped when a listener
/// is set) and how many tries it sent.
struct wait_story {
    std::chrono::steady_clock::time_point began{};
    unsigned tries = 0;
};

class event_sink {
public:
    using clock = std::chrono::steady_clock;

    event_sink() noexcept = default;
    explicit event_sink(std::shared_ptr<lock_listener> listener) noexcept : l_(std::move(listener)) {}

    [[nodiscard]] bool on() const noexcept { return l_ != nullptr; }
    /// Now, when a listener will want it; else the epoch (never read).
    [[nodiscard]] clock::time_point stamp() const noexcept { return l_ ? clock::now() : clock::time_point{}; }
    /// The story of a wait its call began at `began` (kept when a listener will want it).
    [[nodiscard]] wait_story begin(clock::time_point began) const noexcept {
        return wait_story{l_ ? began : clock::time_point{}, 0};
    }

    void acquired(std::string_view kind, std::string_view lock, std::uint64_t hold_id, const wait_story& s,
                  bool handed_locally = false) const noexcept;
    /// `taken`: the hold's stamp when it was acquired (the epoch: not known, told as 0).
    void released(std::string_view kind, std::string_view lock, std::uint64_t hold_id, clock::time_point taken,
                  bool handed_on = false) const noexcept;
    void renewed(std::string_view server, std::size_t holds, clock::time_point sent) const noexcept;
    void wait_ended(std::string_view kind, std::string_view lock, const wait_story& s,
                    bool cancelled) const noexcept;

    void notice(std::string_view server, std::string_view message) const noexcept;

    /// The client's on_lock_lost as the core calls it: with a listener, each report is first
    /// told as an event (a refused renewal as renewal_refused, any other as lost), then to
    /// `handler`. Every report the core makes goes through on_lock_lost, so this is the one
    /// place losses become events.
    static lock_lost_handler telling(lock_lost_handler handler, std::shared_ptr<lock_listener> listener);

private:
    template <class F>
    static void tell(F&& f) noexcept {
        try {
            f();
        } catch (...) {  // a listener's failure is its own
        }
    }
    static std::chrono::nanoseconds since(clock::time_point t) noexcept;

    std::shared_ptr<lock_listener> l_;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void event_sink::acquired(std::string_view kind, std::string_view lock,
                                     std::uint64_t hold_id, const wait_story& s,
                                     bool handed_locally) const noexcept {
    if (!l_) return;
    tell([&] {
        l_->acquired(acquired_event{lock, kind, hold_id, since(s.began), s.tries, handed_locally});
    });
}

RLOCK_DECL void event_sink::released(std::string_view kind, std::string_view lock,
                                     std::uint64_t hold_id, clock::time_point taken,
                                     bool handed_on) const noexcept {
    if (!l_) return;
    tell([&] { l_->released(released_event{lock, kind, hold_id, since(taken), handed_on}); });
}

RLOCK_DECL void event_sink::renewed(std::string_view server, std::size_t holds,
                                    clock::time_point sent) const noexcept {
    if (!l_) return;
    tell([&] { l_->renewed(renewed_event{server, holds, since(sent)}); });
}

RLOCK_DECL void event_sink::wait_ended(std::string_view kind, std::string_view lock,
                                       const wait_story& s, bool cancelled) const noexcept {
    if (!l_) return;
    tell([&] { l_->wait_ended(wait_ended_event{lock, kind, since(s.began), s.tries, cancelled}); });
}

RLOCK_DECL void event_sink::notice(std::string_view server,
                                   std::string_view message) const noexcept {
    if (!l_) return;
    tell([&] { l_->notice(notice_event{server, message}); });
}

RLOCK_DECL lock_lost_handler event_sink::telling(lock_lost_handler handler,
                                                 std::shared_ptr<lock_listener> listener) {
    if (!listener) return handler;
    return lock_lost_handler([handler = std::move(handler), l = std::move(listener)](
                                 const lost_hold& h, const error& reason) {
        tell([&] {
            if (h.refused) {
                l->renewal_refused(renewal_refused_event{h.lock, h.hold_id, reason});
            } else {
                l->lost(lost_event{h.lock, h.hold_id, reason});
            }
        });
        if (handler) handler(h, reason);
    });
}

RLOCK_DECL std::chrono::nanoseconds event_sink::since(clock::time_point t) noexcept {
    if (t == clock::time_point{}) return std::chrono::nanoseconds(0);
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
