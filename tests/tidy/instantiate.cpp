// The translation unit scripts/tidy hands to clang-tidy: it instantiates every lock template
// explicitly, so the checks see all member functions of include/rlock, not only the ones some
// test happens to call. Not built by CMake.
#include <chrono>
#include <vector>

#include "rlock/rlock.hpp"
#if __has_include(<asio.hpp>)
#include "rlock/asio.hpp"
#endif

using namespace std::chrono_literals;

template class rlock::detail::basic_lock<rlock::detail::mutex_kind>;
template class rlock::detail::basic_lock<rlock::detail::reentrant_kind>;
template class rlock::detail::basic_lock<rlock::detail::fair_kind>;
template class rlock::detail::basic_lock<rlock::detail::rw_write_kind>;
template class rlock::detail::basic_lock<rlock::detail::rw_read_kind>;

// Calls the non-template classes' members; never run.
bool use_every_kind(rlock::client& c) {
    rlock::mutex m(c, "m");
    rlock::reentrant_lock r(c, "r");
    rlock::fair_lock f(c, "f");
    rlock::read_write_lock rw(c, "rw");
    rlock::multi_lock all{m, r, f, rw};
    std::vector<rlock::mutex*> basket{&m};
    rlock::multi_lock some(basket);
    rlock::red_lock red({&c}, "red");
    return all.try_lock() && red.try_lock() && rw.try_lock_shared() && some.try_lock_for(1s, 2s) &&
           all.hold_id() + red.hold_id() > 0 && red.try_lock_until(std::chrono::system_clock::now(), 1s);
}

// The synchronizers' templates and members; never run.
long long use_every_synchronizer(rlock::client& c) {
    rlock::semaphore s(c, "s");
    rlock::count_down_latch l(c, "l");
    rlock::permit_expirable_semaphore p(c, "p");
    rlock::permit a = p.try_acquire_for(1s, 2s, 2);
    rlock::permit b = p.try_acquire_until(std::chrono::system_clock::now(), 2);
    rlock::permit d = p.acquire(5s);
    (void)p.update_lease_time(a.id(), 1s);
    return static_cast<long long>(s.try_acquire_for(1s, 2) && l.wait_for(1s)) +
           static_cast<long long>(s.try_acquire_until(std::chrono::system_clock::now())) +
           static_cast<long long>(b.lost()) + static_cast<long long>(d.detach().size()) + p.permits() +
           static_cast<long long>(l.wait_until(std::chrono::system_clock::now()));
}

// The asynchronous forms: the engine, the wait groups, each kind's async_acquire, the hold,
// and (when Asio is here) the Asio adapter; never run.
void use_every_async_form(rlock::client& c) {
    rlock::mutex m(c, "m");
    rlock::reentrant_lock r(c, "r");
    rlock::fair_lock f(c, "f");
    rlock::read_write_lock rw(c, "rw");
    rlock::owner who;
    rlock::pending p = m.async_lock([](const std::exception_ptr&, rlock::hold) {});
    p.cancel();
    (void)r.async_try_lock_for(who, 1s, 2s, [](const std::exception_ptr&, rlock::hold) {});
    (void)f.async_try_lock_until(std::chrono::system_clock::now(), 1s, [](const std::exception_ptr&, rlock::hold) {});
    (void)rw.async_lock_shared(rlock::use_future);
    rlock::hold h = rw.async_lock(who, 3s, rlock::use_future).get();
    h.async_unlock([](const std::exception_ptr&) {});
    rlock::hold g = m.async_try_lock(rlock::use_future).get();
    g.async_unlock(rlock::use_future).get();
    rlock::semaphore s(c, "s");
    rlock::count_down_latch l(c, "l");
    (void)s.async_try_acquire_for(1s, 2, rlock::use_future);
    (void)s.async_try_acquire_until(std::chrono::system_clock::now(), [](const std::exception_ptr&, bool) {});
    (void)l.async_wait_for(1s, rlock::use_future);
    rlock::permit_expirable_semaphore ps(c, "ps");
    (void)ps.async_try_acquire_for(1s, 2s, 1, rlock::use_future);
    (void)ps.async_try_acquire_until(std::chrono::system_clock::now(), 1, [](const std::exception_ptr&, rlock::permit) {});
    (void)ps.async_acquire(1s, 2, rlock::use_future);
    rlock::red_lock red({&c}, "red");
    rlock::multi_lock all{m, r, f, rw, red};
    (void)red.async_try_lock_for(who, 1s, [](const std::exception_ptr&, rlock::hold) {});
    rlock::hold both = all.async_lock(2s, rlock::use_future).get();
    (void)both.lost();
    both.async_unlock(rlock::use_future).get();
#if __has_include(<asio.hpp>)
    asio::io_context io;
    (void)l.async_wait(asio::use_future);
    (void)m.async_lock(asio::use_future);
    m.async_lock(asio::bind_executor(io, [](const std::exception_ptr&, rlock::hold) {}));
#endif
}
