// SHA-1, only to name Lua scripts for EVALSHA (Redis keys its script cache by SHA-1 hex).
// Not used for anything that needs collision resistance.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rlock/config.hpp"

namespace rlock::detail {

RLOCK_DECL std::string sha1_hex(std::string_view data);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::string sha1_hex(std::string_view data) {
    std::uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    auto rol = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
    std::string msg(data);
    const std::uint64_t bit_len = static_cast<std::uint64_t>(data.size()) * 8;
    msg += static_cast<char>(0x80);
    while (msg.size() % 64 != 56) msg += '\0';
    for (int i = 7; i >= 0; --i) msg += static_cast<char>((bit_len >> (i * 8)) & 0xFF);
    for (std::size_t off = 0; off < msg.size(); off += 64) {
        std::uint32_t w[80];
        for (std::size_t i = 0; i < 16; ++i) {
            const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + i * 4);
            w[i] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                   (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
        }
        for (int i = 16; i < 80; ++i) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; ++i) {
            std::uint32_t f, k;
            if (i < 20) {
                f = (b & c) | (~b & d), k = 0x5A827999u;
            } else if (i < 40) {
                f = b ^ c ^ d, k = 0x6ED9EBA1u;
            } else if (i < 60) {
                f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDCu;
            } else {
                f = b ^ c ^ d, k = 0xCA62C1D6u;
            }
            const std::uint32_t t = rol(a, 5) + f + e + k + w[i];
            e = d, d = c, c = rol(b, 30), b = a, a = t;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(40);
    for (std::uint32_t v : h) {
        for (int i = 7; i >= 0; --i) out += digits[(v >> (i * 4)) & 0xF];
    }
    return out;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
