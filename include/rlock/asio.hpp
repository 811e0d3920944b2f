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
// Destruction in either order: an io_context may be destroyed before or after the rlock::client
// whose operations complete on it. When the io_context goes first, the operations still pending
// on it are cancelled and their handlers destroyed without being called (a suspended
// coroutine's frame with them, releasing the holds it owns), as Asio does with its own pending
// handlers; the client's later destruction completes nothing there. When the client goes first,
// its pending operations complete with connection_failed on their executors as usual.
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

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(RLOCK_USE_BOOST_ASIO)
#include <boost/asio.hpp>
namespace rlock::detail::asio_ns {
using namespace ::boost::asio;  // NOLINT(google-build-using-namespace): one spelling for both
}  // namespace rlock::detail::asio_ns
// asio::deferred: in asio:: from 1.24 (Boost 1.80), in asio::experimental:: before.
#if BOOST_ASIO_VERSION >= 102400
#define RLOCK_ASIO_DEFERRED_T ::boost::asio::deferred_t
#elif __has_include(<boost/asio/experimental/deferred.hpp>)
#include <boost/asio/experimental/deferred.hpp>
#define RLOCK_ASIO_DEFERRED_T ::boost::asio::experimental::deferred_t
#endif
#else
#include <asio.hpp>
namespace rlock::detail::asio_ns {
using namespace ::asio;  // NOLINT(google-build-using-namespace): one spelling for both
}  // namespace rlock::detail::asio_ns
#if ASIO_VERSION >= 102400
#define RLOCK_ASIO_DEFERRED_T ::asio::deferred_t
#elif __has_include(<asio/experimental/deferred.hpp>)
#include <asio/experimental/deferred.hpp>
#define RLOCK_ASIO_DEFERRED_T ::asio::experimental::deferred_t
#endif
#endif

#include "rlock/detail/runtime/completion.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

/// Which tokens go through Asio: everything that is not a plain callback of the operation's
/// signature (nor rlock::use_future), and callbacks with an executor of their own (bound with
/// bind_executor, or a handler class naming one: executor_type and get_executor()) or bound to
/// a cancellation slot.
template <class T, class Signature>
struct is_asio_token
    : std::bool_constant<(!is_handler_for<T, Signature>::value && !std::is_same_v<T, use_future_t>) ||
                         !std::is_same_v<asio_ns::associated_executor_t<T>, asio_ns::system_executor>> {};
template <class T, class Executor, class Signature>
struct is_asio_token<asio_ns::executor_binder<T, Executor>, Signature> : std::true_type {};
template <class T, class Slot, class Signature>
struct is_asio_token<asio_ns::cancellation_slot_binder<T, Slot>, Signature> : std::true_type {};
#ifdef RLOCK_ASIO_DEFERRED_T
// Callable with one argument (it takes a token): an unlock's callback, had it not been named.
template <class Signature>
struct is_asio_token<RLOCK_ASIO_DEFERRED_T, Signature> : std::true_type {};
#undef RLOCK_ASIO_DEFERRED_T
#endif

/// An operation whose handler is bound to an execution context (an io_context): told when that
/// context shuts down.
class context_bound {
public:
    virtual ~context_bound() = default;
    /// The context is shutting down (its destructor runs): the handler and its work guard are
    /// destroyed without being called, as Asio does with the handlers it queues, and the rlock
    /// operation is cancelled. Its completion, later on the client's engine thread, finds no
    /// handler and does nothing.
    virtual void context_gone() noexcept = 0;
};

/// The Asio service that lets an io_context and an rlock::client be destroyed in either order:
/// registered in each context an rlock operation completes on, it tells the operations still
/// pending there when the context shuts down, before the context is freed. Without it a client
/// destroyed after the io_context completed its pending waits on the freed context.
class context_watch final : public asio_ns::execution_context::service {
public:
    using key_type = context_watch;
    // Asio names it so; its constructor does nothing (declared without noexcept).
    static inline asio_ns::execution_context::id id;  // NOLINT(readability-identifier-naming,cert-err58-cpp)

    explicit context_watch(asio_ns::execution_context& ctx) : asio_ns::execution_context::service(ctx) {}

