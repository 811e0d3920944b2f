// The Redisson side of scripts/interop: real RLock, RFairLock, RReadWriteLock and RFencedLock
// holds on a lock name that C++ processes using rlock share.
//
//   java rlock.interop.Peer <contend|once|latch|permit> key=value ...
//
// Common keys: port (redis-server on 127.0.0.1; with cluster=host:port,... the locks are in that
// Redis Cluster and only the overlap counters on port), name (the lock), kind (lock | fair | read |
// write | rw | fenced), counter (overlap counter key), watchdog (Redisson's lockWatchdogTimeout,
// ms), threads. kind, at, wait and hold may be comma lists: thread i takes item i (or the last).
//
// Start: each thread looks at its lock once (so its first real command is warm), prints
// `EV ready`, and waits for the orchestrator's line `go <epoch ms>` on stdin; then it sleeps
// until go + at (ms, default 0). So arrival order across processes is the orchestrator's,
// whatever a JVM's start-up costs.
//
// contend: each thread loops until ms have passed: wait for the lock (bounded by what is left),
//   INCR the counter (a reply other than 1 is an overlap), hold `hold` ms (reenter=1: lock again,
//   check getHoldCount() == 2, unlock the inner level, hold again), DECR, unlock, stay away
//   `away` ms. kind=rw: each round is a reader or a writer at random; a writer INCRs
//   <counter>:w and must see 1 and <counter>:r at 0, a reader INCRs <counter>:r and must see
//   <counter>:w at 0. kind=fenced: tokens from lockAndGetToken must exceed the last token any
//   peer stored in <counter>:last (checked and stored inside the lock).
//   Prints: RESULT acq=.. overlaps=.. maxwait_ms=.. bad=.. maxshared=..
// once: each thread prints `EV waiting`, waits up to `wait` ms (wait=-1: lock(), no wait
//   time), then `EV acquired` (or `EV gaveup`), holds `hold` ms, checks it still holds
//   (isHeldByCurrentThread), prints `EV releasing`, unlocks, `EV released`. Every EV line
//   carries t=<epoch microseconds>.
//   Prints: RESULT acq=.. overlaps=.. bad=..
// contend with kind=semaphore (RSemaphore) or kind=permit (RPermitExpirableSemaphore), latch
//   (RCountDownLatch) and permit (RPermitExpirableSemaphore: take a permit with or without a
//   lease and release it or leave it taken, or release one by id): see contendSemaphore,
//   contendPermit, latch and permit below.
package rlock.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.Lock;

import org.redisson.Redisson;
import org.redisson.api.RCountDownLatch;
import org.redisson.api.RFencedLock;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.client.codec.StringCodec;
import org.redisson.config.ClusterServersConfig;
import org.redisson.config.Config;
import org.redisson.config.ShardedSubscriptionMode;

public final class Peer {
    private final Map<String, String> args = new HashMap<>();
    private RedissonClient redisson;
    private RedissonClient counters;

    private final AtomicLong acquisitions = new AtomicLong();
    private final AtomicLong overlaps = new AtomicLong();
    private final AtomicLong bad = new AtomicLong();
    private final AtomicLong maxWaitUs = new AtomicLong();
    private final AtomicLong maxShared = new AtomicLong();

