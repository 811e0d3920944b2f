// rlock::multi_lock — several locks held as one, all or nothing.
//
//     rlock::mutex a(redis, "account:1"), b(redis, "account:2");
//     rlock::multi_lock both{a, b};
//     std::lock_guard<rlock::multi_lock> guard(both);   // both, or (while waiting) neither
//
// Parts may be any rlock locks (mutex, reentrant_lock, fair_lock, read_write_lock's write side,
// red_lock), on one client or several. TimedLockable, with the lease overloads.
//
// All or nothing: if a part cannot be had within the wait, every part already taken is released
// before the call returns, and refused() names the part that refused.
//
// No deadlock: parts are taken in one canonical order (by server, then name), and the call
// never waits for a part while holding another — as std::lock: it waits for the part that
// refused on its own, then tries the others without waiting, and on a refusal releases all
// and starts over from the refusing part. Two multi_locks naming the same locks in different
// orders therefore both finish.
//
// One node, one round trip: when every part is a mutex or reentrant_lock of the same client
// (and none uses fencing or is already held by this thread), acquire and release each run as
// one atomic script on that node.
//
// Watched parts are renewed in their clients' watchdog batches; losing any part marks the
// whole multi_lock lost (lost()) and tells the owner once (the first part's on_lock_lost),
// under multi_lock::hold_id(). A red_lock part is told as its own red_lock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "rlock/config.hpp"
#include "rlock/client.hpp"
#include "rlock/detail/front/async_lockable.hpp"
#include "rlock/detail/front/timed_lockable.hpp"
#include "rlock/detail/protocol/kind.hpp"
#include "rlock/detail/protocol/lua_checks.hpp"
#include "rlock/detail/protocol/multi_scripts.hpp"
#include "rlock/detail/redis/cluster.hpp"
#include "rlock/detail/redis/script.hpp"
#include "rlock/detail/runtime/client_core.hpp"
#include "rlock/detail/waiting/multi_parts.hpp"
#include "rlock/errors.hpp"
#include "rlock/mutex.hpp"
#include "rlock/reentrant_lock.hpp"

namespace rlock {

/// lock() blocks until every part is held (watched parts: renewed by their clients'
/// watchdogs); with a lease every part is leased and never renewed. It never waits while holding
/// a part: a refused part is waited on alone, then the round starts again in canonical order.
/// try_lock() is one attempt at every part; try_lock_for() and try_lock_until() give up at
/// their deadline (steady_clock; another clock's deadline is converted once). A false return
/// leaves no part held, and refused() names the part that refused last. All of them
/// (timed_lockable) throw what a part's lock() throws (would_deadlock, connection errors, ...),
/// with every part already taken released first, and invalid_argument for a lease not positive
/// or over 100 years (nothing sent).
///
/// The asynchronous forms (async_lockable: async_lock, async_try_lock, async_try_lock_for,
/// async_try_lock_until, with a lease and an rlock::owner) run the same algorithm, each step a
/// part's own asynchronous acquire, and complete with one rlock::hold for every part (lost
/// when any part is; released part by part). The owner is every part's: reentrant parts
/// re-enter. They take the parts one by one, never in one script.
class multi_lock : public detail::timed_lockable<multi_lock>, public detail::async_lockable<multi_lock> {
    using clock = std::chrono::steady_clock;

    struct part {
        void* lock = nullptr;
        std::string name;
        bool (*try_until)(void*, detail::wait_call, detail::lease_request) = nullptr;
        void (*release)(void*) = nullptr;
        bool (*is_lost)(void*) = nullptr;
        std::uint64_t (*hold_id)(void*) = nullptr;
        detail::part_view view;  // what the lock says of itself as a part (part_access)
    };

public:
    /// Names the parts; sends nothing. Throws `error` (invalid_argument) when a lock is given
    /// twice.
    template <class... Locks, std::enable_if_t<!detail::is_lock_range_v<Locks...>, int> = 0>
    multi_lock(Locks&... locks) {  // NOLINT(google-explicit-constructor): brace-init
        static_assert(sizeof...(Locks) > 0, "a multi_lock needs at least one lock");
        (parts_.push_back(make_part(locks)), ...);
        name_parts();
    }
    /// The parts from a range known at run time: its elements are locks, or pointers (plain or
    /// smart) or std::reference_wrappers to locks (a basket of N keys:
    /// `std::vector<std::unique_ptr<rlock::mutex>>`, `std::deque<rlock::mutex>`, ...). The range
    /// may go; the locks must outlive the multi_lock. Sends nothing. Throws `error`
    /// (invalid_argument) for an empty range or a lock given twice.
    template <class Range, std::enable_if_t<detail::is_lock_range_v<Range>, int> = 0>
    explicit multi_lock(Range& locks) {
        for (auto& element : locks) parts_.push_back(make_part(detail::lock_of(element)));
        if (parts_.empty()) {
            throw error(errc::invalid_argument, "", "", "a multi_lock needs at least one lock");
        }
        name_parts();
    }
    multi_lock(const multi_lock&) = delete;
    multi_lock& operator=(const multi_lock&) = delete;

