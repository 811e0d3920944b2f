// Unpredictable bytes for lock tokens and client ids, from the operating system's CSPRNG.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#if defined(__linux__)
#include <sys/random.h>
#include <cerrno>
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
#include <stdlib.h>
#endif

namespace rlock::detail {

inline void random_bytes(unsigned char* out, std::size_t n) {
#if defined(__linux__)
    while (n > 0) {
        const ssize_t got = ::getrandom(out, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            break;  // very old kernel: fall through to random_device (/dev/urandom)
        }
        out += got;
        n -= static_cast<std::size_t>(got);
    }
    if (n == 0) return;
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
    ::arc4random_buf(out, n);
    return;
#endif
    std::random_device rd;
    while (n > 0) {
        const unsigned int v = rd();
        for (std::size_t i = 0; i < sizeof v && n > 0; ++i, --n) *out++ = (v >> (i * 8)) & 0xFF;
    }
}

/// This thread's engine for retry delays (not secrets), seeded once from random_bytes: no
/// system call per use.
inline std::mt19937_64& thread_rng() {
    thread_local std::mt19937_64 engine = [] {
        unsigned char b[8];
        random_bytes(b, sizeof b);
        std::uint64_t seed = 0;
        for (unsigned char x : b) seed = (seed << 8) | x;
        return std::mt19937_64(seed);
    }();
    return engine;
}

/// How every token rlock stores in a mutex-layout key starts (rlock::mutex, red_lock,
/// multi_lock's mutex parts). It marks a holder whose release publishes on the lock's channel:
/// a waiter behind any other value (redis-py's Lock, node-redlock, go-redsync, an rlock older
/// than this mark) cannot count on a message and looks again itself (basic_lock's wait loop).
/// ':' is neither a hex digit (redis-py, node-redlock) nor base64 (go-redsync), so no random
/// token of theirs starts with it.
inline constexpr std::string_view token_prefix = "rlock:";

/// A mutex token: token_prefix, then 128 random bits as 32 lowercase hex digits.
inline std::string random_token() {
    unsigned char b[16];
    random_bytes(b, sizeof b);
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(token_prefix);
    out.resize(token_prefix.size() + 32, '0');
    char* hex = &out[token_prefix.size()];
    for (std::size_t i = 0; i < sizeof b; ++i) {
        hex[2 * i] = digits[b[i] >> 4];
        hex[2 * i + 1] = digits[b[i] & 0xF];
    }
    return out;
}

/// True for a value random_token() could have made: its holder publishes its release.
inline bool is_rlock_token(std::string_view value) noexcept {
    return value.size() > token_prefix.size() &&
           value.substr(0, token_prefix.size()) == token_prefix;
}

/// A random (version 4) UUID string, the client id in holder ids, as Redisson makes them.
inline std::string random_uuid() {
    unsigned char b[16];
    random_bytes(b, sizeof b);
    b[6] = static_cast<unsigned char>((b[6] & 0x0F) | 0x40);
    b[8] = static_cast<unsigned char>((b[8] & 0x3F) | 0x80);
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(36);
    for (std::size_t i = 0; i < sizeof b; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
        out += digits[b[i] >> 4];
        out += digits[b[i] & 0xF];
    }
    return out;
}

/// A number unique to the calling thread within this process, never reused: the threadId part
/// of a holder id. A thread that ends cannot pass its holds on to a thread that starts later.
inline std::uint64_t current_thread_number() noexcept {
    static std::atomic<std::uint64_t> next{1};
    thread_local const std::uint64_t mine = next.fetch_add(1, std::memory_order_relaxed);
    return mine;
}

}  // namespace rlock::detail