    public static void main(String[] argv) throws Exception {
        if (argv.length < 1) {
            System.err.println("usage: Peer <contend|once|latch|permit> key=value ...");
            System.exit(2);
        }
        Peer p = new Peer();
        for (int i = 1; i < argv.length; ++i) {
            int eq = argv[i].indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("not key=value: " + argv[i]);
            p.args.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        int rc = p.run(argv[0]);
        System.out.flush();
        System.exit(rc);
    }

    private String arg(String key, String otherwise) {
        return args.getOrDefault(key, otherwise);
    }

    private long num(String key, long otherwise) {
        return Long.parseLong(arg(key, Long.toString(otherwise)));
    }

    /** Item `thread` of a comma list (the last item for threads beyond it). */
    private String item(String key, int thread, String otherwise) {
        String[] items = arg(key, otherwise).split(",");
        return items[Math.min(thread, items.length - 1)];
    }

    private final CountDownLatch go = new CountDownLatch(1);
    private volatile long goMs;

    /** Warm, say ready, wait for the go line, then sleep until go + at. */
    private void start(int thread, Lock lock) throws InterruptedException {
        ((RLock) lock).isLocked();
        startWarm(thread);
    }

    /** Say ready (connections warm), wait for the go line, then sleep until go + at. */
    private void startWarm(int thread) throws InterruptedException {
        event("ready", thread, "");
        go.await();
        long left = goMs + Long.parseLong(item("at", thread, "0")) - System.currentTimeMillis();
        if (left > 0) Thread.sleep(left);
    }

    private static long nowUs() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000L;
    }

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private void event(String what, int thread, String extra) {
        say("EV " + what + " t=" + nowUs() + " lib=redisson thread=" + thread
            + (extra.isEmpty() ? "" : " " + extra));
    }

    /** A client of the server on `port`, or of the cluster when `cluster` is set. */
    private RedissonClient connect(boolean toCluster) {
        Config config = new Config();
        config.setLockWatchdogTimeout(num("watchdog", 30000));
        config.setCodec(StringCodec.INSTANCE);
        if (toCluster) {
            ClusterServersConfig cluster = config.useClusterServers()
                .setMasterConnectionMinimumIdleSize(1)
                .setMasterConnectionPoolSize(8)
                .setSubscriptionConnectionMinimumIdleSize(1)
                .setSubscriptionConnectionPoolSize(4);
            for (String node : arg("cluster", "").split(",")) {
                cluster.addNodeAddress("redis://" + node);
            }
            // sharded=off: classic pub/sub in the cluster (its default, AUTO, is sharded there).
            if ("off".equals(arg("sharded", "auto"))) {
                cluster.setShardedSubscriptionMode(ShardedSubscriptionMode.OFF);
            }
        } else {
            config.useSingleServer()
                .setAddress("redis://127.0.0.1:" + arg("port", "6379"))
                .setConnectionMinimumIdleSize(1)
                .setConnectionPoolSize(8)
                .setSubscriptionConnectionMinimumIdleSize(1)
                .setSubscriptionConnectionPoolSize(4);
        }
        return Redisson.create(config);
    }

    private int run(String command) throws Exception {
        // With cluster=host:port,... the locks live in that Redis Cluster and the overlap
        // counters stay on the plain server on `port`, shared with the other peers.
        boolean toCluster = args.containsKey("cluster");
        redisson = connect(toCluster);
        counters = toCluster ? connect(false) : redisson;
        try {
            int threads = (int) num("threads", 1);
            Thread[] workers = new Thread[threads];
            for (int i = 0; i < threads; ++i) {
                final int index = i;
                workers[i] = new Thread(() -> {
                    try {
                        if (command.equals("contend")) contend(index);
                        else if (command.equals("once")) once(index);
                        else if (command.equals("latch")) latch(index);
                        else if (command.equals("permit")) permit(index);
                        else throw new IllegalArgumentException("unknown command " + command);
                    } catch (Exception e) {
                        say("ERROR thread=" + index + " " + e);
                        e.printStackTrace();
                        bad.incrementAndGet();
                    }
                });
                workers[i].start();
            }
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line = in.readLine();
            if (line == null || !line.startsWith("go ")) {
                throw new IllegalStateException("no go line on stdin");
            }
            goMs = Long.parseLong(line.substring(3).trim());
            go.countDown();
            for (Thread w : workers) w.join();
            say("RESULT lib=redisson version=" + redissonVersion() + " acq=" + acquisitions.get()
                + " overlaps=" + overlaps.get() + " bad=" + bad.get()
                + " maxwait_ms=" + String.format("%.1f", maxWaitUs.get() / 1000.0)
                + " maxshared=" + maxShared.get());
            return overlaps.get() == 0 && bad.get() == 0 ? 0 : 1;
        } finally {
            if (counters != redisson) counters.shutdown(0, 2, TimeUnit.SECONDS);
            redisson.shutdown(0, 2, TimeUnit.SECONDS);
        }
    }

