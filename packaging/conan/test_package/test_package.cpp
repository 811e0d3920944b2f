// Conan test_package: compiles against the headers, links hiredis, and runs without a Redis
// server — a client aimed at a port nothing listens on must fail with connection_failed.
#include <cstdio>
#include <rlock/rlock.hpp>

int main() {
    const rlock::client_options o = rlock::client_options::from_uri("redis://127.0.0.1:1/2");
    if (o.port != 1 || o.db != 2) return 1;
    try {
        rlock::client redis(o);
        std::fprintf(stderr, "connected to 127.0.0.1:1, which was not expected\n");
        return 1;
    } catch (const rlock::error& e) {
        std::printf("rlock %s: %s\n", rlock::version_string, e.what());
        return e.code() == rlock::errc::connection_failed || e.code() == rlock::errc::timeout ? 0 : 1;
    }
}
