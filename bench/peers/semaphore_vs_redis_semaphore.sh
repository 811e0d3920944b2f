#!/usr/bin/env bash
# rlock::semaphore beside redis-semaphore (npm) under one contended workload, in one run on one
# server: W worker processes share ONE semaphore of P permits; each loops acquire (the wait is
# timed), hold H ms, release, away A ms, for T seconds. rlock's side is bench/contention
# (`--kind semaphore`), redis-semaphore's is bench/peers/redis_semaphore_contention.js, which
# defines every figure as bench/contention does. One throwaway redis-server on a free loopback
# port serves all the runs: rlock, redis-semaphore, rlock, redis-semaphore (ROUNDS rounds). Then
# one table.
#
#   bench/peers/semaphore_vs_redis_semaphore.sh
#
#   RLOCK_CONTENTION=path       the bench/contention binary (default: build/test-plain/bench/
#                               contention, else build/bench-peer/bench/contention, which is
#                               built when neither exists)
#   WORKERS=8 PERMITS=3 HOLD_MS=1 AWAY_MS=1 SECONDS_PER_RUN=5 ROUNDS=2
#   RETRY_INTERVAL=ms           redis-semaphore's retryInterval (default: its own, 10 ms)
#
# Installs node/npm (Debian packages) when absent and redis-semaphore + ioredis into
# bench/peers/node_modules (npm ci, from package-lock.json) when missing. Every program's own
# output: build/bench-peers/. Exits 1 when a run counted a violation, 2 when a run failed.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
cd "$rlock_root"

workers=${WORKERS:-8}
permits=${PERMITS:-3}
hold_ms=${HOLD_MS:-1}
away_ms=${AWAY_MS:-1}
seconds=${SECONDS_PER_RUN:-5}
rounds=${ROUNDS:-2}
peers=bench/peers
out=build/bench-peers
mkdir -p "$out"
rm -f "$out"/run-*.out

# --- what the two sides need ------------------------------------------------------------------
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || ensure_packages redis-server
command -v node >/dev/null && command -v npm >/dev/null || ensure_packages nodejs npm
if [ ! -f "$peers/node_modules/redis-semaphore/package.json" ] || [ ! -f "$peers/node_modules/ioredis/package.json" ]; then
    say "installing redis-semaphore and ioredis into $peers/node_modules (npm ci)"
    (cd "$peers" && npm ci --no-audit --no-fund --loglevel=error) >"$out/npm.log" 2>&1 ||
        { cat "$out/npm.log" >&2; say "npm ci failed"; exit 2; }
fi

contention=${RLOCK_CONTENTION:-}
if [ -z "$contention" ]; then
    for c in build/test-plain/bench/contention build/bench-peer/bench/contention; do
        if [ -x "$c" ]; then contention=$c; break; fi
    done
fi
if [ -z "$contention" ]; then
    say "no bench/contention binary: building it in build/bench-peer"
    ensure_deps
    # shellcheck disable=SC2046
    cmake -S . -B build/bench-peer $(generator_args) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRLOCK_BUILD_TESTS=OFF \
        -DRLOCK_BUILD_EXAMPLES=OFF -DRLOCK_BUILD_BENCHMARKS=ON -DRLOCK_INSTALL=OFF >"$out/cmake.log" 2>&1 &&
        cmake --build build/bench-peer --target rlock_contention >>"$out/cmake.log" 2>&1 ||
        { cat "$out/cmake.log" >&2; say "building bench/contention failed"; exit 2; }
    contention=build/bench-peer/bench/contention
fi

# --- one throwaway redis-server -----------------------------------------------------------------
server_pid=
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
}
trap stop_server EXIT
port=
for _ in 1 2 3 4 5; do
    p=$(free_port)
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
        --logfile "$rlock_root/$out/redis-$p.log" &
    server_pid=$!
    for _ in $(seq 1 50); do
        if redis-cli -p "$p" ping >/dev/null 2>&1; then port=$p; break; fi
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] && break
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
done
[ -n "$port" ] || { say "no redis-server could be started"; exit 2; }
uri=redis://127.0.0.1:$port
say "redis-server $(redis-server --version | grep -o 'v=[^ ]*') on $uri; rlock: $contention;" \
    "redis-semaphore $(node -p "require('./$peers/node_modules/redis-semaphore/package.json').version")," \
    "ioredis $(node -p "require('./$peers/node_modules/ioredis/package.json').version"), node $(node --version)"

shape=(--workers "$workers" --permits "$permits" --hold-ms "$hold_ms" --away-ms "$away_ms" --seconds "$seconds")
node_extra=()
if [ -n "${RETRY_INTERVAL:-}" ]; then node_extra+=(--retry-interval "$RETRY_INTERVAL"); fi

