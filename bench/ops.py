#!/usr/bin/env python3
"""Two builds of kolo side by side on every collective: busbw and /dev/shm peak per op, rank count
and size, alternated and repeated, as ratios.

    python3 bench/ops.py --compare-root /tmp/kolo-old --np 2,8 --repeats 3

Each run is `kolo bench OP --np N --sizes ... --json F` of one build (this checkout's bin/kolo, or
--compare-root's). Round i runs the builds in a rotated order, --pause seconds apart, so that a
drifting machine slows both alike; the table gives, per op, rank count and size, each build's
median busbw with its range over the rounds and the ratio of the medians, and each build's
/dev/shm peak over the run (sampled every 50 ms), which is what an alltoall's pair rings cost.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scaling import PeakSampler, env_with  # noqa: E402
from autotune import med  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(kolo, op, n, sizes, iters, small_iters):
    """One kolo bench run: {size: busbw GB/s}, and the /dev/shm peak in MiB."""
    out = {}
    peak = 0.0
    for sz_set, it in ((sizes[0], small_iters), (sizes[1], iters)):
        if not sz_set:
            continue
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "r.json")
            sampler = PeakSampler()
            p = subprocess.run([kolo, "bench", op, "--np", str(n), "--sizes", ",".join(sz_set), "--iters", str(it),
                                "--json", js], env=env_with({"KOLO_OVERSUBSCRIBE": "1"}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=600)
            peak = max(peak, sampler.peak() / (1 << 20))
            if p.returncode != 0:
                raise RuntimeError(f"kolo bench {op} --np {n} failed ({p.returncode}):\n{p.stdout[-3000:]}")
            with open(js) as f:
                rep = json.load(f)
        for r, s in zip(rep["results"], sz_set):
            out[s] = (r["busbw_GBps"], r["median_us"])
    return out, peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare-root", required=True, help="another kolo checkout with bin/kolo built")
    p.add_argument("--label", default="this", help="this build's name in the table")
    p.add_argument("--compare-label", default="before")
    p.add_argument("--ops", default="allgather,broadcast,alltoall,reducescatter,allreduce")
    p.add_argument("--np", default="2,8")
    p.add_argument("--sizes", default="4KiB,256KiB,4MiB,64MiB",
                   help="sizes per rank; those under 64 KiB run --small-iters ops")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--small-iters", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pause", type=float, default=2.0)
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args()
    builds = [(args.compare_label, os.path.join(os.path.abspath(args.compare_root), "bin", "kolo")),
              (args.label, os.path.join(ROOT, "bin", "kolo"))]
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

    def nbytes(s):
        for u, m in units.items():
            if s.endswith(u):
                return int(s[:-len(u)]) * m
        return int(s)
    sizes = args.sizes.split(",")
    split = ([s for s in sizes if nbytes(s) < 64 << 10], [s for s in sizes if nbytes(s) >= 64 << 10])
    res = {}  # (op, n, build) -> {"bw": {size: [..]}, "shm": [..]}
    for n in [int(x) for x in args.np.split(",")]:
        for op in args.ops.split(","):
            for i in range(args.repeats):
                order = builds if i % 2 == 0 else builds[::-1]
                for label, kolo in order:
                    time.sleep(args.pause)
                    bw, peak = run(kolo, op, n, split, args.iters, args.small_iters)
                    slot = res.setdefault((op, n, label), {"bw": {}, "us": {}, "shm": []})
                    slot["shm"].append(peak)
                    for s, (b, us) in bw.items():
                        slot["bw"].setdefault(s, []).append(b)
                        slot["us"].setdefault(s, []).append(us)
                    print(f"# {op} np={n} {label} round {i + 1}: " + ", ".join(f"{s} {b:.2f} GB/s" for s, (b, _) in bw.items())
                          + f"; /dev/shm peak {peak:.0f} MiB", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{op},{n},{lab}": v for (op, n, lab), v in res.items()}, f, indent=1)
    a, b = args.compare_label, args.label
    print(f"# kolo bench, {a} vs {b}: busbw GB/s (median per op; medians over {args.repeats} alternated rounds, ranges)")
    print(f"| op | ranks | size | {a} busbw | {b} busbw | {b}/{a} | {a} median us | {b} median us | {a} /dev/shm MiB | {b} /dev/shm MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (op, n, lab) in res:
        if lab != a:
            continue
        ra, rb = res[(op, n, a)], res[(op, n, b)]
        for s in sizes:
            va, vb = ra["bw"].get(s, []), rb["bw"].get(s, [])
            ratio = statistics.median(vb) / statistics.median(va) if va and vb and statistics.median(va) > 0 else float("nan")
            print(f"| {op} | {n} | {s} | {med(va, '%.2f')} | {med(vb, '%.2f')} | {ratio:.2f}x "
                  f"| {med(ra['us'].get(s, []), '%.1f')} | {med(rb['us'].get(s, []), '%.1f')} "
                  f"| {max(ra['shm']):.0f} | {max(rb['shm']):.0f} |")


if __name__ == "__main__":
    main()
