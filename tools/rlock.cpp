// rlock — the operator's command for locks in Redis: who holds a lock, who waits, which names
// are locked, and deleting a stuck lock so that its waiters wake. It is rlock::inspect,
// rlock::list_locks and rlock::force_unlock (rlock/inspect.hpp) on the command line; the JSON
// fields and exit codes are documented in docs/api.md ("The rlock command").
//
// Exit codes: 0 found / done (watch: interrupted by SIGINT or SIGTERM); 1 not found (nothing
// listed, nothing to delete); 2 bad input, a key of a non-lock type, or a connection / server
// error; 3 force-unlock not confirmed.
// Every failure is one line on stderr: no exception leaves main.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "rlock/client.hpp"
#include "rlock/detail/redis/connect.hpp"
#include "rlock/detail/redis/hiredis.hpp"
#include "rlock/errors.hpp"
#include "rlock/inspect.hpp"
#include "rlock/version.hpp"

namespace {

constexpr int exit_found = 0, exit_not_found = 1, exit_bad = 2, exit_not_confirmed = 3;

constexpr std::string_view usage = R"(usage: rlock COMMAND [ARGS] [OPTIONS]

Commands:
  inspect NAME         what Redis holds for the lock NAME: kind, holders and leases,
                       readers, the fair queue, permits, the fencing counter
  list [PATTERN]       every name with a lock, semaphore or latch (SCAN; every master of a
                       Redis Cluster), one line each: name, kind, holder, lease, waiters.
                       PATTERN is a glob (*, ?, [...]) matched against names
  force-unlock NAME    delete the lock NAME whoever holds it and wake its waiters
                       (asks for confirmation on stdin unless --yes)
  watch NAME           follow NAME until interrupted: a line for each holder that comes or
                       goes, count or lease that changes (a renewal), waiter that joins or
                       leaves, and each unlock message; read again on every message on the
                       name's channels and at least every --interval

Options:
  --uri URI            the deployment: redis://[[user:]password@]host[:port][/db],
                       unix:///path[?db=N], redis-sentinel://host:port[,...]/master[/db] or
                       redis-cluster://host:port[,...]  (default: $RLOCK_URI, else
                       redis://127.0.0.1:6379)
  --json               print JSON instead of a table (inspect, list)
  --yes                force-unlock without asking
  --interval MS        watch: the longest time between two reads (default 1000); acquisitions
                       and renewals publish nothing, so they are seen at the next read
  -h, --help           this text
  --version            rlock's version

Exit codes: 0 found / done, 1 not found, 2 bad input or connection error,
            3 force-unlock not confirmed.
)";

/// `text` on one line: control characters written as \n, \r, \t or \xNN (defined below).
std::string one_line(std::string_view text);

/// A command line that cannot be run: its message goes to stderr, exit 2.
struct bad_input {
    std::string message;
};

struct command_line {
    std::string command;
    std::vector<std::string> args;
    std::string uri;
    std::string uri_from = "the default";  // where `uri` came from, for a bad one
    bool json = false;
    bool yes = false;
    std::chrono::milliseconds interval{1000};
    bool help = false;
    bool version = false;
};

