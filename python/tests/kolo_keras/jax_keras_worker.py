"""kolo.keras on Keras 3's JAX backend, for test_keras.py (KERAS_BACKEND=jax); one mode per job:

    bin/kolo run -np 2 .venv/jax/bin/python python/tests/kolo_keras/jax_keras_worker.py train

train: the ops on jax arrays, at once and inside jax.jit (allreduce and its gradient,
grouped_allreduce, allgather, broadcast, reducescatter, alltoall, objects); then model.fit of a
small MLP where every rank starts from its own random weights and trains on its own data shard,
with DistributedOptimizer, BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateWarmupCallback and LearningRateScheduleCallback: at the end the weights are the same
on every rank and equal to what a single-process computation gives (rank 0's first weights,
each step's gradients of every shard averaged, the callbacks' learning rates); then
backward_passes_per_step=2 against the same kind of reference, with a collective on the updating
steps only and iterations counting every pass; PartialDistributedOptimizer (a local layer's
gradients this rank's own, divided by the size); run_eagerly; load_model, also of an accumulating
optimizer; hvd.elastic there (keras_elastic_worker.py uses it). Prints "JAX-KERAS-OK rank=R".

mismatch: rank 1's model has a wider layer: the gradients' allreduce inside the compiled step
fails on both ranks with the shapes each sent. Prints "JAX-MISMATCH rank=R err=...".

kill: rank 1 (in a child that outlives it, as tf_kill_worker.py) SIGKILLs itself at the start of
a batch, while rank 0 is inside the compiled step's allreduce: rank 0's fit raises, naming rank
1. Prints "JAX-KILL-RESULT rank=0 elapsed_ms=MS err=ERROR".

TensorFlow cannot be imported here (an import hook refuses it): kolo.keras on JAX must not need it.
"""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODE = sys.argv[1]
LINGER = float(os.environ.get("KOLO_PROGRESS_TIMEOUT_SECONDS", "60")) + 15


class _NoTensorFlow(object):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("jax_keras_worker: kolo.keras on JAX imported TensorFlow")


sys.meta_path.insert(0, _NoTensorFlow())
os.environ["KERAS_BACKEND"] = "jax"

if MODE == "kill" and int(os.environ["KOLO_RANK"]) == 1 and "--child" not in sys.argv:
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), MODE, "--child"])
    child.wait()
    print("victim's process ended (%s)" % ("SIGKILL" if child.returncode == -signal.SIGKILL else child.returncode),
          flush=True)
    time.sleep(LINGER)
    sys.exit(1)

sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kolo.keras as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
CHECKS = [0]


def check(ok, what):
    if not ok:
        raise AssertionError("rank %d: %s" % (R, what))
    CHECKS[0] += 1


def close(a, b, what, rtol=1e-4, atol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol),
          "%s: %s != %s (max diff %s)" % (what, a, b, np.max(np.abs(a - b)) if a.shape == b.shape else "-"))


# ----------------------------------------------------------------------------------------------
# The model and its single-process reference

IN, HIDDEN, BATCH, SAMPLES = 4, 8, 8, 32
STEPS = SAMPLES // BATCH  # per epoch


def shard(r):
    """Rank r's data: its own, different from every other rank's."""
    rng = np.random.default_rng(100 + r)
    x = rng.normal(size=[SAMPLES, IN]).astype(np.float32)
    return x, x.sum(1, keepdims=True) + np.float32(0.5)


def make_model(seed, hidden=HIDDEN):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input([IN]), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(1)])


def _loss(params, x, y):
    k1, b1, k2, b2 = params
    pred = jnp.maximum(x @ k1 + b1, 0) @ k2 + b2
    return jnp.mean((pred - y) ** 2)


_grad = jax.jit(jax.grad(_loss))


