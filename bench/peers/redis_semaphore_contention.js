#!/usr/bin/env node
// bench/contention's `--kind semaphore` workload, run with redis-semaphore's Semaphore (npm
// `redis-semaphore`, ioredis client) instead of rlock::semaphore, so that the two can be set side
// by side on one server (bench/peers/semaphore_vs_redis_semaphore.sh).
//
// W worker processes (node, each with its own ioredis connection) share ONE semaphore of P
// permits for T seconds. Each worker loops: acquire() (the wait is timed), hold H ms, release(),
// stay away A ms. The parent collects every hold and prints one JSON object, with the figures
// defined exactly as bench/contention.cpp defines them:
//
//   acq_per_s   acquisitions made in the window of T seconds, per second
//   busy        sum of all holds (clipped to the window) / (T x permits): 1.0 means no permit
//               ever idled
//   wait_ms     the worst worker's p50, p99 and max wait for acquire() (each the maximum over
//               the workers); per_worker has each worker's own (p50/p90/p99/max, nearest rank)
//   handoff_ms  contended hand-overs only (the next holder was already waiting when the holder
//               called release()): time from release() being called to the next acquire()
//               returning
//   violations  acquisitions that found all P permits held, from the holds' timestamps.
//               process.hrtime is libuv's uv_hrtime, CLOCK_MONOTONIC on Linux, the clock that
//               bench/contention's std::chrono::steady_clock reads, one for every process on
//               the machine. Non-zero exits 1.
//   load        the 1-minute load average when the run started
//
// With --counter each worker also INCRs a shared Redis counter right after acquire() returns
// and DECRs it right before release(); a value above P counts in counter_violations. Off by
// default: the two round trips lengthen every hold, so the workload is no longer bench/
// contention's.
//
// Sleeps (hold, away, the wait for the start instant) are Atomics.wait on a private buffer: the
// thread blocks for the given time like bench/contention's std::this_thread::sleep_for, rather
// than a setTimeout, whose wake-up lands on the event loop's millisecond timer (about 1-2 ms for
// a 1 ms timer). Nothing is pending on the event loop while a worker holds or stays away
// (redis-semaphore's refresh timer fires after 0.8 x lockTimeout = 8 s).
//
//   node redis_semaphore_contention.js --uri redis://127.0.0.1:PORT [--workers 8] [--permits 3]
//        [--hold-ms 1] [--away-ms 1] [--seconds 5] [--name NAME] [--retry-interval MS]
//        [--counter] [--detail]
//
// redis-semaphore's options are its defaults (lockTimeout 10000, acquireTimeout 10000,
// acquireAttemptsLimit Infinity, retryInterval 10, refreshInterval 8000) unless
// --retry-interval is given. With --detail the parent also resets the server's command stats
// after the warm-up and reports the commands per acquisition (as bench/contention --detail).
'use strict';

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');

function usage(why) {
  process.stderr.write(
    `redis_semaphore_contention: ${why}\nusage: redis_semaphore_contention.js --uri redis://127.0.0.1:PORT ` +
      '[--workers N] [--permits N] [--hold-ms MS] [--away-ms MS] [--seconds S] [--name NAME] ' +
      '[--retry-interval MS] [--counter] [--detail]\n'
  );
  process.exit(2);
}

function parse(argv) {
  const o = {
    workers: 8,
    permits: 3,
    holdMs: 1,
    awayMs: 1,
    seconds: 5,
    uri: '',
    name: '',
    retryInterval: undefined,
    counter: false,
    detail: false,
    worker: false,
  };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`missing value after ${a}`);
      return argv[++i];
    };
    const number = (lo) => {
      const v = value();
      const d = Number(v);
      if (v === '' || !Number.isFinite(d) || !(d >= lo)) usage(`bad value for ${a}: ${v}`);
      return d;
    };
    if (a === '--workers') o.workers = Math.trunc(number(1));
    else if (a === '--permits') o.permits = Math.trunc(number(1));
    else if (a === '--hold-ms') o.holdMs = number(0);
    else if (a === '--away-ms') o.awayMs = number(0);
    else if (a === '--seconds') o.seconds = number(0.001);
    else if (a === '--uri') o.uri = value();
    else if (a === '--name') o.name = value();
    else if (a === '--retry-interval') o.retryInterval = number(0);
    else if (a === '--counter') o.counter = true;
    else if (a === '--detail') o.detail = true;
    else if (a === '--worker') o.worker = true;
    else usage(`unknown argument ${a}`);
  }
  if (!o.uri) usage('--uri is required (this program starts no redis-server of its own)');
  return o;
}

const nowNs = () => process.hrtime.bigint();
const sleeper = new Int32Array(new SharedArrayBuffer(4));
/** Blocks the thread for `ms` milliseconds (like std::this_thread::sleep_for). */
function sleepMs(ms) {
  if (ms > 0) Atomics.wait(sleeper, 0, 0, ms);
}
/** Blocks until the monotonic instant `ns` (like std::this_thread::sleep_until). */
function sleepUntil(ns) {
  const left = Number(ns - nowNs()) / 1e6;
  sleepMs(left);
}