command_line parse(int argc, char** argv) {
    command_line cl;
    // Read before the client starts any thread.
    if (const char* env = std::getenv("RLOCK_URI")) {  // NOLINT(concurrency-mt-unsafe)
        cl.uri = env;
        cl.uri_from = "$RLOCK_URI";
    }
    if (cl.uri.empty()) {
        cl.uri = "redis://127.0.0.1:6379";
        cl.uri_from = "the default";
    }
    bool options_done = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (!options_done && a.size() > 1 && a[0] == '-') {
            if (a == "--") {
                options_done = true;
            } else if (a == "--json") {
                cl.json = true;
            } else if (a == "--yes" || a == "-y") {
                cl.yes = true;
            } else if (a == "-h" || a == "--help") {
                cl.help = true;
            } else if (a == "--version") {
                cl.version = true;
            } else if (a == "--uri") {
                if (i + 1 >= argc) throw bad_input{"--uri needs a value (rlock --help)"};
                cl.uri = argv[++i];
                cl.uri_from = "--uri";
            } else if (a.substr(0, 6) == "--uri=") {
                cl.uri = std::string(a.substr(6));
                cl.uri_from = "--uri";
            } else if (a == "--interval") {
                if (i + 1 >= argc) throw bad_input{"--interval needs a value in ms (rlock --help)"};
                const std::string v = argv[++i];
                char* end = nullptr;
                const long ms = std::strtol(v.c_str(), &end, 10);
                if (v.empty() || *end != '\0' || ms < 10 || ms > 3600000) {
                    throw bad_input{"--interval takes milliseconds from 10 to 3600000, not '" + v + "'"};
                }
                cl.interval = std::chrono::milliseconds(ms);
            } else {
                throw bad_input{"unknown option '" + std::string(a) + "' (rlock --help)"};
            }
        } else if (cl.command.empty()) {
            cl.command = std::string(a);
        } else {
            cl.args.emplace_back(a);
        }
    }
    return cl;
}

// --- formatting -------------------------------------------------------------------------------

std::string seconds(std::chrono::milliseconds ms) {
    const long long v = ms.count();
    const long long whole = (v < 0 ? -v : v) / 1000, frac = (v < 0 ? -v : v) % 1000;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%lld.%03lld s", v < 0 ? "-" : "", whole, frac);
    return buf;
}

std::string ttl_text(const rlock::remaining_ttl& t) { return t ? seconds(*t) : std::string("no expiry"); }

const char* kind_text(rlock::lock_kind k) {
    switch (k) {
        case rlock::lock_kind::not_found: return "not found";
        case rlock::lock_kind::token: return "token (mutex, red_lock node, redis-py, node-redlock)";
        case rlock::lock_kind::reentrant: return "reentrant (reentrant_lock, Redisson RLock)";
        case rlock::lock_kind::fair: return "fair (fair_lock, Redisson RFairLock)";
        case rlock::lock_kind::read_write: return "read_write (read_write_lock, Redisson RReadWriteLock)";
        case rlock::lock_kind::count: return "count (semaphore or count_down_latch)";
        case rlock::lock_kind::permit_expirable: return "permit_expirable (permit_expirable_semaphore)";
    }
    return "unknown";
}

