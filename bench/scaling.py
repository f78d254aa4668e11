#!/usr/bin/env python3
"""How kolo's costs grow with the number of ranks on one host: the scaling table of
docs/benchmarks.md.

    python3 bench/scaling.py --ranks 2,4,8,16,32,64 --repeats 3

For each rank count it runs `kolo run --verbose -np N kolo bench allreduce` and reports:
- shared memory per host: the peak of /dev/shm's used space while the job runs (sampled every
  50 ms, minus what was used before);
- start-up: from launching `kolo run` to rank 0's first 4-byte allreduce returning, and the
  slowest rank's kolo.Init alone;
- rendezvous requests: what the launcher's rendezvous server served over the whole job;
- sockets per rank: the most sockets any rank holds once connected (rendezvous client, listener,
  and every TCP connection to a peer; ranks of one host talk through shared memory);
- 4-byte and 4 MiB allreduce time (median per op, kolo bench), beside OpenMPI's (mpi4py, the
  same sizes and iterations) run right after, for the ratios.

Runs of a rank count alternate kolo and OpenMPI with a pause between runs, and the table gives
medians with ranges over the repeats. Ranks beyond the machine's cores are oversubscribed: the
allreduce times then measure scheduling as much as the transport.

    python3 bench/scaling.py --hosts 8 --ranks 16,32,64 --repeats 3

emulates hosts instead: the job runs as that many no-SSH `kolo run --rendezvous` nodes on this
machine (each node a host of its own name, ranks of different nodes talking TCP over loopback),
and each row is measured twice, alternately: with the lazy mesh kolo uses (connections to rank 0,
the ring neighbours and the hierarchical allreduce's peers at start-up, the rest on first use) and
with KOLO_TCP_FULL_MESH=1 (every remote rank connected at start-up, as before). Sockets per rank
are counted after the first allreduce and again at the end of the benchmark. OpenMPI is left out
there: its ranks on one machine would talk through shared memory.

--plot FILE.png also draws the table, one panel per figure against the ranks, medians with their
ranges (needs python3-matplotlib, imported only then).
"""
import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000"}


def shm_used(path="/dev/shm"):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class PeakSampler:
    """Samples /dev/shm's used bytes every 50 ms in a thread; peak() is the most seen."""

    def __init__(self):
        self.base = shm_used()
        self.top = self.base
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop.is_set():
            self.top = max(self.top, shm_used())
            time.sleep(0.05)

    def peak(self):
        self.stop.set()
        self.t.join()
        return self.top - self.base


