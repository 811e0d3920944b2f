// URI parsing for client_options::from_uri.
#pragma once

#include <cctype>
#include <string>
#include <tuple>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/errors.hpp"

namespace rlock::detail {

struct uri_parts {
    std::string host, unix_socket, username, password;
    int port = 6379;
    int db = 0;
    std::vector<std::pair<std::string, int>> sentinels;  // redis-sentinel:// only
    std::string sentinel_master;
    bool cluster = false;                                 // redis-cluster://
    std::vector<std::pair<std::string, int>> seeds;       // redis-cluster:// only
};

// The password may sit in the URI: errors name the problem, never echo the URI itself.
[[noreturn]] RLOCK_DECL void bad_uri(std::string_view /*uri*/, std::string_view why);

RLOCK_DECL int parse_uint(std::string_view uri, std::string_view text, int max, const char* what);

RLOCK_DECL std::string percent_decode(std::string_view uri, std::string_view text);

/// `host[:port]` or `[ipv6][:port]`, with `default_port` when the port is left out.
RLOCK_DECL std::pair<std::string, int> parse_host_port(std::string_view uri, std::string_view text,
                                                   int default_port);

RLOCK_DECL uri_parts parse_uri(std::string_view uri);

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL void bad_uri(std::string_view, std::string_view why) {
    throw error(errc::invalid_argument, "", "", std::string("bad Redis URI: ").append(why));
}

RLOCK_DECL int parse_uint(std::string_view uri, std::string_view text, int max, const char* what) {
    if (text.empty() || text.size() > 9) bad_uri(uri, std::string(what) + " is not a number");
    int value = 0;
    for (char ch : text) {
        if (!std::isdigit(static_cast<unsigned char>(ch))) {
            bad_uri(uri, std::string(what) + " is not a number");
        }
        value = value * 10 + (ch - '0');
    }
    if (value > max) bad_uri(uri, std::string(what) + " is out of range");
    return value;
}

RLOCK_DECL std::string percent_decode(std::string_view uri, std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out += text[i];
            continue;
        }
        if (i + 2 >= text.size()) bad_uri(uri, "truncated %-escape");
        auto hex = [&](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            bad_uri(uri, "bad %-escape");
        };
        out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
        i += 2;
    }
    return out;
}

RLOCK_DECL std::pair<std::string, int> parse_host_port(std::string_view uri, std::string_view text,
                                                       int default_port) {
    std::pair<std::string, int> out{std::string(), default_port};
    std::string_view port_text;
    if (!text.empty() && text.front() == '[') {
        auto close = text.find(']');
        if (close == std::string_view::npos) bad_uri(uri, "unclosed [ in IPv6 host");
        out.first = std::string(text.substr(1, close - 1));
        text = text.substr(close + 1);
        if (!text.empty()) {
            if (text.front() != ':') bad_uri(uri, "junk after IPv6 host");
            port_text = text.substr(1);
            if (port_text.empty()) bad_uri(uri, "empty port");
        }
    } else {
        auto colon = text.find(':');
        out.first = std::string(text.substr(0, colon));
        if (colon != std::string_view::npos) {
            port_text = text.substr(colon + 1);
            if (port_text.empty()) bad_uri(uri, "empty port");
        }
    }
    if (out.first.empty()) bad_uri(uri, "no host");
    if (!port_text.empty()) {
        out.second = parse_uint(uri, port_text, 65535, "port");
        if (out.second == 0) bad_uri(uri, "port 0");
    }
    return out;
}

