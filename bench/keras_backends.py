#!/usr/bin/env python3
"""Keras 3 model.fit throughput with kolo.keras on the JAX, TensorFlow and PyTorch backends, side by
side in one run, each with one plain process (no kolo) as its baseline.

    make build lib && scripts/jax_venv.sh && scripts/tf_venv.sh && scripts/keras_torch_venv.sh
    python3 bench/keras_backends.py --np 2 --repeats 3 --backends jax,tensorflow,torch

The same script trains on every backend: an MLP (--depth hidden layers of --width units on 784
inputs and 10 classes; by default 2 of 256: 0.27 M parameters in 6 arrays, 1.1 MB of float32
gradients; --depth 40 --width 64 makes 82 small arrays) on synthetic data with SGD, model.fit with hvd.DistributedOptimizer and BroadcastGlobalVariablesCallback under
`kolo run -np N`. Setups per backend: plain Keras in one process; kolo.keras at -np 1 (the
reduction's fixed cost: on JAX an io_callback out of the compiled step, on TensorFlow a
tf.numpy_function, on torch none: the step is eager, kolo.torch's grouped op;
each into the engine); kolo.keras at -np N. Each measurement is one fresh job:
--warmup steps (compilation), then one fit of --steps timed steps on every rank; steps/s is one
rank's (every rank steps together), samples/s counts every rank's. Every process gets the CPUs
divided among the ranks as its threads. The setups run in turn, --repeats times, so drift on a
shared machine hits all alike; the table gives the median and the range.

Worker mode (what the jobs run): --worker, with --backend and --kolo.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KOLO = os.path.join(ROOT, "bin", "kolo")


def worker(args):
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "tensorflow":
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif args.backend == "torch":
        import torch
        torch.set_num_threads(args.threads)
    import keras
    import numpy as np
    hvd = None
    if args.kolo:
        import kolo.keras as hvd
        hvd.init()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input([784])] +
                             [keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)] +
                             [keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.SGD(0.01)
    callbacks = []
    if hvd is not None:
        opt = hvd.DistributedOptimizer(opt)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.normal(size=[n, 784]).astype(np.float32)
    y = rng.integers(0, 10, size=[n]).astype(np.int32)
    w = args.warmup * args.batch
    model.fit(x[:w], y[:w], batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False)
    dt = time.perf_counter() - t0
    if hvd is None or hvd.rank() == 0:
        print("RESULT " + json.dumps({"steps_per_s": args.steps / dt}), flush=True)


def run_job(args, backend, np_, kolo):
    py = {"jax": args.jax_python, "torch": args.torch_python}.get(backend, args.tf_python)
    threads = max(1, (os.cpu_count() or 1) // np_)
    cmd = [py, os.path.abspath(__file__), "--worker", "--backend", backend, "--kolo", str(int(kolo)),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--width", str(args.width), "--depth", str(args.depth), "--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="-1")
    if backend == "jax" and threads == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    if kolo:
        cmd = [KOLO, "run", "-np", str(np_)] + cmd
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=args.timeout).stdout
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])["steps_per_s"]
    raise RuntimeError("%s: no result\n%s" % (" ".join(cmd), out[-3000:]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--backend", default="jax")
    p.add_argument("--kolo", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backends", default="jax,tensorflow")
    p.add_argument("--jax-python", default=os.path.join(ROOT, ".venv", "jax", "bin", "python"))
    p.add_argument("--tf-python", default=os.path.join(ROOT, ".venv", "tf", "bin", "python"))
    p.add_argument("--torch-python", default=os.path.join(ROOT, ".venv", "keras-torch", "bin", "python"))
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    setups = []
    for b in args.backends.split(","):
        setups += [(b, 1, False), (b, 1, True), (b, args.np, True)]
    got = {s: [] for s in setups}
    for r in range(args.repeats):
        for s in setups:
            v = run_job(args, *s)
            got[s].append(v)
            print("repeat %d: %s np=%d %s: %.1f steps/s" % (r + 1, s[0], s[1], "kolo" if s[2] else "plain", v),
                  file=sys.stderr, flush=True)
    print("| backend | setup | steps/s (median, range) | ms/step | samples/s, all ranks |")
    print("|---|---|---:|---:|---:|")
    for s in setups:
        v = got[s]
        med = statistics.median(v)
        what = "kolo run -np %d" % s[1] if s[2] else "one process, no kolo"
        print("| %s | %s | %.1f (%.1f-%.1f) | %.1f | %.0f |" % (s[0], what, med, min(v), max(v), 1e3 / med,
                                                             med * args.batch * s[1]))


if __name__ == "__main__":
    main()
