// Redis Cluster: hash slots, the slot map, and the replies that redirect a command.
//
// Every key of one lock is named so that it hashes to the slot of the lock's name (see
// prefixed_key), so each script touches one slot and runs on the master that owns it. The slot
// map says which master that is; MOVED and ASK replies correct it.
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/detail/redis/error_origin.hpp"
#include "rlock/errors.hpp"
#include "rlock/options.hpp"

namespace rlock::detail {

inline constexpr int cluster_slots = 16384;

/// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes
/// keys with.
RLOCK_DECL std::uint16_t crc16(std::string_view data) noexcept;

/// The slot of `key`: only the part between the first '{' and the first '}' after it is hashed
/// when that part is not empty (the hash tag); otherwise the whole key.
RLOCK_DECL int key_slot(std::string_view key) noexcept;

/// A key that belongs with the lock `name`, the way Redisson names them: `prefix:{name}`, or
/// `prefix:name` when the name has a '{' of its own (its own hash tag then decides the slot).
RLOCK_DECL std::string prefixed_key(std::string_view prefix, std::string_view name);

/// Reads MOVED <slot> <host>:<port>, ASK <slot> <host>:<port>, TRYAGAIN and CLUSTERDOWN
/// (both: the command did not run; try again shortly). An empty host means the node we asked.
RLOCK_DECL redirect parse_redirect(std::string_view text);

/// Which master serves each slot. Thread-safe; a MOVED updates one slot at once and marks the
/// map stale, so that the next lookup loads the whole map again (a failover or resharding
/// moves many slots at a time).
class slot_map {
public:
    static constexpr std::uint16_t unknown = 0xFFFF;

    slot_map() { owner_.fill(unknown); }

    /// The master of `slot`, if the map knows one.
    std::optional<server_address> master_of(int slot) const;

    /// Every master the map names, for connections that may go to any node (the subscriber's).
    std::vector<server_address> masters() const {
        std::lock_guard<std::mutex> g(mu_);
        return masters_;
    }

    bool stale() const {
        std::lock_guard<std::mutex> g(mu_);
        return stale_;
    }
    void mark_stale() {
        std::lock_guard<std::mutex> g(mu_);
        stale_ = true;
    }

    /// MOVED: `slot` is served by `to` now.
    void moved(int slot, const server_address& to);

    /// Replaces the map with a CLUSTER SLOTS reply from the node at `asked` (whose own entries
    /// may carry an empty host). False, leaving the map as it was, when the reply is not one.
    bool load(const redisReply* r, const std::string& asked);

private:
    std::uint16_t index_of(const server_address& a);

