// A self-pipe: a thread that poll()s a socket polls fd() too, and other threads poke() it
// awake. Both ends are non-blocking and close-on-exec; a full pipe means it is poked already.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include <mutex>
#include <string_view>
#include <thread>

#include "rlock/config.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

class wake_pipe {
public:
    /// `server` names the client's server in the error thrown when no pipe can be made.
    explicit wake_pipe(std::string_view server);
    wake_pipe(const wake_pipe&) = delete;
    wake_pipe& operator=(const wake_pipe&) = delete;
    ~wake_pipe() {
        ::close(fds_[0]);
        ::close(fds_[1]);
    }

    /// The end to poll for POLLIN.
    int fd() const noexcept { return fds_[0]; }

    void poke() noexcept;

    /// Waits, with no timeout, until `fd` is readable (`readable`) or the pipe is poked
    /// (`poked`). False when poll() failed; true with neither set after a signal (EINTR).
    bool wait_with(int fd, bool& readable, bool& poked) const noexcept;

    /// Empties the pipe after poll() said it was poked.
    void drain() noexcept;

private:
    int fds_[2] = {-1, -1};
};

/// Ends a thread that polls `wake` and reads `stopping` under `mu` (the subscriber's, the
/// sentinel watch's): sets `stopping` once (a second call returns at once), runs `also` under
/// `mu` too (to wake condition variables), pokes the pipe and joins the thread.
template <class F>
void stop_polling_thread(std::mutex& mu, bool& stopping, wake_pipe& wake, std::thread& thread,
                         F&& also) {
    {
        std::lock_guard<std::mutex> g(mu);
        if (stopping) return;
        stopping = true;
        also();
    }
    wake.poke();
    if (thread.joinable()) thread.join();
}

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL wake_pipe::wake_pipe(std::string_view server) {
    if (::pipe(fds_) != 0) {
        throw error(errc::connection_failed, "", server, "cannot create the wake-up pipe");
    }
    for (int fd : fds_) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
}

RLOCK_DECL void wake_pipe::poke() noexcept {
    const char b = 1;
    [[maybe_unused]] ssize_t n = ::write(fds_[1], &b, 1);  // full pipe: already poked
}

RLOCK_DECL bool wake_pipe::wait_with(int fd, bool& readable, bool& poked) const noexcept {
    pollfd p[2] = {{fd, POLLIN, 0}, {fds_[0], POLLIN, 0}};
    readable = poked = false;
    if (::poll(p, 2, -1) < 0) return errno == EINTR;
    readable = p[0].revents != 0;
    poked = p[1].revents != 0;
    return true;
}

RLOCK_DECL void wake_pipe::drain() noexcept {
    char buf[64];
    while (::read(fds_[0], buf, sizeof buf) > 0) {
    }
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
