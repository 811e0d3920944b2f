// rlock/asio.hpp — Asio completion tokens for every rlock asynchronous call.
//
//     #include <rlock/asio.hpp>
//
//     asio::awaitable<void> serve(rlock::mutex& m) {
//         rlock::hold h = co_await m.async_lock(asio::use_awaitable);   // C++20
//         ...                                                            // h owns the lock
//     }                                                                  // released with h
//
//     m.async_try_lock_for(2s, asio::bind_executor(strand, [](std::exception_ptr e, rlock::hold h) {
//         ...                                                // runs on `strand`
//     }));
//
// With this header an async call (async_lock, async_try_lock, async_try_lock_for,
// async_try_lock_until, the read side's *_shared forms, and hold::async_unlock) accepts any
// Asio completion token for its signature, `void(std::exception_ptr, rlock::hold)` (an acquire)
// or `void(std::exception_ptr)` (an unlock): use_awaitable, use_future,
// deferred, as_tuple(...), a handler bound to an executor (bind_executor) or to a cancellation
// slot (bind_cancellation_slot). A plain callable that is not bound to an executor keeps the
// plain rlock form (it runs on the client's engine thread and the call returns an
// rlock::pending).
//
// Where the completion runs: on the handler's associated executor (for use_awaitable, the
// coroutine's), through asio::dispatch from the client's engine thread, so never inside the
// initiating call. While the operation is pending it counts as work on that executor, so an
// io_context::run() does not return under it. A handler with no associated executor (the
// system executor) runs on the engine thread.
//
// Cancellation: an operation whose handler has a connected cancellation slot is cancelled by
// any emitted cancellation type (terminal, partial or total: nothing has happened that
// would need undoing by the caller); it completes with `rlock::error` (operation_aborted),
// leaving nothing behind. An operation that has already acquired completes with its hold.
//
// Errors arrive as std::exception_ptr (an rlock::error naming the lock, the server and the
// cause), which use_awaitable and use_future rethrow. Include this header in every translation
// unit that gives rlock an Asio token. Standalone Asio by default (Debian: libasio-dev); define
// RLOCK_USE_BOOST_ASIO before including it for Boost.Asio.
#pragma once

#include <exception>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(RLOCK_USE_BOOST_ASIO)
#include <boost/asio.hpp>
namespace rlock::detail::asio_ns {
using namespace ::boost::asio;  // NOLINT(google-build-using-namespace): one spelling for both
}  // namespace rlock::detail::asio_ns
#else
#include <asio.hpp>
namespace rlock::detail::asio_ns {
using namespace ::asio;  // NOLINT(google-build-using-namespace): one spelling for both
}  // namespace rlock::detail::asio_ns
#endif

#include "rlock/detail/completion.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// Which tokens go through Asio: everything that is not a plain callback of the operation's
/// signature (nor rlock::use_future), and callbacks bound to an executor or a cancellation slot.
template <class T, class Signature>
struct is_asio_token : std::bool_constant<!is_handler_for<T, Signature>::value && !std::is_same_v<T, use_future_t>> {};
template <class T, class Executor, class Signature>
struct is_asio_token<asio_ns::executor_binder<T, Executor>, Signature> : std::true_type {};
template <class T, class Slot, class Signature>
struct is_asio_token<asio_ns::cancellation_slot_binder<T, Slot>, Signature> : std::true_type {};

template <class Token, class... R>
struct token_adapter<Token, void(std::exception_ptr, R...),
                     std::enable_if_t<is_asio_token<Token, void(std::exception_ptr, R...)>::value>> {
    static constexpr bool defined = true;
    using signature = void(std::exception_ptr, R...);

    template <class T, class Start>
    static auto initiate(T&& token, Start&& start) {
        return asio_ns::async_initiate<T, signature>(
            [](auto handler, auto begin) {
                auto slot = asio_ns::get_associated_cancellation_slot(handler);
                auto work = asio_ns::make_work_guard(asio_ns::get_associated_executor(handler));
                completion_t<signature> done(
                    [h = std::move(handler), w = std::move(work)](std::exception_ptr e, R... got) mutable {
                        auto ex = asio_ns::get_associated_executor(h);
                        asio_ns::dispatch(ex, [h = std::move(h), e = std::move(e),
                                               got = std::make_tuple(std::move(got)...)]() mutable {
                            std::apply([&](auto&&... g) { std::move(h)(std::move(e), std::move(g)...); },
                                       std::move(got));
                        });
                        w.reset();
                    });
                if constexpr (std::is_same_v<decltype(begin(std::move(done))), rlock::pending>) {
                    rlock::pending p = begin(std::move(done));
                    if (slot.is_connected()) {
                        slot.assign([p](asio_ns::cancellation_type) { p.cancel(); });
                    }
                } else {
                    begin(std::move(done));
                }
            },
            token, std::forward<Start>(start));
    }
};

}  // namespace rlock::detail
