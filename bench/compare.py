#!/usr/bin/env python3
"""Side-by-side allreduce benchmark: kolo, torch.distributed with Gloo, and OpenMPI (mpi4py), same
sizes, same machine, one run, one table with ratios.

    python3 bench/compare.py --np 2 --sizes 4,4KiB,256KiB,4MiB,64MiB

Every peer is timed the same way (median wall time of one blocking allreduce after warm-up, warm
buffers, float32 sum). A peer that is not installed is reported as missing, not silently skipped.
Glibc is told to keep freed memory (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_) for every peer, so
that none of them pays to fault fresh pages per op.

    python3 bench/compare.py --np 2 --sizes 4MiB,64MiB --peers kolo,openmpi --repeats 6 --pause 5
    python3 bench/compare.py --np 2 --sizes 4MiB,64MiB --peers kolo --kolo-env KOLO_SHM_STREAM_STORES=0 \
        --kolo-env KOLO_SHM_STREAM_STORES=1 --repeats 6 --pause 3

repeats the comparison: round i runs the peers in a rotated order, and rounds 2, 3, 6, 7, ... run
them back to back (no pause: a run starts right after the other peer's, when the machine is in
whatever state that one left; with two peers each peer gets such runs), the others --pause seconds
apart. The table then gives, per
size, each peer's median busbw with its range over the rounds, and the ratio of the medians; the
rounds run right after another peer are also summarised apart, since a run's speed can depend on
what ran just before it.

--plot FILE.png also draws the table (busbw by size, a line per peer, ranges as error bars; needs
python3-matplotlib, imported only then); --replot FILE.json --plot FILE.png draws what an earlier
run wrote with --json, measuring nothing.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.environ.get("KOLO_PYTHON") or "/usr/bin/python3"  # KOLO_PYTHON: a Python with torch elsewhere

sys.path.insert(0, os.path.join(HERE, "peers"))
import common  # noqa: E402  (bench/peers/common.py: the size syntax every peer parses)

MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, env=None, timeout=900):
    e = dict(os.environ)
    e.update(MALLOC_ENV)
    if env:
        e.update(env)
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    return p.stdout


def bench_kolo(args, out, env=None):
    kolo = os.path.join(ROOT, "bin", "kolo")
    run([kolo, "bench", "allreduce", "-np", str(args.np), "--sizes", args.sizes, "--iters", str(args.iters),
         "--warmup", str(args.warmup), "--json", out], env=env)


def env_setting(p, kv):
    """--kolo-env's VAR=VALUE as {VAR: VALUE}; a malformed one is p's usage error."""
    var, sep, val = kv.partition("=")
    if not sep or not var:
        p.error("--kolo-env wants VAR=VALUE, got %r" % kv)
    return {var: val}


def split_sizes(args):
    """The sizes as (sizes, iters) runs: small ones with --small-iters, the rest with --iters. A
    median of 20 ops of 4 bytes says more about scheduling in that one millisecond than about the
    op; thousands of them take no longer than 20 of the large sizes."""
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    small = [s for s in sizes if common.parse_size(s) <= SMALL_BYTES]
    large = [s for s in sizes if common.parse_size(s) > SMALL_BYTES]
    runs = []
    if small:
        runs.append((",".join(small), max(args.small_iters, args.iters)))
    if large:
        runs.append((",".join(large), args.iters))
    return runs


SMALL_BYTES = 64 << 10


def bench_gloo(args, out, backend="gloo"):
    """torch.distributed's allreduce on backend (gloo; nccl, for tensors on GPUs)."""
    port = free_port()
    procs = []
    for r in range(args.np):
        env = dict(os.environ, **MALLOC_ENV, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.np),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([PY, os.path.join(HERE, "peers", "gloo_allreduce.py"), "--sizes", args.sizes,
                                       "--iters", str(args.iters), "--warmup", str(args.warmup),
                                       "--json", out, "--device", getattr(args, "device", "cpu"),
                                       "--backend", backend],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:  # on a timeout or Ctrl-C, leave no rank behind
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        if p.returncode != 0:
            last = ([ln for ln in logs[r].splitlines() if ln.strip()] or ["no output"])[-1]
            raise RuntimeError(f"{backend} rank {r} failed: {last[:300]}\n{logs[r][-3000:]}")


def bench_mpi(args, out):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise RuntimeError("mpirun not found (apt-get install openmpi-bin python3-mpi4py)")
    run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.np), PY,
         os.path.join(HERE, "peers", "mpi_allreduce.py"), "--sizes", args.sizes, "--iters", str(args.iters),
         "--warmup", str(args.warmup), "--json", out], env={"OMPI_MCA_rmaps_base_oversubscribe": "1"})


def human(n):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return f"{n}B"


