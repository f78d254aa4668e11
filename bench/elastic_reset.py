#!/usr/bin/env python3
"""What a lost worker costs an elastic kolo job: the time from a worker's SIGKILL to the first
step the survivors complete in their new world (kill -> new round's first commit), over repeated
trials with the victim and the moment drawn at random, rank 0's host included.

Each trial is one `kolo run` in elastic mode running python/tests/elastic_worker.py (a small
model; one commit per step) on host names of this machine (localhost, 127.0.0.1 and the machine's
own name are three hosts to kolo). The worker logs its exit and every commit with a timestamp;
the table gives, per layout, the median, p95 and max of:

  detect+rejoin: kill -> the survivors' first record in the new round (the new world is formed)
  first step:    kill -> the survivors' first commit in the new round (a step done there)

    make lib build && /usr/bin/python3 bench/elastic_reset.py --trials 10
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KOLO = os.path.join(ROOT, "bin", "kolo")
WORKER = os.path.join(ROOT, "python", "tests", "elastic_worker.py")
PY = "/usr/bin/python3"


def layouts():
    me = socket.gethostname()
    return [
        ("2 hosts x 1", ["localhost:1", "127.0.0.1:1"]),
        ("2 hosts x 2", ["localhost:2", "127.0.0.1:2"]),
        ("3 hosts x 1", ["localhost:1", "127.0.0.1:1", me + ":1"]),
    ]


def trial(hosts, rng):
    np_ = sum(int(h.rsplit(":", 1)[1]) for h in hosts)
    victim = rng.randrange(np_)
    batch = rng.randrange(3, 10)
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "log.jsonl")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        cmd = [KOLO, "run", "-np", str(np_), "--min-np", "1", "-H", ",".join(hosts), PY, WORKER,
               "--log", log, "--epochs", "1", "--batches-per-epoch", str(40 * np_),
               "--batch-size", "2", "--exit-mode", "kill",
               "--exit-schedule", json.dumps({"(0, %d)" % batch: [victim]})]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        recs = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
    if p.returncode != 0:
        raise RuntimeError("kolo run exited %d:\n%s" % (p.returncode, p.stdout[-3000:]))
    killed = [r for r in recs if r["kind"] == "exit"]
    if not killed:
        raise RuntimeError("no worker exited:\n" + p.stdout[-3000:])
    k = killed[0]
    after = [r for r in recs if r["round"] > k["round"]]
    first = min(r["time"] for r in after)
    step = min(r["time"] for r in after if r["kind"] == "commit")
    return victim, first - k["time"], step - k["time"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between trials")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for name, hosts in layouts():
        rejoin, step, victims = [], [], []
        for _ in range(args.trials):
            v, a, b = trial(hosts, rng)
            victims.append(v)
            rejoin.append(a)
            step.append(b)
            time.sleep(args.pause)
        rows.append((name, rejoin, step, victims))
        print("%s: done (victims %s)" % (name, victims), file=sys.stderr)
    print("\nkill -> survivors' new world, %d trials per layout, seconds: median / p95 / max\n" % args.trials)
    print("| layout | detect+rejoin | first step in the new world | victims rank 0 |")
    print("|---|---|---|---:|")
    for name, rejoin, step, victims in rows:
        print("| %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %d of %d |" % (
            name, statistics.median(rejoin), pct(rejoin, 0.95), max(rejoin),
            statistics.median(step), pct(step, 0.95), max(step),
            sum(1 for v in victims if v == 0), len(victims)))


if __name__ == "__main__":
    main()
