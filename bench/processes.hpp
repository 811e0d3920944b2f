// What the multi-process bench programs (contention, flash_sale) share: workers are the program
// itself again (fork + exec of /proc/self/exe), so no thread or connection of the parent is ever
// inherited. A worker reports on fd 3 ('R' when ready, then its records) and reads the common
// start time (steady_clock ns, 8 bytes) on fd 4.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

constexpr int result_fd = 3;  // worker -> parent
constexpr int go_fd = 4;      // parent -> workers

/// steady_clock (CLOCK_MONOTONIC: one clock for every process on the machine), in ns.
inline std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline bool write_all(int fd, const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= static_cast<std::size_t>(w);
    }
    return true;
}

/// The instant (now_ns) after which read_all gives up, 0 for never: the parent sets it, so that
/// a worker stuck (in an acquire that never ends) fails the run instead of holding it for ever.
inline std::int64_t read_deadline_ns = 0;

inline bool read_all(int fd, void* data, std::size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        if (read_deadline_ns != 0) {
            const std::int64_t left_ms = (read_deadline_ns - now_ns()) / 1'000'000;
            pollfd in{fd, POLLIN, 0};
            const int ready = left_ms > 0 ? ::poll(&in, 1, static_cast<int>(left_ms)) : 0;
            if (ready < 0 && errno == EINTR) continue;
            if (ready == 0) {
                std::fprintf(stderr, "a worker did not report in time\n");
                return false;
            }
        }
        const ssize_t r = ::read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

/// A vector as its size (8 bytes) and then its elements.
template <class T>
bool write_vector(int fd, const std::vector<T>& v) {
    const std::uint64_t n = v.size();
    return write_all(fd, &n, sizeof n) && write_all(fd, v.data(), v.size() * sizeof(T));
}
template <class T>
bool read_vector(int fd, std::vector<T>& v) {
    std::uint64_t n = 0;
    if (!read_all(fd, &n, sizeof n)) return false;
    v.resize(n);
    return read_all(fd, v.data(), n * sizeof(T));
}

/// Starts this program again with `args` (args[0] its name); returns its pid and sets
/// `results` to the read end of its fd 3. `go_read` becomes its fd 4.
inline pid_t spawn_self(std::vector<std::string> args, int go_read, int& results) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(1);
        // Move both ends out of the way first (either may already be fd 3 or 4), then onto
        // their fixed numbers: dup2 clears FD_CLOEXEC on the copies, the rest close at exec.
        const int out = ::fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
        const int start = ::fcntl(go_read, F_DUPFD_CLOEXEC, 10);
        if (out < 0 || start < 0 || ::dup2(out, result_fd) < 0 || ::dup2(start, go_fd) < 0) {
            ::_exit(1);
        }
        ::execv("/proc/self/exe", argv.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    results = fds[0];
    return pid;
}

/// The q-quantile (nearest rank) of `v`.
inline double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size(), std::max<std::size_t>(rank, 1)) - 1];
}

/// The 1-minute load average (the machine is shared), or -1.
inline double load_average() {
    double l = -1;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &l) != 1) l = -1;
        std::fclose(f);
    }
    return l;
}

inline std::string fmt_double(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d);
    return buf;
}

}  // namespace bench