def measure(name, fn, args, tmp, tag):
    """One run of a peer over every size: {bytes: result}."""
    out = {}
    for i, (sizes, iters) in enumerate(split_sizes(args)):
        path = os.path.join(tmp, f"{name}-{tag}-{i}.json")
        fn(argparse.Namespace(**dict(vars(args), sizes=sizes, iters=iters)), path)
        with open(path) as f:
            out.update({r["bytes"]: r for r in json.load(f)["results"]})
    return out


def reason(e):
    """Why a peer was not measured, in one line."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def span(vals, fmt):
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m)
    return f"{fmt(m)} ({fmt(min(vals))}-{fmt(max(vals))})"


def draw(args, busbw, note=None):
    """--plot: the table as a picture, busbw by size with a line per peer (median and range over rounds)."""
    import plot  # bench/plot.py; matplotlib is needed only when a picture is asked for

    sizes = sorted({b for per in busbw.values() for b in per})
    series = {name: [(b, statistics.median(v), min(v), max(v)) for b, v in per.items() if v]
              for name, per in busbw.items()}
    rounds = f", median and range of {args.repeats} rounds" if args.repeats > 1 else ""
    plot.panels(args.plot, f"allreduce float32 sum, {args.np} ranks: busbw by size{rounds}", "size per rank",
                [("busbw GB/s (log)", True, series)], sizes, [human(b) for b in sizes],
                note=note or plot.machine())


def replot(args):
    """--replot: --plot from a --json file, either shape (one run per peer, or rounds)."""
    with open(args.replot) as f:
        rep = json.load(f)
    args.np = rep["np"]
    if "runs" in rep:
        busbw = {}
        for run in rep["runs"]:
            per = busbw.setdefault(run["peer"], {})
            for b, r in run["results"].items():
                per.setdefault(int(b), []).append(r["busbw_GBps"])
        args.repeats = 1 + max(run["round"] for run in rep["runs"])
    else:
        busbw = {n: {int(b): [r["busbw_GBps"]] for b, r in res.items()} for n, res in rep["results"].items()}
        args.repeats = 1
    draw(args, busbw, note=rep.get("measured"))
    return 0


def repeated(args, peers):
    """--repeats > 1: rounds of every peer, rotated, half of them back to back."""
    tmp = tempfile.mkdtemp(prefix="kolo-compare-")
    runs = []  # (round, peer, right_after, {bytes: result}); right_after: another peer's run just ended
    missing = {}
    last = None
    for rnd in range(args.repeats):
        order = peers[rnd % len(peers):] + peers[:rnd % len(peers)]
        # Rounds 2, 3, 6, 7, ... run back to back: with two peers, each then starts right after
        # the other's run once in every four rounds.
        back_to_back = rnd % 4 in (1, 2)
        for name, fn in order:
            if name in missing:
                continue
            if not back_to_back or last is None:
                time.sleep(args.pause)
                after = None
            else:
                after = last
            try:
                res = measure(name, fn, args, tmp, f"r{rnd}")
            except Exception as e:
                missing[name] = reason(e)
                continue
            right_after = after is not None and after != name
            runs.append((rnd, name, right_after, res))
            print(f"# round {rnd + 1} {name}{' (right after ' + after + ')' if after else ''}: " +
                  ", ".join(f"{human(b)} {r['busbw_GBps']:.2f} GB/s" for b, r in sorted(res.items())),
                  file=sys.stderr, flush=True)
            last = name
    names = [n for n, _ in peers if n not in missing]
    print(f"# allreduce float32 sum, np={args.np}, {args.repeats} rounds (peers rotated; rounds 2, 3, 6, 7, ... back to "
          f"back, the others {args.pause:g} s apart), each run the median of {args.iters} ops "
          f"({max(args.small_iters, args.iters)} up to {human(SMALL_BYTES)}) after {args.warmup} untimed; "
          f"busbw GB/s = algbw x 2(n-1)/n, median (range) over the rounds; ratios > 1 mean kolo is faster")
    others = [n for n in names if n != "kolo"]
    hdr = ["size"] + [f"{n} busbw" for n in names] + [f"kolo/{n}" for n in others] +           [f"kolo/{n}, runs right after the other" for n in others]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---:|" * len(hdr))
    sizes = sorted({b for _, _, _, res in runs for b in res})
    gb = lambda v: f"{v:.2f}"  # noqa: E731
    for b in sizes:
        row = [human(b)]
        med = {}
        for n in names:
            vals = [res[b]["busbw_GBps"] for _, pn, _, res in runs if pn == n and b in res]
            med[n] = statistics.median(vals) if vals else None
            row.append(span(vals, gb) if vals else "-")
        for n in others:
            row.append(f"{med['kolo'] / med[n]:.2f}x" if med.get("kolo") and med.get(n) else "-")
        for n in others:
            k = [res[b]["busbw_GBps"] for _, pn, ra, res in runs if pn == "kolo" and ra and b in res]
            o = [res[b]["busbw_GBps"] for _, pn, ra, res in runs if pn == n and ra and b in res]
            row.append(f"{statistics.median(k) / statistics.median(o):.2f}x" if k and o else "-")
        print("| " + " | ".join(row) + " |")
    for b in sizes:
        widths = []
        for n in names:
            vals = [res[b]["busbw_GBps"] for _, pn, _, res in runs if pn == n and b in res]
            if vals:
                widths.append(f"{n} {(max(vals) - min(vals)) / statistics.median(vals) * 100:.0f}%")
        print(f"# {human(b)}: range as a share of the median: " + ", ".join(widths))
    for name, why in missing.items():
        print(f"# {name}: not measured: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "warmup": args.warmup, "runs": [
                {"round": r, "peer": n, "right_after": ra, "results": res} for r, n, ra, res in runs],
                "missing": missing}, f, indent=2)
    if args.plot:
        draw(args, {n: {b: [res[b]["busbw_GBps"] for _, pn, _, res in runs if pn == n and b in res] for b in sizes}
                    for n in names})
    return 0 if "kolo" in names else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", default="4,4KiB,256KiB,4MiB,64MiB")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--small-iters", type=int, default=1000,
                   help="iterations for sizes up to 64 KiB (default 1000)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed iterations per size, for every peer (default 3, as kolo bench's)")
    p.add_argument("--json", help="write the combined table as JSON here")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw the table: busbw by size, a line per peer (needs matplotlib: python3-matplotlib)")
    p.add_argument("--replot", metavar="FILE.json",
                   help="measure nothing: draw --plot from a file an earlier run wrote with --json")
    p.add_argument("--peers", default="kolo,gloo,openmpi", help="which peers to run (kolo always first in tables)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every peer (see above; default 1)")
    p.add_argument("--pause", type=float, default=5.0, help="seconds before a run that is not back to back")
    p.add_argument("--kolo-env", action="append", default=[], metavar="VAR=VALUE",
                   help="also run kolo with this variable set, as a peer of its own in the rounds (kolo/that "
                        "peer compares the setting with kolo's default); repeatable, implies the rounds' table")
    args = p.parse_args()
    if args.replot:
        if not args.plot:
            p.error("--replot needs --plot FILE.png")
        return replot(args)

    known = {"kolo": bench_kolo, "gloo": bench_gloo, "openmpi": bench_mpi}
    wanted = [n.strip() for n in args.peers.split(",") if n.strip()]
    for n in wanted:
        if n not in known:
            p.error(f"unknown peer {n!r} (known: {', '.join(known)})")
    if "kolo" not in wanted:
        p.error("--peers must include kolo")
    peers = [(n, known[n]) for n in wanted]
    for kv in args.kolo_env:
        peers.append(("kolo " + kv, lambda a, o, e=env_setting(p, kv): bench_kolo(a, o, e)))
    if args.repeats > 1 or args.kolo_env:
        return repeated(args, peers)

    tmp = tempfile.mkdtemp(prefix="kolo-compare-")
    data, missing = {}, {}
    for name, fn in peers:
        try:
            data[name] = measure(name, fn, args, tmp, "single")
        except Exception as e:  # a missing peer is reported, the others still run
            missing[name] = reason(e)
    print(f"# allreduce float32 sum, np={args.np}, median of {args.iters} ops "
          f"({max(args.small_iters, args.iters)} up to {human(SMALL_BYTES)}) after {args.warmup} untimed, "
          f"warm buffers; busbw = algbw x 2(n-1)/n; ratios > 1 mean kolo is faster")
    hdr = ["size", "kolo us", "gloo us", "mpi us", "kolo busbw", "gloo busbw", "mpi busbw", "kolo/gloo", "kolo/mpi"]
    rows = []
    for nbytes in sorted(data.get("kolo", {})):
        k = data["kolo"][nbytes]
        g = data.get("gloo", {}).get(nbytes)
        m = data.get("openmpi", {}).get(nbytes)

        def ratio(peer):
            if not peer or k["median_us"] <= 0:
                return "-"
            return f"{peer['median_us'] / k['median_us']:.2f}x"

        rows.append([human(nbytes), f"{k['median_us']:.1f}",
                     f"{g['median_us']:.1f}" if g else "-", f"{m['median_us']:.1f}" if m else "-",
                     f"{k['busbw_GBps']:.2f}", f"{g['busbw_GBps']:.2f}" if g else "-",
                     f"{m['busbw_GBps']:.2f}" if m else "-", ratio(g), ratio(m)])
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    print("  ".join(h.rjust(w) for h, w in zip(hdr, widths)))
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    for name, why in missing.items():
        print(f"# {name}: not measured: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "warmup": args.warmup, "results": data, "missing": missing}, f, indent=2)
    if args.plot:
        draw(args, {n: {b: [r["busbw_GBps"]] for b, r in res.items()} for n, res in data.items()})
    return 0 if "kolo" in data else 1


if __name__ == "__main__":
    sys.exit(main())