def reference(inits, lrs, momentum, passes=1, broadcast_after_first=False, local=(), rank=0):
    """The weights that data-parallel SGD with momentum gives, in one process: at step k every
    rank's gradient on its own batch at its own weights, averaged; with passes > 1 every rank's
    gradients of passes steps summed before averaging, the update on every passes-th step; with
    broadcast_after_first every rank takes rank 0's weights after the first step. The weights
    numbered in local are worker-local (momentum 0 only): each rank's own gradient divided by the
    number of ranks; the weights returned are rank's."""
    shards = [shard(r) for r in range(N)]
    ws = [[jnp.asarray(a) for a in w] for w in inits]
    mom = [jnp.zeros_like(a) for a in ws[0]]
    acc = [[jnp.zeros_like(a) for a in ws[0]] for _ in range(N)]
    for k, lr in enumerate(lrs):
        b = k % STEPS
        gs = [_grad(ws[r], shards[r][0][b * BATCH:(b + 1) * BATCH], shards[r][1][b * BATCH:(b + 1) * BATCH])
              for r in range(N)]
        if passes > 1:
            acc = [[a + g for a, g in zip(acc[r], gs[r])] for r in range(N)]
            if (k + 1) % passes:
                continue
            gs, acc = acc, [[jnp.zeros_like(a) for a in ws[0]] for _ in range(N)]
        mean = [sum(g[i] for g in gs) / N for i in range(len(mom))]
        if local:
            ws = [[w - lr * (gs[r][i] / N if i in local else mean[i]) for i, w in enumerate(ws[r])]
                  for r in range(N)]
            continue
        mom = [momentum * m - lr * g for m, g in zip(mom, mean)]
        ws = [[w + m for w, m in zip(ws[r], mom)] for r in range(N)]
        if broadcast_after_first and k == 0:
            ws = [ws[0]] * N
    return ws[rank]


def weights(model):
    return [np.asarray(v) for v in model.weights]


def same_on_every_rank(ws, what):
    every = hvd.allgather_object(ws, name="same." + what)
    check(all(len(w) == len(every[0]) and all(np.array_equal(a, b) for a, b in zip(every[0], w)) for w in every),
          "%s: the same weights on every rank" % what)


# ----------------------------------------------------------------------------------------------
# Modes

def ops():
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * (R + 1)
    total = sum(range(1, N + 1))
    close(hvd.allreduce(x), np.arange(6).reshape(2, 3) * total / N, "allreduce average")
    close(hvd.allreduce(x, op=hvd.Sum, name="sum"), np.arange(6).reshape(2, 3) * total, "allreduce sum")
    close(hvd.allreduce(jnp.int32(R), op=hvd.Max), N - 1, "allreduce max of a scalar")
    close(hvd.allreduce(x, compression=hvd.Compression.fp16, op=hvd.Sum), np.arange(6).reshape(2, 3) * total,
          "allreduce fp16")
    check(hvd.allreduce(x, compression=hvd.Compression.fp16).dtype == jnp.float32, "fp16 decompressed")
    a, b = hvd.grouped_allreduce([x, jnp.ones(3, jnp.int32) * R], op=hvd.Sum, name="g")
    close(a, np.arange(6).reshape(2, 3) * total, "grouped 0")
    close(b, np.ones(3) * sum(range(N)), "grouped 1")
    g = hvd.allgather(jnp.full((R + 1, 2), R, jnp.float32))  # first dimensions differ
    close(g, np.concatenate([np.full((r + 1, 2), r) for r in range(N)]), "allgather")
    close(hvd.broadcast(jnp.arange(3) + R, root_rank=N - 1), np.arange(3) + N - 1, "broadcast")
    check(bool(np.all(np.asarray(hvd.broadcast(jnp.array([R == 0, True]), 0)) == [True, True])), "broadcast bool")
    out, rs = hvd.alltoall(jnp.arange(N, dtype=jnp.float32) + 10 * R, splits=[1] * N)
    close(out, [10 * r + R for r in range(N)], "alltoall")
    check(list(np.asarray(rs)) == [1] * N, "alltoall splits")
    close(hvd.reducescatter(jnp.ones((N + 1, 2)), op=hvd.Sum), np.ones((2 if R == 0 else 1, 2)) * N,
          "reducescatter")

    @jax.jit
    def step(v):
        s = hvd.allreduce(v * 2, op=hvd.Sum, name="jit.s")
        unnamed = hvd.allreduce(v)
        gathered = hvd.allgather(v)
        root = hvd.broadcast(v, 0)
        scattered = hvd.reducescatter(jnp.arange(N + 1, dtype=jnp.float32) + v[0], op=hvd.Sum)
        gr = hvd.grouped_allreduce([v, v + 1], op=hvd.Sum)
        return s, unnamed, gathered, root, scattered, gr
    for _ in range(3):  # compiled once, run three times: the names match every time
        v = jnp.full([3], float(R + 1))
        s, unnamed, gathered, root, scattered, gr = step(v)
        close(s, np.full(3, 2.0 * total), "jit allreduce")
        close(unnamed, np.full(3, total / N), "jit unnamed allreduce")
        close(gathered, np.concatenate([np.full(3, r + 1.0) for r in range(N)]), "jit allgather")
        close(root, np.ones(3), "jit broadcast")
        rows = np.arange(N + 1) * N + total
        close(scattered, rows[:2] if R == 0 else rows[2 + (R - 1):2 + R], "jit reducescatter")
        close(gr[1], np.full(3, total + N), "jit grouped")

    # allreduce's gradient is the allreduce of the output's: d/dv sum(allreduce_sum(v)^2) summed
    g = jax.grad(lambda v: jnp.sum(hvd.allreduce(v, op=hvd.Sum, name="grad.v") ** 2))(jnp.ones(2) * (R + 1))
    close(g, np.full(2, 2.0 * total * N), "allreduce gradient")
    g = jax.jit(jax.grad(lambda v: jnp.sum(hvd.allreduce(v, name="grad.w") * (R + 1))))(jnp.ones(2))
    close(g, np.full(2, total / N), "allreduce gradient inside jit")
    check(hvd.broadcast_object({"r": R}, root_rank=1) == {"r": 1}, "broadcast_object")
    check(hvd.allgather_object(R) == list(range(N)), "allgather_object")
    hvd.barrier()
    try:
        hvd.broadcast_global_variables(0)
        check(False, "broadcast_global_variables raises")
    except RuntimeError as e:
        check("BroadcastGlobalVariablesCallback" in str(e), "broadcast_global_variables says what to use")


