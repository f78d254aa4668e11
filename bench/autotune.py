#!/usr/bin/env python3
"""Does `kolo run --autotune` earn its flag? The tuned job against an exhaustive grid over the
same knobs, side by side in one run: the autotune table of docs/benchmarks.md.

    python3 bench/autotune.py --jobs mlp:16,mlp:64,cnn:16,cnn:64,mlp:16:bad

A job is MODEL:BATCH (2 ranks, DistributedOptimizer, synthetic data, the models of
examples/pytorch_synthetic_benchmark.py), started from kolo's defaults, or with ":bad" from bad
settings (fusion 1 MiB, cycle 20 ms). For each job:
- the grid: every (fusion threshold, cycle time) point of --fusion-mib x --cycle-ms, times the
  collective knobs' values of --small-kib (small-allreduce threshold) and --round-kib (shared-memory
  round) when given (the tuner searches both on these 2-rank jobs; empty: the job's own), runs
  --grid-steps steps after --warmup, in --grid-repeats rounds that rotate the points' order; a
  point's steps/s is the median over the rounds of rank 0's rate;
- the tuned runs (--tuned-repeats): `kolo run --autotune` (with --tuned-flags) from the job's
  settings for --tuned-steps steps; from its log come the step it decided at and what it chose; the tuned
  steps/s is the step rate after the decision (from 5 steps past it), the tuning overhead is
  1 - (steps/s while tuning) / (the grid's steps/s at the job's own settings); the in-run overhead
  is the time to the decision over the same steps at the run's own defaults samples' step time,
  less 1 (a reference measured in the same minutes, which a drifting machine moves alike);
- beside each tuned run (unless --no-paired), a run fixed at the grid's best point and one at the
  job's settings, as long, in an order that rotates from slot to slot: "tuned / best, paired" is
  the tuned run's rate after its decision over the best point's run's rate over the same steps.
  The grid's best of a dozen noisy points is biased up (the winner's curse) and measured minutes
  away from the tuned runs; the paired ratio is what the tuner's choice is worth against it.
Runs are --pause seconds apart, because a machine's speed drifts over minutes (other tenants of a
shared or virtual host, thermal limits); the table gives medians with ranges.

--compare-root DIR (another kolo checkout, built with `make lib build`, such as an earlier
commit's `git archive`) adds that build's tuned runs beside this one's, each slot running both in
alternating order, and a row per job marked with --compare-label: an A/B of two tuners on the same
machine at the same time, where tables measured on different days compare the days as well.
"""
import argparse
import csv
import json
import math
import os
import statistics
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
KOLO = os.path.join(ROOT, "bin", "kolo")

WORKER = r'''
import json, sys, time
import torch, torch.nn.functional as F
sys.path.insert(0, %(examples)r)
import pytorch_synthetic_benchmark as ex
import kolo.torch as hvd
model_name, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hvd.init()
torch.set_num_threads(1)
torch.manual_seed(1234)
class A: pass
a = A(); a.model = model_name; a.mlp_sizes = "784,2048,2048,10"; a.batch_size = batch
model, data, classes = ex.build(a)
target = torch.randint(0, classes, (batch,))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
ends = []
for _ in range(steps):
    opt.zero_grad()
    F.cross_entropy(model(data), target).backward()
    opt.step()
    ends.append(time.monotonic())
if hvd.rank() == 0:
    print("STEPS " + json.dumps(ends), flush=True)
hvd.shutdown()
'''