    mutable std::mutex mu_;
    std::array<std::uint16_t, cluster_slots> owner_{};
    std::vector<server_address> masters_;
    bool stale_ = true;
};

}  // namespace rlock::detail

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock::detail {

RLOCK_DECL std::uint16_t crc16(std::string_view data) noexcept {
    std::uint16_t crc = 0;
    for (const char ch : data) {
        crc = static_cast<std::uint16_t>(
            crc ^ (static_cast<std::uint16_t>(static_cast<unsigned char>(ch)) << 8));
        for (int bit = 0; bit < 8; ++bit) {
            crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
        }
    }
    return crc;
}

RLOCK_DECL int key_slot(std::string_view key) noexcept {
    const std::size_t open = key.find('{');
    if (open != std::string_view::npos) {
        const std::size_t close = key.find('}', open + 1);
        if (close != std::string_view::npos && close > open + 1) {
            key = key.substr(open + 1, close - open - 1);
        }
    }
    return crc16(key) & (cluster_slots - 1);
}

RLOCK_DECL std::string prefixed_key(std::string_view prefix, std::string_view name) {
    std::string k(prefix);
    if (name.find('{') != std::string_view::npos) {
        k.append(":").append(name);
    } else {
        k.append(":{").append(name).append("}");
    }
    return k;
}

RLOCK_DECL redirect parse_redirect(std::string_view text) {
    redirect r;
    const bool moved = text.substr(0, 6) == "MOVED ";
    const bool ask = text.substr(0, 4) == "ASK ";
    // A script that reached an undeclared key already migrated away ("ERR Script attempted
    // to access a non local key in a cluster node"): rlock's scripts fail so before they write.
    if (text.substr(0, 8) == "TRYAGAIN" || text.substr(0, 11) == "CLUSTERDOWN" ||
        (text.substr(0, 4) == "ERR " &&
         text.find("attempted to access a non local key") != std::string_view::npos)) {
        r.kind = redirect::try_again;
        return r;
    }
    if (!moved && !ask) return r;
    text.remove_prefix(moved ? 6 : 4);
    const std::size_t space = text.find(' ');
    const std::size_t colon = text.rfind(':');
    if (space == std::string_view::npos || colon == std::string_view::npos || colon < space)
        return r;
    if (space == 0 || colon + 1 == text.size()) return r;  // no slot, or no port
    int slot = 0, port = 0;
    for (const char ch : text.substr(0, space)) {
        if (ch < '0' || ch > '9') return r;
        slot = slot * 10 + (ch - '0');
        if (slot >= cluster_slots) return r;
    }
    for (const char ch : text.substr(colon + 1)) {
        if (ch < '0' || ch > '9') return r;
        port = port * 10 + (ch - '0');
        if (port > 65535) return r;
    }
    std::string_view host = text.substr(space + 1, colon - space - 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    r.kind = moved ? redirect::moved : redirect::ask;
    r.slot = slot;
    r.host = std::string(host);
    r.port = port;
    return r;
}

RLOCK_DECL std::optional<server_address> slot_map::master_of(int slot) const {
    std::lock_guard<std::mutex> g(mu_);
    const std::uint16_t i = owner_[static_cast<std::size_t>(slot)];
    if (i == unknown) return std::nullopt;
    return masters_[i];
}

RLOCK_DECL void slot_map::moved(int slot, const server_address& to) {
    std::lock_guard<std::mutex> g(mu_);
    owner_[static_cast<std::size_t>(slot)] = index_of(to);
    stale_ = true;
}

RLOCK_DECL bool slot_map::load(const redisReply* r, const std::string& asked) {
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return false;
    std::array<std::uint16_t, cluster_slots> owner{};
    owner.fill(unknown);
    std::vector<server_address> masters;
    for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER ||
            range->element[1]->type != REDIS_REPLY_INTEGER ||
            range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2) {
            return false;
        }
        const long long first = range->element[0]->integer, last = range->element[1]->integer;
        const redisReply* node = range->element[2];
        const int host_type = node->element[0]->type;
        if (first < 0 || last >= cluster_slots || first > last ||
            (host_type != REDIS_REPLY_STRING && host_type != REDIS_REPLY_NIL) ||
            node->element[1]->type != REDIS_REPLY_INTEGER) {
            return false;
        }
        // NULL (cluster-preferred-endpoint-type unknown-endpoint) and "" (before Redis 7)
        // mean the address we asked at; "?" a node whose address is not known yet: its
        // slots stay unknown until a later load or a MOVED names it.
        std::string host = host_type == REDIS_REPLY_NIL
                               ? std::string()
                               : std::string(node->element[0]->str, node->element[0]->len);
        if (host == "?") continue;
        if (host.empty()) host = asked;
        server_address a{std::move(host), static_cast<int>(node->element[1]->integer)};
        std::size_t at = 0;
        while (at < masters.size() && (masters[at].host != a.host || masters[at].port != a.port))
            ++at;
        if (at == masters.size()) masters.push_back(std::move(a));
        for (long long s = first; s <= last; ++s)
            owner[static_cast<std::size_t>(s)] = static_cast<std::uint16_t>(at);
    }
    if (masters.empty()) return false;
    std::lock_guard<std::mutex> g(mu_);
    owner_ = owner;
    masters_ = std::move(masters);
    stale_ = false;
    return true;
}

RLOCK_DECL std::uint16_t slot_map::index_of(const server_address& a) {
    for (std::size_t i = 0; i < masters_.size(); ++i) {
        if (masters_[i].host == a.host && masters_[i].port == a.port)
            return static_cast<std::uint16_t>(i);
    }
    masters_.push_back(a);
    return static_cast<std::uint16_t>(masters_.size() - 1);
}

}  // namespace rlock::detail

#endif  // RLOCK_DEFINE_RUNTIME