RLOCK_DECL uri_parts parse_uri(std::string_view uri) {
    uri_parts out;
    constexpr std::string_view tcp = "redis://", unix_scheme = "unix://";
    if (uri.substr(0, unix_scheme.size()) == unix_scheme) {
        std::string_view rest = uri.substr(unix_scheme.size());
        std::string_view query;
        if (auto q = rest.find('?'); q != std::string_view::npos) {
            query = rest.substr(q + 1);
            rest = rest.substr(0, q);
        }
        if (rest.empty() || rest.front() != '/') bad_uri(uri, "unix socket path must be absolute");
        out.unix_socket = std::string(rest);
        out.host.clear();
        while (!query.empty()) {
            auto amp = query.find('&');
            std::string_view item = query.substr(0, amp);
            query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
            if (item.substr(0, 3) == "db=") {
                out.db = parse_uint(uri, item.substr(3), 1 << 20, "db");
            } else {
                bad_uri(uri, "unknown query parameter (only db=N is understood)");
            }
        }
        return out;
    }
    constexpr std::string_view sentinel_scheme = "redis-sentinel://",
                               cluster_scheme = "redis-cluster://";
    const bool sentinel = uri.substr(0, sentinel_scheme.size()) == sentinel_scheme;
    out.cluster = uri.substr(0, cluster_scheme.size()) == cluster_scheme;
    if (uri.substr(0, 9) == "rediss://" || uri.substr(0, 18) == "rediss-sentinel://" ||
        uri.substr(0, 17) == "rediss-cluster://") {
        bad_uri(uri, "TLS (rediss://) is not supported by this build of rlock");
    }
    if (!sentinel && !out.cluster && uri.substr(0, tcp.size()) != tcp) {
        bad_uri(uri, "scheme must be redis://, redis-sentinel://, redis-cluster:// or unix://");
    }
    // After the userinfo: a password may hold a '?'.
    const std::size_t userinfo_end = uri.rfind('@');
    if (uri.find('?', userinfo_end == std::string_view::npos ? 0 : userinfo_end + 1) !=
        std::string_view::npos) {
        bad_uri(uri, out.cluster ? "query parameters (?...) are not supported in a "
                                   "redis-cluster:// URI"
                     : sentinel  ? "query parameters (?...) are not supported: give the "
                                   "database as a path, redis-sentinel://host:port/master/2"
                                 : "query parameters (?...) are not supported: give the "
                                   "database as a path, redis://host:port/2");
    }
    std::string_view rest = uri.substr(sentinel      ? sentinel_scheme.size()
                                       : out.cluster ? cluster_scheme.size()
                                                     : tcp.size());
    std::string_view path;
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
        path = rest.substr(slash + 1);
        rest = rest.substr(0, slash);
    }
    if (auto at = rest.rfind('@'); at != std::string_view::npos) {
        std::string_view userinfo = rest.substr(0, at);
        rest = rest.substr(at + 1);
        auto colon = userinfo.find(':');
        if (colon == std::string_view::npos) {
            // redis://secret@host is the common spelling of a password without user.
            out.password = percent_decode(uri, userinfo);
        } else {
            out.username = percent_decode(uri, userinfo.substr(0, colon));
            out.password = percent_decode(uri, userinfo.substr(colon + 1));
        }
    }
    if (out.cluster) {
        // host[:port][,host[:port]...][/]: a cluster has no db but 0.
        if (!path.empty() && path != "0") bad_uri(uri, "Redis Cluster has no database but 0");
        while (true) {
            const auto comma = rest.find(',');
            out.seeds.push_back(parse_host_port(uri, rest.substr(0, comma), 6379));
            if (comma == std::string_view::npos) break;
            rest = rest.substr(comma + 1);
        }
        out.host = out.seeds.front().first;
        out.port = out.seeds.front().second;
        return out;
    }
    if (sentinel) {
        // host[:port][,host[:port]...]/master-name[/db]
        const auto slash = path.find('/');
        out.sentinel_master = percent_decode(uri, path.substr(0, slash));
        if (out.sentinel_master.empty()) bad_uri(uri, "no master name after the sentinel list");
        if (slash != std::string_view::npos) {
            out.db = parse_uint(uri, path.substr(slash + 1), 1 << 20, "db");
        }
        while (true) {
            const auto comma = rest.find(',');
            out.sentinels.push_back(parse_host_port(uri, rest.substr(0, comma), 26379));
            if (comma == std::string_view::npos) break;
            rest = rest.substr(comma + 1);
        }
        out.host.clear();
        out.port = 0;
        return out;
    }
    std::tie(out.host, out.port) = parse_host_port(uri, rest, 6379);
    if (!path.empty()) out.db = parse_uint(uri, path, 1 << 20, "db");
    return out;
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