function semaphoreOptions(o) {
  // Only what the command line asks for: everything else is redis-semaphore's default.
  return o.retryInterval === undefined ? undefined : { retryInterval: o.retryInterval };
}

// ---------------------------------------------------------------------------------------------
// Worker side: talks to the parent over the IPC channel.

async function runWorker(o) {
  const redis = new Redis(o.uri, { lazyConnect: true });
  await redis.connect();
  const sem = new Semaphore(redis, o.name, o.permits, semaphoreOptions(o));
  const counterKey = `${o.name}:inside`;
  // Warm-up outside the window: connects and loads the script (EVALSHA falls back to EVAL once).
  await sem.acquire();
  await sem.release();

  const start = await new Promise((resolve) => {
    process.once('message', (m) => resolve(BigInt(m.start)));
    process.send({ ready: true });
  });
  const end = start + BigInt(Math.round(o.seconds * 1e9));
  // asked, acquired, released, unlocked: ns, relative to `start` (fits a double exactly).
  const turns = [];
  let counterViolations = 0;
  sleepUntil(start);
  while (nowNs() < end) {
    const asked = nowNs();
    await sem.acquire();
    const acquired = nowNs();
    if (o.counter && (await redis.incr(counterKey)) > o.permits) ++counterViolations;
    sleepMs(o.holdMs);
    if (o.counter) await redis.decr(counterKey);
    const released = nowNs();
    await sem.release();
    const unlocked = nowNs();
    turns.push([asked, acquired, released, unlocked].map((t) => Number(t - start)));
    sleepMs(o.awayMs);
  }
  await new Promise((resolve) => process.send({ turns, counterViolations }, resolve));
  redis.disconnect();
  process.disconnect();
}

// ---------------------------------------------------------------------------------------------
// Parent side

/** Nearest rank, as bench/contention's percentile(). */
function percentile(values, q) {
  if (values.length === 0) return 0;
  const v = Float64Array.from(values).sort();
  const rank = Math.ceil(q * v.length);
  return v[Math.min(v.length, Math.max(rank, 1)) - 1];
}

function loadAverage() {
  try {
    return Number(fs.readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
  } catch {
    return -1;
  }
}

function packageVersion(name) {
  // Their package.json files are not exported, so read them off the resolved entry point.
  let dir = path.dirname(require.resolve(name));
  for (;;) {
    const file = path.join(dir, 'package.json');
    if (fs.existsSync(file)) {
      const p = JSON.parse(fs.readFileSync(file, 'utf8'));
      if (p.name === name) return p.version;
    }
    const up = path.dirname(dir);
    if (up === dir) return 'unknown';
    dir = up;
  }
}

function spawnWorker(o) {
  const args = [
    __filename, '--worker', '--uri', o.uri, '--name', o.name,
    '--workers', String(o.workers), '--permits', String(o.permits),
    '--hold-ms', String(o.holdMs), '--away-ms', String(o.awayMs), '--seconds', String(o.seconds),
  ];
  if (o.retryInterval !== undefined) args.push('--retry-interval', String(o.retryInterval));
  if (o.counter) args.push('--counter');
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const w = { child, turns: null, counterViolations: 0 };
  w.ready = new Promise((resolve, reject) => {
    child.once('message', (m) => (m && m.ready ? resolve() : reject(new Error('bad hello'))));
    child.once('exit', (code) => reject(new Error(`worker exited (${code}) before it was ready`)));
  });
  // The results arrive as one message; the exit comes after it (or instead of it).
  const results = new Promise((resolve, reject) => {
    child.on('message', (m) => {
      if (m && m.turns) {
        w.turns = m.turns;
        w.counterViolations = m.counterViolations;
        resolve();
      }
    });
    child.once('exit', () => reject(new Error('worker exited without its results')));
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal)));
  w.done = results.then(() => exited).then((code) => {
    if (code !== 0) throw new Error(`worker exited (${code})`);
  });
  w.ready.catch(() => {});
  results.catch(() => {});
  return w;
}

async function commandsPerAcquisition(redis, acquisitions) {
  const info = await redis.info('commandstats');
  const out = {};
  for (const line of info.split('\n')) {
    const m = /^cmdstat_([^:]+):calls=(\d+),[^,]*,usec_per_call=([\d.]+)/.exec(line);
    if (!m || m[1].startsWith('config') || m[1].startsWith('info')) continue;
    out[m[1]] = { per_acquisition: Number((Number(m[2]) / acquisitions).toFixed(2)), usec_per_call: Number(m[3]) };
  }
  return out;
}

