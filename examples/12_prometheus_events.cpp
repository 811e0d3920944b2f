// 12 — lock events as Prometheus metrics: a lock_listener and a /metrics endpoint.
//
//     12_prometheus_events <redis uri> [metrics port]
//
// A client with `client_options::listener` tells it what its locks do (rlock/events.hpp): a
// hold acquired (and how long it was waited for), released (and how long it was held),
// renewed, a renewal refused, a hold lost, a wait that ended without the lock. The listener here
// turns them into Prometheus' text exposition format:
//   rlock_wait_seconds{kind}, rlock_hold_seconds{kind}     histograms
//   rlock_acquired_total{kind}, rlock_wait_ended_total{kind,cancelled}, rlock_renewals_total
//   (holds renewed), rlock_renewal_refused_total, rlock_lost_total     counters
// and a tiny HTTP/1.0 server thread serves them at http://127.0.0.1:<port>/metrics (port 0, the
// default: one the kernel picks; it is printed). No dependency: POSIX sockets only.
//
// The listener's methods run on rlock's own threads — the acquiring thread, the client's engine
// thread, the watchdog thread — while that thread waits: they must be thread-safe and must not
// block. Here each takes a std::mutex for a few additions and returns; the text is formatted,
// and sent, on the server's thread, from a copy.
//
// Then it makes traffic and scrapes itself, as Prometheus would:
//   1. 4 threads lock one of 2 mutexes 20 times each (80 holds, most handed on locally);
//   2. a try_lock_for runs out while a second client holds the lock;
//   3. a hold is lost: the second client force_unlock()s it and the watchdog (lease 300 ms,
//      renewed every 100 ms) finds it gone;
//   4. GET /metrics, print it and check the numbers. Exits 0 when they are right.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <rlock/rlock.hpp>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0  // not Linux
#endif

namespace {

using namespace std::chrono_literals;

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// The buckets' upper bounds, in seconds; +Inf is the count.
constexpr std::array<double, 9> bounds{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};

struct histogram {
    std::array<std::uint64_t, bounds.size()> in_bucket{};  // per bucket: summed when written
    std::uint64_t count = 0;
    double sum = 0;

    void observe(std::chrono::nanoseconds d) {
        const double s = std::chrono::duration<double>(d).count();
        const auto first_fit = std::lower_bound(bounds.begin(), bounds.end(), s);  // s <= bound
        if (first_fit != bounds.end()) ++in_bucket[first_fit - bounds.begin()];
        ++count;
        sum += s;
    }
    void write(std::string& out, const std::string& name, const std::string& kind) const {
        const std::string k = "{kind=\"" + kind + "\"";  // kinds are fixed names: no escaping
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i < bounds.size(); ++i) {
            cumulative += in_bucket[i];
            out += name + "_bucket" + k + ",le=\"" + number(bounds[i]) + "\"} " +
                   std::to_string(cumulative) + "\n";
        }
        out += name + "_bucket" + k + ",le=\"+Inf\"} " + std::to_string(count) + "\n";
        out += name + "_sum" + k + "} " + number(sum) + "\n";
        out += name + "_count" + k + "} " + std::to_string(count) + "\n";
    }
};

/// Events in, Prometheus text out. Each callback: one short critical section, no I/O.
class prometheus_listener final : public rlock::lock_listener {
public:
    void acquired(const rlock::acquired_event& e) override {
        std::lock_guard<std::mutex> g(mu_);
        ++of(e.kind).acquired;
        of(e.kind).wait.observe(e.wait);
    }
    void released(const rlock::released_event& e) override {
        std::lock_guard<std::mutex> g(mu_);
        of(e.kind).hold.observe(e.held);
    }
    void wait_ended(const rlock::wait_ended_event& e) override {
        std::lock_guard<std::mutex> g(mu_);
        ++(e.cancelled ? of(e.kind).cancelled : of(e.kind).ran_out);
    }
    void renewed(const rlock::renewed_event& e) override {
        std::lock_guard<std::mutex> g(mu_);
        renewals_ += e.holds;
    }
    void renewal_refused(const rlock::renewal_refused_event&) override {
        std::lock_guard<std::mutex> g(mu_);
        ++refused_;
    }
    void lost(const rlock::lost_event&) override {
        std::lock_guard<std::mutex> g(mu_);
        ++lost_;
    }

    std::uint64_t losses() const {
        std::lock_guard<std::mutex> g(mu_);
        return lost_;
    }

