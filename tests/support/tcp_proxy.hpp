// Test support: a TCP proxy between a client and a redis-server, for network faults the server
// itself cannot show — a slow link, a partition (a black hole), reset connections, a reply cut
// in the middle. One thread poll()s every socket; the mode is switched at run time:
//
//   pass_through()  forwards everything at once (the start mode);
//   delay(d)        forwards each chunk d after it arrived, in order;
//   blackhole()     accepts connections but forwards nothing and reads nothing, as a partition
//                   would: what was sent waits in the kernel's buffers and arrives on heal;
//   reset_all()     resets every open connection now (SO_LINGER 0, then close: the peers see
//                   RST), then passes through again;
//   cut_after(n)    forwards n more bytes towards the clients, then resets the connection that
//                   carried the last of them (a reply cut mid-way), then passes through again.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rlock/options.hpp"

namespace rlock_test {

class tcp_proxy {
    using clock = std::chrono::steady_clock;

public:
    /// Listens on a free 127.0.0.1 port and forwards to 127.0.0.1:`target_port`.
    explicit tcp_proxy(int target_port) : target_(target_port) {
        listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const int one = 1;
        ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a = loopback(0);
        if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(listen_, 64) != 0) {
            ::close(listen_);
            throw std::runtime_error("tcp_proxy: cannot listen");
        }
        socklen_t len = sizeof a;
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
            ::close(listen_);
            throw std::runtime_error("tcp_proxy: cannot create a pipe");
        }
        thread_ = std::thread([this] { run(); });
    }
    tcp_proxy(const tcp_proxy&) = delete;
    tcp_proxy& operator=(const tcp_proxy&) = delete;
    ~tcp_proxy() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
        }
        poke();
        thread_.join();
        for (auto& l : links_) close_link(*l, false);
        ::close(listen_);
        ::close(wake_[0]);
        ::close(wake_[1]);
    }

    int port() const { return port_; }
    /// Client options that connect through the proxy.
    rlock::client_options options() const {
        rlock::client_options o;
        o.host = "127.0.0.1";
        o.port = port_;
        return o;
    }

    void pass_through() { set(mode::pass, std::chrono::milliseconds(0)); }
    void delay(std::chrono::milliseconds d) { set(mode::delay, d); }
    void blackhole() { set(mode::blackhole, std::chrono::milliseconds(0)); }

    /// Resets every open connection and passes through again; returns at once (the reset is
    /// done when resets() has grown).
    void reset_all() {
        {
            std::lock_guard<std::mutex> g(mu_);
            mode_ = mode::pass;
            delay_ = std::chrono::milliseconds(0);
            reset_pending_ = true;
        }
        poke();
    }

    /// Forwards `bytes` more bytes towards the clients, then resets that connection.
    void cut_after(std::size_t bytes) {
        {
            std::lock_guard<std::mutex> g(mu_);
            mode_ = mode::pass;
            cut_armed_ = true;
            cut_budget_ = bytes;
        }
        poke();
    }

    /// Delays what the server sends on the connections open now by `d`, for as long as they
    /// stay open; connections made later pass through. A reply then arrives after the client
    /// gave up on it, while the client's retry (on a new connection) goes through at once.
    /// Returns once the proxy thread has applied it.
    void slow_replies_on_open_connections(std::chrono::milliseconds d) {
        std::uint64_t want;
        {
            std::lock_guard<std::mutex> g(mu_);
            slow_pending_ = d;
            want = ++slow_asked_;
        }
        poke();
        for (int i = 0; i < 2000; ++i) {  // bounded: 2 s
            {
                std::lock_guard<std::mutex> g(mu_);
                if (slow_applied_ >= want) return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        throw std::runtime_error("tcp_proxy: slow_replies_on_open_connections not applied");
    }

    /// Connections reset by reset_all() or cut_after() so far.
    std::size_t resets() const {
        std::lock_guard<std::mutex> g(mu_);
        return resets_;
    }
    /// Client connections open through the proxy right now.
    std::size_t open_connections() const {
        std::lock_guard<std::mutex> g(mu_);
        return open_;
    }
    /// Connections accepted so far.
    std::size_t accepted() const {
        std::lock_guard<std::mutex> g(mu_);
        return accepted_;
    }

private:
    enum class mode { pass, delay, blackhole };

    struct chunk {
        clock::time_point due;
        std::string data;
        std::size_t sent = 0;
    };
    // One direction of a connection.
    struct half {
        int from = -1, to = -1;
        bool toward_client = false;
        std::deque<chunk> queue;
        std::size_t queued = 0;
    };
    struct link {
        int client = -1, server = -1;
        half up, down;  // client -> server, server -> client
        bool dead = false;
        std::chrono::milliseconds slow{0};  // extra delay of server -> client
    };

    static constexpr std::size_t max_queued = 1 << 20;  // stop reading beyond this (backpressure)

    static sockaddr_in loopback(int port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        return a;
    }

    void set(mode m, std::chrono::milliseconds d) {
        {
            std::lock_guard<std::mutex> g(mu_);
            mode_ = m;
            delay_ = d;
        }
        poke();
    }

    void poke() {
        const char b = 1;
        [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
    }

    static void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

    // Closes both ends; with `rst` the client end is reset (SO_LINGER 0) rather than closed.
    void close_link(link& l, bool rst) {
        if (l.dead) return;
        if (rst) {
            const linger hard{1, 0};
            ::setsockopt(l.client, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
            ::setsockopt(l.server, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
        }
        ::close(l.client);
        ::close(l.server);
        l.dead = true;
        std::lock_guard<std::mutex> g(mu_);
        --open_;
        if (rst) ++resets_;
    }

    void accept_one() {
        const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a = loopback(target_);
        if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(s);
            ::close(c);
            return;
        }
        const int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblocking(c);
        set_nonblocking(s);
        auto l = std::make_unique<link>();
        l->client = c;
        l->server = s;
        l->up.from = c;
        l->up.to = s;
        l->down.from = s;
        l->down.to = c;
        l->down.toward_client = true;
        links_.push_back(std::move(l));
        std::lock_guard<std::mutex> g(mu_);
        ++open_;
        ++accepted_;
    }

    // Reads what is there into the queue; false when the connection ended.
    bool read_into(half& h, std::chrono::milliseconds delay) {
        char buf[16384];
        const ssize_t n = ::read(h.from, buf, sizeof buf);
        if (n == 0) return false;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        h.queue.push_back(
            chunk{clock::now() + delay, std::string(buf, static_cast<std::size_t>(n))});
        h.queued += static_cast<std::size_t>(n);
        return true;
    }

    // Writes what is due; false when the connection ended (or was cut).
    bool flush(link& l, half& h) {
        const auto now = clock::now();
        while (!h.queue.empty() && h.queue.front().due <= now) {
            chunk& c = h.queue.front();
            std::size_t want = c.data.size() - c.sent;
            bool cut_now = false;
            if (h.toward_client) {
                std::lock_guard<std::mutex> g(mu_);
                if (cut_armed_ && cut_budget_ <= want) {
                    want = cut_budget_;
                    cut_now = true;
                    cut_armed_ = false;
                }
            }
            ssize_t n = 0;
            if (want > 0) {
                n = ::write(h.to, c.data.data() + c.sent, want);
                if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
            }
            if (h.toward_client) {
                std::lock_guard<std::mutex> g(mu_);
                if (cut_armed_) cut_budget_ -= static_cast<std::size_t>(n);
            }
            if (cut_now) {
                if (static_cast<std::size_t>(n) < want) {  // short write: give the rest back
                    std::lock_guard<std::mutex> g(mu_);
                    cut_armed_ = true;
                    cut_budget_ = want - static_cast<std::size_t>(n);
                    c.sent += static_cast<std::size_t>(n);
                    h.queued -= static_cast<std::size_t>(n);
                    return true;
                }
                close_link(l, true);
                return false;
            }
            c.sent += static_cast<std::size_t>(n);
            h.queued -= static_cast<std::size_t>(n);
            if (c.sent < c.data.size()) return true;  // socket full: wait for POLLOUT
            h.queue.pop_front();
        }
        return true;
    }

    void run() {
        for (;;) {
            mode m;
            std::chrono::milliseconds delay;
            bool reset;
            {
                std::lock_guard<std::mutex> g(mu_);
                if (stop_) return;
                m = mode_;
                delay = delay_;
                reset = reset_pending_;
                reset_pending_ = false;
                if (slow_applied_ < slow_asked_) {
                    for (auto& l : links_) l->slow = slow_pending_;
                    slow_applied_ = slow_asked_;
                }
            }
            if (reset) {
                for (auto& l : links_) close_link(*l, true);
            }
            links_.erase(
                std::remove_if(links_.begin(), links_.end(), [](const auto& l) { return l->dead; }),
                links_.end());
            const bool forwarding = m != mode::blackhole;
            if (forwarding) {
                for (auto& l : links_) {
                    if (!l->dead && (!flush(*l, l->up) || (!l->dead && !flush(*l, l->down)))) {
                        close_link(*l, false);
                    }
                }
            }
            std::vector<pollfd> fds = {{listen_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
            std::vector<link*> polled;
            const auto now = clock::now();
            auto next_due = clock::time_point::max();
            for (auto& l : links_) {
                if (l->dead) continue;
                auto events = [&](half& in, half& out) {
                    short e = 0;
                    if (forwarding && in.queued < max_queued) e |= POLLIN;
                    if (forwarding && !out.queue.empty()) {
                        if (out.queue.front().due <= now) {
                            e |= POLLOUT;
                        } else {
                            next_due = std::min(next_due, out.queue.front().due);
                        }
                    }
                    return e;
                };
                fds.push_back({l->client, events(l->up, l->down), 0});
                fds.push_back({l->server, events(l->down, l->up), 0});
                polled.push_back(l.get());
            }
            int timeout = 50;  // also bounds how late a mode change is seen
            if (next_due != clock::time_point::max()) {
                const auto ms =
                    std::chrono::ceil<std::chrono::milliseconds>(next_due - now).count();
                timeout = static_cast<int>(std::clamp<long long>(ms, 0, timeout));
            }
            if (::poll(fds.data(), fds.size(), timeout) < 0) continue;
            if (fds[1].revents) {
                char buf[64];
                while (::read(wake_[0], buf, sizeof buf) > 0) {
                }
            }
            if (fds[0].revents & POLLIN) accept_one();
            for (std::size_t i = 0; i < polled.size(); ++i) {
                link& l = *polled[i];
                const short cr = fds[2 + 2 * i].revents, sr = fds[3 + 2 * i].revents;
                if (l.dead || !forwarding) continue;
                const bool ok = (!(cr & (POLLIN | POLLHUP | POLLERR)) || read_into(l.up, delay)) &&
                                (!(sr & (POLLIN | POLLHUP | POLLERR)) ||
                                 read_into(l.down, std::max(delay, l.slow)));
                if (!ok) close_link(l, false);
            }
        }
    }

    const int target_;
    int listen_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};
    std::vector<std::unique_ptr<link>> links_;  // the thread's own

    mutable std::mutex mu_;
    mode mode_ = mode::pass;
    std::chrono::milliseconds delay_{0};
    bool reset_pending_ = false;
    bool cut_armed_ = false;
    std::size_t cut_budget_ = 0;
    std::size_t resets_ = 0;
    std::size_t open_ = 0;
    std::size_t accepted_ = 0;
    std::chrono::milliseconds slow_pending_{0};
    std::uint64_t slow_asked_ = 0, slow_applied_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace rlock_test
