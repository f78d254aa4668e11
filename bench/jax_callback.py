#!/usr/bin/env python3
"""What a jax.experimental.io_callback costs a jit-compiled function on the CPU, without kolo: the
crossing kolo.keras's DistributedOptimizer makes once per step on the JAX backend.

    .venv/jax/bin/python bench/jax_callback.py --operands 82 --calls 300

Jitted functions of --operands small float32 arrays (--size elements each), timed per call
(dispatch to result, one call after another): no callback; one callback of one operand, as an
ordered io_callback (what kolo.keras uses), an unordered one, and a pure_callback; an ordered
io_callback of all --operands operands; the same with them packed into one buffer (concatenated
before, split after: what kolo.keras does). The host function only returns what it got, so the
difference to the first is JAX's crossing alone.
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback


def host(*arrays):
    return [np.asarray(a) for a in arrays]


def make(mode, shapes):
    sizes = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]

    @jax.jit
    def step(xs):
        ys = [x + 1 for x in xs]
        if mode == "each":
            ys = io_callback(host, [jax.ShapeDtypeStruct(y.shape, y.dtype) for y in ys], *ys, ordered=True)
        elif mode == "packed":
            flat = jnp.concatenate([y.ravel() for y in ys])
            flat = io_callback(host, [jax.ShapeDtypeStruct(flat.shape, flat.dtype)], flat, ordered=True)[0]
            ys = [p.reshape(s) for p, s in zip(jnp.split(flat, sizes), shapes)]
        elif mode in ("one", "unordered"):
            ys[0] = io_callback(host, [jax.ShapeDtypeStruct(ys[0].shape, ys[0].dtype)], ys[0],
                                ordered=mode == "one")[0]
        elif mode == "pure":
            ys[0] = jax.pure_callback(host, [jax.ShapeDtypeStruct(ys[0].shape, ys[0].dtype)], ys[0])[0]
        return ys
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--operands", type=int, default=82)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    shapes = [(args.size,)] * args.operands
    modes = [("none", "no callback"), ("one", "ordered io_callback, 1 operand"),
             ("unordered", "unordered io_callback, 1 operand"), ("pure", "pure_callback, 1 operand"),
             ("each", "ordered io_callback, %d operands" % args.operands),
             ("packed", "ordered io_callback, %d arrays packed into 1" % args.operands)]
    got = {m: [] for m, _ in modes}
    for _ in range(args.repeats):  # in turn, so that drift on a shared machine hits all alike
        for m, _ in modes:
            f = make(m, shapes)
            xs = [jnp.zeros(s, jnp.float32) for s in shapes]
            for _ in range(10):
                xs = f(xs)
            jax.block_until_ready(xs)
            t = time.perf_counter()
            for _ in range(args.calls):
                xs = f(xs)
            jax.block_until_ready(xs)
            got[m].append((time.perf_counter() - t) / args.calls * 1e3)
    print("| jitted function of %d arrays of %d float32 | ms per call (median, range) |" % (args.operands, args.size))
    print("|---|---:|")
    for m, what in modes:
        v = got[m]
        print("| %s | %.3f (%.3f-%.3f) |" % (what, statistics.median(v), min(v), max(v)))


if __name__ == "__main__":
    main()