    /// The exposition text (format 0.0.4), made from a copy taken under the mutex.
    std::string render() const {
        std::unique_lock<std::mutex> g(mu_);
        const auto kinds = kinds_;
        const std::uint64_t renewals = renewals_, refused = refused_, lost = lost_;
        g.unlock();

        std::string out;
        auto family = [&](const std::string& name, const char* type, const char* help) {
            out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
        };
        auto counter = [&](const std::string& series, std::uint64_t v) {
            out += series + " " + std::to_string(v) + "\n";
        };
        family("rlock_wait_seconds", "histogram", "Time from the call to the hold.");
        for (const auto& [kind, s] : kinds) s.wait.write(out, "rlock_wait_seconds", kind);
        family("rlock_hold_seconds", "histogram", "Time from the hold to its release.");
        for (const auto& [kind, s] : kinds) s.hold.write(out, "rlock_hold_seconds", kind);
        family("rlock_acquired_total", "counter", "Holds taken.");
        for (const auto& [kind, s] : kinds) {
            counter("rlock_acquired_total{kind=\"" + kind + "\"}", s.acquired);
        }
        family("rlock_wait_ended_total", "counter", "Waits that ended without the lock.");
        for (const auto& [kind, s] : kinds) {
            const std::string series = "rlock_wait_ended_total{kind=\"" + kind + "\",cancelled=";
            counter(series + "\"false\"}", s.ran_out);
            counter(series + "\"true\"}", s.cancelled);
        }
        family("rlock_renewals_total", "counter", "Holds sent for renewal by the watchdog.");
        counter("rlock_renewals_total", renewals);
        family("rlock_renewal_refused_total", "counter", "Renewals refused with an error.");
        counter("rlock_renewal_refused_total", refused);
        family("rlock_lost_total", "counter", "Holds lost.");
        counter("rlock_lost_total", lost);
        return out;
    }

private:
    struct stats {
        histogram wait, hold;
        std::uint64_t acquired = 0, ran_out = 0, cancelled = 0;
    };
    // A kind's string is made once, at its first event (a few fixed names: events.hpp).
    stats& of(std::string_view kind) {
        auto it = kinds_.find(kind);
        if (it == kinds_.end()) it = kinds_.emplace(std::string(kind), stats{}).first;
        return it->second;
    }

    mutable std::mutex mu_;
    std::map<std::string, stats, std::less<>> kinds_;
    std::uint64_t renewals_ = 0, refused_ = 0, lost_ = 0;
};

[[noreturn]] void fail(const char* what) {
    throw std::system_error(errno, std::generic_category(), what);
}

sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/// `fd`, its every recv and send now giving up after 2 s.
int bounded(int fd) {
    const timeval two_seconds{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &two_seconds, sizeof two_seconds);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &two_seconds, sizeof two_seconds);
    return fd;
}

int tcp_socket() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) fail("socket");
    return bounded(fd);
}

void send_all(int fd, const std::string& data) {
    for (std::size_t sent = 0; sent < data.size();) {
        const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;  // the peer went away, or 2 s passed: give up on it
        sent += static_cast<std::size_t>(n);
    }
}

/// Serves GET /metrics on 127.0.0.1:port from a background thread, one connection at a time,
/// each bounded (8 KiB of request, 2 s timeouts). The destructor stops it within 100 ms.
class metrics_server {
public:
    metrics_server(int port, std::function<std::string()> body) : body_(std::move(body)) {
        fd_ = tcp_socket();
        const int one = 1;
        ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a = loopback(port);
        socklen_t len = sizeof a;
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 8) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            const int e = errno;
            ::close(fd_);
            errno = e;
            fail("listening on 127.0.0.1");
        }
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { run(); });
    }
    metrics_server(const metrics_server&) = delete;
    metrics_server& operator=(const metrics_server&) = delete;
    ~metrics_server() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    int port() const { return port_; }

private:
    void run() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;  // every 100 ms: look at stop_
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) continue;
            bounded(c);
            std::string request;
            char buf[1024];
            while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
                const ssize_t n = ::recv(c, buf, sizeof buf, 0);
                if (n <= 0) break;
                request.append(buf, static_cast<std::size_t>(n));
            }
            const bool found = request.rfind("GET /metrics ", 0) == 0;
            const std::string body = found ? body_() : "not found\n";
            send_all(c, std::string(found ? "HTTP/1.0 200 OK" : "HTTP/1.0 404 Not Found") +
                            "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
            ::close(c);
        }
    }

    std::function<std::string()> body_;
    int fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

/// The whole HTTP response to `GET path` on 127.0.0.1:port (empty when nobody answers).
std::string http_get(int port, const std::string& path) {
    const int fd = tcp_socket();
    const sockaddr_in a = loopback(port);
    std::string response;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) {
        send_all(fd, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        char buf[4096];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
            response.append(buf, static_cast<std::size_t>(n));
        }
    }
    ::close(fd);
    return response;
}

