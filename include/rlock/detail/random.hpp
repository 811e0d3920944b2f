// Unpredictable bytes for lock tokens and client ids, from the operating system's CSPRNG.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

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

/// 128 random bits as 32 lowercase hex digits: a mutex token.
inline std::string random_token() {
    unsigned char b[16];
    random_bytes(b, sizeof b);
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(32, '0');
    for (std::size_t i = 0; i < sizeof b; ++i) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 0xF];
    }
    return out;
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