async function parentMain(o) {
  if (!o.name) o.name = `bench:contention:${process.pid}`;
  const admin = new Redis(o.uri, { lazyConnect: true });
  await admin.connect();
  const key = `semaphore:${o.name}`; // redis-semaphore's key for `name`
  const counterKey = `${o.name}:inside`;
  await admin.del(key, counterKey);
  const load = loadAverage();

  const workers = [];
  for (let i = 0; i < o.workers; ++i) workers.push(spawnWorker(o));
  try {
    await Promise.all(workers.map((w) => w.ready));
  } catch (e) {
    for (const w of workers) w.child.kill('SIGKILL');
    throw e;
  }
  if (o.detail) await admin.config('RESETSTAT');
  // Every worker sleeps until the same instant; 20 ms is ample for them to read it.
  const start = nowNs() + 20000000n;
  const windowNs = Math.round(o.seconds * 1e9);
  for (const w of workers) w.child.send({ start: start.toString() });
  try {
    await Promise.all(workers.map((w) => w.done));
  } catch (e) {
    for (const w of workers) w.child.kill('SIGKILL');
    throw e;
  }

  // Every hold, by when it began (times relative to `start`).
  const all = [];
  for (const w of workers) for (const t of w.turns) all.push(t);
  all.sort((a, b) => a[1] - b[1]);
  const ASKED = 0, ACQUIRED = 1, RELEASED = 2, UNLOCKED = 3;

  // An acquisition that finds `permits` holds still running is a violation. At equal times a
  // release comes first.
  const edges = [];
  for (const t of all) {
    edges.push([t[ACQUIRED], +1]);
    edges.push([t[RELEASED], -1]);
  }
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let violations = 0, holding = 0, mostInside = 0;
  for (const [, step] of edges) {
    holding += step;
    if (step > 0 && holding > o.permits) ++violations;
    mostInside = Math.max(mostInside, holding);
  }

  let acquisitions = 0, busyNs = 0, holdNs = 0;
  for (const t of all) {
    if (t[ACQUIRED] >= 0 && t[ACQUIRED] < windowNs) ++acquisitions;
    const a = Math.max(t[ACQUIRED], 0), b = Math.min(t[RELEASED], windowNs);
    if (b > a) busyNs += b - a;
    holdNs += t[RELEASED] - t[ACQUIRED];
  }

  const perWorker = workers.map((w) => {
    const waits = w.turns.map((t) => (t[ACQUIRED] - t[ASKED]) / 1e6);
    return {
      turns: w.turns.length,
      wait_ms_p50: percentile(waits, 0.5),
      wait_ms_p90: percentile(waits, 0.9),
      wait_ms_p99: percentile(waits, 0.99),
      wait_ms_max: percentile(waits, 1.0),
    };
  });
  const worst = (k) => Math.max(0, ...perWorker.map((p) => p[k]));

  // Contended hand-overs: the next holder asked before this one called release().
  const handoffs = [];
  for (let i = 0; i + 1 < all.length; ++i) {
    const prev = all[i], next = all[i + 1];
    if (next[ASKED] > prev[RELEASED] || next[ACQUIRED] < prev[RELEASED]) continue;
    handoffs.push((next[ACQUIRED] - prev[RELEASED]) / 1e6);
  }

  const round = (x, d) => Number(x.toFixed(d));
  const result = {
    kind: `redis-semaphore P=${o.permits}`,
    W: o.workers,
    P: o.permits,
    H: o.holdMs,
    A: o.awayMs,
    T: o.seconds,
    acq_per_s: round(acquisitions / o.seconds, 1),
    busy: round(busyNs / (windowNs * o.permits), 3),
    wait_ms_p50: round(worst('wait_ms_p50'), 2),
    wait_ms_p99: round(worst('wait_ms_p99'), 2),
    wait_ms_max: round(worst('wait_ms_max'), 2),
    handoff_ms_p50: round(percentile(handoffs, 0.5), 3),
    handoff_ms_p99: round(percentile(handoffs, 0.99), 3),
    violations,
    most_inside: mostInside,
    counter_violations: o.counter ? workers.reduce((s, w) => s + w.counterViolations, 0) : null,
    hold_ms_mean: round(all.length ? holdNs / all.length / 1e6 : 0, 3),
    load,
    per_worker: perWorker.map((p) => Object.fromEntries(Object.entries(p).map(([k, v]) => [k, k === 'turns' ? v : round(v, 2)]))),
    semaphore_options: semaphoreOptions(o) ?? 'defaults',
    versions: { 'redis-semaphore': packageVersion('redis-semaphore'), ioredis: packageVersion('ioredis'), node: process.versions.node },
  };
  if (o.detail) result.server_per_acquisition = await commandsPerAcquisition(admin, acquisitions + 4 * o.workers);
  await admin.del(key, counterKey);
  admin.disconnect();
  process.stdout.write(JSON.stringify(result) + '\n');
  return violations === 0 && !(result.counter_violations > 0) ? 0 : 1;
}

const opts = parse(process.argv.slice(2));
(opts.worker ? runWorker(opts).then(() => 0) : parentMain(opts)).then(
  (code) => {
    process.exitCode = code;
  },
  (e) => {
    process.stderr.write(`redis_semaphore_contention${opts.worker ? ` worker ${process.pid}` : ''}: ${e && e.stack ? e.stack : e}\n`);
    process.exit(2);
  }
);
