// Test support: real redis-server processes on free loopback ports, in temporary directories,
// started and stopped by the tests themselves. Never port 6379, never a server started by hand.
// Raw connections and commands beside them, for fault injection and bookkeeping.
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/options.hpp"

namespace rlock_test {

namespace fs = std::filesystem;

inline std::string redis_server_binary() {
    if (const char* p = std::getenv("RLOCK_REDIS_SERVER")) return p;
    return "redis-server";
}

/// A loopback port nobody listens on right now (the kernel picks it; never 6379). At most
/// 55535: a cluster node also listens on its port + 10000, and refuses to start above that
/// (the kernel's ephemeral range reaches 60999; a cluster test failed on a port it drew there).
inline int free_port() {
    for (int tries = 0; tries < 1000; ++tries) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
        socklen_t len = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
        ::close(fd);
        const int port = ntohs(a.sin_port);
        if (port != 6379 && port <= 55535) return port;
    }
    throw std::runtime_error("free_port: no free loopback port at or below 55535");
}

/// A TCP socket listening on loopback `port` (0: a free one the kernel picks) with `backlog`;
/// -1 when it cannot bind or listen.
inline int loopback_listener(int port, int backlog) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

/// A listener on loopback `port` that accepts nothing and whose backlog is full, as a host behind
/// a firewall that drops packets: a connect() to it hangs (its SYN is dropped) until the caller's
/// own timeout, where a stopped server's port would refuse at once.
class full_backlog_listener {
public:
    explicit full_backlog_listener(int port) : fd_(loopback_listener(port, 0)) {
        if (fd_ < 0) throw std::runtime_error("full_backlog_listener: cannot listen on " + std::to_string(port));
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        // Fill the accept queue (backlog 0 takes one) until a connect no longer completes.
        for (int i = 0; i < 8; ++i) {
            const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            fillers_.push_back(c);
            (void)::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
            pollfd p{c, POLLOUT, 0};
            if (::poll(&p, 1, 200) == 0) return;  // this one hangs: the backlog is full
        }
        for (int c : fillers_) ::close(c);
        ::close(fd_);
        throw std::runtime_error("full_backlog_listener: connects to " + std::to_string(port) + " still complete");
    }
    full_backlog_listener(const full_backlog_listener&) = delete;
    full_backlog_listener& operator=(const full_backlog_listener&) = delete;
    ~full_backlog_listener() {
        for (int c : fillers_) ::close(c);
        ::close(fd_);
    }

private:
    int fd_ = -1;
    std::vector<int> fillers_;
};

/// Whether process `pid` holds the socket listening on loopback `port`. A server that could not
/// bind its port (another test's server took it between free_port and the bind) exits soon, but
/// until then a PING on that port is answered by the other server: only the listener's owner
/// tells the two apart (PING, INFO and the log do not, for every version, Sentinel and
/// requirepass alike).
inline bool listens_on(pid_t pid, int port) {
    char want[16];
    std::snprintf(want, sizeof want, ":%04X", port);
    std::vector<std::string> inodes;
    for (const char* table : {"/net/tcp", "/net/tcp6"}) {
        std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + table).c_str(), "r");
        if (!f) continue;
        char line[512];
        while (std::fgets(line, sizeof line, f)) {
            char local[64], remote[64], state[8];
            unsigned long inode = 0;
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if (std::sscanf(line, " %*s %63s %63s %7s %*s %*s %*s %*s %*s %lu", local, remote,
                            state, &inode) == 4 &&
                std::string_view(state) == "0A" && std::string_view(local).size() > 5 &&
                std::string_view(local).substr(std::string_view(local).size() - 5) == want) {
                inodes.push_back("socket:[" + std::to_string(inode) + "]");
            }
        }
        std::fclose(f);
    }
    if (inodes.empty()) return false;
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
        std::error_code link_ec;
        const std::string target = fs::read_symlink(fd.path(), link_ec).string();
        for (const std::string& i : inodes) {
            if (target == i) return true;
        }
    }
    return false;
}

