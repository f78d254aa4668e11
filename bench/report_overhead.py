#!/usr/bin/env python3
"""What the ranks' reports and kolo run's live view cost training: steps/s with them on (every rank
reporting a few times a second, kolo run drawing the status lines: --status on) against off
(KOLO_REPORTS=0, --status off), side by side in one run.

    python3 bench/report_overhead.py --np 2,8 --steps 2000,400 --repeats 5

The training is bench/ddp_compare.py's kolo setup (DistributedOptimizer, an MLP, synthetic data,
one torch thread per rank). On and off alternate, the first of each pair rotating, so that slow
drift on a shared machine hits both alike; the table gives the median steps/s of each, the median
of the paired ratios (on / off) and their range.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"

sys.path.insert(0, HERE)
from compare import free_port  # noqa: E402


def measure(np, on, steps, args):
    env = dict(os.environ, OMP_NUM_THREADS="1", KOLO_OVERSUBSCRIBE="1")  # --np 8 on fewer CPUs
    env.pop("KOLO_REPORTS", None)
    status = ["--status", "on"] if on else ["--status", "off"]
    if not on:
        env["KOLO_REPORTS"] = "0"
    cmd = [os.path.join(ROOT, "bin", "kolo"), "run", "-np", str(np)] + status + [
        PY, os.path.join(HERE, "ddp_compare.py"), "--worker", "kolo", "--port", str(free_port()),
        "--batch", str(args.batch), "--steps", str(steps), "--warmup", str(args.warmup),
        "--mlp-sizes", args.mlp_sizes]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    import json
    for line in p.stdout.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            res = json.loads(line[i + len("RESULT "):])
            return 1000.0 / res["step_ms"]
    raise RuntimeError("no result from %s:\n%s" % (" ".join(cmd), p.stdout[-3000:]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,8", help="rank counts")
    p.add_argument("--repeats", type=int, default=5, help="on/off pairs per rank count")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", default="2000,400",
                   help="timed steps per run, for each rank count (one value: for all)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mlp-sizes", default="784,512,512,10")
    args = p.parse_args()
    lines = ["| ranks | reports and view on, steps/s | off, steps/s | on / off: median of pairs (range) |",
             "|---:|---:|---:|---:|"]
    nps = [int(n) for n in args.np.split(",")]
    steps = [int(s) for s in args.steps.split(",")]
    steps += [steps[-1]] * (len(nps) - len(steps))
    for np, n in zip(nps, steps):
        rates = {True: [], False: []}
        for r in range(args.repeats):
            order = [True, False] if r % 2 == 0 else [False, True]
            pair = {}
            for on in order:
                pair[on] = measure(np, on, n, args)
                rates[on].append(pair[on])
            print("np %d repeat %d: on %.2f steps/s, off %.2f steps/s, on/off %.3f"
                  % (np, r, pair[True], pair[False], pair[True] / pair[False]), file=sys.stderr, flush=True)
        ratios = [a / b for a, b in zip(rates[True], rates[False])]

        def cell(v):
            return "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))
        lines.append("| %d | %s | %s | %.3fx (%.3f-%.3f) |" % (
            np, cell(rates[True]), cell(rates[False]), statistics.median(ratios), min(ratios), max(ratios)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