def lr_schedule(lr, warmup_epochs, after, epochs):
    """Horovod's warmup (per batch) then a staircase multiplier, as the callbacks set it: the
    learning rate of every step, computed apart from the callbacks' code."""
    out = []
    for e in range(epochs):
        for b in range(STEPS):
            if e < warmup_epochs:
                epoch = e + b / STEPS + 1.0 / STEPS
                out.append(lr / N * (epoch * (N - 1) / warmup_epochs + 1))
            else:
                out.append(lr * after)
    return out


def fit_with_callbacks():
    LR, EPOCHS = 0.05, 3
    model = make_model(10 + R)  # different weights on every rank: the callback must fix them
    inits = hvd.allgather_object(weights(model), name="inits")
    check(not all(np.array_equal(a, b) for a, b in zip(inits[0], inits[-1])), "ranks start apart")
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), loss="mse",
                  metrics=["mae"])
    x, y = shard(R)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=2),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=lambda epoch: 0.1, start_epoch=2),
    ]
    hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=callbacks, verbose=0, shuffle=False)
    losses, lrs = hist.history["loss"], hist.history["lr"]
    check(losses[-1] < losses[0], "loss falls: %s" % losses)
    same_on_every_rank(weights(model), "fit")
    every = hvd.allgather_object(hist.history, name="history")
    check(all(h["loss"] == every[0]["loss"] and h["mae"] == every[0]["mae"] for h in every),
          "metrics averaged: %s" % [h["loss"] for h in every])
    want_lrs = lr_schedule(LR, 2, 0.1, EPOCHS)
    close(lrs, [want_lrs[STEPS * (e + 1) - 1] for e in range(EPOCHS)], "learning rate by epoch")
    for w, want in zip(weights(model), reference(inits, want_lrs, 0.9, broadcast_after_first=True)):
        close(w, want, "fit: weights against the single-process reference")
    check(int(model.optimizer.iterations) == STEPS * EPOCHS, "iterations")
    return model


def fit_accumulating():
    """backward_passes_per_step=2: every rank the same start (no broadcast), the update every
    second step from the two steps' gradients summed, then averaged across ranks; the collective
    runs on those steps only (kolo counts a step per reduction)."""
    LR, EPOCHS = 0.02, 2
    model = make_model(7)
    inits = [weights(model)] * N
    steps_before = hvd.rank_stats()["steps"]
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.5),
                                                     backward_passes_per_step=2), loss="mse")
    x, y = shard(R)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False)
    same_on_every_rank(weights(model), "accumulating")
    for w, want in zip(weights(model), reference(inits, [LR] * (STEPS * EPOCHS), 0.5, passes=2)):
        close(w, want, "backward_passes_per_step=2: weights against the single-process reference")
    reductions = hvd.rank_stats()["steps"] - steps_before
    check(reductions == STEPS * EPOCHS // 2, "a reduction on updating steps only: %d of %d steps"
          % (reductions, STEPS * EPOCHS))
    check(int(model.optimizer.iterations) == STEPS * EPOCHS,
          "iterations %d, want %d (every pass counts)" % (int(model.optimizer.iterations), STEPS * EPOCHS))
    return model


