#!/usr/bin/env python3
"""Small-allreduce latency on one host, with more ranks than cores or not: kolo and OpenMPI
(mpi4py), in one run.

    python3 bench/small_ops.py --ranks 2,4,8,16 --repeats 3

For each rank count the peers run in turn, 3 s apart, the order rotating each repeat so
that each peer also runs right after each other; each run times --iters ops of each size after
--warmup untimed ones and reports the median per op. The table gives medians over the repeats
with their ranges, and the ratios of the medians to OpenMPI's.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
PEERS = ("kolo", "mpi")
LABELS = {"kolo": "kolo", "mpi": "OpenMPI", "bound": "kolo, bound", "mpibound": "OpenMPI, bound"}


def run(peer, n, args, slices=False):
    """A run's per-op medians by size, or with slices, in the order of args.sizes (sizes may repeat)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        env = dict(os.environ, KOLO_OVERSUBSCRIBE="1")  # as mpirun's --oversubscribe: n may exceed the CPUs
        peer, _, place = peer.partition("@")  # kolo@0,0,0,1: each local rank pinned (pin.py)
        pin = [PY, os.path.join(HERE, "peers", "pin.py"), place] if place else []
        if peer in ("mpi", "mpibound"):
            mpirun = shutil.which("mpirun")
            if not mpirun:
                raise RuntimeError("mpirun not found (apt-get install openmpi-bin python3-mpi4py)")
            bind = ["--bind-to", "core:overload-allowed"] if peer == "mpibound" else []
            cmd = [mpirun, "--oversubscribe", *bind, "-np", str(n), *pin, PY,
                   os.path.join(HERE, "peers", "mpi_allreduce.py")]
            if os.geteuid() == 0:
                cmd.insert(1, "--allow-run-as-root")
        else:
            bind = ["--bind-to", "core:overload-allowed"] if peer == "bound" else []
            kolo = args.compare_kolo if peer == "other" else args.kolo
            cmd = [kolo, "run", "-np", str(n), *bind, *pin, kolo, "bench", "allreduce"]
        cmd += ["--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", out]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=args.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
        rep = json.load(open(out))
    if slices:
        return [r["median_us"] for r in rep["results"]]
    return {r["bytes"]: r["median_us"] for r in rep["results"]}


def slices(args, peers):
    """--slices: one size timed in consecutive slices of --iters ops from the start, no warm-up, so
    that a state that comes and goes within a run shows; each peer's runs, rotated, one row each."""
    args.sizes, args.warmup = ",".join([args.sizes.split(",")[0]] * args.slices), 0
    print(f"# {args.sizes.split(',')[0]} B allreduces (float32 sum) on one host ({os.cpu_count()} CPUs), "
          f"{args.slices} consecutive slices of {args.iters} ops from each run's first op; each slice's median, us")
    print("| ranks | peer | run | " + " | ".join(f"ops {i * args.iters + 1}-{(i + 1) * args.iters}" for i in range(args.slices)) + " |")
    print("|---:|---|---:|" + "---:|" * args.slices)
    for n in [int(x) for x in args.ranks.split(",")]:
        got = {peer: [] for peer in peers}
        for rep in range(args.repeats):
            k = rep % len(peers)
            for peer in peers[k:] + peers[:k]:
                time.sleep(args.pause)
                got[peer].append(run(peer, n, args, slices=True))
        for peer in peers:
            for i, row in enumerate(got[peer]):
                print(f"| {n} | {LABELS[peer]} | {i + 1} | " + " | ".join(f"{v:.1f}" for v in row) + " |")


def med(vals):
    return f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4,8,16")
    p.add_argument("--sizes", default="4,1KiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--pause", type=float, default=3.0)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--kolo", default=os.path.join(ROOT, "bin", "kolo"))
    p.add_argument("--compare-kolo", default="",
                   help="another kolo binary (an earlier commit's bin/kolo) as one more peer, labelled "
                        "with --compare-label: an A/B of two builds in one run")
    p.add_argument("--compare-label", default="other build")
    p.add_argument("--bound", action="store_true",
                   help="two more peers: kolo and OpenMPI, each rank bound to one CPU round "
                        "robin (kolo run / mpirun --bind-to core:overload-allowed)")
    p.add_argument("--placements", default="",
                   help="semicolon-separated CPU lists, one CPU per local rank (0,0,0,1;0,1,0,1): for each, "
                        "two more peers, kolo and OpenMPI with every rank pinned there (one --ranks "
                        "value, as long as each list)")
    p.add_argument("--slices", type=int, default=0,
                   help="time the first size in this many consecutive slices of --iters ops from each run's "
                        "start (no warm-up), one row per run")
    args = p.parse_args()
    peers = PEERS + (("bound", "mpibound") if args.bound else ())
    if args.compare_kolo:
        peers += ("other",)
        LABELS["other"] = f"kolo, {args.compare_label}"
    for place in filter(None, args.placements.split(";")):
        if len(args.ranks.split(",")) != 1 or len(place.split(",")) != int(args.ranks):
            p.error(f"--placements {place!r}: give one --ranks value and one CPU per rank")
        peers += (f"kolo@{place}", f"mpi@{place}")
        LABELS[f"kolo@{place}"], LABELS[f"mpi@{place}"] = f"kolo, CPUs {place}", f"OpenMPI, CPUs {place}"
    if args.slices:
        return slices(args, peers)
    ranks = [int(x) for x in args.ranks.split(",")]
    rows = {}
    for n in ranks:
        got = {peer: [] for peer in peers}
        for rep in range(args.repeats):
            k = rep % len(peers)
            order = peers[k:] + peers[:k]
            for peer in order:
                time.sleep(args.pause)
                got[peer].append(run(peer, n, args))
            print(f"# {n} ranks, repeat {rep + 1}: " + ", ".join(f"{peer} {got[peer][-1]}" for peer in peers),
                  file=sys.stderr, flush=True)
        rows[n] = got
    sizes = sorted(rows[ranks[0]]["kolo"][0])
    print(f"# small allreduces (float32 sum) on one host ({os.cpu_count()} CPUs), {args.iters} ops per run, "
          f"{args.repeats} runs of each peer rotated; medians of the runs' per-op medians, us (ranges)")
    # Each kolo peer over the OpenMPI run placed alike (a pinned kolo over OpenMPI pinned the same
    # way), the others over unbound OpenMPI; with --compare-kolo, this build over the other too.
    base = [(p, "mpi@" + p.partition("@")[2] if p.startswith("kolo@") else "mpi")
            for p in peers if p != "mpi" and not p.startswith("mpi@")]
    if args.compare_kolo:
        base.append(("kolo", "other"))
    head = "| ranks | size |" + "".join(f" {LABELS[p]} |" for p in peers) + "".join(
        f" {LABELS[p]} / {LABELS[b]} |" for p, b in base)
    print(head)
    print("|---:|---:|" + "---:|" * (len(peers) + len(base)))
    for n, got in rows.items():
        for s in sizes:
            vals = {peer: [r[s] for r in got[peer]] for peer in peers}
            print(f"| {n} | {s} B |" + "".join(f" {med(vals[peer])} |" for peer in peers)
                  + "".join(f" {statistics.median(vals[p]) / statistics.median(vals[b]):.2f}x |"
                            for p, b in base))

if __name__ == "__main__":
    main()
