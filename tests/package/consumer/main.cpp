// The smallest real user of rlock: connects to the Redis given on the command line, takes and
// releases one rlock::mutex, checks Redis saw both, and prints OK. Built three ways by
// tests/package/run.sh (find_package, add_subdirectory, pkg-config).
#include <cstdio>
#include <mutex>
#include <string>

#include <rlock/rlock.hpp>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <redis uri>\n", argv[0]);
        return 2;
    }
    try {
        rlock::client redis(argv[1]);
        rlock::mutex lock(redis, "rlock:package-test");
        {
            std::lock_guard<rlock::mutex> guard(lock);
            if (!lock.is_held_by_current_thread()) {
                std::fprintf(stderr, "locked, but Redis does not say this thread holds it\n");
                return 1;
            }
        }
        if (lock.is_locked()) {
            std::fprintf(stderr, "unlocked, but the key is still there\n");
            return 1;
        }
        std::printf("OK rlock %s\n", rlock::version_string);
        return 0;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