    /// Releases every part (on one node: one script). Throws not_owner only to a thread that
    /// holds no part; runtime failures go to on_lock_lost, as for the parts.
    void unlock();

    /// Some part of this thread's hold is lost (no round trip).
    [[nodiscard]] bool lost() const;

    /// The part that refused the calling thread's last failed attempt, as "server/name";
    /// empty when its last attempt succeeded.
    [[nodiscard]] std::string refused() const {
        std::lock_guard<std::mutex> g(mu_);
        return refused_;
    }

    /// The calling thread's hold's id, as on_lock_lost is told it (lost_hold::hold_id): the
    /// parts stand or fall together, and the loss of any is told once, under this id. A red_lock
    /// part is the exception: it is told as its own red_lock, under its own hold_id() (with only
    /// red_lock parts, this is the first one's). Throws `error` (not_owner, naming the multi_lock
    /// and every server) when this thread holds no part. No round trip.
    [[nodiscard]] std::uint64_t hold_id() const;

    /// Number of parts. Never blocks or throws.
    std::size_t size() const noexcept { return parts_.size(); }

private:
    // Canonical order, no lock twice, and whether one script can take them all.
    void name_parts();

    // A part through the lock's public calls and its own view of itself (part_access): no
    // lock type is named here.
    template <class L>
    static part make_part(L& l) {
        part p;
        p.lock = &l;
        p.name = l.name();
        p.try_until = [](void* o, detail::wait_call call, detail::lease_request lease) {
            return detail::part_access::acquire(*static_cast<L*>(o), call, lease);
        };
        p.release = [](void* o) { static_cast<L*>(o)->unlock(); };
        p.is_lost = [](void* o) { return static_cast<L*>(o)->lost(); };
        p.hold_id = [](void* o) { return static_cast<const L*>(o)->hold_id(); };
        p.view = detail::part_access::view(l);
        return p;
    }

    void set_refused(std::string what);

    // The same key given twice through clients of one server whose addresses are spelled
    // differently, which name_parts cannot tell apart (detail::twin_parts): throws
    // invalid_argument when found. Checked as an acquire starts and after each of its rounds.
    void refuse_one_server_twice() const {
        if (twins_) twins_->refuse_one_server();
    }

    friend class detail::timed_lockable<multi_lock>;
    friend class detail::async_lockable<multi_lock>;
    // What a lease error names: every part, as "multi_lock(a, b)", and their servers.
    const std::string& name() const noexcept { return label_; }
    std::string_view server() const noexcept { return servers_; }

    // timed_lockable's entry point (see there).
    bool acquire(detail::wait_call call, detail::lease_request lease);

    // async_lockable's entry point (async_lockable.hpp).
    template <class Token>
    auto start_async(detail::wait_call call, detail::lease_request lease, std::uint64_t owner, Token&& token) {
        return detail::start_with(async_starter(), call, lease, owner, std::forward<Token>(token));
    }

    // What starts an asynchronous acquire of every part, sharing their sites.
    detail::async_start async_starter();

    void release(const std::vector<std::size_t>& taken) noexcept;

    // Links the parts' holds so that the loss of any one is the loss of all, told once.
    void group_parts();

    // `began`: the call's start (its listener's wait is told from it).
    bool acquire_in_one_script(detail::lease_request requested, clock::time_point began, std::size_t& refusing);