    /// Watches `op` until it completes (a weak reference). False, with `op` not watched, when
    /// the context is shutting down already: the caller completes nothing there.
    bool watch(const std::shared_ptr<context_bound>& op) {
        std::lock_guard<std::mutex> g(mu_);
        if (shut_) return false;
        // Forget completed operations now and then, so the list stays as long as what is
        // pending.
        if (ops_.size() >= 2 * live_at_prune_ + 16) {
            ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [](const auto& w) { return w.expired(); }),
                       ops_.end());
            live_at_prune_ = ops_.size();
        }
        ops_.push_back(op);
        return true;
    }

private:
    void shutdown() override {
        std::vector<std::shared_ptr<context_bound>> pending;
        {
            std::lock_guard<std::mutex> g(mu_);
            shut_ = true;
            for (auto& w : ops_) {
                if (auto op = w.lock()) pending.push_back(std::move(op));
            }
            ops_.clear();
        }
        for (auto& op : pending) op->context_gone();
    }

    std::mutex mu_;
    bool shut_ = false;
    std::size_t live_at_prune_ = 0;
    std::vector<std::weak_ptr<context_bound>> ops_;
};

/// One operation's Asio handler and the work it counts on the handler's executor, shared by
/// the completion (on the client's engine thread) and the context_watch (on the thread that
/// destroys the io_context): whichever comes first takes them, under `mu_`, and the other finds
/// nothing. The completion dispatches while holding `mu_`, so a context cannot finish shutting
/// down (and be freed) in the middle of a dispatch to it.
template <class Handler, class Work, class... R>
class bound_handler final : public context_bound {
public:
    bound_handler(Handler h, Work w) : handler_(std::move(h)), work_(std::move(w)) {}

    /// The operation's cancel handle, once it has started. Cancelled at once when the context
    /// went meanwhile (context_gone found none to cancel); a completed operation ignores it.
    void set_pending(const rlock::pending& p) {
        bool gone = false;
        {
            std::lock_guard<std::mutex> g(mu_);
            pending_ = p;
            gone = !handler_;
        }
        if (gone) p.cancel();
    }

    void complete(std::exception_ptr e, R... got) {
        std::lock_guard<std::mutex> g(mu_);
        if (!handler_) return;  // the context is gone
        auto ex = asio_ns::get_associated_executor(*handler_);
        asio_ns::dispatch(ex, [h = std::move(*handler_), e = std::move(e),
                               got = std::make_tuple(std::move(got)...)]() mutable {
            // A result not delivered (this dropped unrun with its context) gives back what it
            // owns (owned_result); one delivered is the handler's.
            std::apply([&](auto&... g) { std::move(h)(std::move(e), deliver(g)...); }, got);
        });
        handler_.reset();
        work_.reset();
    }

    /// The operation could not start: its initiation threw (run lazily by a token such as
    /// use_awaitable, inside the coroutine's suspension, after the client was destroyed, say).
    /// The handler is told `e` with empty results, posted: never run inside the initiation.
    void fail_to_start(std::exception_ptr e) {
        std::lock_guard<std::mutex> g(mu_);
        if (!handler_) return;  // the context is gone
        auto ex = asio_ns::get_associated_executor(*handler_);
        asio_ns::post(ex, [h = std::move(*handler_), e = std::move(e)]() mutable {
            std::tuple<R...> none;
            std::apply([&](auto&... g) { std::move(h)(std::move(e), deliver(g)...); }, none);
        });
        handler_.reset();
        work_.reset();
    }

    void context_gone() noexcept override {
        std::optional<Handler> handler;
        rlock::pending p;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!handler_) return;
            handler.emplace(std::move(*handler_));
            handler_.reset();
            work_.reset();
            p = pending_;
        }
        p.cancel();
        // Destroyed here, outside the lock: a coroutine frame it owns may hold an rlock::hold,
        // whose destructor unlocks.
        handler.reset();
    }

private:
    std::mutex mu_;
    std::optional<Handler> handler_;
    std::optional<Work> work_;
    rlock::pending pending_;
};

