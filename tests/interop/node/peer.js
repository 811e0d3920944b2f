// The node-redlock side of scripts/interop: redlock (4.2.0, over ioredis) on a name that
// rlock::mutex workers share. Same command and output as the other peers:
//
//   node peer.js contend port=.. name=.. counter=.. threads=2 ms=4000 hold=1 away=1
//
// Each "thread" (an async loop; each with its own connection) connects, prints `EV ready`,
// waits for the orchestrator's `go <epoch ms>` line on stdin and sleeps until then; then it
// loops until ms have passed:
// redlock.lock(name, 30000) with redlock's own retries (retryDelay 200 ms, jitter 100 ms, as
// many tries as fit in what is left), INCR the counter (a reply other than 1 is an overlap),
// hold, DECR, unlock, stay away.
// Prints: RESULT lib=node-redlock acq=.. overlaps=.. bad=.. maxwait_ms=.. maxshared=0
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');

const args = Object.fromEntries(process.argv.slice(3).map((a) => {
  const eq = a.indexOf('=');
  return [a.slice(0, eq), a.slice(eq + 1)];
}));
const stats = { acq: 0, overlaps: 0, bad: 0, maxwait: 0 };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const now = () => Number(process.hrtime.bigint()) / 1e6;
const go = new Promise((resolve) => {
  let buffered = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    buffered += chunk;
    const m = /^go (\d+)\n/.exec(buffered);
    if (m) resolve(Number(m[1]));
  });
  process.stdin.on('end', () => resolve(null));
});

async function worker() {
  const port = Number(args.port);
  const client = new Redis({ host: '127.0.0.1', port, lazyConnect: false });
  const counter = new Redis({ host: '127.0.0.1', port });
  const retryDelay = 200;
  const ttl = Number(args.ttl || 30000);
  const hold = Number(args.hold || 1);
  const away = Number(args.away || 1);
  const name = args.name || 'interop';
  const key = args.counter || 'interop:counter';
  let end;
  try {
    await client.ping();
    await counter.ping();
    console.log(`EV ready t=${Date.now() * 1000} lib=node-redlock`);
    const at = await go;
    if (at === null) throw new Error('no go line');
    await sleep(Math.max(0, at - Date.now()));
    end = now() + Number(args.ms || 3000);
    for (;;) {
      const left = end - now();
      if (left <= 0) break;
      const redlock = new Redlock([client], {
        retryCount: Math.max(0, Math.floor(left / retryDelay)), retryDelay, retryJitter: 100,
      });
      const t0 = now();
      let lock;
      try {
        lock = await redlock.lock(name, ttl);
      } catch (e) {
        if (!(e instanceof Redlock.LockError)) throw e;
      }
      stats.maxwait = Math.max(stats.maxwait, now() - t0);
      if (!lock) break;
      if ((await counter.incr(key)) !== 1) stats.overlaps += 1;
      await sleep(hold);
      await counter.decr(key);
      await lock.unlock();
      stats.acq += 1;
      await sleep(away);
    }
  } catch (e) {
    console.log(`ERROR ${e}`);
    stats.bad += 1;
  } finally {
    client.disconnect();
    counter.disconnect();
  }
}

async function main() {
  if (process.argv[2] !== 'contend') {
    console.error('usage: peer.js contend key=value ...');
    process.exit(2);
  }
  const n = Number(args.threads || 1);
  await Promise.all(Array.from({ length: n }, worker));
  process.stdin.destroy();
  const version = require('redlock/package.json').version;
  console.log(`RESULT lib=node-redlock version=${version} acq=${stats.acq} overlaps=${stats.overlaps}`
    + ` bad=${stats.bad} maxwait_ms=${stats.maxwait.toFixed(1)} maxshared=0`);
  process.exit(stats.overlaps === 0 && stats.bad === 0 ? 0 : 1);
}

main();
