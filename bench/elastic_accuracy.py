#!/usr/bin/env python3
"""Does a lost worker cost an elastic job accuracy? examples/pytorch_mnist_elastic.py (a CNN on
Fashion-MNIST) on 4 ranks (-H localhost:2,127.0.0.1:2, --min-np 2), per seed once without a
failure and twice with one worker SIGKILLed at a random step (the same step and worker both
times). The killed worker's host is blacklisted, so the job goes on as 2 ranks, in one of two
ways:

  lr x size:    Horovod's examples: the batch per rank stays 64, so the global batch halves to
                128, and the reset callback halves the learning rate (lr = 1.5e-3 x ranks).
  fixed global: the example's --global-batch-size 256 --lr 6e-3: each rank takes 256 / ranks
                samples a step and the learning rate stays; the same computation as
                uninterrupted, up to the order of floating-point sums.

At 4 ranks both are the same computation (64 per rank, lr 6e-3), so one uninterrupted run per
seed serves both; one more uninterrupted run of the first seed, with --global-batch-size, checks
that, and that a run repeats itself. Same seeds, same data, same number of epochs over the same
training subset (an epoch ends when the elastic sampler has given every sample once, whatever the
world size).

The table gives, per seed, the final test accuracies and wall times, then the spread (min-max)
of each group, how many interrupted runs fall within the spread of the uninterrupted ones, and the
same-seed differences. Exit status 1 if an interrupted run falls outside.

    make lib build && /usr/bin/python3 bench/elastic_accuracy.py            # ~10 min here
    /usr/bin/python3 bench/elastic_accuracy.py --seeds 1,2 --epochs 1       # a quick look
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KOLO = os.path.join(ROOT, "bin", "kolo")
EXAMPLE = os.path.join(ROOT, "examples", "pytorch_mnist_elastic.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
FINAL = re.compile(r"final test accuracy ([0-9.]+)% after (\d+) epochs on (\d+) ranks "
                   r"\((\d+) steps, (\d+) resets?")
HOSTS = "localhost:2,127.0.0.1:2"
NP = 4
BATCH = 64  # per rank, the example's default
LR = 1.5e-3  # per rank, the example's default
MODES = {
    "lr x size": [],
    "fixed global": ["--global-batch-size", str(NP * BATCH), "--lr", repr(LR * NP)],
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3,4,5",
                   help="comma-separated seeds (default %(default)s)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-samples", type=int, default=6400,
                   help="training subset per epoch (default %(default)s: 25 steps at 4 ranks)")
    p.add_argument("--test-samples", type=int, default=5000)
    p.add_argument("--batches-per-commit", type=int, default=10)
    p.add_argument("--kill-seed", type=int, default=0,
                   help="seed of the draw of the step and the worker to kill")
    p.add_argument("--no-repeat", action="store_true",
                   help="skip the second uninterrupted run of the first seed")
    p.add_argument("--log-dir", default=None, help="keep every run's output here")
    p.add_argument("--timeout", type=int, default=400, help="seconds per run")
    return p.parse_args()


def env():
    e = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for k in list(e):
        if k.startswith(("KOLO_RANK", "KOLO_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_", "PMI_",
                         "SLURM_", "KOLO_LAUNCHER_VERSION")):
            del e[k]
    return e


def run(args, seed, kill, mode, log_dir, name):
    cmd = [KOLO, "run", "-np", str(NP), "--min-np", "2", "--max-np", str(NP), "-H", HOSTS,
           PY, EXAMPLE, "--seed", str(seed), "--epochs", str(args.epochs),
           "--max-train-samples", str(args.train_samples),
           "--max-test-samples", str(args.test_samples),
           "--batches-per-commit", str(args.batches_per_commit), "--log-interval", "1000"]
    cmd += MODES[mode]
    if kill:
        cmd += ["--kill-at-step", str(kill[1]), "--kill-rank", str(kill[0])]
    start = time.monotonic()
    p = subprocess.run(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=args.timeout)
    took = time.monotonic() - start
    with open(os.path.join(log_dir, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n\n" + p.stdout)
    m = FINAL.search(p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError("%s: kolo run exited %d:\n%s" % (name, p.returncode, p.stdout[-3000:]))
    r = dict(acc=float(m.group(1)), ranks=int(m.group(3)), steps=int(m.group(4)),
             resets=int(m.group(5)), wall=took)
    print("seed %d %s: %.2f%% on %d ranks, %d steps (%.0f s)"
          % (seed, name.split("-", 1)[1], r["acc"], r["ranks"], r["steps"], took), flush=True)
    if kill and (r["ranks"] != NP // 2 or r["resets"] != 1):
        raise RuntimeError("%s: expected one reset to %d ranks:\n%s"
                           % (name, NP // 2, p.stdout[-3000:]))
    return r


def main():
    args = parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="kolo-elastic-accuracy-")
    os.makedirs(log_dir, exist_ok=True)
    steps = args.epochs * -(-args.train_samples // (NP * BATCH))  # at 4 ranks
    rng = random.Random(args.kill_seed)
    print("elastic accuracy: %d seeds, %d epochs of %d training samples (%d steps at %d ranks), "
          "%d test samples; logs in %s" % (len(seeds), args.epochs, args.train_samples, steps,
                                          NP, args.test_samples, log_dir), flush=True)
    rows = []
    begin = time.monotonic()
    for seed in seeds:
        # A step after the first commit and before the last few: the kill always costs work.
        kill = (rng.randrange(NP), rng.randrange(args.batches_per_commit + 1, steps - 5))
        full = run(args, seed, None, "lr x size", log_dir, "seed%d-uninterrupted" % seed)
        cuts = {}
        for mode in MODES:
            cuts[mode] = run(args, seed, kill, mode, log_dir, "seed%d-kill-rank%d-step%d-%s"
                             % (seed, kill[0], kill[1], mode.replace(" ", "-")))
        rows.append((seed, kill, full, cuts))
    repeat = None
    if not args.no_repeat:
        repeat = run(args, seeds[0], None, "fixed global", log_dir,
                     "seed%d-uninterrupted-fixed-global" % seeds[0])
    total = time.monotonic() - begin

    print()
    print("| seed | killed: start rank @ step | uninterrupted | lr x size | steps | difference "
          "| fixed global | steps | difference | wall: uninterrupted, lr x size, fixed global |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for seed, kill, full, cuts in rows:
        a, b = cuts["lr x size"], cuts["fixed global"]
        print("| %d | %d @ %d of %d | %.2f | %.2f | %d | %+.2f | %.2f | %d | %+.2f "
              "| %.0f, %.0f, %.0f s |"
              % (seed, kill[0], kill[1], steps, full["acc"], a["acc"], a["steps"],
                 a["acc"] - full["acc"], b["acc"], b["steps"], b["acc"] - full["acc"],
                 full["wall"], a["wall"], b["wall"]))
    fulls = [r[2]["acc"] for r in rows]
    n = len(fulls)
    print()
    print("uninterrupted:  spread %.2f-%.2f (%.2f), mean %.2f"
          % (min(fulls), max(fulls), max(fulls) - min(fulls), statistics.mean(fulls)))
    ok = True
    for mode in MODES:
        cuts = [r[3][mode]["acc"] for r in rows]
        diffs = [c - f for c, f in zip(cuts, fulls)]
        inside = sum(min(fulls) <= c <= max(fulls) for c in cuts)
        ok = ok and inside == n
        print("%-14s  spread %.2f-%.2f (%.2f), mean %.2f; within the uninterrupted spread: "
              "%d of %d; same-seed difference mean %+.2f, sd %.2f, range %+.2f to %+.2f"
              % (mode + ":", min(cuts), max(cuts), max(cuts) - min(cuts), statistics.mean(cuts),
                 inside, n, statistics.mean(diffs), statistics.stdev(diffs) if n > 1 else 0.0,
                 min(diffs), max(diffs)))
    # If a kill changed nothing but the seed's luck, an interrupted run would be one more draw
    # of the uninterrupted runs' distribution: within the min-max of n others with probability
    # (n-1)/(n+1). The same-seed difference is the sharper look.
    if n > 1:
        print("(a run like the others falls within the spread of %d with probability %d/%d = "
              "%.0f%%)" % (n, n - 1, n + 1, 100.0 * (n - 1) / (n + 1)))
    if repeat is not None:
        same = repeat["acc"] == rows[0][2]["acc"]
        print("seed %d uninterrupted again, with --global-batch-size: %.2f and %.2f (%s)"
              % (seeds[0], rows[0][2]["acc"], repeat["acc"], "identical" if same else
                 "differ by %.2f" % abs(repeat["acc"] - rows[0][2]["acc"])))
    print("total wall time %.0f s" % total)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