def run_job(model, batch, steps, env, flags=(), timeout=900, root=ROOT):
    with tempfile.TemporaryDirectory() as d:
        w = os.path.join(d, "worker.py")
        with open(w, "w") as f:
            f.write(WORKER % {"examples": os.path.join(root, "examples")})
        e = dict(os.environ)
        e["PYTHONPATH"] = os.path.join(root, "python")
        e.update(env)
        p = subprocess.run([os.path.join(root, "bin", "kolo"), "run", "-np", "2", *flags, PY, w, model, str(batch), str(steps)],
                           env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{model}:{batch} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    for line in p.stdout.splitlines():
        i = line.find("STEPS ")
        if i >= 0:
            return json.loads(line[i + 6:]), p.stdout
    raise RuntimeError("no step times in:\n" + p.stdout[-3000:])


def rate(ends, first, last=None):
    """Steps per second from the end of step `first` to the end of step `last` (1-based)."""
    last = last or len(ends)
    return (last - first) / (ends[last - 1] - ends[first - 1])


def settings_env(fusion_mib, cycle_ms, small_kib=None, round_kib=None, spin_us=None, cache=None):
    e = {"KOLO_FUSION_THRESHOLD": str(int(fusion_mib * (1 << 20))) if fusion_mib else "0",
         "KOLO_CYCLE_TIME": str(cycle_ms)}
    if small_kib is not None:
        e["KOLO_SMALL_ALLREDUCE_BYTES"] = str(int(small_kib * 1024))
    if round_kib is not None:
        e["KOLO_SHM_ROUND_BYTES"] = str(int(round_kib * 1024))
    if spin_us is not None:
        e["KOLO_SPIN_TIME"] = f"{spin_us:g}"
    if cache == 0:
        e["KOLO_CACHE_CAPACITY"] = "0"
    return e


def point_str(pt):
    f, c, *rest = pt
    out = f"{f:g}, {c:g}"
    if any(x is not None for x in rest):
        out += "".join(", " + ("-" if x is None else f"{x:g}") for x in rest)
    return out


def parse_point(text, own):
    """A grid point from 'fusion,cycle[,small,round,spin,cache]'; '-' or a missing field: the job's own."""
    parts = text.split(",")
    out = []
    for i, default in enumerate(own):
        v = parts[i].strip() if i < len(parts) else "-"
        out.append(default if v == "-" else float(v))
    return tuple(out)


def decision(log):
    with open(log) as f:
        rows = list(csv.DictReader(l for l in f if not l.startswith("#")))
    for r in rows:
        if r["role"] == "chosen":
            kib = lambda col: float(r[col]) / 1024 if r.get(col) else None
            spin = float(r["spin_us"]) if r.get("spin_us") else None
            cache = {"on": 1.0, "off": 0.0}.get(r.get("response_cache") or "")
            return int(r["step"]), (float(r["fusion_bytes"]) / (1 << 20), float(r["cycle_ms"]),
                                    kib("small_allreduce_bytes"), kib("shared_round_bytes"), spin, cache)
    return None, None


def abandoned(log):
    """Candidate samples the tuner cut short (logs that have the phase)."""
    with open(log) as f:
        return sum(1 for r in csv.DictReader(l for l in f if not l.startswith("#")) if r.get("phase") == "abandoned")


def defaults_step(log):
    """Seconds per step of the defaults' measured samples in the log (geometric mean), or None."""
    with open(log) as f:
        xs = [float(r["step_time_s"]) for r in csv.DictReader(l for l in f if not l.startswith("#"))
              if r["role"] == "default" and r["phase"] == "tuning"]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def med(v, fmt="%.2f"):
    if not v:
        return "-"
    m = statistics.median(v)
    if len(v) > 1 and min(v) != max(v):
        return (fmt + " (" + fmt + "-" + fmt + ")") % (m, min(v), max(v))
    return fmt % m


def median_rate(runs):
    return statistics.median(runs) if runs else None


def ab_env(args):
    """--ab-env: each job at its own settings, without and with the variables, alternating."""
    extra = dict(kv.split("=", 1) for kv in args.ab_env.split(","))
    print(f"# each job at its own settings without and with {args.ab_env}, {args.ab_repeats} rounds "
          f"alternating the order, {args.warmup} + {args.grid_steps} steps a run; steps/s medians (ranges); "
          "'paired': a round's rate with the variables over its rate without")
    print(f"| job | without | with {args.ab_env} | with / without, paired |")
    print("|---|---:|---:|---:|")
    for job in args.jobs.split(","):
        parts = job.split(":")
        model, batch, bad = parts[0], int(parts[1]), len(parts) > 2 and parts[2] == "bad"
        env = settings_env(*((1.0, 20.0) if bad else (128.0, 0.0)))
        rates = {False: [], True: []}
        for k in range(args.ab_repeats):
            for with_env in ((False, True) if k % 2 == 0 else (True, False)):
                time.sleep(args.pause)
                ends, _ = run_job(model, batch, args.warmup + args.grid_steps, {**env, **extra} if with_env else env)
                rates[with_env].append(rate(ends, args.warmup))
                print(f"# {job} round {k + 1} {'with' if with_env else 'without'}: {rates[with_env][-1]:.2f} steps/s",
                      file=sys.stderr, flush=True)
        paired = [w / o for w, o in zip(rates[True], rates[False])]
        print(f"| {job} | {med(rates[False])} | {med(rates[True])} | {med(paired, '%.3f')} |")


def vs_defaults(args):
    """--vs-defaults N: issue 30's acceptance. Each job N times as `kolo run --autotune` from the job's
    settings (bad: fusion 1 MiB, cycle 20 ms; else kolo's defaults) beside a run at kolo's defaults
    without the tuner, alternating which goes first; each run's steps/s over the last half of its
    steps, and the tuned run's over its partner's."""
    steps = args.tuned_steps
    print(f"# `kolo run --autotune` from each job's settings against kolo's defaults without it, "
          f"{args.vs_defaults} pairs alternating the order, {steps} steps a run, steps/s over the last "
          f"{steps - steps // 2}; 'tuned / defaults': each pair's ratio; target: every pair at least "
          f"{args.bad_target} from bad settings, {args.default_target} from the defaults")
    print("| job | defaults steps/s | tuned steps/s | tuned / defaults, each pair | min | target | met |")
    print("|---|---:|---:|---|---:|---:|:---:|")
    for job in args.jobs.split(","):
        parts = job.split(":")
        model, batch, bad = parts[0], int(parts[1]), len(parts) > 2 and parts[2] == "bad"
        env = settings_env(1.0, 20.0) if bad else {}
        rates = {False: [], True: []}
        for k in range(args.vs_defaults):
            for tuned in ((True, False) if k % 2 == 0 else (False, True)):
                time.sleep(args.pause)
                if tuned:
                    with tempfile.TemporaryDirectory() as d:
                        log = os.path.join(d, "at.csv")
                        ends, _ = run_job(model, batch, steps, env,
                                          flags=("--autotune", "--autotune-log-file", log, *shlex.split(args.tuned_flags)))
                        step, chosen = decision(log)
                        if args.keep_logs:
                            os.makedirs(args.keep_logs, exist_ok=True)
                            shutil.copy(log, os.path.join(args.keep_logs, f"{job}.{k + 1}.csv".replace(":", "_")))
                    print(f"# {job} pair {k + 1} tuned: decided at step {step}, chose "
                          f"{point_str(chosen) if chosen else '-'} (fusion MiB, cycle ms, small KiB, round KiB, spin us, cache)",
                          file=sys.stderr, flush=True)
                else:
                    ends, _ = run_job(model, batch, steps, {})
                rates[tuned].append(rate(ends, steps // 2))
                # The rate by window tells a slow-down after the tuner's decision from a slow run.
                cuts = sorted({min(c, steps) for c in (args.warmup + 1, steps // 10, steps // 3, steps // 2, steps)})
                windows = ", ".join(f"{a}-{b}: {rate(ends, a, b):.1f}" for a, b in zip(cuts, cuts[1:]) if b > a)
                print(f"# {job} pair {k + 1} {'tuned' if tuned else 'defaults'}: {rates[tuned][-1]:.2f} steps/s "
                      f"(by steps {windows})", file=sys.stderr, flush=True)
        ratios = [t / d for t, d in zip(rates[True], rates[False])]
        target = args.bad_target if bad else args.default_target
        print(f"| {job} | {med(rates[False])} | {med(rates[True])} | {', '.join('%.3f' % r for r in ratios)} "
              f"| {min(ratios):.3f} | {target:g} | {'yes' if min(ratios) >= target else 'no'} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="mlp:16,mlp:64,cnn:16,cnn:64,mlp:16:bad")
    p.add_argument("--fusion-mib", default="0,1,16,128", help="grid fusion thresholds, MiB (0: off)")
    p.add_argument("--cycle-ms", default="0,5,20", help="grid cycle times, ms")
    p.add_argument("--small-kib", default="", help="grid small-allreduce thresholds, KiB (empty: the job's own)")
    p.add_argument("--round-kib", default="", help="grid shared-memory rounds, KiB (empty: the job's own)")
    p.add_argument("--spin-us", default="", help="grid spin times, us (empty: the job's own)")
    p.add_argument("--keep-logs", default="", help="keep each tuned run's autotune log in this folder")
    p.add_argument("--cache", default="", help="grid response cache, 'on,off' (empty: the job's own)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--grid-steps", type=int, default=40)
    p.add_argument("--grid-repeats", type=int, default=2,
                   help="rounds over the grid, each in another order; a point's rate is its median "
                        "(0: no grid, the tuned runs paired with the job's settings only)")
    p.add_argument("--grid-paired", action="store_true",
                   help="run every grid point beside a run at the job's own settings (order alternating) and "
                        "score it by its steps/s over that run's: a machine whose speed shifts for minutes "
                        "then moves both, where it decides a single run's rate")
    p.add_argument("--points", default="",
                   help="grid points instead of the product of the lists, ';'-separated, each "
                        "'fusion,cycle[,small,round,spin,cache]' ('-' for the job's own; cache 1 on, 0 off)")
    p.add_argument("--tuned-steps", type=int, default=340)
    p.add_argument("--tuned-repeats", type=int, default=2)
    p.add_argument("--tuned-flags", default="",
                   help="more `kolo run` flags for the tuned runs, such as '--autotune-steps-per-sample 30'")
    p.add_argument("--no-paired", action="store_true",
                   help="skip the fixed runs at the grid's best point and at the job's settings beside each tuned run")
    p.add_argument("--ab-env", default="",
                   help="VAR=VALUE[,VAR=VALUE]: instead of tuning, run each job at its own settings with and "
                        "without these variables, alternating, --ab-repeats times, and print the ratio "
                        "(for a knob the tuner does not search, such as KOLO_CACHE_CAPACITY=0)")
    p.add_argument("--ab-repeats", type=int, default=3)
    p.add_argument("--pause", type=float, default=2.0)
    p.add_argument("--vs-defaults", type=int, default=0, metavar="N",
                   help="instead of the grid: N pairs of a tuned run against kolo's defaults per job (issue 30's acceptance)")
    p.add_argument("--bad-target", type=float, default=0.95, help="with --vs-defaults: least tuned/defaults from bad settings")
    p.add_argument("--default-target", type=float, default=0.97, help="with --vs-defaults: least tuned/defaults from the defaults")
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument("--compare-root", help="another built kolo checkout whose tuned runs go beside this one's")
    p.add_argument("--compare-label", default="old")
    args = p.parse_args()
    if args.ab_env:
        return ab_env(args)
    if args.vs_defaults:
        return vs_defaults(args)
    roots = [(ROOT, "")] + ([(os.path.abspath(args.compare_root), " (" + args.compare_label + ")")] if args.compare_root else [])
    fusions = [float(x) for x in args.fusion_mib.split(",")]
    cycles = [float(x) for x in args.cycle_ms.split(",")]
    smalls = [float(x) for x in args.small_kib.split(",")] if args.small_kib else [None]
    rounds = [float(x) for x in args.round_kib.split(",")] if args.round_kib else [None]
    spins = [float(x) for x in args.spin_us.split(",")] if args.spin_us else [None]
    caches = [{"on": 1.0, "off": 0.0}[x] for x in args.cache.split(",")] if args.cache else [None]
    # The job's own collective knobs, as the grid names them: kolo's defaults (64 KiB, 1 MiB).
    own_small = 64.0 if args.small_kib else None
    own_round = 1024.0 if args.round_kib else None
    own_spin = 50.0 if args.spin_us else None  # 2 ranks on a host with a CPU for each
    own_cache = 1.0 if args.cache else None
    out = {}
    rows = []
    for job in args.jobs.split(","):
        parts = job.split(":")
        model, batch, bad = parts[0], int(parts[1]), len(parts) > 2 and parts[2] == "bad"
        own = ((1.0, 20.0) if bad else (128.0, 0.0)) + (own_small, own_round, own_spin, own_cache)
        grid = {}
        paired = {}  # --grid-paired: a point's steps/s over the job's settings' run beside it, per round
        points = [(f, c, s, r, sp, ca) for f in fusions for c in cycles for s in smalls for r in rounds for sp in spins
                  for ca in caches]
        if args.points:
            points = [parse_point(x, own) for x in args.points.split(";")]
        if own not in points:
            points.append(own)
        # The grid first, in rounds that rotate the points' order (a drifting machine then slows
        # different points in different rounds); a point's rate is its median over the rounds.
        for k in range(args.grid_repeats):
            shift = k * len(points) // max(args.grid_repeats, 1)
            order = points[shift:] + points[:shift]
            if k % 2:
                order = order[::-1]
            for i, pt in enumerate(order):
                pair = [pt]
                if args.grid_paired and pt != own:
                    pair = [pt, own] if (i + k) % 2 else [own, pt]
                got = {}
                for q in pair:
                    time.sleep(args.pause)
                    ends, _ = run_job(model, batch, args.warmup + args.grid_steps, settings_env(*q))
                    got[q] = rate(ends, args.warmup)
                    grid.setdefault(q, []).append(got[q])
                if len(pair) == 2:
                    paired.setdefault(pt, []).append(got[pt] / got[own])
                print(f"# {job} grid round {k + 1} ({point_str(pt)}): {got[pt]:.3f} steps/s"
                      + (f", {got[pt] / got[own]:.3f}x the job's settings beside it" if len(pair) == 2 else ""),
                      file=sys.stderr, flush=True)
        gridm = {pt: median_rate(v) for pt, v in grid.items()}
        pairedm = {pt: statistics.median(v) for pt, v in paired.items()}
        # --grid-repeats 0: no grid; the tuned runs are paired with the job's settings only.
        best = max(gridm, key=gridm.get) if gridm else own
        if pairedm:
            # The best point is the one furthest above the job's settings beside it; none above
            # them: the job's settings are the best.
            best = max(pairedm, key=pairedm.get)
            if pairedm[best] <= 1:
                best = own
        # Then the tuned runs, each beside a run fixed at the grid's best point and one at the job's
        # own settings, as long as the tuned run, in an order that rotates from slot to slot. The
        # grid's best of 12 noisy points is biased up (the winner's curse), and runs minutes apart
        # see different machines; the paired runs, compared over the steps after the tuned run's
        # decision, measure what the tuner's choice is worth against the best and the start.
        tuned = {label: [] for _, label in roots}
        for slot in range(args.tuned_repeats):
            runs = [("tuned", root, label) for root, label in roots]
            if not args.no_paired:
                runs += ([("best", ROOT, "")] if best != own else []) + [("own", ROOT, "")]
            shift = slot % len(runs)
            runs = runs[shift:] + runs[:shift]
            fixed = {}
            results = []
            for kind, root, label in runs:
                time.sleep(args.pause)
                if kind != "tuned":
                    ends, _ = run_job(model, batch, args.tuned_steps, settings_env(*(best if kind == "best" else own)))
                    fixed[kind] = ends
                    continue
                with tempfile.TemporaryDirectory() as d:
                    log = os.path.join(d, "at.csv")
                    ends, text = run_job(model, batch, args.tuned_steps, settings_env(*own),
                                         flags=("--autotune", "--autotune-log-file", log, *shlex.split(args.tuned_flags)),
                                         root=root)
                    step, chosen = decision(log)
                    if args.keep_logs:
                        os.makedirs(args.keep_logs, exist_ok=True)
                        shutil.copy(log, os.path.join(args.keep_logs, f"{job}{label}.{slot + 1}.csv".replace(":", "_").replace(" ", "_")))
                    cut = abandoned(log)
                    ref = defaults_step(log)
                line = next((l for l in text.splitlines() if "autotune:" in l and "INFO" not in l), "")
                t = {"decided_at": step, "chosen": chosen, "abandoned": cut, "line": line.split("autotune:", 1)[-1].strip()}
                if step and step + 5 < len(ends):
                    t["tuned_rate"] = rate(ends, step + 5)
                    t["tuning_rate"] = rate(ends, 1, step)
                    if ref:
                        # The same run's defaults samples, interleaved with the candidates', are
                        # the reference: a machine whose speed drifts between runs moves both.
                        t["in_run_overhead"] = (ends[step - 1] - ends[0]) / ((step - 1) * ref) - 1
                results.append((label, t))
            for label, t in results:
                if "tuned_rate" in t:
                    first = t["decided_at"] + 5
                    for kind, ends in fixed.items():
                        if first < len(ends):
                            t[kind + "_rate"] = rate(ends, first)
                            t["vs_" + kind] = t["tuned_rate"] / t[kind + "_rate"]
                tuned[label].append(t)
                print(f"# {job}{label} tuned: {t}", file=sys.stderr, flush=True)
        out[job] = {"grid": {point_str(pt): r for pt, r in grid.items()}, "best": list(best), "tuned": tuned,
                    "paired": {point_str(pt): r for pt, r in paired.items()}}
        for _, label in roots:
            tl = tuned[label]
            rates = [t["tuned_rate"] for t in tl if "tuned_rate" in t]
            rows.append({
                "job": job + label, "own": gridm.get(own), "best": gridm.get(best), "best_at": best,
                "tuned": rates, "vs_grid": [r / gridm[best] for r in rates] if gridm else [],
                "vs_best": [t["vs_best"] for t in tl if "vs_best" in t],
                "vs_own": [t["vs_own"] for t in tl if "vs_own" in t],
                "decided": [t["decided_at"] for t in tl if t["decided_at"]],
                "overhead": [1 - t["tuning_rate"] / gridm[own] for t in tl if "tuning_rate" in t and gridm],
                "in_run": [t["in_run_overhead"] for t in tl if "in_run_overhead" in t],
                "chosen": [t["chosen"] for t in tl],
                "best_vs_own": pairedm.get(best, 1.0) if pairedm else None,
                # The tuned run over the job's settings, over the best point over them: both
                # ratios of runs beside each other.
                "vs_best_via_own": [t["vs_own"] / pairedm.get(best, 1.0) for t in tl if "vs_own" in t] if pairedm else [],
                "undecided": sum(1 for t in tl if not t["decided_at"]),
            })
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    knobs = (f" x small allreduce {args.small_kib or 'own'} KiB x shm round {args.round_kib or 'own'} KiB"
             f" x spin {args.spin_us or 'own'} us x response cache {args.cache or 'own'}")
    what = f"an exhaustive grid (fusion {args.fusion_mib} MiB x cycle {args.cycle_ms} ms{knobs}"
    if args.points:
        what = f"grid points ({args.points}; fusion MiB, cycle ms, small allreduce KiB, shm round KiB, spin us"
    if args.grid_paired:
        what += ", each beside a run at the job's settings"
    print(f"# kolo run --autotune vs {what}, "
          f"{args.grid_repeats} rounds), 2 ranks, {args.tuned_repeats} tuned runs per job"
          + (f" (kolo run --autotune {args.tuned_flags})" if args.tuned_flags else "") + "; medians (ranges). "
          "'paired' ratios: the tuned run's steps/s after its decision over a run fixed at the grid's best point "
          "(or at the job's settings), same steps, run beside it")
    print("| job | job's settings steps/s | grid's best steps/s (at) | tuned steps/s | tuned / grid's best | tuned / best, paired "
          "| tuned / job's settings, paired | decided at step | tuning overhead | in-run overhead "
          "| chosen (fusion MiB, cycle ms[, small allreduce KiB, shm round KiB, spin us]) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        chosen = "; ".join(point_str(ch) if ch is not None else "undecided" for ch in r["chosen"])
        own_s = f"{r['own']:.2f}" if r["own"] is not None else "-"
        best_s = f"{r['best']:.2f} ({point_str(r['best_at'])})" if r["best"] is not None else "-"
        print(f"| {r['job']} | {own_s} | {best_s} | {med(r['tuned'])} "
              f"| {med(r['vs_grid'], '%.3f')} | {med(r['vs_best'], '%.3f')} | {med(r['vs_own'], '%.3f')} "
              f"| {med(r['decided'], '%.0f')} | {med(r['overhead'], '%.3f')} "
              f"| {med(r['in_run'], '%.3f')} | {chosen} |")

    if args.grid_paired:
        print()
        print("Paired grid: each point's steps/s over the job's settings' run beside it (median over rounds), "
              "and the tuned runs' over theirs")
        print("| job | grid's best / job's settings, paired (at) | tuned / job's settings, paired | tuned / grid's best, via the job's settings |")
        print("|---|---:|---:|---:|")
        for r in rows:
            if r["best_vs_own"] is None:
                continue
            print(f"| {r['job']} | {r['best_vs_own']:.3f} ({point_str(r['best_at'])}) | {med(r['vs_own'], '%.3f')} "
                  f"| {med(r['vs_best_via_own'], '%.3f')} |")


if __name__ == "__main__":
    main()
