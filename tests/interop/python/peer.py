"""The redis-py side of scripts/interop: redis-py's own Lock (Debian's python3-redis) on a
name that rlock::mutex workers share. Same command and output as the other peers:

    /usr/bin/python3 peer.py contend port=.. name=.. counter=.. threads=2 ms=4000 hold=1 away=1

Each thread connects, prints `EV ready`, waits for the orchestrator's `go <epoch ms>` line on
stdin and sleeps until then; then it loops until ms have passed: Lock(timeout=30).acquire(blocking_timeout=what is
left), INCR the counter (a reply other than 1 is an overlap), hold, DECR, release, stay away.
Prints: RESULT lib=redis-py acq=.. overlaps=.. bad=.. maxwait_ms=.. maxshared=0
"""
import sys
import threading
import time

import redis

args = dict(a.split("=", 1) for a in sys.argv[2:])
stats = {"acq": 0, "overlaps": 0, "bad": 0, "maxwait": 0.0}
stats_lock = threading.Lock()
go = threading.Event()
go_at = [0.0]


def worker():
    r = redis.Redis(host="127.0.0.1", port=int(args["port"]))
    counter = args.get("counter", "interop:counter")
    hold = int(args.get("hold", 1)) / 1000.0
    away = int(args.get("away", 1)) / 1000.0
    lock = r.lock(args.get("name", "interop"), timeout=int(args.get("ttl", 30)))
    r.ping()
    with stats_lock:  # one line at a time: print from two threads can interleave
        print("EV ready t=%d lib=redis-py" % int(time.time() * 1e6), flush=True)
    go.wait()
    time.sleep(max(0.0, go_at[0] - time.time()))
    end = time.monotonic() + int(args.get("ms", 3000)) / 1000.0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        t0 = time.monotonic()
        got = lock.acquire(blocking=True, blocking_timeout=left)
        waited = time.monotonic() - t0
        with stats_lock:
            stats["maxwait"] = max(stats["maxwait"], waited)
        if not got:
            break
        overlap = r.incr(counter) != 1
        time.sleep(hold)
        r.decr(counter)
        lock.release()
        with stats_lock:
            stats["acq"] += 1
            stats["overlaps"] += overlap
        time.sleep(away)


def main():
    if sys.argv[1:2] != ["contend"]:
        print("usage: peer.py contend key=value ...", file=sys.stderr)
        return 2
    threads = [threading.Thread(target=worker) for _ in range(int(args.get("threads", 1)))]
    for t in threads:
        t.start()
    line = sys.stdin.readline()
    if not line.startswith("go "):
        print("ERROR no go line", flush=True)
        stats["bad"] += 1
    else:
        go_at[0] = int(line.split()[1]) / 1000.0
    go.set()
    for t in threads:
        t.join()
    print("RESULT lib=redis-py version=%s acq=%d overlaps=%d bad=%d maxwait_ms=%.1f maxshared=0"
          % (redis.__version__, stats["acq"], stats["overlaps"], stats["bad"],
             stats["maxwait"] * 1000), flush=True)
    return 0 if stats["overlaps"] == 0 and stats["bad"] == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # one line for the orchestrator, the trace for the log
        print("ERROR %r" % (e,), flush=True)
        raise