def env_with(extra=None):
    e = dict(os.environ)
    e.update(MALLOC_ENV)
    if extra:
        e.update(extra)
    return e


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(kolo, n, args, full_mesh):
    """One job of n ranks as args.hosts no-SSH nodes of this machine."""
    hosts = args.hosts
    if n % hosts:
        raise RuntimeError(f"{n} ranks do not split over {hosts} hosts")
    extra = {"KOLO_SECRET": secrets.token_hex(32), "KOLO_TCP_FULL_MESH": "1" if full_mesh else "0"}
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "kolo.json")
        bench_cmd = [kolo, "bench", "allreduce", "--sizes", "4,4MiB", "--iters", str(args.iters), "--warmup", "3",
                     "--json", out]
        sampler = PeakSampler()
        t0 = time.time_ns()
        procs = []
        try:
            for i in range(hosts):
                cmd = [kolo, "run", "--verbose", "--rendezvous", f"127.0.0.1:{port}", "--nnodes", str(hosts),
                       "--node-rank", str(i), "--nproc-per-node", str(n // hosts)] + bench_cmd
                procs.append(subprocess.Popen(cmd, env=env_with(extra), stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        peak = sampler.peak()
        for p, o in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(f"node failed ({p.returncode}):\n{o[-3000:]}")
        rep = json.load(open(out))
    # Every node here owns 127.0.0.1: whichever binds the port first serves the rendezvous.
    return figures(rep, "\n".join(outs), t0, peak)


def figures(rep, log, t0, peak):
    """One run's row: kolo bench's JSON report, the launcher's log, the launch time, the shm peak."""
    m = re.search(r"rendezvous served.* requests=(\d+)", log)
    st = rep["startup"]
    times = {r["bytes"]: r["median_us"] for r in rep["results"]}
    return {
        "shm_peak": peak,
        "startup_s": (st["first_allreduce_unix_ns"] - t0) / 1e9,
        "init_s": st["init_s"],
        "requests": int(m.group(1)) if m else None,
        "sockets": st["sockets_max"],
        "sockets_end": st.get("sockets_max_end"),
        "sockets_others": st.get("sockets_max_not_rank0"),
        "sockets_others_end": st.get("sockets_max_not_rank0_end"),
        "us4": times[4],
        "us4m": times[4 << 20],
    }


def hosts_table(args, ranks):
    rows = {}
    for n in ranks:
        runs = {"lazy": [], "full": []}
        for rep in range(args.repeats):
            order = ["lazy", "full"] if rep % 2 == 0 else ["full", "lazy"]
            for who in order:
                time.sleep(args.pause)
                runs[who].append(run_nodes(args.kolo, n, args, full_mesh=(who == "full")))
            print(f"# {n} ranks on {args.hosts} hosts, repeat {rep + 1}: lazy {runs['lazy'][-1]}, "
                  f"full mesh {runs['full'][-1]}", file=sys.stderr, flush=True)
        rows[n] = runs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(n): r for n, r in rows.items()}, f, indent=1)
    sec = lambda v: f"{v:.2f}"  # noqa: E731
    num = lambda v: f"{v:.0f}"  # noqa: E731
    us = lambda v: f"{v:.1f}"  # noqa: E731
    ms_ = lambda v: f"{v / 1000:.2f}"  # noqa: E731
    print(f"# kolo across {args.hosts} emulated hosts (no-SSH nodes on one machine, {os.cpu_count()} CPUs), "
          f"{args.repeats} repeats alternated, medians (ranges)")
    print("| ranks | mesh | start-up to first allreduce s | slowest Init s | rendezvous requests "
          "| sockets, rank 0 | sockets, other ranks (most) | other ranks at the end "
          "| 4 B allreduce us | 4 MiB allreduce ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, runs in rows.items():
        for who, label in (("lazy", "lazy (default)"), ("full", "full (KOLO_TCP_FULL_MESH=1)")):
            ks = runs[who]
            print(f"| {n} | {label} | {med([k['startup_s'] for k in ks], sec)} | {med([k['init_s'] for k in ks], sec)} "
                  f"| {med([k['requests'] for k in ks], num)} | {med([k['sockets'] for k in ks], num)} "
                  f"| {med([k['sockets_others'] for k in ks], num)} | {med([k['sockets_others_end'] for k in ks], num)} "
                  f"| {med([k['us4'] for k in ks], us)} | {med([k['us4m'] for k in ks], ms_)} |")
    if args.plot:
        def per(who, key, scale=1.0):
            return {n: [r[key] / scale for r in runs[who] if r.get(key) is not None] for n, runs in rows.items()}

        both = lambda key, scale=1.0: {"lazy mesh (default)": per("lazy", key, scale),  # noqa: E731
                                       "full mesh": per("full", key, scale)}
        draw(args.plot, f"kolo across {args.hosts} emulated hosts ({os.cpu_count()} CPUs), {args.repeats} repeats: "
             "median and range", ranks,
             [("start-up to first allreduce s", False, both("startup_s")),
              ("sockets, other ranks (most)", False, both("sockets_others")),
              ("4 B allreduce us (log)", True, both("us4")),
              ("4 MiB allreduce ms (log)", True, both("us4m", 1000.0))])


def run_kolo(kolo, n, args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "kolo.json")
        cmd = [kolo, "run", "--verbose", "-np", str(n), kolo, "bench", "allreduce", "--sizes", "4,4MiB",
               "--iters", str(args.iters), "--warmup", "3", "--json", out]
        sampler = PeakSampler()
        t0 = time.time_ns()
        # KOLO_OVERSUBSCRIBE, as mpirun's --oversubscribe below: n may exceed the CPUs.
        p = subprocess.run(cmd, env=env_with({"KOLO_OVERSUBSCRIBE": "1"}), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
        peak = sampler.peak()
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
        rep = json.load(open(out))
    return figures(rep, p.stdout, t0, peak)


def run_mpi(n, args):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise RuntimeError("mpirun not found (apt-get install openmpi-bin python3-mpi4py)")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "mpi.json")
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), PY,
               os.path.join(HERE, "peers", "mpi_allreduce.py"), "--sizes", "4,4MiB", "--iters", str(args.iters),
               "--warmup", "3", "--json", out]
        p = subprocess.run(cmd, env=env_with({"OMPI_MCA_rmaps_base_oversubscribe": "1"}), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
        rep = json.load(open(out))
    times = {r["bytes"]: r["median_us"] for r in rep["results"]}
    return {"us4": times[4], "us4m": times[4 << 20]}


def spread(vals):
    """(median, low, high) of the figures present, or None."""
    vals = [v for v in vals if v is not None]
    return (statistics.median(vals), min(vals), max(vals)) if vals else None


def draw(path, title, xs, plots):
    """--plot: the table as a picture, one panel per column, ranks on the x axis.

    plots: [(ylabel, ylog, {series label: {ranks: [figures]}})]; figures are already in the panel's unit.
    """
    import plot  # bench/plot.py; matplotlib is needed only when a picture is asked for

    drawn = []
    for ylabel, ylog, series in plots:
        pts = {}
        for label, per in series.items():
            pts[label] = [(n,) + s for n, s in ((n, spread(v)) for n, v in per.items()) if s]
        drawn.append((ylabel, ylog, pts))
    plot.panels(path, title, "ranks", drawn, xs, [str(n) for n in xs], note=plot.machine(), cols=2)


def med(vals, fmt):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals)
    if len(vals) == 1 or min(vals) == max(vals):
        return fmt(m)
    return f"{fmt(m)} ({fmt(min(vals))}-{fmt(max(vals))})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--pause", type=float, default=3.0, help="seconds between runs (default 3)")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--kolo", default=os.path.join(ROOT, "bin", "kolo"), help="the kolo binary (default bin/kolo)")
    p.add_argument("--no-mpi", action="store_true", help="leave OpenMPI out")
    p.add_argument("--json", help="also write every run's figures here")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw the table, a panel per figure against the ranks (needs python3-matplotlib)")
    p.add_argument("--hosts", type=int, default=1,
                   help="emulate this many hosts with no-SSH nodes on this machine, lazy mesh against full mesh")
    args = p.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    if args.hosts > 1:
        hosts_table(args, ranks)
        return
    rows = {}
    for n in ranks:
        ks, ms = [], []
        for rep in range(args.repeats):
            order = ["kolo", "mpi"] if rep % 2 == 0 else ["mpi", "kolo"]
            for who in order:
                if who == "mpi" and args.no_mpi:
                    continue
                time.sleep(args.pause)
                if who == "kolo":
                    ks.append(run_kolo(args.kolo, n, args))
                else:
                    ms.append(run_mpi(n, args))
            print(f"# {n} ranks, repeat {rep + 1}: kolo {ks[-1]}" + (f", OpenMPI {ms[-1]}" if ms else ""),
                  file=sys.stderr, flush=True)
        rows[n] = (ks, ms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(n): {"kolo": k, "mpi": m} for n, (k, m) in rows.items()}, f, indent=1)

    mib = lambda v: f"{v / (1 << 20):.0f}"  # noqa: E731
    sec = lambda v: f"{v:.2f}"  # noqa: E731
    num = lambda v: f"{v:.0f}"  # noqa: E731
    us = lambda v: f"{v:.1f}"  # noqa: E731
    ms_ = lambda v: f"{v / 1000:.2f}"  # noqa: E731
    print(f"# kolo scaling on one host ({os.cpu_count()} CPUs), {args.repeats} repeats, medians (ranges)")
    print("| ranks | /dev/shm peak MiB | start-up to first allreduce s | slowest Init s | rendezvous requests "
          "| sockets per rank | 4 B allreduce us | OpenMPI 4 B us | 4 MiB allreduce ms | OpenMPI 4 MiB ms "
          "| 4 MiB kolo/OpenMPI time |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, (ks, msr) in rows.items():
        ratio = "-"
        if msr:
            ratio = f"{statistics.median(k['us4m'] for k in ks) / statistics.median(m['us4m'] for m in msr):.2f}x"
        print(f"| {n} | {med([k['shm_peak'] for k in ks], mib)} | {med([k['startup_s'] for k in ks], sec)} "
              f"| {med([k['init_s'] for k in ks], sec)} | {med([k['requests'] for k in ks], num)} "
              f"| {med([k['sockets'] for k in ks], num)} | {med([k['us4'] for k in ks], us)} "
              f"| {med([m['us4'] for m in msr], us)} | {med([k['us4m'] for k in ks], ms_)} "
              f"| {med([m['us4m'] for m in msr], ms_)} | {ratio} |")
    if args.plot:
        def per(who, key, scale=1.0):
            return {n: [r[key] / scale for r in (ks if who == "kolo" else msr) if r.get(key) is not None]
                    for n, (ks, msr) in rows.items()}

        both = lambda key, scale: {"kolo": per("kolo", key, scale), "OpenMPI": per("mpi", key, scale)}  # noqa: E731
        draw(args.plot, f"kolo on one host ({os.cpu_count()} CPUs), {args.repeats} repeats: median and range",
             ranks, [("/dev/shm peak MiB", False, {"kolo": per("kolo", "shm_peak", 1 << 20)}),
                     ("start-up to first allreduce s", False, {"kolo": per("kolo", "startup_s")}),
                     ("4 B allreduce us (log)", True, both("us4", 1.0)),
                     ("4 MiB allreduce ms (log)", True, both("us4m", 1000.0))])


if __name__ == "__main__":
    main()