/// The length of the UTF-8 sequence at `s[at]` (1 to 4), or 0 when the bytes there are not one
/// (a stray continuation byte, a sequence cut short, an overlong form, a surrogate, or beyond
/// U+10FFFF).
std::size_t utf8_length(std::string_view s, std::size_t at) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[at + k]); };
    const unsigned char lead = b(0);
    if (lead < 0x80) return 1;
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (lead >= 0xc2 && lead <= 0xdf) {
        n = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
        n = 3;
        if (lead == 0xe0) lo = 0xa0;
        if (lead == 0xed) hi = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
        n = 4;
        if (lead == 0xf0) lo = 0x90;
        if (lead == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (at + n > s.size() || b(1) < lo || b(1) > hi) return 0;
    for (std::size_t k = 2; k < n; ++k) {
        if (b(k) < 0x80 || b(k) > 0xbf) return 0;
    }
    return n;
}

bool is_utf8(std::string_view s) {
    for (std::size_t at = 0; at < s.size();) {
        const std::size_t n = utf8_length(s, at);
        if (n == 0) return false;
        at += n;
    }
    return true;
}

/// `s` as a JSON string (valid UTF-8, as JSON must be): quotes, backslashes and control bytes
/// escaped; a byte that is not part of UTF-8 as U+FFFD (json_of adds the name's bytes in hex).
std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (std::size_t at = 0; at < s.size(); ++at) {
        const char c = s[at];
        const auto b = static_cast<unsigned char>(c);
        if (b >= 0x80) {
            const std::size_t n = utf8_length(s, at);
            if (n == 0) {
                out += "\\ufffd";
            } else {
                out.append(s.substr(at, n));
                at += n - 1;
            }
        } else if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (b < 0x20 || b == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", b);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string json_ms(const std::optional<std::chrono::milliseconds>& t) {
    return t ? std::to_string(t->count()) : std::string("null");
}

template <class T>
std::string json_int(const std::optional<T>& v) {
    return v ? std::to_string(*v) : std::string("null");
}

std::string json_of(const rlock::lock_info& i) {
    std::ostringstream o;
    o << "{\"name\":" << json_string(i.name);
    if (!is_utf8(i.name)) {
        static const char hex[] = "0123456789abcdef";
        std::string bytes;
        for (const char c : i.name) {
            bytes += hex[static_cast<unsigned char>(c) >> 4];
            bytes += hex[static_cast<unsigned char>(c) & 0xf];
        }
        o << R"(,"name_hex":")" << bytes << '"';
    }
    o << ",\"server\":" << json_string(i.server)
      << ",\"found\":" << (i.found() ? "true" : "false") << ",\"kind\":" << json_string(to_string(i.kind))
      << ",\"ttl_ms\":" << json_ms(i.ttl) << ",\"mode\":" << (i.mode.empty() ? "null" : json_string(i.mode))
      << ",\"holders\":[";
    for (std::size_t k = 0; k < i.holders.size(); ++k) {
        const rlock::lock_holder& h = i.holders[k];
        o << (k ? "," : "") << "{\"id\":" << json_string(h.id) << ",\"role\":" << json_string(to_string(h.role))
          << ",\"count\":" << h.count << ",\"lease_ms\":" << json_ms(h.lease);
        if (h.role == rlock::holder_role::reader) o << ",\"live_holds\":" << h.live_holds;
        o << ",\"origin\":" << json_string(to_string(h.origin)) << "}";
    }
    o << "],\"waiters\":[";
    for (std::size_t k = 0; k < i.waiters.size(); ++k) {
        const rlock::lock_waiter& w = i.waiters[k];
        o << (k ? "," : "") << "{\"id\":" << json_string(w.id) << ",\"deadline_in_ms\":" << json_ms(w.deadline_in)
          << ",\"origin\":" << json_string(to_string(w.origin)) << "}";
    }
    o << "],\"count\":" << json_int(i.count) << ",\"permits\":[";
    for (std::size_t k = 0; k < i.permits.size(); ++k) {
        o << (k ? "," : "") << "{\"id\":" << json_string(i.permits[k].id)
          << ",\"lease_ms\":" << json_ms(i.permits[k].lease) << "}";
    }
    o << "],\"fencing_counter\":" << json_int(i.fencing_counter) << "}";
    return o.str();
}

std::string origin_note(rlock::holder_origin o) {
    switch (o) {
        case rlock::holder_origin::rlock: return "  (rlock)";
        case rlock::holder_origin::this_client: return "  (this client)";
        case rlock::holder_origin::unknown: break;
    }
    return "";
}

void print_table(const rlock::lock_info& i) {
    std::cout << "name      " << one_line(i.name) << "\nserver    " << one_line(i.server) << "\nkind      "
              << kind_text(i.kind) << '\n';
    if (!i.found()) return;
    // The name's key: its TTL when it has one, "no expiry" for a holder's key without one.
    if (i.ttl || !i.holders.empty()) std::cout << "ttl       " << ttl_text(i.ttl) << '\n';
    if (!i.mode.empty()) std::cout << "mode      " << i.mode << '\n';
    for (const rlock::lock_holder& h : i.holders) {
        std::cout << (h.role == rlock::holder_role::reader   ? "reader    "
                      : h.role == rlock::holder_role::writer ? "writer    "
                                                             : "holder    ")
                  << one_line(h.id) << "  count " << h.count << "  lease " << ttl_text(h.lease);
        if (h.role == rlock::holder_role::reader) std::cout << "  live holds " << h.live_holds;
        std::cout << origin_note(h.origin) << '\n';
    }
    if (i.holders.empty() && i.kind != rlock::lock_kind::count && i.kind != rlock::lock_kind::permit_expirable) {
        std::cout << "holder    (none)\n";
    }
    for (std::size_t k = 0; k < i.waiters.size(); ++k) {
        const rlock::lock_waiter& w = i.waiters[k];
        std::cout << "waiter " << k + 1 << (k + 1 < 10 ? "  " : " ") << one_line(w.id) << "  deadline in "
                  << (w.deadline_in ? seconds(*w.deadline_in) : std::string("(none)")) << origin_note(w.origin)
                  << '\n';
    }
    if (i.count) std::cout << (i.kind == rlock::lock_kind::count ? "count     " : "free      ") << *i.count << '\n';
    for (const rlock::permit_info& p : i.permits) {
        std::cout << "permit    " << one_line(p.id) << "  lease " << (p.lease ? seconds(*p.lease) : std::string("permanent"))
                  << '\n';
    }
    if (i.fencing_counter) std::cout << "fencing   " << *i.fencing_counter << '\n';
}

/// One `list` row: name, kind, holder, lease, waiters.
std::vector<std::string> row_of(const rlock::lock_info& i) {
    std::string holder = "-", lease = "-";
    if (!i.holders.empty()) {
        holder = one_line(i.holders.front().id);
        if (i.holders.size() > 1) holder += " +" + std::to_string(i.holders.size() - 1);
        lease = ttl_text(i.holders.front().lease);
    } else if (i.kind == rlock::lock_kind::count) {
        holder = "count " + std::to_string(i.count.value_or(0));
    } else if (i.kind == rlock::lock_kind::permit_expirable) {
        holder = std::to_string(i.permits.size()) + " taken, " + std::to_string(i.count.value_or(0)) + " free";
    }
    return {one_line(i.name), to_string(i.kind), holder, lease, std::to_string(i.waiters.size())};
}

void print_rows(const std::vector<std::vector<std::string>>& rows) {
    std::vector<std::size_t> width(rows.front().size(), 0);
    for (const auto& r : rows) {
        for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    }
    for (const auto& r : rows) {
        std::string line;
        for (std::size_t c = 0; c < r.size(); ++c) {
            line += r[c];
            if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
        }
        std::cout << line << '\n';
    }
}

// --- commands ---------------------------------------------------------------------------------

/// `uri` with its password (if any) written as ***: for a message.
std::string without_password(const std::string& uri) {
    const std::size_t scheme = uri.find("://");
    if (scheme == std::string::npos) return uri;
    // Up to the last '@', as the URI parser reads the userinfo: a password may hold '@', and
    // one that holds '/' (a URI the parser refuses) is a password still.
    const std::size_t from = scheme + 3, at = uri.rfind('@');
    if (at == std::string::npos || at < from) return uri;
    const std::size_t colon = uri.find(':', from);
    const std::size_t secret = colon != std::string::npos && colon < at ? colon + 1 : from;
    return uri.substr(0, secret) + "***" + uri.substr(at);
}

/// The client of `cl.uri`. A failure to connect names the lock the command is about (`name`;
/// empty for list), and a bad URI says where it came from.
rlock::client connect(const command_line& cl, std::string_view name) {
    try {
        return rlock::client(cl.uri);
    } catch (const rlock::error& e) {
        if (e.value() == rlock::errc::invalid_argument && e.server().empty()) {
            throw rlock::error(e.value(), name, "",
                               e.cause() + " (" + cl.uri_from + ": " + without_password(cl.uri) + ")");
        }
        if (e.lock().empty() && !name.empty()) throw rlock::error(e.value(), name, e.server(), e.cause());
        throw;
    }
}

void expect_args(const command_line& cl, std::size_t least, std::size_t most, std::string_view what) {
    if (cl.args.size() < least || cl.args.size() > most) {
        throw bad_input{"usage: rlock " + cl.command + " " + std::string(what) + " [--uri URI] (rlock --help)"};
    }
}

int inspect(const command_line& cl) {
    expect_args(cl, 1, 1, "NAME");
    rlock::client redis = connect(cl, cl.args[0]);
    const rlock::lock_info i = rlock::inspect(redis, cl.args[0]);
    if (cl.json) {
        std::cout << json_of(i) << '\n';
    } else {
        print_table(i);
    }
    return i.found() ? exit_found : exit_not_found;
}

int list(const command_line& cl) {
    expect_args(cl, 0, 1, "[PATTERN]");
    rlock::client redis = connect(cl, "");
    const std::vector<rlock::lock_info> locks = rlock::list_locks(redis, cl.args.empty() ? "" : cl.args[0]);
    if (cl.json) {
        std::cout << '[';
        for (std::size_t k = 0; k < locks.size(); ++k) std::cout << (k ? "," : "") << json_of(locks[k]);
        std::cout << "]\n";
    } else {
        std::vector<std::vector<std::string>> rows{{"NAME", "KIND", "HOLDER", "LEASE", "WAITERS"}};
        for (const rlock::lock_info& i : locks) rows.push_back(row_of(i));
        print_rows(rows);
    }
    return locks.empty() ? exit_not_found : exit_found;
}

/// Who holds `i`, for messages: "held by A (count 2), B (count 1)" or "held by nobody".
std::string holders_text(const rlock::lock_info& i) {
    if (i.holders.empty()) return "held by nobody";
    std::string s = "held by ";
    for (std::size_t k = 0; k < i.holders.size(); ++k) {
        const rlock::lock_holder& h = i.holders[k];
        const std::string role =
            h.role == rlock::holder_role::exclusive ? "" : std::string(to_string(h.role)) + ", ";
        s += (k ? ", " : "") + h.id + " (" + role + "count " + std::to_string(h.count) + ")";
    }
    return s;
}

/// The channel(s) the kind's force unlock publishes on.
std::string channel_text(const rlock::lock_info& i) {
    using rlock::detail::prefixed_key;
    switch (i.kind) {
        case rlock::lock_kind::token: return prefixed_key("rlock_lock__channel", i.name);
        case rlock::lock_kind::reentrant: return prefixed_key("redisson_lock__channel", i.name);
        case rlock::lock_kind::fair:
            // The unlock evicts the waiters at the head whose deadline has passed (or that have
            // none) and wakes the first live one.
            for (const rlock::lock_waiter& w : i.waiters) {
                if (w.deadline_in && w.deadline_in->count() > 0) {
                    return prefixed_key("redisson_lock__channel", i.name) + ":" + w.id;
                }
            }
            return i.waiters.empty() ? std::string("no channel (no waiter queued)")
                                     : std::string("no channel (no live waiter queued)");
        case rlock::lock_kind::read_write: return prefixed_key("redisson_rwlock", i.name);
        default: return "";
    }
}

int force_unlock(const command_line& cl) {
    expect_args(cl, 1, 1, "NAME");
    const std::string& name = cl.args[0];
    rlock::client redis = connect(cl, name);
    const rlock::lock_info seen = rlock::inspect(redis, name);
    if (!seen.found()) {
        std::cout << "rlock: \"" << one_line(name) << "\" not found on " << seen.server << "; nothing deleted\n";
        return exit_not_found;
    }
    if (seen.kind == rlock::lock_kind::count || seen.kind == rlock::lock_kind::permit_expirable) {
        // Refused whatever the answer would be: not asked.
        (void)rlock::force_unlock(redis, name);  // throws invalid_argument, deletes nothing
    }
    if (!cl.yes) {
        std::cerr << "Delete the " << to_string(seen.kind) << " lock \"" << one_line(name) << "\" on " << seen.server
                  << ", " << one_line(holders_text(seen)) << "? [y/N] " << std::flush;
        std::string answer;
        if (!std::getline(std::cin, answer) || (answer != "y" && answer != "Y" && answer != "yes")) {
            std::cerr << "rlock: not confirmed; nothing deleted\n";
            return exit_not_confirmed;
        }
    }
    // Deleted only when it is still held as shown: asked about one holder, the operator has not
    // agreed to delete another (the shown one's key may have expired and a live holder come).
    const rlock::forced_unlock done = rlock::force_unlock(redis, name, seen);
    if (done.changed) {
        std::cout << "rlock: \"" << one_line(name) << "\" changed since it was shown: now "
                  << (done.before.found() ? std::string(to_string(done.before.kind)) + ", " +
                                                one_line(holders_text(done.before))
                                          : std::string("not found"))
                  << "; nothing deleted\n";
        return exit_not_found;
    }
    if (!done.deleted) {
        std::cout << "rlock: \"" << one_line(name) << "\" was held by nobody by then ("
                  << to_string(done.before.kind) << "); nothing deleted\n";
        return exit_not_found;
    }
    std::cout << "deleted the " << to_string(done.before.kind) << " lock \"" << one_line(name) << "\" on "
              << done.before.server << ", " << one_line(holders_text(done.before));
    if (done.before.kind == rlock::lock_kind::read_write) {
        std::cout << ", with its readers' hold keys";
    }
    std::cout << "; woke its waiters on " << one_line(channel_text(done.before)) << '\n';
    return exit_found;
}

// --- watch ----------------------------------------------------------------------------------

// SIGINT / SIGTERM may be delivered to any of the client's threads: the handler writes to a
// pipe the watching thread polls, so it leaves at once.
std::atomic<bool> interrupted{false};
int interrupt_pipe[2] = {-1, -1};

extern "C" void on_interrupt(int /*signal*/) {
    interrupted = true;
    const char c = 'x';
    (void)!::write(interrupt_pipe[1], &c, 1);
}

std::string now_text() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm local{};
    ::localtime_r(&t, &local);
    char buf[32];
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03lld", local.tm_hour, local.tm_min, local.tm_sec,
                  static_cast<long long>(ms));
    return buf;
}

