// 07 — what goes wrong, and how rlock says so.
//
//     07_errors <redis uri>
//
// Every failure is an rlock::error (a std::system_error) whose code() is an rlock::errc; compare
// codes, not message text. This example provokes one of each kind it can on a plain server and
// prints the message, which names the lock, the server and the cause:
//
//   invalid_argument    a malformed URI, an empty lock name, a non-positive lease
//   connection_failed   a server that is not there
//   server_error        SELECT of a database the server does not have
//   wrong_type          a reentrant_lock (a hash) on a name a mutex holds (a string)
//   would_deadlock      a thread locking a mutex it already holds
//   not_owner           unlock by a thread that holds nothing
//   timeout             a command the server does not answer within command_timeout
//
// and one thing that is *not* an error: try_lock_for returning false when its wait runs out.
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <rlock/rlock.hpp>

namespace {

using namespace std::chrono_literals;

/// Runs f, which must throw rlock::error with code `want`.
template <class F>
bool expect_error(rlock::errc want, const char* what, F&& f) {
    try {
        f();
    } catch (const rlock::error& e) {
        const bool ok = e.code() == want;
        std::printf("%s %s -> errc \"%s\"\n       %s\n", ok ? "  ok  " : "FAILED", what,
                    e.code().message().c_str(), e.what());
        return ok;
    }
    std::printf("FAILED %s: no error\n", what);
    return false;
}

bool expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "  ok  " : "FAILED", what);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        const rlock::client_options base = rlock::client_options::from_uri(argv[1]);
        rlock::client redis(base);
        bool ok = true;

        // Bad input: nothing is sent to Redis.
        ok &= expect_error(rlock::errc::invalid_argument, "URI with the wrong scheme",
                           [] { rlock::client_options::from_uri("http://127.0.0.1:6379"); });
        ok &= expect_error(rlock::errc::invalid_argument, "empty lock name",
                           [&] { rlock::mutex unnamed(redis, ""); });
        ok &= expect_error(rlock::errc::invalid_argument, "zero lease", [&] {
            rlock::mutex m(redis, "example:errors:lease");
            m.lock(0ms);
        });

        // No server: the client constructor connects once to fail fast. Nothing listens on
        // port 1 (tcpmux, and unprivileged processes cannot bind it).
        ok &= expect_error(rlock::errc::connection_failed, "no server on 127.0.0.1:1", [] {
            rlock::client_options nowhere;
            nowhere.host = "127.0.0.1";
            nowhere.port = 1;
            nowhere.connect_timeout = 500ms;
            rlock::client unreachable(nowhere);
        });

        // A database the server does not have (16 by default): SELECT is refused.
        ok &= expect_error(rlock::errc::server_error, "SELECT 99999", [&] {
            rlock::client_options far = base;
            far.db = 99999;
            rlock::client c(far);
        });

        // The same name used by two kinds of lock: the mutex key is a string, a reentrant_lock
        // wants a hash. Redis answers WRONGTYPE; nothing is overwritten.
        rlock::mutex shared(redis, "example:errors:shared");
        shared.lock();
        ok &= expect_error(rlock::errc::wrong_type, "reentrant_lock on a mutex's key", [&] {
            rlock::reentrant_lock same_name(redis, "example:errors:shared");
            (void)same_name.try_lock();
        });

        // A mutex is not reentrant: locking it again on the holding thread would wait forever.
        ok &= expect_error(rlock::errc::would_deadlock, "mutex locked twice by one thread",
                           [&] { shared.lock(); });

        // A wait that runs out is an answer, not an error: try_lock_for returns false. (Another
        // client: on this one the thread already holds the lock.)
        {
            rlock::client other(base);
            rlock::mutex contender(other, "example:errors:shared");
            const auto t0 = std::chrono::steady_clock::now();
            const bool got = contender.try_lock_for(150ms);
            const auto waited = std::chrono::steady_clock::now() - t0;
            ok &= expect(!got && waited >= 150ms, "try_lock_for(150ms) on a held lock: false");
        }
        shared.unlock();

        // Unlock without a hold: this thread never locked "example:errors:free".
        rlock::mutex free_lock(redis, "example:errors:free", rlock::lock_options{/*fencing=*/true});
        ok &= expect_error(rlock::errc::not_owner, "unlock of a lock this thread does not hold",
                           [&] { free_lock.unlock(); });
        ok &= expect_error(rlock::errc::not_owner, "fencing_token() without a hold",
                           [&] { (void)free_lock.fencing_token(); });

        // A server that stops answering: CLIENT PAUSE holds every client's commands for 2 s
        // (sent on a raw hiredis connection, as an operator would), and a client with a 200 ms
        // command_timeout gives up. When the pause is over the same client works again.
        {
            rlock::client_options impatient = base;
            impatient.command_timeout = 200ms;
            rlock::client slow(impatient);
            rlock::mutex probe(slow, "example:errors:probe");
            redisContext* raw = base.unix_socket.empty()
                                    ? redisConnect(base.host.c_str(), base.port)
                                    : redisConnectUnix(base.unix_socket.c_str());
            if (!raw || raw->err) {
                std::fprintf(stderr, "cannot open a raw connection\n");
                if (raw) redisFree(raw);
                return 1;
            }
            if (!base.password.empty()) {
                void* r = base.username.empty()
                              ? redisCommand(raw, "AUTH %s", base.password.c_str())
                              : redisCommand(raw, "AUTH %s %s", base.username.c_str(),
                                             base.password.c_str());
                if (r) freeReplyObject(r);
            }
            const auto paused_at = std::chrono::steady_clock::now();
            if (void* r = redisCommand(raw, "CLIENT PAUSE 2000")) freeReplyObject(r);
            redisFree(raw);
            ok &= expect_error(rlock::errc::timeout, "a server paused for 2 s, timeout 200 ms",
                               [&] { (void)probe.is_locked(); });
            std::this_thread::sleep_until(paused_at + 2100ms);
            ok &= expect(!probe.is_locked(), "after the pause the same client works again");
        }
        return ok ? 0 : 1;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "unexpected: %s\n", e.what());
        return 1;
    }
}