    private static String redissonVersion() {
        Package p = Redisson.class.getPackage();
        String v = p == null ? null : p.getImplementationVersion();
        return v == null ? "unknown" : v;
    }

    /** The java.util.concurrent view of the lock kind this round uses. */
    private Lock lockFor(String kind) {
        String name = arg("name", "interop");
        switch (kind) {
            case "lock": return redisson.getLock(name);
            case "fair": return redisson.getFairLock(name);
            case "read": return redisson.getReadWriteLock(name).readLock();
            case "write": return redisson.getReadWriteLock(name).writeLock();
            case "fenced": return redisson.getFencedLock(name);
            default: throw new IllegalArgumentException("unknown kind " + kind);
        }
    }

    private long incr(String key, long by) {
        return counters.getAtomicLong(key).addAndGet(by);
    }

    private long get(String key) {
        return counters.getAtomicLong(key).get();
    }

    private void updateMax(AtomicLong max, long value) {
        max.accumulateAndGet(value, Math::max);
    }

    /**
     * contend with kind=semaphore: RSemaphore `name`, one permit per round; the counter may
     * reach `permits`, never more.
     */
    private void contendSemaphore(int thread) throws Exception {
        final String counter = arg("counter", "interop:counter");
        final long hold = num("hold", 1), away = num("away", 1), permits = num("permits", 1);
        RSemaphore s = redisson.getSemaphore(arg("name", "interop"));
        s.availablePermits();
        startWarm(thread);
        final long end = System.nanoTime() + num("ms", 3000) * 1_000_000L;
        while (true) {
            long left = (end - System.nanoTime()) / 1_000_000L;
            if (left <= 0) break;
            long t0 = System.nanoTime();
            boolean got = s.tryAcquire(1, Duration.ofMillis(left));
            updateMax(maxWaitUs, (System.nanoTime() - t0) / 1000);
            if (!got) break;
            acquisitions.incrementAndGet();
            long in = incr(counter, 1);
            updateMax(maxShared, in);
            if (in > permits) overlaps.incrementAndGet();
            Thread.sleep(hold);
            incr(counter, -1);
            s.release();
            if (away > 0) Thread.sleep(away);
        }
    }

    /**
     * contend with kind=permit: RPermitExpirableSemaphore `name`, one permit per round, taken by
     * tryAcquire(what is left, lease, ms) (lease: `lease` ms, default 5000) and released by its
     * id; the counter may reach `permits`, never more.
     */
    private void contendPermit(int thread) throws Exception {
        final String counter = arg("counter", "interop:counter");
        final long hold = num("hold", 1), away = num("away", 1), permits = num("permits", 1);
        final long lease = num("lease", 5000);
        RPermitExpirableSemaphore s = redisson.getPermitExpirableSemaphore(arg("name", "interop"));
        s.availablePermits();
        startWarm(thread);
        final long end = System.nanoTime() + num("ms", 3000) * 1_000_000L;
        while (true) {
            long left = (end - System.nanoTime()) / 1_000_000L;
            if (left <= 0) break;
            long t0 = System.nanoTime();
            String id = s.tryAcquire(left, lease, TimeUnit.MILLISECONDS);
            updateMax(maxWaitUs, (System.nanoTime() - t0) / 1000);
            if (id == null) break;
            acquisitions.incrementAndGet();
            long in = incr(counter, 1);
            updateMax(maxShared, in);
            if (in > permits) overlaps.incrementAndGet();
            Thread.sleep(hold);
            incr(counter, -1);
            s.release(id);  // throws when the permit is no longer taken
            if (away > 0) Thread.sleep(away);
        }
    }