/// The value of the sample `series` (its name and labels, exactly) in `response`; -1: absent.
double sample(const std::string& response, const std::string& series) {
    const std::string line = "\n" + series + " ";
    const std::size_t at = response.find(line);
    return at == std::string::npos ? -1 : std::strtod(response.c_str() + at + line.size(), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: %s <redis uri> [metrics port]\n", argv[0]);
        return 2;
    }
    try {
        auto metrics = std::make_shared<prometheus_listener>();
        rlock::client_options options = rlock::client_options::from_uri(argv[1]);
        options.listener = metrics;
        options.lock_watchdog_timeout = 300ms;  // short, so that the loss below is found soon
        rlock::client app(options);
        rlock::client other(argv[1]);  // another service's client: no listener, not counted
        metrics_server server(argc == 3 ? std::atoi(argv[2]) : 0,
                              [&metrics] { return metrics->render(); });
        std::printf("serving http://127.0.0.1:%d/metrics\n", server.port());
        bool ok = true;

        std::printf("1. 4 threads x 20 holds of 2 mutexes\n");
        rlock::mutex first(app, "example:metrics:1"), second(app, "example:metrics:2");
        std::atomic<int> failures{0};
        std::vector<std::thread> workers;
        for (int t = 0; t < 4; ++t) {
            workers.emplace_back([&, t] {
                try {
                    for (int i = 0; i < 20; ++i) {
                        std::lock_guard<rlock::mutex> guard(t % 2 == 0 ? first : second);
                        std::this_thread::sleep_for(1ms);  // the critical section
                    }
                } catch (const rlock::error& e) {
                    std::fprintf(stderr, "worker %d: %s\n", t, e.what());
                    ++failures;
                }
            });
        }
        for (std::thread& w : workers) w.join();
        ok &= expect(failures == 0, "80 holds taken and released");

        std::printf("2. a try_lock_for runs out while another client holds the lock\n");
        rlock::mutex busy(app, "example:metrics:busy"), busy_other(other, "example:metrics:busy");
        busy_other.lock();
        ok &= expect(!busy.try_lock_for(150ms), "try_lock_for(150 ms) returned false");
        busy_other.unlock();

        std::printf("3. a hold is lost: the other client force_unlock()s it\n");
        rlock::mutex victim(app, "example:metrics:lost"), breaker(other, "example:metrics:lost");
        victim.lock();
        std::this_thread::sleep_for(250ms);  // renewed twice meanwhile
        ok &= expect(breaker.force_unlock(), "force_unlock() found it held");
        // lost() turns true as the watchdog marks the hold lost; the watchdog tells the
        // listener a moment later: wait for both.
        const auto deadline = std::chrono::steady_clock::now() + 3s;
        while ((!victim.lost() || metrics->losses() == 0) &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(10ms);
        }
        ok &= expect(victim.lost(), "victim.lost() is true");
        victim.unlock();  // does not throw: the loss was told (once, not again here)

        std::printf("4. GET /metrics\n");
        const std::string response = http_get(server.port(), "/metrics");
        std::printf("%s\n", response.c_str());
        ok &= expect(response.rfind("HTTP/1.0 200 OK\r\n", 0) == 0 &&
                         response.find("\r\nContent-Type: text/plain; version=0.0.4") !=
                             std::string::npos,
                     "200 OK, Content-Type: text/plain; version=0.0.4");
        ok &= expect(sample(response, "rlock_acquired_total{kind=\"mutex\"}") == 81,
                     "rlock_acquired_total{kind=\"mutex\"} 81: 80, and the hold later lost");
        const std::string wait = "rlock_wait_seconds_bucket{kind=\"mutex\",le=\"";
        bool cumulative = sample(response, wait + number(bounds[0]) + "\"}") >= 0;
        for (std::size_t i = 1; i < bounds.size(); ++i) {
            cumulative &= sample(response, wait + number(bounds[i - 1]) + "\"}") <=
                          sample(response, wait + number(bounds[i]) + "\"}");
        }
        ok &= expect(cumulative && sample(response, wait + "+Inf\"}") == 81 &&
                         sample(response, "rlock_wait_seconds_count{kind=\"mutex\"}") == 81,
                     "rlock_wait_seconds{kind=\"mutex\"}: cumulative buckets, +Inf = count = 81");
        ok &= expect(sample(response, "rlock_hold_seconds_count{kind=\"mutex\"}") == 81,
                     "rlock_hold_seconds_count{kind=\"mutex\"} 81: the lost hold's unlock too");
        const std::string ran_out = "rlock_wait_ended_total{kind=\"mutex\",cancelled=\"false\"}";
        ok &= expect(sample(response, ran_out) == 1, (ran_out + " 1: the try_lock_for").c_str());
        ok &= expect(sample(response, "rlock_lost_total") == 1, "rlock_lost_total 1");
        ok &= expect(sample(response, "rlock_renewals_total") >= 1, "rlock_renewals_total >= 1");
        ok &= expect(http_get(server.port(), "/").rfind("HTTP/1.0 404", 0) == 0, "GET / is 404");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {  // rlock::error, or a socket's std::system_error
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