/// One redis-server child process. Dies with the test process (PR_SET_PDEATHSIG).
class redis_server {
public:
    explicit redis_server(std::vector<std::string> extra = {}) : redis_server(std::move(extra), "") {}

    /// A Redis Sentinel (redis-server --sentinel) with `conf` as the rest of its config file,
    /// e.g. "sentinel monitor m 127.0.0.1 7000 1\n". It answers `cmd` as a server does.
    static std::unique_ptr<redis_server> sentinel(std::string conf) {
        return std::unique_ptr<redis_server>(new redis_server({}, std::move(conf)));
    }

    redis_server(std::vector<std::string> extra, std::string sentinel_conf)
        : extra_(std::move(extra)), sentinel_conf_(std::move(sentinel_conf)) {
        char tmpl[] = "/tmp/rlock-test-XXXXXX";
        if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
        for (int tries = 0; tries < 5; ++tries) {
            port_ = free_port();
            if (launch()) return;
        }
        throw std::runtime_error("could not start redis-server (is it installed?) log: " + log());
    }
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;
    ~redis_server() {
        kill_now();
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }
    std::string socket_path() const { return dir_ + "/redis.sock"; }
    rlock::client_options options() const {
        rlock::client_options o;
        o.host = "127.0.0.1";
        o.port = port_;
        return o;
    }

    /// Stops the server at once without saving (its data is gone, as after a crash).
    void kill_now() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGCONT);
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    /// Starts it again on the same port, empty.
    void restart() {
        kill_now();
        for (int tries = 0; tries < 50; ++tries) {
            if (launch()) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        throw std::runtime_error("could not restart redis-server: " + log());
    }
    void pause() { ::kill(pid_, SIGSTOP); }
    void resume() { ::kill(pid_, SIGCONT); }

    /// A raw command on a fresh connection, for assertions and fault injection.
    rlock::detail::reply_ptr cmd(std::initializer_list<std::string_view> parts) const {
        rlock::detail::context_ptr c(redisConnect("127.0.0.1", port_));
        if (!c || c->err) throw std::runtime_error("test cannot connect to redis");
        rlock::detail::reply_ptr r = rlock::detail::command(c.get(), parts);
        if (!r) throw std::runtime_error("test command failed");
        return r;
    }
    long long integer(std::initializer_list<std::string_view> parts) const {
        auto r = cmd(parts);
        if (r->type != REDIS_REPLY_INTEGER) throw std::runtime_error("not an integer reply");
        return r->integer;
    }
    std::string text(std::initializer_list<std::string_view> parts) const {
        auto r = cmd(parts);
        return std::string(rlock::detail::reply_text(r.get()));
    }

    std::string log() const {
        std::string out;
        if (FILE* f = std::fopen((dir_ + "/redis.log").c_str(), "r")) {
            char buf[512];
            size_t n;
            while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
            std::fclose(f);
        }
        return out;
    }

private:
    bool launch() {
        std::vector<std::string> args = {redis_server_binary(),
                                         "--port", std::to_string(port_),
                                         "--bind", "127.0.0.1",
                                         "--unixsocket", socket_path(),
                                         "--unixsocketperm", "700",
                                         "--save", "",
                                         "--appendonly", "no",
                                         "--dir", dir_,
                                         "--daemonize", "no",
                                         "--protected-mode", "no",
                                         "--enable-debug-command", "local",
                                         "--logfile", dir_ + "/redis.log"};
        args.insert(args.end(), extra_.begin(), extra_.end());
        if (!sentinel_conf_.empty()) {
            // Sentinel rewrites its config file: one of its own, written afresh at each launch.
            const std::string conf = dir_ + "/sentinel.conf";
            std::FILE* f = std::fopen(conf.c_str(), "w");
            if (!f) return false;
            std::fprintf(f, "port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n"
                            "dir %s\nlogfile %s/redis.log\n%s",
                         port_, dir_.c_str(), dir_.c_str(), sentinel_conf_.c_str());
            std::fclose(f);
            args = {redis_server_binary(), conf, "--sentinel"};
        }
        const pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(1);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execvp(argv[0], argv.data());
            ::_exit(127);
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return false;  // exited: port taken, or no binary
            }
            rlock::detail::context_ptr c(redisConnect("127.0.0.1", port_));
            if (c && !c->err && listens_on(pid_, port_)) {
                rlock::detail::reply_ptr r = rlock::detail::command(c.get(), {"PING"});
                // PONG, or NOAUTH from a server with requirepass: either way it is serving.
                if (r && (r->type == REDIS_REPLY_STATUS ||
                          rlock::detail::reply_is_error(r.get(), "NOAUTH"))) {
                    return true;
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        kill_now();
        return false;
    }

    std::vector<std::string> extra_;
    std::string sentinel_conf_;
    std::string dir_;
    int port_ = 0;
    pid_t pid_ = -1;
};

// ---- Raw commands, for fault injection and bookkeeping ---------------------------------------

/// A raw connection for fault injection and bookkeeping, as `user` when one is given.
inline rlock::detail::context_ptr raw_connection(int port, const std::string& user = "",
                                                 const std::string& password = "") {
    rlock::detail::context_ptr c(redisConnect("127.0.0.1", port));
    if (!c || c->err) throw std::runtime_error("test: cannot connect to redis");
    if (!user.empty()) {
        auto r = rlock::detail::command(c.get(), {"AUTH", user, password});
        if (!r || r->type == REDIS_REPLY_ERROR) throw std::runtime_error("test: AUTH failed");
    }
    return c;
}

/// Any command from a vector of parts (ACL SETUSER takes many).
inline rlock::detail::reply_ptr command_vec(redisContext* c,
                                            const std::vector<std::string>& parts) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& p : parts) {
        argv.push_back(p.data());
        lens.push_back(p.size());
    }
    return rlock::detail::command_argv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
}