/// Where an Asio cancellation slot's handler finds the operation to cancel: connected before the
/// operation starts (a cancellation emitted from then on applies, as Asio's own operations do),
/// given the operation's cancel handle once it has started; a cancellation that came first is
/// applied then.
class slot_cancel {
public:
    void emitted() {
        rlock::pending p;
        {
            std::lock_guard<std::mutex> g(mu_);
            asked_ = true;
            if (!started_) return;
            p = p_;
        }
        p.cancel();
    }
    void started(const rlock::pending& p) {
        bool asked = false;
        {
            std::lock_guard<std::mutex> g(mu_);
            p_ = p;
            started_ = true;
            asked = asked_;
        }
        if (asked) p.cancel();
    }

private:
    std::mutex mu_;
    rlock::pending p_;
    bool started_ = false;
    bool asked_ = false;
};

template <class Executor, class = void>
struct has_context_member : std::false_type {};
template <class Executor>
struct has_context_member<Executor, std::void_t<decltype(std::declval<const Executor&>().context())>>
    : std::true_type {};

/// The execution context of `ex`, when it can tell: by the standard query (io_context's
/// executor, strand<>, any_io_executor) or, for the executors from before it
/// (io_context::strand, the polymorphic asio::executor), by their context().
template <class Executor>
asio_ns::execution_context* context_of(const Executor& ex) {
    if constexpr (asio_ns::can_query<const Executor&, asio_ns::execution::context_t>::value) {
        return &asio_ns::query(ex, asio_ns::execution::context);
    } else if constexpr (has_context_member<Executor>::value) {
        return &ex.context();
    } else {
        return nullptr;
    }
}

template <class Token, class... R>
struct token_adapter<Token, void(std::exception_ptr, R...),
                     std::enable_if_t<is_asio_token<Token, handler_signature_t<void(std::exception_ptr, R...)>>::value>> {
    static constexpr bool defined = true;
    using signature = handler_signature_t<void(std::exception_ptr, R...)>;

    template <class T, class Start>
    static auto initiate(T&& token, Start&& start) {
        return asio_ns::async_initiate<T, signature>(
            [](auto handler, auto begin) {
                auto slot = asio_ns::get_associated_cancellation_slot(handler);
                const auto ex = asio_ns::get_associated_executor(handler);
                auto work = asio_ns::make_work_guard(ex);
                using bound = bound_handler<decltype(handler), decltype(work), R...>;
                auto op = std::make_shared<bound>(std::move(handler), std::move(work));
                asio_ns::execution_context* ctx = context_of(ex);
                // A context already shutting down gets no completion: the operation is
                // cancelled and its handler destroyed, as if it had been pending there.
                const bool watched = !ctx || asio_ns::use_service<context_watch>(*ctx).watch(op);
                completion_t<void(std::exception_ptr, R...)> done(
                    [op](std::exception_ptr e, R... got) { op->complete(std::move(e), std::move(got)...); });
                // What the start throws (a client destroyed, a lease refused) goes to the
                // handler, as Asio's own operations report errors, and co_await rethrows it: a
                // lazy token (use_awaitable) runs this inside the coroutine's suspension, where
                // a throw would end the process.
                try {
                    using started = decltype(begin(std::move(done)));
                    if constexpr (std::is_same_v<started, rlock::pending>) {
                        // The slot is connected before the operation starts: once started, it
                        // may complete, and its handler run on another thread (and reuse or
                        // destroy the slot's signal), before this returns.
                        std::shared_ptr<slot_cancel> on_cancel;
                        if (slot.is_connected()) {
                            on_cancel = std::make_shared<slot_cancel>();
                            slot.assign(
                                [on_cancel](asio_ns::cancellation_type) { on_cancel->emitted(); });
                        }
                        const rlock::pending p = begin(std::move(done));
                        op->set_pending(p);
                        if (on_cancel) on_cancel->started(p);
                    } else {
                        begin(std::move(done));
                    }
                } catch (...) {
                    if (slot.is_connected()) slot.clear();
                    op->fail_to_start(std::current_exception());
                }
                if (!watched) op->context_gone();
            },
            token, std::forward<Start>(start));
    }
};

}  // namespace rlock::detail
