// 01 — rlock::mutex with std::lock_guard, across processes.
//
//     01_mutex <redis uri> <worker name> <rounds>
//
// Each round takes the lock "demo", says when it got it, holds it 200 ms, releases it and stays
// away 100 ms. Start several of these at once (scripts/demo does) and read the times: the
// holds never overlap, and a waiter gets the lock within milliseconds of the release, because
// it waits for the unlock message rather than polling.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>

#include <rlock/rlock.hpp>

namespace {

std::string wall_clock() {
    using namespace std::chrono;
    const auto now = system_clock::now();
    const std::time_t secs = system_clock::to_time_t(now);
    const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
    char buf[32];
    std::strftime(buf, sizeof buf, "%H:%M:%S", std::localtime(&secs));
    return std::string(buf) + "." + std::to_string(1000 + ms).substr(1);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s <redis uri> <worker name> <rounds>\n", argv[0]);
        return 2;
    }
    const std::string who = argv[2];
    const int rounds = std::atoi(argv[3]);
    try {
        rlock::client redis(argv[1]);
        rlock::mutex lock(redis, "demo", rlock::lock_options{/*fencing=*/true});
        for (int i = 0; i < rounds; ++i) {
            const auto asked = std::chrono::steady_clock::now();
            {
                std::lock_guard<rlock::mutex> guard(lock);
                const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - asked);
                std::printf("%s  %-9s holds \"demo\" (fencing token %llu, waited %lld ms)\n",
                            wall_clock().c_str(), who.c_str(),
                            static_cast<unsigned long long>(lock.fencing_token()),
                            static_cast<long long>(waited.count()));
                std::fflush(stdout);
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                std::printf("%s  %-9s releases\n", wall_clock().c_str(), who.c_str());
                std::fflush(stdout);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return 0;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
        return 1;
    }
}