    /**
     * permit: RPermitExpirableSemaphore `name`, one permit per thread; role, wait, lease, after
     * and hold are comma lists.
     * role=take: tryAcquire(wait, lease, ms) (lease=0: -1, a permit without lease), with events
     *   waiting, then acquired id=<hex> (or gaveup). after=release: holds `hold` ms and releases
     *   it by its id (releasing, released). after=detach: leaves it taken (detached id=<hex>),
     *   so that the JVM exits without releasing it.
     * role=release: release(`id`) of a permit given out by any client (releasing, released),
     *   then checks that tryRelease(id) is false from then on.
     */
    private void permit(int thread) throws Exception {
        RPermitExpirableSemaphore s = redisson.getPermitExpirableSemaphore(arg("name", "interop"));
        String role = item("role", thread, "take");
        s.availablePermits();
        startWarm(thread);
        if (role.equals("release")) {
            String id = arg("id", "");
            event("releasing", thread, "id=" + id);
            s.release(id);
            event("released", thread, "id=" + id);
            if (s.tryRelease(id)) {
                say("ERROR tryRelease(" + id + ") true after the permit was released");
                bad.incrementAndGet();
            }
            return;
        }
        long wait = Long.parseLong(item("wait", thread, "10000"));
        long lease = Long.parseLong(item("lease", thread, "0"));
        event("waiting", thread, "");
        String id = s.tryAcquire(wait, lease > 0 ? lease : -1, TimeUnit.MILLISECONDS);
        if (id == null) {
            event("gaveup", thread, "");
            return;
        }
        event("acquired", thread, "id=" + id);
        acquisitions.incrementAndGet();
        if (item("after", thread, "release").equals("detach")) {
            event("detached", thread, "id=" + id);
            return;
        }
        Thread.sleep(Long.parseLong(item("hold", thread, "100")));
        event("releasing", thread, "id=" + id);
        s.release(id);
        event("released", thread, "id=" + id);
    }

    private void contend(int thread) throws Exception {
        final String kind = arg("kind", "lock");
        if (kind.equals("semaphore")) {
            contendSemaphore(thread);
            return;
        }
        if (kind.equals("permit")) {
            contendPermit(thread);
            return;
        }
        final String counter = arg("counter", "interop:counter");
        final long hold = num("hold", 1), away = num("away", 1);
        final boolean reenter = num("reenter", 0) != 0;
        start(thread, lockFor(kind.equals("rw") ? "read" : kind));
        final long end = System.nanoTime() + num("ms", 3000) * 1_000_000L;
        while (true) {
            long left = (end - System.nanoTime()) / 1_000_000L;
            if (left <= 0) break;
            String k = kind;
            if (kind.equals("rw")) {
                k = ThreadLocalRandom.current().nextInt(3) == 0 ? "write" : "read";
            }
            Lock lock = lockFor(k);
            long t0 = System.nanoTime();
            long token = -1;
            boolean got;
            if (k.equals("fenced")) {
                Long t = ((RFencedLock) lock).tryLockAndGetToken(left, TimeUnit.MILLISECONDS);
                got = t != null;
                if (got) token = t;
            } else {
                got = ((RLock) lock).tryLock(left, TimeUnit.MILLISECONDS);
            }
            updateMax(maxWaitUs, (System.nanoTime() - t0) / 1000);
            if (!got) break;
            acquisitions.incrementAndGet();
            try {
                inside(k, counter, token, hold, reenter, (RLock) lock);
            } finally {
                lock.unlock();
            }
            if (away > 0) Thread.sleep(away);
        }
    }

