// How an asynchronous call completes, for each kind of completion token: a callback, the
// rlock::use_future token, or (token_adapter, defined by rlock/asio.hpp) an Asio token. An
// operation's signature is `void(std::exception_ptr, R...)`: an acquire's R is rlock::hold, an
// unlock's is nothing, a semaphore acquire's an owned_result (its handler is told a bool).
#pragma once

#include <exception>
#include <future>
#include <type_traits>
#include <utility>

#include "rlock/detail/runtime/engine.hpp"

namespace rlock {
struct use_future_t;
}  // namespace rlock

namespace rlock::detail {

/// A result its handler must receive to own it: a semaphore's `true`, whose permits nothing
/// else releases (they do not expire). Dropped undelivered — its handler destroyed unrun with
/// its io_context, or completing after that context went — it runs `give_back`, as a dropped
/// rlock::hold releases itself. The handler is told the plain bool (handler_signature_t).
class owned_result {
public:
    owned_result() noexcept = default;
    owned_result(bool value, unique_callback<> give_back) noexcept
        : value_(value), give_back_(std::move(give_back)) {}
    owned_result(const owned_result&) = delete;
    owned_result& operator=(const owned_result&) = delete;
    owned_result(owned_result&&) noexcept = default;
    owned_result& operator=(owned_result&& o) noexcept {
        if (this != &o) {
            give_back();
            value_ = o.value_;
            give_back_ = std::move(o.give_back_);
        }
        return *this;
    }
    ~owned_result() { give_back(); }

    /// The value, for the handler, which owns what it says from now on.
    bool take() noexcept {
        give_back_ = unique_callback<>();
        return value_;
    }

private:
    void give_back() noexcept {
        try {
            give_back_();  // once: the call lets it go
        } catch (...) {
        }
    }

    bool value_ = false;
    unique_callback<> give_back_;
};

/// What a handler is called with for an operation's result `R`: R itself, but an owned_result's
/// plain bool (deliver takes it).
template <class R>
struct delivered {
    using type = R;
};
template <>
struct delivered<owned_result> {
    using type = bool;
};
template <class R>
R&& deliver(R& r) noexcept {
    return std::move(r);
}
inline bool deliver(owned_result& r) noexcept { return r.take(); }

/// The signature a handler of an operation of `Signature` has (delivered).
template <class Signature>
struct handler_signature;
template <class... R>
struct handler_signature<void(std::exception_ptr, R...)> {
    using type = void(std::exception_ptr, typename delivered<R>::type...);
};
template <class Signature>
using handler_signature_t = typename handler_signature<Signature>::type;

/// A completion handler as the engine keeps it, for an operation of `Signature`.
template <class Signature>
struct completion_of;
template <class... R>
struct completion_of<void(std::exception_ptr, R...)> {
    using type = unique_callback<std::exception_ptr, R...>;
};
template <class Signature>
using completion_t = typename completion_of<Signature>::type;

/// Whether `F` can be called as a handler of `Signature`.
template <class F, class Signature>
struct is_handler_for : std::false_type {};
template <class F, class... A>
struct is_handler_for<F, void(A...)> : std::bool_constant<std::is_invocable_v<F&, A...>> {};

/// How an asynchronous call completes for a token that is neither a callback nor
/// rlock::use_future: rlock/asio.hpp defines it for Asio's completion tokens.
template <class Token, class Signature, class = void>
struct token_adapter {
    static constexpr bool defined = false;
};

template <class... R>
struct first_or_void {
    using type = void;
};
template <class F, class... R>
struct first_or_void<F, R...> {
    using type = F;
};

template <class Signature>
struct initiator;
template <class... R>
struct initiator<void(std::exception_ptr, R...)> {
    using signature = void(std::exception_ptr, R...);
    using completion = completion_t<signature>;

    template <class Token, class Start>
    static auto run(Token&& token, Start&& start) {
        using T = std::decay_t<Token>;
        if constexpr (std::is_same_v<T, use_future_t>) {
            using value = typename first_or_void<typename delivered<R>::type...>::type;
            std::promise<value> promise;
            std::future<value> f = promise.get_future();
            (void)start(completion([p = std::move(promise)](std::exception_ptr e, R... r) mutable {
                if (e) {
                    p.set_exception(std::move(e));
                } else {
                    p.set_value(deliver(r)...);
                }
            }));
            return f;
        } else if constexpr (token_adapter<T, signature>::defined) {
            return token_adapter<T, signature>::initiate(std::forward<Token>(token), std::forward<Start>(start));
        } else {
            static_assert(is_handler_for<T, handler_signature_t<signature>>::value,
                          "an rlock async call takes a callback (std::exception_ptr[, rlock::hold]), "
                          "rlock::use_future, or, with <rlock/asio.hpp> included, an Asio completion "
                          "token");
            if constexpr (std::is_same_v<handler_signature_t<signature>, signature>) {
                return start(completion(std::forward<Token>(token)));
            } else {
                // Called on the engine thread, always: what it is told is its own.
                return start(completion([h = T(std::forward<Token>(token))](std::exception_ptr e, R... r) mutable {
                    h(std::move(e), deliver(r)...);
                }));
            }
        }
    }
};

/// Starts an asynchronous operation of `Signature` for `token`: `start(completion)` posts it
/// and returns what a callback's caller gets (an acquire's rlock::pending; nothing for an
/// unlock). rlock::use_future gives a std::future; an Asio token what Asio makes of it.
template <class Signature, class Token, class Start>
auto initiate(Token&& token, Start&& start) {
    return initiator<Signature>::run(std::forward<Token>(token), std::forward<Start>(start));
}

}  // namespace rlock::detail
