// 05 — rlock::red_lock: the Redlock algorithm over several independent masters.
//
//     05_red_lock <redis uri> [<redis uri>...]
//
// Give one URI per master (five is typical). Given a single URI, the example uses databases
// 0..4 of that one server as stand-in nodes, so that it runs anywhere — that shows the API,
// not Redlock's fault tolerance, which needs separate servers.
//
// It takes the lock (a majority of nodes must accept, in parallel), shows the validity left,
// shows that a competing red_lock is refused, releases on every node, and checks each step.
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <rlock/rlock.hpp>

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <redis uri> [<redis uri>...]\n", argv[0]);
        return 2;
    }
    std::vector<std::string> uris(argv + 1, argv + argc);
    if (uris.size() == 1) {
        const std::string base = uris[0];
        uris.clear();
        for (int db = 0; db < 5; ++db) uris.push_back(base + "/" + std::to_string(db));
        std::printf("one URI given: using databases 0..4 of it as five stand-in nodes\n");
    }
    try {
        std::vector<std::unique_ptr<rlock::client>> mine, theirs;
        std::vector<rlock::client*> my_nodes, their_nodes;
        for (const std::string& uri : uris) {
            mine.push_back(std::make_unique<rlock::client>(uri));
            theirs.push_back(std::make_unique<rlock::client>(uri));
            my_nodes.push_back(mine.back().get());
            their_nodes.push_back(theirs.back().get());
        }
        rlock::red_lock lock(my_nodes, "example:red"), rival(their_nodes, "example:red");
        std::printf("%zu nodes, quorum %zu\n", lock.size(), lock.quorum());

        const auto start = std::chrono::steady_clock::now();
        lock.lock(std::chrono::seconds(10));  // leased: 10 s, not renewed
        const auto took = std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now() - start);
        std::printf("held after %lld us; validity left %lld ms\n",
                    static_cast<long long>(took.count()),
                    static_cast<long long>(lock.remaining_lease().count()));
        if (!lock.is_held_by_current_thread() || lock.remaining_lease() <= std::chrono::seconds(9)) {
            std::fprintf(stderr, "the red_lock is not held as it should be\n");
            return 1;
        }
        if (rival.try_lock_for(std::chrono::milliseconds(200))) {
            std::fprintf(stderr, "a competing red_lock got in\n");
            return 1;
        }
        std::printf("a competing red_lock was refused for 200 ms\n");

        const std::size_t released = lock.unlock();
        std::printf("released on %zu of %zu nodes\n", released, lock.size());
        if (released != lock.size()) return 1;

        std::lock_guard<rlock::red_lock> guard(rival);  // works with the standard guards
        std::printf("the rival holds it now; its guard releases it on the way out\n");
        return 0;
    } catch (const rlock::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