def fit_partial():
    """PartialDistributedOptimizer with the first layer local: every rank the same start, its
    kernel and bias updated with this rank's own gradient divided by the size, the second layer's
    with the average; the local weights part, the others stay the same on every rank."""
    LR = 0.02
    model = make_model(9)
    inits = [weights(model)] * N
    model.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR),
                                                            local_layers=model.layers[0]), loss="mse")
    check(len(model.optimizer.variables) == 2, "local variables not tracked by the optimizer: %s"
          % [v.path for v in model.optimizer.variables])
    x, y = shard(R)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    got = weights(model)
    for i, (w, want) in enumerate(zip(got, reference(inits, [LR] * STEPS, 0.0, local=(0, 1), rank=R))):
        close(w, want, "PartialDistributedOptimizer: weight %d against the reference" % i)
    every = hvd.allgather_object(got, name="partial")
    check(not np.allclose(every[0][0], every[-1][0]), "the local layer's kernel differs across ranks")
    check(all(np.array_equal(e[2], every[0][2]) for e in every), "the shared layer's kernel is the same")


def fit_eagerly():
    LR = 0.02
    model = make_model(8)
    inits = [weights(model)] * N
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse", run_eagerly=True)
    x, y = shard(R)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    for w, want in zip(weights(model), reference(inits, [LR] * STEPS, 0.0)):
        close(w, want, "run_eagerly: weights against the single-process reference")


def load_and_train(model, passes=1):
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    check(type(loaded.optimizer).__mro__[1].__name__ == "_JaxDistributedOptimizer",
          "load_model's optimizer is distributed: %s" % (type(loaded.optimizer).__mro__,))
    check(int(loaded.optimizer.iterations) == int(model.optimizer.iterations), "optimizer state carried over")
    check(loaded.optimizer._hvd_settings.backward_passes_per_step == passes,
          "backward_passes_per_step %d after load_model" % loaded.optimizer._hvd_settings.backward_passes_per_step)
    x, y = shard(R)
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    same_on_every_rank(weights(loaded), "loaded")


def train():
    ops()
    model = fit_with_callbacks()
    accumulating = fit_accumulating()
    fit_partial()
    fit_eagerly()
    load_and_train(model)
    load_and_train(accumulating, passes=2)
    check(issubclass(hvd.elastic.CommitStateCallback, keras.callbacks.Callback)
          and hvd.elastic.KerasState.__module__ == "kolo.keras.elastic", "hvd.elastic on JAX")
    check("tensorflow" not in sys.modules, "TensorFlow not imported")
    print("JAX-KERAS-OK rank=%d checks=%d" % (R, CHECKS[0]), flush=True)


def mismatch():
    model = make_model(3, hidden=HIDDEN + R)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x, y = shard(R)
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    except Exception as e:  # jax.errors.JaxRuntimeError, kolo's error at the end of its message
        print("JAX-MISMATCH rank=%d type=%s err=%s" % (R, type(e).__name__, str(e).strip().splitlines()[-1]),
              flush=True)
        os._exit(0)
    print("JAX-MISMATCH rank=%d type=none err=none" % R, flush=True)


class _KillAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.at = batch
        self.t0 = None

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.at and R == 1:
            time.sleep(0.5)  # rank 0 is inside the step's allreduce by now
            print("rank 1: SIGKILL before batch %d" % batch, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        self.t0 = time.monotonic()


def kill():
    model = make_model(3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x, y = shard(R)
    cb = _KillAt(5)
    try:
        model.fit(np.tile(x, (100, 1)), np.tile(y, (100, 1)), batch_size=BATCH, epochs=1, verbose=0,
                  callbacks=[cb])
    except Exception as e:
        print("JAX-KILL-RESULT rank=%d elapsed_ms=%.0f type=%s err=%s"
              % (R, (time.monotonic() - cb.t0) * 1e3, type(e).__name__, str(e).strip().splitlines()[-1]),
              flush=True)
        os._exit(0)  # the job is broken; leave without the shutdown barrier
    print("JAX-KILL-RESULT rank=%d elapsed_ms=0 type=none err=none" % R, flush=True)


{"train": train, "mismatch": mismatch, "kill": kill}[MODE]()
