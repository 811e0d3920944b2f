// A self-pipe: a thread that poll()s a socket polls fd() too, and other threads poke() it
// awake. Both ends are non-blocking and close-on-exec; a full pipe means it is poked already.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string_view>

#include "rlock/errors.hpp"

namespace rlock::detail {

class wake_pipe {
public:
    /// `server` names the client's server in the error thrown when no pipe can be made.
    explicit wake_pipe(std::string_view server) {
        if (::pipe(fds_) != 0) {
            throw error(errc::connection_failed, "", server, "cannot create the wake-up pipe");
        }
        for (int fd : fds_) {
            ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
            ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
    }
    wake_pipe(const wake_pipe&) = delete;
    wake_pipe& operator=(const wake_pipe&) = delete;
    ~wake_pipe() {
        ::close(fds_[0]);
        ::close(fds_[1]);
    }

    /// The end to poll for POLLIN.
    int fd() const noexcept { return fds_[0]; }

    void poke() noexcept {
        const char b = 1;
        [[maybe_unused]] ssize_t n = ::write(fds_[1], &b, 1);  // full pipe: already poked
    }

    /// Empties the pipe after poll() said it was poked.
    void drain() noexcept {
        char buf[64];
        while (::read(fds_[0], buf, sizeof buf) > 0) {
        }
    }

private:
    int fds_[2] = {-1, -1};
};

}  // namespace rlock::detail
