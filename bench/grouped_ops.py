#!/usr/bin/env python3
"""The engine's cost per op: many small allreduces submitted as separate ops, as one grouped op,
and as one op of the same bytes (numpy arrays through kolo._ops, no framework).

    make build lib && bin/kolo run -np 2 python3 bench/grouped_ops.py --arrays 82

The arrays are a model's gradients in miniature: --arrays float32 arrays alternating --size x
--size and --size elements (kernels and biases). Each way runs --iters times after --warmup;
rank 0 prints the median per call. What kolo.keras on JAX chose for a step's gradients (one
group) and why: docs/keras.md.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from kolo import _lib, _ops  # noqa: E402


def timed(fn, iters, warmup):
    out = []
    for i in range(warmup + iters):
        t = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arrays", type=int, default=82)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    _lib.init(None)
    rank, size = _lib.topology()[0], _lib.topology()[1]
    arrays = [np.full((args.size, args.size) if i % 2 == 0 else (args.size,), rank + 1, np.float32)
              for i in range(args.arrays)]
    names = ["g.%d" % i for i in range(args.arrays)]
    flat = np.concatenate([a.ravel() for a in arrays])
    want = size * (size + 1) / 2
    got = _ops.run_group(np, _ops.ALLREDUCE, arrays, "check", _ops.Sum)
    assert all(np.all(g == want) for g in got), "run_group reduced wrongly"
    separate = timed(lambda: _ops.run_many(np, _ops.ALLREDUCE, arrays, names, _ops.Average), args.iters, args.warmup)
    group = timed(lambda: _ops.run_group(np, _ops.ALLREDUCE, arrays, "grads", _ops.Average), args.iters, args.warmup)
    one = timed(lambda: _ops.run(np, _ops.ALLREDUCE, flat, "flat", _ops.Average), args.iters, args.warmup)
    if rank == 0:
        print("%d ranks, %d arrays (%.0f kB): separate ops %.2f ms, one grouped op %.2f ms, one op of the same "
              "bytes %.2f ms (medians per call)" % (size, args.arrays, flat.nbytes / 1e3, separate, group, one))


if __name__ == "__main__":
    main()