/// ACL SETUSER `rules...` on `s`; throws unless the server says OK.
inline void set_acl_user(const redis_server& s, std::vector<std::string> rules) {
    rules.insert(rules.begin(), {"ACL", "SETUSER"});
    auto c = raw_connection(s.port());
    auto r = command_vec(c.get(), rules);
    if (!r || r->type != REDIS_REPLY_STATUS) {
        throw std::runtime_error("ACL SETUSER failed: " +
                                 std::string(rlock::detail::reply_text(r.get())));
    }
}

/// Whether server() below has been started in this process.
inline bool& started_server() {
    static bool started = false;
    return started;
}

/// The server the test files' free functions talk to: started at first use, one per test
/// process (ctest runs each test in a process of its own), stopped at exit.
inline redis_server& server() {
    static redis_server s;
    started_server() = true;
    return s;
}

/// How many times `s` has run `command` (INFO commandstats; lower case: "set", "evalsha").
inline long long calls_of(const redis_server& s, std::string_view command) {
    const std::string info = s.text({"INFO", "commandstats"});
    const std::string field = "cmdstat_" + std::string(command) + ":calls=";
    const std::size_t at = info.find(field);
    return at == std::string::npos ? 0 : std::atoll(info.c_str() + at + field.size());
}

/// The same, on server().
inline long long calls_of(std::string_view command) { return calls_of(server(), command); }

/// The server's keys, space-separated, except those starting with `except` (when not empty).
inline std::string keys_left(const redis_server& s, std::string_view except = "") {
    std::string out;
    rlock::detail::reply_ptr keys = s.cmd({"KEYS", "*"});
    if (!keys || keys->type != REDIS_REPLY_ARRAY) return "(KEYS failed)";
    for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string_view k = rlock::detail::reply_text(keys->element[i]);
        if (!except.empty() && k.substr(0, except.size()) == except) continue;
        out += (out.empty() ? "" : " ") + std::string(k);
    }
    return out;
}

}  // namespace rlock_test