# run <n> <label> <command...>: its output to $out/run-<n>-<label>.out, its CPU (user+sys of the
# program and its workers) to $out/run-<n>-<label>.cpu; keeps the worst exit status.
status=0
run() {
    local n=$1 label=$2 rc=0
    shift 2
    local file=$out/run-$n-$label
    say "run $n: $label: $*"
    local TIMEFORMAT='%U %S'
    { time "$@" >"$file.out" 2>"$file.err" || rc=$?; } 2>"$file.cpu"
    cat "$file.err" >&2
    if [ "$rc" -ge 2 ]; then
        say "run $n ($label) failed with status $rc"
        status=2
    elif [ "$rc" -eq 1 ] && [ "$status" -lt 1 ]; then
        status=1
    fi
    sleep 1  # let the server and the machine settle between runs
}

n=0
for r in $(seq 1 "$rounds"); do
    n=$((n + 1))
    run "$n" rlock "$contention" --kind semaphore "${shape[@]}" --uri "$uri" --name "bench:semaphore-vs:$r:rlock" --detail
    n=$((n + 1))
    run "$n" redis-semaphore node "$peers/redis_semaphore_contention.js" "${shape[@]}" --uri "$uri" \
        --name "bench:semaphore-vs:$r:redis-semaphore" --detail "${node_extra[@]}"
done

# --- the table ----------------------------------------------------------------------------------
node - "$out" "$n" <<'EOF'
const fs = require('node:fs');
const [dir, count] = process.argv.slice(2);
const rows = [];
for (let i = 1; i <= Number(count); ++i) {
  const label = fs.existsSync(`${dir}/run-${i}-rlock.out`) ? 'rlock' : 'redis-semaphore';
  const base = `${dir}/run-${i}-${label}`;
  const text = fs.existsSync(`${base}.out`) ? fs.readFileSync(`${base}.out`, 'utf8') : '';
  const [user, sys] = (fs.existsSync(`${base}.cpu`) ? fs.readFileSync(`${base}.cpu`, 'utf8').trim().split(/\s+/).slice(-2) : []).map(Number);
  const row = { run: i, impl: label, cpu: user + sys };
  if (label === 'rlock') {
    const m = /P=(\d+) .*T=([\d.]+) acq\/s=([\d.]+) busy=([\d.]+) wait_ms_p50\/p99\/max=([\d.]+)\/([\d.]+)\/([\d.]+) .*violations=(\d+) load=([\d.]+)/.exec(text);
    if (!m) { rows.push({ ...row, failed: true }); continue; }
    const [P, T, acq, busy, p50, p99, max, violations, load] = m.slice(1).map(Number);
    const perWorker = [...text.matchAll(/wait_ms_p50\/p90\/p99\/max=[\d.]+\/[\d.]+\/([\d.]+)\//g)].map((x) => Number(x[1]));
    // Mean hold from busy = sum(holds) / (T x P): holds clipped to the window, near enough.
    Object.assign(row, { P, acq, busy, p50, p99, max, violations, load, perWorker, hold: (busy * P * 1000) / acq });
  } else {
    let j;
    try { j = JSON.parse(text.trim().split('\n').pop()); } catch { rows.push({ ...row, failed: true }); continue; }
    Object.assign(row, {
      P: j.P, acq: j.acq_per_s, busy: j.busy, p50: j.wait_ms_p50, p99: j.wait_ms_p99, max: j.wait_ms_max,
      violations: j.violations, load: j.load, perWorker: j.per_worker.map((w) => w.wait_ms_p99), hold: j.hold_ms_mean,
    });
  }
  rows.push(row);
}
const f = (x, d) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(d));
const head = ['run', 'impl', 'busy', 'wait p50', 'worst p99', 'p99 per worker', 'max', 'acq/s', 'viol', 'hold mean', 'cpu s', 'load'];
const lines = [head];
for (const r of rows) {
  if (r.failed) { lines.push([String(r.run), r.impl, 'FAILED']); continue; }
  lines.push([
    String(r.run), r.impl, f(r.busy, 3), f(r.p50, 2), f(r.p99, 2),
    `${f(Math.min(...r.perWorker), 2)}..${f(Math.max(...r.perWorker), 2)}`, f(r.max, 2), f(r.acq, 1),
    String(r.violations), f(r.hold, 3), f(r.cpu, 2), f(r.load, 2),
  ]);
}
const width = head.map((_, c) => Math.max(...lines.map((l) => (l[c] || '').length)));
for (const l of lines) console.log(l.map((s, c) => (c < 2 ? s.padEnd(width[c]) : s.padStart(width[c]))).join('  '));
console.log('(times in ms; wait p50/worst p99/max: the worst worker\'s, as bench/contention prints them; ' +
  'p99 per worker: the best..worst worker; hold mean: rlock\'s from busy x P / acq/s; ' +
  'cpu s: user+sys of the program and its workers; load: 1-minute load average at the run\'s start)');
EOF
say "each run's own output: $out/run-*.out"
exit "$status"
