"""hvd.SyncBatchNormalization on Keras 3's JAX or torch backend (KERAS_BACKEND), for test_keras.py,
at 2 ranks whose batches differ in content and in size (3 and 5 samples of one global batch of 8):

    bin/kolo run -np 2 .venv/jax/bin/python python/tests/kolo_keras/keras_sync_bn_worker.py

Against keras.layers.BatchNormalization in this process over the whole global batch, with the same
gamma and beta: each rank's outputs are the reference's rows of its samples, and the moving mean
and variance after the step are the reference's; eagerly, and on JAX also inside jax.jit (the
layer's stateless_call, as Keras's compiled train step runs it). Gradients of sum(outputs * W) (W
fixed weights per sample): each rank's input gradient is the reference's rows of its samples, and
gamma's and beta's summed across ranks are the reference's (torch's autograd through kolo.torch's
allreduce; on JAX jax.grad inside jax.jit, through kolo.keras's allreduce and its gradient). Then
model.fit of a small model with the layer and the DistributedOptimizer, each rank on its own data:
the moving statistics and the weights are the same on both ranks (plain BatchNormalization's
would differ). Prints "KERAS-SYNCBN-OK rank=R checks=N".
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kolo.keras as hvd  # noqa: E402

BACKEND = keras.backend.backend()
if BACKEND == "torch":
    import torch
    torch.set_num_threads(1)
else:
    import jax
    import jax.numpy as jnp

hvd.init()
R, N = hvd.rank(), hvd.size()
assert N == 2, "run with -np 2"
CHECKS = [0]
ROWS = [slice(0, 3), slice(3, 8)]  # rank 0: 3 samples, rank 1: 5
SHAPE = (5, 3)  # per sample; channels last, so the statistics reduce over the batch and 5 rows


def check(ok, what):
    if not ok:
        raise AssertionError("rank %d: %s" % (R, what))
    CHECKS[0] += 1


def close(a, b, what, rtol=1e-4, atol=1e-5):
    a, b = np.asarray(keras.ops.convert_to_numpy(a)), np.asarray(keras.ops.convert_to_numpy(b))
    check(a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol),
          "%s: %s != %s (max diff %s)" % (what, a, b, np.max(np.abs(a - b)) if a.shape == b.shape else "-"))


rng = np.random.default_rng(0)
X = (rng.normal(size=(8,) + SHAPE) * 3 + 2).astype(np.float32)  # the global batch
W = rng.normal(size=X.shape).astype(np.float32)  # the loss's weights, sum(outputs * W)
GAMMA = rng.normal(size=[SHAPE[-1]]).astype(np.float32)
BETA = rng.normal(size=[SHAPE[-1]]).astype(np.float32)
x, w = X[ROWS[R]], W[ROWS[R]]


def layers():
    sync = hvd.SyncBatchNormalization(momentum=0.9, epsilon=1e-3)
    ref = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3)
    for layer in (sync, ref):
        layer.build((None,) + SHAPE)
        layer.gamma.assign(GAMMA)
        layer.beta.assign(BETA)
    return sync, ref


def check_moving(sync, ref, what):
    close(sync.moving_mean, ref.moving_mean, what + ": moving mean")
    close(sync.moving_variance, ref.moving_variance, what + ": moving variance")
    # Not the local statistics: the shards' means differ from the global one.
    local = 0.9 * 0 + 0.1 * x.mean(axis=(0, 1))
    check(not np.allclose(keras.ops.convert_to_numpy(sync.moving_mean), local, atol=1e-4),
          what + ": the moving mean is not this rank's own")


def forward_eager():
    sync, ref = layers()
    out = sync(x, training=True)
    want = ref(X, training=True)
    close(out, keras.ops.convert_to_numpy(want)[ROWS[R]], "eager: outputs against the global batch's")
    check_moving(sync, ref, "eager")
    # Inference uses the moving statistics, no collective.
    close(sync(x, training=False), keras.ops.convert_to_numpy(ref(X, training=False))[ROWS[R]], "inference")


def gradients_torch():
    sync, ref = layers()
    xt = torch.tensor(x, requires_grad=True)
    torch.sum(sync(xt, training=True) * torch.from_numpy(w)).backward()
    Xt = torch.tensor(X, requires_grad=True)
    torch.sum(ref(Xt, training=True) * torch.from_numpy(W)).backward()
    close(xt.grad, Xt.grad[ROWS[R]], "torch: input gradient against the global batch's")
    for name in ("gamma", "beta"):
        mine = getattr(sync, name).value.grad
        total = hvd.allreduce(mine, op=hvd.Sum, name="sum." + name)
        close(total, getattr(ref, name).value.grad, "torch: %s's gradient summed across ranks" % name)
        check(not np.allclose(mine.numpy(), total.numpy()), "torch: %s's gradient is this rank's share" % name)
    check_moving(sync, ref, "torch, with gradients")


def jitted_jax():
    """The layer as Keras's compiled train step runs it: stateless_call inside jax.jit, its
    gradient with jax.grad, the new moving statistics returned."""
    sync, ref = layers()

    def run(layer, trainable, non_trainable, inputs, weights):
        out, new_nt = layer.stateless_call(trainable, non_trainable, inputs, training=True)
        return jnp.sum(out * weights), (out, new_nt)

    grad = jax.jit(jax.grad(run, argnums=(1, 3), has_aux=True), static_argnums=0)
    tv = [v.value for v in sync.trainable_variables]
    nt = [v.value for v in sync.non_trainable_variables]
    (g_params, g_x), (out, new_nt) = grad(sync, tv, nt, jnp.asarray(x), jnp.asarray(w))
    (r_params, r_x), (r_out, r_nt) = jax.jit(jax.grad(run, argnums=(1, 3), has_aux=True), static_argnums=0)(
        ref, [v.value for v in ref.trainable_variables], [v.value for v in ref.non_trainable_variables],
        jnp.asarray(X), jnp.asarray(W))
    close(out, np.asarray(r_out)[ROWS[R]], "jit: outputs against the global batch's")
    for a, b, v in zip(new_nt, r_nt, sync.non_trainable_variables):
        close(a, b, "jit: %s" % v.name)
    close(g_x, np.asarray(r_x)[ROWS[R]], "jit: input gradient against the global batch's")
    for g, r, v in zip(g_params, r_params, sync.trainable_variables):
        total = hvd.allreduce(g, op=hvd.Sum, name="sum." + v.name)
        close(total, r, "jit: %s's gradient summed across ranks" % v.name)
        check(not np.allclose(np.asarray(g), np.asarray(total)), "jit: %s's gradient is this rank's share" % v.name)


def fit():
    """model.fit with the layer between two Dense layers, each rank on its own data: its
    statistics, and so its moving statistics, are the global batch's on both ranks."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input([4]), keras.layers.Dense(6), hvd.SyncBatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    data = np.random.default_rng(10 + R).normal(size=[32, 4]).astype(np.float32) * (1 + 2 * R)
    model.fit(data, data.sum(1, keepdims=True), batch_size=8, epochs=2, verbose=0, shuffle=False)
    bn = model.layers[1]
    every = hvd.allgather_object([keras.ops.convert_to_numpy(v) for v in model.weights], name="fit.weights")
    check(all(np.array_equal(a, b) for a, b in zip(every[0], every[1])), "fit: the same weights on both ranks")
    moving = keras.ops.convert_to_numpy(bn.moving_variance)
    check(not np.allclose(moving, 1.0), "fit: the moving variance moved: %s" % moving)


forward_eager()
if BACKEND == "torch":
    gradients_torch()
else:
    jitted_jax()
fit()
print("KERAS-SYNCBN-OK rank=%d checks=%d" % (R, CHECKS[0]), flush=True)
