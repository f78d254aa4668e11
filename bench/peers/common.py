"""Shared timing loop for the peer benchmarks: the same sizes, iterations and statistics as
`kolo bench` (median of per-op wall times after warm-up, warm buffers), written as kolo's JSON."""
import argparse
import json
import statistics
import time

BUS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def parse_args(form=None):
    """The command line every peer takes: --sizes, --iters, --warmup, --json; with form (default,
    choices), also --form, for a peer that times an op called in several ways."""
    p = argparse.ArgumentParser()
    if form:
        p.add_argument("--form", default=form[0], choices=form[1])
    p.add_argument("--sizes", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", required=True)
    p.add_argument("--device", default="cpu", help="where the torch peers' tensors live (cpu, cuda)")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="torch.distributed's backend")
    a = p.parse_args()
    a.sizes = [parse_size(s) for s in a.sizes.split(",")]
    return a


def parse_size(s):
    s = s.strip()
    for suffix, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mult)
    return int(s)


def measure(op_name, nranks, sizes, iters, warmup, make_buffer, run_once, barrier, sync=None):
    """make_buffer(nbytes) -> buffer; run_once(buffer) runs one op; barrier() aligns ranks; sync(),
    if given, waits for the op's result to be where the caller can use it (a GPU's stream), inside
    the timed interval: an op is timed until its result is usable, whatever ran it."""
    results = []
    for nbytes in sizes:
        buf = make_buffer(nbytes)
        barrier()
        times = []
        for it in range(warmup + iters):
            t0 = time.perf_counter()
            run_once(buf)
            if sync:
                sync()
            dt = time.perf_counter() - t0
            if it >= warmup:
                times.append(dt * 1e6)
        med = statistics.median(times)
        algbw = nbytes / (med * 1e3) if med > 0 else 0.0
        results.append({
            "bytes": nbytes,
            "count": nbytes // 4,
            "median_us": med,
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * (BUS[op_name](nranks) if nranks > 1 else 1.0),
        })
    return results


def write(path, op_name, nranks, iters, results):
    with open(path, "w") as f:
        json.dump({"op": op_name, "np": nranks, "dtype": "float32", "iters": iters,
                   "results": results}, f, indent=2)