    // The one-script release of every part, each with its value (parts_ order).
    detail::script_call release_call(const std::vector<std::string_view>& values) const;

    // Replica sync after the one-script acquire on `c`, as basic_lock's sync_or_undo for each
    // part: too few acknowledgements release every part and throw replica_sync_failed.
    void sync_or_undo(detail::client_core& core, const detail::connection& c,
                      const std::vector<std::string_view>& values) const;

    bool release_in_one_script();

    std::vector<part> parts_;
    std::string label_;    // name()
    std::string servers_;  // server(): each part's servers, once, in parts_ order
    bool one_node_ = false;
    std::shared_ptr<const detail::twin_parts> twins_;  // null: no name given through two clients
    mutable std::mutex mu_;
    std::string refused_;
};

}  // namespace rlock

// Definitions: in every unit, or with RLOCK_SEPARATE_COMPILATION in the one that includes
// <rlock/src.hpp> (rlock/config.hpp).
#if RLOCK_DEFINE_RUNTIME

namespace rlock {

RLOCK_DECL void multi_lock::unlock() {
    if (one_node_ && release_in_one_script()) return;
    bool any = false;
    for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {
        try {
            it->release(it->lock);
            any = true;
        } catch (const error& e) {
            if (e.value() != errc::not_owner) throw;
        }
    }
    if (!any) {
        throw error(errc::not_owner, label_, servers_,
                    "unlock by a thread that holds no part of the multi_lock");
    }
}

RLOCK_DECL bool multi_lock::lost() const {
    return std::any_of(parts_.begin(), parts_.end(),
                       [](const part& p) { return p.is_lost(p.lock); });
}

RLOCK_DECL std::uint64_t multi_lock::hold_id() const {
    const std::uint64_t thread = detail::current_thread_number();
    for (const part& p : parts_) {
        if (!p.view.core) continue;
        if (auto h = p.view.core->reg.find(p.view.kind, p.name, thread)) {
            if (auto group = p.view.core->reg.with([&] { return h->group; })) return group->id;
        }
    }
    // Only red_lock parts are held (each told as its own red_lock): the first one's.
    for (const part& p : parts_) {
        if (p.view.core) continue;
        try {
            return p.hold_id(p.lock);
        } catch (const error& e) {
            if (e.value() != errc::not_owner) throw;
        }
    }
    throw error(errc::not_owner, label_, servers_,
                "this thread does not hold the multi_lock (a part locked on its own is not "
                "a hold of it)");
}

RLOCK_DECL void multi_lock::name_parts() {
    std::sort(parts_.begin(), parts_.end(), [](const part& a, const part& b) {
        return std::tie(a.view.server, a.name) < std::tie(b.view.server, b.name);
    });
    // The same key twice (one name on a server both parts are on, whatever their kinds): the
    // acquire would wait for itself. Distinct servers are distinct locks, unless they are one
    // server under two spellings: one name through two clients of one database is checked by
    // run_id as the acquire goes (twins_).
    auto twins = std::make_shared<detail::twin_parts>();
    for (std::size_t i = 0; i < parts_.size(); ++i) {
        for (std::size_t j = i + 1; j < parts_.size(); ++j) {
            const part& a = parts_[i];
            const part& b = parts_[j];
            if (a.name != b.name) continue;
            for (const std::string& at : a.view.where) {
                const auto& other = b.view.where;
                if (std::find(other.begin(), other.end(), at) == other.end()) continue;
                throw error(errc::invalid_argument, a.name, at,
                            "the same lock is given twice to one multi_lock");
            }
            if (!a.view.core || !b.view.core || a.view.core == b.view.core ||
                a.view.core->ep.options.db != b.view.core->ep.options.db)
                continue;
            twins->pairs.push_back(
                {a.view.core->shared_from_this(), b.view.core->shared_from_this(), a.name});
        }
    }
    if (!twins->pairs.empty()) twins_ = std::move(twins);
    std::vector<std::string_view> seen;
    for (const part& p : parts_) {
        label_ += (label_.empty() ? "multi_lock(" : ", ") + p.name;
        for (const std::string& at : p.view.where) {
            if (std::find(seen.begin(), seen.end(), at) != seen.end()) continue;
            seen.push_back(at);
            servers_ += (servers_.empty() ? "" : ", ") + at;
        }
    }
    label_ += ")";
    one_node_ = std::all_of(parts_.begin(), parts_.end(), [&](const part& p) {
        // In a cluster one script reaches one slot only.
        return p.view.code && !p.view.fencing && p.view.core == parts_.front().view.core &&
               (!p.view.core->ep.slots ||
                detail::key_slot(p.name) == detail::key_slot(parts_.front().name));
    });
}

RLOCK_DECL void multi_lock::set_refused(std::string what) {
    std::lock_guard<std::mutex> g(mu_);
    refused_ = std::move(what);
}

RLOCK_DECL bool multi_lock::acquire(detail::wait_call call, detail::lease_request lease) {
    const clock::time_point deadline = call.deadline;
    refuse_one_server_twice();
    std::size_t first = 0;
    if (one_node_) {
        std::size_t refusing = 0;
        try {
            if (acquire_in_one_script(lease, call.began, refusing)) {
                set_refused("");
                return true;
            }
            first = refusing;  // wait for that one first
        } catch (const error& e) {
            // An ACL's NOPERM does not say which key it refused, and the script ran nothing:
            // the parts one by one name the part refused (and take the others back).
            if (e.value() != errc::auth_failed) throw;
            first = 0;
        }
    }
    for (;;) {
        part& head = parts_[first];
        if (!head.try_until(head.lock, call, lease)) {
            set_refused(head.view.server + "/" + head.name);
            return false;
        }
        std::size_t refusing = parts_.size();
        std::vector<std::size_t> taken{first};
        for (std::size_t i = 0; i < parts_.size(); ++i) {
            if (i == first) continue;
            bool ok = false;
            try {
                ok = parts_[i].try_until(parts_[i].lock, {clock::now(), call.began}, lease);
            } catch (const error& e) {
                // A part out of reach is the one waited for next: its own wait rides the
                // outage until the deadline (detail::part_outage). Any other error is ours.
                if (!detail::part_outage(e) || clock::now() >= deadline) {
                    release(taken);
                    throw;
                }
            } catch (...) {
                release(taken);
                throw;
            }
            if (!ok) {
                refusing = i;
                break;
            }
            taken.push_back(i);
        }
        if (refusing == parts_.size()) {
            group_parts();
            set_refused("");
            return true;
        }
        release(taken);  // never wait while holding a part
        first = refusing;
        if (clock::now() >= deadline) {
            set_refused(parts_[refusing].view.server + "/" + parts_[refusing].name);
            return false;
        }
        refuse_one_server_twice();  // the refusal may be the other half of one key
    }
}

RLOCK_DECL detail::async_start multi_lock::async_starter() {
    refuse_one_server_twice();
    std::vector<detail::multi_acquire::part_ref> refs;
    refs.reserve(parts_.size());
    for (part& p : parts_) {
        std::vector<std::weak_ptr<detail::client_core>> clients;
        for (detail::client_core* c : p.view.clients) clients.push_back(c->weak_from_this());
        refs.push_back({p.view.starter(), p.name, p.view.core != nullptr,
                        p.view.core ? p.view.core->ep.options.on_lock_lost : lock_lost_handler(),
                        std::move(clients)});
    }
    return [refs = std::move(refs), twins = twins_](detail::wait_call call, detail::lease_request lease,
                                    std::uint64_t owner, detail::completion done) {
        auto op = std::make_shared<detail::multi_acquire>(
            refs, twins, call, lease, owner != 0 ? owner : detail::next_owner_number(),
            std::move(done));
        op->begin();
        return rlock::pending(op);
    };
}

RLOCK_DECL void multi_lock::release(const std::vector<std::size_t>& taken) noexcept {
    for (std::size_t i : taken) {
        try {
            parts_[i].release(parts_[i].lock);
        } catch (...) {
        }
    }
}

RLOCK_DECL void multi_lock::group_parts() {
    auto group = std::make_shared<detail::hold_group>();
    group->name = parts_.front().name;
    group->tolerance = 0;
    const std::uint64_t thread = detail::current_thread_number();
    for (part& p : parts_) {
        if (!p.view.core) continue;
        if (!group->tell) group->tell = p.view.core->ep.options.on_lock_lost;
        if (auto h = p.view.core->reg.find(p.view.kind, p.name, thread)) {
            p.view.core->reg.with([&] { h->group = group; });
        }
    }
}

RLOCK_DECL bool multi_lock::acquire_in_one_script(detail::lease_request requested, clock::time_point began,
                                                  std::size_t& refusing) {
    detail::client_core& core = *parts_.front().view.core;
    const std::uint64_t thread = detail::current_thread_number();
    core.throw_if_destroyed(label_, "the client this lock was made from has been destroyed");
    for (part& p : parts_) {
        if (core.reg.find(p.view.kind, p.name, thread)) {
            refusing = 0;
            return false;  // a re-entry or would_deadlock: the parts decide, one by one
        }
    }
    detail::wait_story story = core.events.begin(began);
    story.tries = 1;
    const bool watched = requested.is_watched();
    const std::chrono::milliseconds lease =
        requested.duration(core.ep.options.lock_watchdog_timeout);
    const std::string lease_text = std::to_string(lease.count());
    const std::string token = detail::random_token(), holder = core.holder_id(thread);
    std::vector<std::string_view> values;
    values.reserve(parts_.size());
    for (part& p : parts_) values.push_back(p.view.code == 'm' ? std::string_view(token) : holder);
    detail::script_call call;
    call.start(detail::multi_acquire_script(), parts_.size());
    for (part& p : parts_) call.push(p.view.keys->name);
    call.push(lease_text);
    for (std::size_t i = 0; i < parts_.size(); ++i) {
        call.push(parts_[i].view.code == 'm' ? "m" : "r");
        call.push(values[i]);
    }
    const std::string& name = parts_.front().name;
    const auto sent = clock::now();
    detail::reply_ptr r;
    bool undone_after = false;  // the undo was written after the script, on its connection
    try {
        r = core.pool.run(name, detail::on_break::fail, [&](const detail::connection& c) {
            detail::reply_ptr got;
            try {
                got = detail::run_script(c, call, name, core.ep.name);
            } catch (const error& e) {
                // Left unanswered (a paused server): the undo goes after the script on the
                // same connection, as a lock's attempt does (lock_site), so the server runs
                // both in order once it answers, and nobody waits for it a second time.
                if (e.value() == errc::timeout) {
                    core.note_unanswered(name);
                    detail::script_call undo = release_call(values);
                    undone_after = detail::write_after(c, undo);
                }
                throw;
            }
            if (got && got->type == REDIS_REPLY_ARRAY && got->elements >= 1 &&
                got->element[0]->integer == 1) {
                sync_or_undo(core, c, values);
            }
            return got;
        });
    } catch (const error& e) {
        // A connection that broke (or timed out without the undo written after) may have run
        // the script: undo it, as basic_lock's attempt does, so nothing of ours outlives the
        // failure.
        if (detail::is_ambiguous(e) && !undone_after && !detail::error_access::origin(e).unsent) {
            try {
                detail::script_call undo = release_call(values);
                (void)core.pool.run(name, detail::on_break::retry,
                                    [&](const detail::connection& c) {
                                        return detail::run_script(c, undo, name, core.ep.name);
                                    });
            } catch (const error&) {  // unreachable still: the parts expire with the lease
            }
        }
        throw;
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        throw error(errc::protocol_error, name, core.ep.name,
                    "unexpected reply from the multi-lock script");
    }
    if (r->element[0]->integer != 1) {
        refusing = r->elements > 1 ? static_cast<std::size_t>(r->element[1]->integer - 1) : 0;
        return false;
    }
    auto group = std::make_shared<detail::hold_group>();
    group->name = parts_.front().name;
    group->tell = core.ep.options.on_lock_lost;
    const detail::hold_terms terms{
        lease, watched ? detail::renewal::watched : detail::renewal::leased, sent};
    for (part& p : parts_) {
        const detail::registry::hold_ptr h = core.add_hold(
            *p.view.kind, p.name, p.view.code == 'm' ? token : holder, thread, terms, 0, group);
        p.view.lost_at_unlock->forget(thread);  // a new hold: the last one's verdict ends
        core.events.acquired(p.view.kind->name, p.name, h->id,
                             story);  // each part, as the lock it is
    }
    return true;
}

RLOCK_DECL detail::script_call multi_lock::release_call(
    const std::vector<std::string_view>& values) const {
    detail::script_call call;
    call.start(detail::multi_release_script(), 2 * parts_.size());
    for (const part& p : parts_) {
        call.push(p.view.keys->name);
        call.push(p.view.keys->channel);
    }
    for (std::size_t i = 0; i < parts_.size(); ++i) {
        call.push(parts_[i].view.code == 'm' ? "m" : "r");
        call.push(values[i]);
    }
    return call;
}

RLOCK_DECL void multi_lock::sync_or_undo(detail::client_core& core, const detail::connection& c,
                                         const std::vector<std::string_view>& values) const {
    const int wanted = core.ep.options.sync_replicas;
    if (wanted <= 0) return;
    const std::string& name = parts_.front().name;
    const long long acked = core.wait_for_replicas(c, name);
    if (acked >= wanted) return;
    try {
        detail::script_call undo = release_call(values);
        (void)detail::run_script(c, undo, name, core.ep.name);
    } catch (const error& e) {
        // Not a redirection for the pool to follow: that would run the acquire again.
        throw detail::error_access::unredirected(e);
    }
    throw error(errc::replica_sync_failed, label_, core.ep.name,
                std::to_string(acked) + " of the " + std::to_string(wanted) +
                    " replicas asked for acknowledged the acquire of the multi_lock's " +
                    std::to_string(parts_.size()) + " parts within " +
                    std::to_string(core.ep.options.sync_timeout.count()) + " ms; it was undone");
}

RLOCK_DECL bool multi_lock::release_in_one_script() {
    detail::client_core& core = *parts_.front().view.core;
    const std::uint64_t thread = detail::current_thread_number();
    std::vector<detail::registry::hold_ptr> holds;
    for (part& p : parts_) {
        auto h = core.reg.find(p.view.kind, p.name, thread);
        if (!h || core.reg.with([&] { return h->count; }) != 1) return false;  // part by part
        holds.push_back(std::move(h));
    }
    for (auto& h : holds) core.reg.remove(h);
    std::vector<std::string_view> values;
    values.reserve(holds.size());
    for (const auto& h : holds) values.push_back(h->value);
    detail::script_call call = release_call(values);
    try {
        detail::reply_ptr r = core.pool.run(
            parts_.front().name, detail::on_break::retry, [&](const detail::connection& c) {
                return detail::run_script(c, call, parts_.front().name, core.ep.name);
            });
        // Each part's verdict as a lone lock's unlock keeps it (lock_site::release_level),
        // marked before anyone is told: an on_lock_lost handler that asks lost() sees it.
        for (std::size_t i = 0; i < holds.size() && r && i < r->elements; ++i) {
            detail::hold& h = *holds[i];
            detail::lost_at_unlock_owners& verdict = *parts_[i].view.lost_at_unlock;
            if (r->element[i]->integer < 0 && !core.reg.ended_by_lease(h)) {
                verdict.mark(thread);
                core.reg.report(h, error(errc::lock_lost, h.name, core.ep.name,
                                         "at unlock the part was no longer held"));
            } else if (core.reg.claim_untold_loss(h)) {
                // lost() said lost (its lease ran out before a renewal landed) and the
                // watchdog had not told it yet: the verdict stands, and is told once.
                verdict.mark(thread);
                core.reg.tell_hold(h, error(errc::lock_lost, h.name, core.ep.name,
                                            "the lease ran out before the watchdog could renew it"));
            } else if (core.reg.told_lost(h)) {
                verdict.mark(thread);  // told before: final, whatever the release found
            }
        }
    } catch (const error& e) {
        for (part& p : parts_) p.view.lost_at_unlock->mark(thread);
        core.reg.report(*holds.front(), e);
    }
    // A part taken through its lock's gate (a mutex's local hand-off) frees it: another
    // thread of this client may wait there.
    for (auto& h : holds) {
        h->gate.release();
        core.events.released(h->kind->name, h->name, h->id, h->taken);
    }
    return true;
}

}  // namespace rlock

#endif  // RLOCK_DEFINE_RUNTIME
