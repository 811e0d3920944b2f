// How an asynchronous call completes, for each kind of completion token: a callback, the
// rlock::use_future token, or (token_adapter, defined by rlock/asio.hpp) an Asio token. An
// operation's signature is `void(std::exception_ptr, R...)`: an acquire's R is rlock::hold, an
// unlock's is nothing.
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
            using value = typename first_or_void<R...>::type;
            std::promise<value> promise;
            std::future<value> f = promise.get_future();
            (void)start(completion([p = std::move(promise)](std::exception_ptr e, R... r) mutable {
                if (e) {
                    p.set_exception(std::move(e));
                } else {
                    p.set_value(std::move(r)...);
                }
            }));
            return f;
        } else if constexpr (token_adapter<T, signature>::defined) {
            return token_adapter<T, signature>::initiate(std::forward<Token>(token), std::forward<Start>(start));
        } else {
            static_assert(is_handler_for<T, signature>::value,
                          "an rlock async call takes a callback (std::exception_ptr[, rlock::hold]), "
                          "rlock::use_future, or, with <rlock/asio.hpp> included, an Asio completion "
                          "token");
            return start(completion(std::forward<Token>(token)));
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