    /** The critical section of one contend round: enter and leave the overlap counters. */
    private void inside(String k, String counter, long token, long hold, boolean reenter,
                        RLock lock) throws Exception {
        if (k.equals("read")) {
            long readers = incr(counter + ":r", 1);
            updateMax(maxShared, readers);
            if (get(counter + ":w") != 0) overlaps.incrementAndGet();
            Thread.sleep(hold);
            incr(counter + ":r", -1);
            return;
        }
        String key = k.equals("write") ? counter + ":w" : counter;
        if (incr(key, 1) != 1) overlaps.incrementAndGet();
        if (k.equals("write") && get(counter + ":r") != 0) overlaps.incrementAndGet();
        if (k.equals("fenced")) {
            long last = get(counter + ":last");
            if (token <= last) {
                say("ERROR fencing token " + token + " after " + last);
                bad.incrementAndGet();
            }
            counters.getAtomicLong(counter + ":last").set(token);
        }
        Thread.sleep(hold);
        if (reenter) {
            lock.lock();
            try {
                if (lock.getHoldCount() != 2) {
                    say("ERROR hold count " + lock.getHoldCount() + " after re-entry");
                    bad.incrementAndGet();
                }
            } finally {
                lock.unlock();
            }
            // The inner unlock must leave the lock held: others entering now are overlaps.
            Thread.sleep(hold);
        }
        incr(key, -1);
    }

    /**
     * latch: RCountDownLatch `name`. Thread i's role (role=wait|down, a comma list) waits up to
     * `wait` ms for the count to reach 0 (events waiting, then passed or gaveup) or counts down
     * once at go + at (events counting, counted).
     */
    private void latch(int thread) throws Exception {
        RCountDownLatch latch = redisson.getCountDownLatch(arg("name", "interop"));
        latch.getCount();
        String role = item("role", thread, "wait");
        startWarm(thread);
        if (role.equals("down")) {
            event("counting", thread, "");
            latch.countDown();
            event("counted", thread, "");
            return;
        }
        event("waiting", thread, "");
        boolean passed = latch.await(Long.parseLong(item("wait", thread, "10000")), TimeUnit.MILLISECONDS);
        event(passed ? "passed" : "gaveup", thread, "");
        if (passed) acquisitions.incrementAndGet();
    }

    private void once(int thread) throws Exception {
        final String kind = item("kind", thread, "lock");
        final String counter = arg("counter", "interop:counter");
        final long wait = Long.parseLong(item("wait", thread, "10000"));
        final long hold = Long.parseLong(item("hold", thread, "100"));
        Lock lock = lockFor(kind);
        RLock r = (RLock) lock;
        start(thread, lock);
        event("waiting", thread, "kind=" + kind);
        long token = -1;
        boolean got;
        if (kind.equals("fenced")) {
            Long t = ((RFencedLock) lock).tryLockAndGetToken(wait, TimeUnit.MILLISECONDS);
            got = t != null;
            if (got) token = t;
        } else if (wait < 0) {
            r.lock();  // no wait time: Redisson's defaults (RFairLock: threadWaitTime 5 min)
            got = true;
        } else {
            got = r.tryLock(wait, TimeUnit.MILLISECONDS);
        }
        if (!got) {
            event("gaveup", thread, "");
            return;
        }
        event("acquired", thread, "kind=" + kind + (token >= 0 ? " token=" + token : ""));
        acquisitions.incrementAndGet();
        boolean shared = kind.equals("read");
        String key = shared ? counter + ":r" : counter;
        long in = incr(key, 1);
        if (shared) updateMax(maxShared, in);
        else if (in != 1) overlaps.incrementAndGet();
        if (num("reenter", 0) != 0) {
            r.lock();
            if (r.getHoldCount() != 2) bad.incrementAndGet();
            r.unlock();
        }
        Thread.sleep(hold);
        if (!r.isHeldByCurrentThread()) {
            say("ERROR lost the hold on " + r.getName() + " while holding it " + hold + " ms");
            bad.incrementAndGet();
        }
        incr(key, -1);
        event("releasing", thread, "");
        lock.unlock();
        event("released", thread, "");
    }
}
