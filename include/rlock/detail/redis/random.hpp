// Unpredictable bytes for lock tokens and client ids, from the operating system's CSPRNG.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#if defined(__linux__)
#include <sys/random.h>
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
#include <stdlib.h>
#endif

#include "rlock/config.hpp"
#include "rlock/hold.hpp"

namespace rlock::detail {

RLOCK_DECL void random_bytes(unsigned char* out, std::size_t n);

/// A number drawn evenly from [lo, hi] for retry delays and pauses (not secrets): this
/// thread's splitmix64 sequence, seeded once from random_bytes, so no system call per use.
RLOCK_DECL long long random_between(long long lo, long long hi);

/// How every token rlock stores in a mutex-layout key starts (rlock::mutex, red_lock,
/// multi_lock's mutex parts). It marks a holder whose release publishes on the lock's channel:
/// a waiter behind any other value (redis-py's Lock, node-redlock, go-redsync, an rlock older
/// than this mark) cannot count on a message and looks again itself (the blocking driver, wait_blocking).
/// ':' is neither a hex digit (redis-py, node-redlock) nor base64 (go-redsync), so no random
/// token of theirs starts with it.
inline constexpr std::string_view token_prefix = "rlock:";

/// Writes the `n` bytes at `b` as 2n lowercase hex digits at `out`.
RLOCK_DECL void write_hex(const unsigned char* b, std::size_t n, char* out) noexcept;

/// `bytes` as lowercase hex digits (a permit id as Redisson writes one).
RLOCK_DECL std::string hex(std::string_view bytes);

/// A mutex token: token_prefix, then 128 random bits as 32 lowercase hex digits.
RLOCK_DECL std::string random_token();

/// True for a value random_token() could have made: its holder publishes its release.
RLOCK_DECL bool is_rlock_token(std::string_view value) noexcept;

/// A random (version 4) UUID string, the client id in holder ids, as Redisson makes them.
RLOCK_DECL std::string random_uuid();

/// Threads and rlock::owner objects are numbered from one counter (rlock::owner's), so that an
/// owner never shares a number (a registry key, a Redisson holder id "<client id>:<number>")
/// with a thread.
inline std::uint64_t next_owner_number() noexcept { return owner().number(); }

/// A number unique to the calling thread within this process, never reused: the threadId part
/// of a holder id. A thread that ends cannot pass its holds on to a thread that starts later.
inline std::uint64_t current_thread_number() noexcept {
    thread_local const std::uint64_t mine = next_owner_number();
    return mine;
}

/// How messages name the owner numbered `n`: the calling thread, or the rlock::owner whose
/// number() it is.
RLOCK_DECL std::string owner_name(std::uint64_t n);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void random_bytes(unsigned char* out, std::size_t n) {
#if defined(__linux__)
    while (n > 0) {
        const ssize_t got = ::getrandom(out, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            break;  // very old kernel: fall through to /dev/urandom
        }
        out += got;
        n -= static_cast<std::size_t>(got);
    }
    if (n == 0) return;
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__NetBSD__)
    ::arc4random_buf(out, n);
    return;
#endif
    // Very old kernel (no getrandom), or another system: the device the OS seeds its CSPRNG
    // into. <random>'s random_device reads the same, but costs every user of rlock 17 000
    // preprocessed lines.
    const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && n > 0) {
        const ssize_t got = ::read(fd, out, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        out += got;
        n -= static_cast<std::size_t>(got);
    }
    if (fd >= 0) ::close(fd);
    if (n > 0)
        throw std::runtime_error("rlock: no source of random bytes (getrandom, /dev/urandom)");
}

RLOCK_DECL long long random_between(long long lo, long long hi) {
    thread_local std::uint64_t state = [] {
        unsigned char b[8];
        random_bytes(b, sizeof b);
        std::uint64_t seed = 0;
        for (unsigned char x : b) seed = (seed << 8) | x;
        return seed;
    }();
    if (hi <= lo) return lo;
    state += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    // In unsigned arithmetic, where any lo <= hi fits (hi - lo may not in long long). The
    // spans rlock asks for are small: the modulo bias is nil.
    const std::uint64_t span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
    const std::uint64_t drawn = span == 0 ? z : z % span;  // 0: the whole range
    const std::uint64_t at = static_cast<std::uint64_t>(lo) + drawn;
    return static_cast<long long>(at);
}

RLOCK_DECL void write_hex(const unsigned char* b, std::size_t n, char* out) noexcept {
    static constexpr char digits[] = "0123456789abcdef";
    for (std::size_t i = 0; i < n; ++i) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 0xF];
    }
}

RLOCK_DECL std::string hex(std::string_view bytes) {
    std::string out(2 * bytes.size(), '0');
    write_hex(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), out.data());
    return out;
}

RLOCK_DECL std::string random_token() {
    unsigned char b[16];
    random_bytes(b, sizeof b);
    std::string out(token_prefix);
    out.resize(token_prefix.size() + 32, '0');
    write_hex(b, sizeof b, &out[token_prefix.size()]);
    return out;
}

RLOCK_DECL bool is_rlock_token(std::string_view value) noexcept {
    return value.size() > token_prefix.size() &&
           value.substr(0, token_prefix.size()) == token_prefix;
}

RLOCK_DECL std::string random_uuid() {
    unsigned char b[16];
    random_bytes(b, sizeof b);
    b[6] = static_cast<unsigned char>((b[6] & 0x0F) | 0x40);
    b[8] = static_cast<unsigned char>((b[8] & 0x3F) | 0x80);
    std::string out(36, '-');
    char* at = out.data();
    const unsigned char* from = b;
    for (const std::size_t group : {4, 2, 2, 2, 6}) {  // 8-4-4-4-12 digits
        write_hex(from, group, at);
        at += 2 * group + 1;
        from += group;
    }
    return out;
}

RLOCK_DECL std::string owner_name(std::uint64_t n) {
    if (n == current_thread_number()) return "this thread";
    return "rlock::owner " + std::to_string(n) + " (owner::number())";
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