/// `name` with the glob characters PSUBSCRIBE reads escaped.
std::string glob_escaped(const std::string& name) {
    std::string out;
    for (const char c : name) {
        if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}

/// What changed from `was` to `is`, one line each (without the time).
std::vector<std::string> changes(const rlock::lock_info& was, const rlock::lock_info& is,
                                 std::chrono::milliseconds elapsed) {
    std::vector<std::string> out;
    if (was.kind != is.kind) out.push_back(std::string("kind ") + to_string(was.kind) + " -> " + to_string(is.kind));
    if (was.mode != is.mode && !is.mode.empty()) out.push_back("mode " + is.mode);
    auto key = [](const rlock::lock_holder& h) { return std::string(to_string(h.role)) + " " + h.id; };
    for (const rlock::lock_holder& h : was.holders) {
        bool kept = false;
        for (const rlock::lock_holder& n : is.holders) kept = kept || key(n) == key(h);
        if (!kept) out.push_back("- " + key(h) + " released (or expired, or deleted)");
    }
    for (const rlock::lock_holder& h : is.holders) {
        const rlock::lock_holder* before = nullptr;
        for (const rlock::lock_holder& o : was.holders) {
            if (key(o) == key(h)) before = &o;
        }
        if (!before) {
            out.push_back("+ " + key(h) + " count " + std::to_string(h.count) + " lease " + ttl_text(h.lease));
            continue;
        }
        if (before->count != h.count) {
            out.push_back("  " + key(h) + " count " + std::to_string(before->count) + " -> " + std::to_string(h.count));
        }
        // A lease only runs down between two reads; one that rose was renewed or re-entered.
        if (before->lease && h.lease && *h.lease > *before->lease - elapsed + std::chrono::milliseconds(50)) {
            out.push_back("  " + key(h) + " lease renewed: " + seconds(*h.lease));
        }
    }
    std::set<std::string> waited, waits;
    for (const rlock::lock_waiter& w : was.waiters) waited.insert(w.id);
    for (const rlock::lock_waiter& w : is.waiters) waits.insert(w.id);
    for (const std::string& w : waited) {
        if (!waits.count(w)) out.push_back("- waiter " + w + " left the queue");
    }
    for (std::size_t k = 0; k < is.waiters.size(); ++k) {
        if (!waited.count(is.waiters[k].id)) {
            out.push_back("+ waiter " + is.waiters[k].id + " queued at " + std::to_string(k + 1));
        }
    }
    if (was.count != is.count && is.count) {
        out.push_back("count " + (was.count ? std::to_string(*was.count) : std::string("-")) + " -> " +
                      std::to_string(*is.count));
    }
    if (was.permits.size() != is.permits.size()) {
        out.push_back("permits taken " + std::to_string(was.permits.size()) + " -> " +
                      std::to_string(is.permits.size()));
    }
    return out;
}

/// Subscribes a connection of its own to every channel a lock, semaphore or latch of `name`
/// publishes on (classic pub/sub; with Redis Cluster none: the reads at each interval alone).
/// A fair lock's waiters' channels take a pattern, which an ACL's channel rules match
/// literally (`&redisson_lock__channel:{app:*` does not grant the PSUBSCRIBE of
/// `redisson_lock__channel:{app:orders}:*`): refused, `no_pattern` is set and the watch goes on
/// without those messages (the queue itself is still read every --interval).
rlock::detail::context_ptr subscribe_to(rlock::client& redis, const std::string& name,
                                        bool& no_pattern) {
    rlock::detail::endpoint& ep = rlock::detail::client_access::core(redis).ep;
    if (ep.slots) return nullptr;
    using rlock::detail::prefixed_key;
    rlock::detail::context_ptr c = rlock::detail::connect(ep);
    const std::string fair_waiters = glob_escaped(prefixed_key("redisson_lock__channel", name)) + ":*";
    const std::string latch = "redisson_countdownlatch__channel__{" + name + "}";
    const rlock::detail::connection conn{c.get()};
    // One confirmation per channel; each read through run_command would wait for the next.
    for (const std::string& ch : {prefixed_key("rlock_lock__channel", name), prefixed_key("redisson_lock__channel", name),
                                  prefixed_key("redisson_rwlock", name), prefixed_key("redisson_sc", name), latch}) {
        try {
            (void)rlock::detail::run_command(conn, {"SUBSCRIBE", ch}, name, ep.name);
        } catch (const rlock::error& e) {
            // Which channel the ACL refused (watch needs every kind's: docs/api.md).
            if (e.value() != rlock::errc::auth_failed) throw;
            throw rlock::error(e.value(), name, ep.name, e.cause() + " (SUBSCRIBE " + ch + ")");
        }
    }
    try {
        (void)rlock::detail::run_command(conn, {"PSUBSCRIBE", fair_waiters}, name, ep.name);
    } catch (const rlock::error& e) {
        if (e.value() != rlock::errc::auth_failed) throw;
        no_pattern = true;
    }
    return c;
}

int watch(const command_line& cl) {
    expect_args(cl, 1, 1, "NAME");
    const std::string& name = cl.args[0];
    rlock::client redis = connect(cl, name);
    if (::pipe2(interrupt_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        throw rlock::error(rlock::errc::invalid_argument, name, redis.server(), "cannot make a pipe");
    }
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    bool no_pattern = false;
    const rlock::detail::context_ptr sub = subscribe_to(redis, name, no_pattern);
    rlock::lock_info last = rlock::inspect(redis, name);
    auto read_at = std::chrono::steady_clock::now();
    auto show = [&](const rlock::lock_info& i, const std::vector<std::string>& lines) {
        if (cl.json) {
            std::cout << json_of(i) << std::endl;
            return;
        }
        for (const std::string& l : lines) std::cout << now_text() << "  " << one_line(l) << std::endl;
    };
    show(last, {std::string(last.found() ? "" : "(not found) ") + "watching " + name + " on " + last.server +
                (sub ? "" : " (Redis Cluster: reads every --interval only)") +
                (no_pattern ? " (PSUBSCRIBE refused: a fair lock's wake-ups are not shown)"
                            : "")});
    if (!cl.json) {
        for (const std::string& l : changes(rlock::lock_info{}, last, std::chrono::milliseconds(0))) show(last, {l});
    }
    while (!interrupted) {
        pollfd p[2] = {{interrupt_pipe[0], POLLIN, 0}, {sub ? sub->fd : -1, POLLIN, 0}};
        const int ready = ::poll(p, 2, static_cast<int>(cl.interval.count()));
        if (ready < 0 && errno != EINTR) {
            throw rlock::error(rlock::errc::connection_failed, name, last.server, "poll failed");
        }
        if (sub) {
            if (ready > 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
                const bool ok = rlock::detail::read_replies(sub.get(), [&](const redisReply* r) {
                    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
                    const std::string_view kind = rlock::detail::reply_text(r->element[0]);
                    const redisReply* channel = r->element[r->elements - 2];
                    const redisReply* payload = r->element[r->elements - 1];
                    if (kind != "message" && kind != "pmessage") return;
                    if (!cl.json) {
                        show(last, {"message \"" + std::string(rlock::detail::reply_text(payload)) + "\" on " +
                                    std::string(rlock::detail::reply_text(channel))});
                    }
                });
                if (!ok) {
                    throw rlock::error(rlock::errc::connection_failed, name, last.server,
                                       "the subscription broke");
                }
            }
        }
        if (interrupted) break;
        const rlock::lock_info now = rlock::inspect(redis, name);
        const auto at = std::chrono::steady_clock::now();
        const std::vector<std::string> lines =
            changes(last, now, std::chrono::duration_cast<std::chrono::milliseconds>(at - read_at));
        if (!lines.empty()) show(now, lines);
        last = now;
        read_at = at;
    }
    return exit_found;
}

int run(int argc, char** argv) {
    const command_line cl = parse(argc, argv);
    if (cl.help) {
        std::cout << usage;
        return exit_found;
    }
    if (cl.version) {
        std::cout << "rlock " << RLOCK_VERSION_MAJOR << '.' << RLOCK_VERSION_MINOR << '.'
                  << RLOCK_VERSION_PATCH << '\n';
        return exit_found;
    }
    if (cl.command.empty()) throw bad_input{"no command (rlock --help)"};
    if (cl.command == "inspect") return inspect(cl);
    if (cl.command == "list") return list(cl);
    if (cl.command == "force-unlock") return force_unlock(cl);
    if (cl.command == "watch") return watch(cl);
    throw bad_input{"unknown command '" + cl.command + "' (rlock --help)"};
}

/// `text` on one line: control characters (a name may hold a newline) written as \n, \r, \t
/// or \xNN, so that a failure is one line on stderr whatever the name.
std::string one_line(std::string_view text) {
    std::string out;
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u != 0x7f) {
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 0xf];
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const bad_input& e) {
        std::cerr << "rlock: " << one_line(e.message) << '\n';
    } catch (const rlock::error& e) {
        // what() starts with "rlock: " and names the lock and server
        std::cerr << one_line(e.what()) << '\n';
    } catch (const std::exception& e) {
        std::cerr << "rlock: " << one_line(e.what()) << '\n';
    } catch (...) {
        std::cerr << "rlock: unknown failure\n";
    }
    return exit_bad;
}
