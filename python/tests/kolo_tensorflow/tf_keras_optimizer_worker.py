"""The distributed Keras optimizer's gradients, for test_tensorflow.py. With argument "keras3",
Keras 3 through kolo.keras; "keras2", standalone Keras 2 (TensorFlow before 2.16) through kolo.keras;
"tf-keras", Keras 2 as tf.keras (tf-keras, or TensorFlow's own before 2.16) through
kolo.tensorflow.keras:

    bin/kolo run -np 2 .venv/tf/bin/python python/tests/kolo_tensorflow/tf_keras_optimizer_worker.py keras3

Rank r's gradients are r + 1 times the same ones, so a reduced gradient differs from a local one
by a known factor: the mean (N + 1) / 2, the sum N (N + 1) / 2. Checked, eagerly and in
tf.function: that _compute_gradients then apply_gradients reduces once, and apply_gradients
alone once; backward_passes_per_step (updates every Nth pass with the reduced sum or mean, the
aggregation counter, iterations counting every pass, sparse gradients); worker-local variables
(register_local_var, PartialDistributedOptimizer) and the tape's local sources; model.fit with
backward_passes_per_step; KerasState's sync, restore and commit, and the elastic callbacks.
Prints "TF-KERAS-OPT-OK rank=R mode=M checks=K".
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
MODE = sys.argv[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if MODE == "tf-keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if MODE in ("keras3", "keras2"):
    import keras  # noqa: E402
    import kolo.keras as hvd  # noqa: E402
else:
    keras = tf.keras
    import kolo.tensorflow.keras as hvd  # noqa: E402
assert hasattr(keras, "ops") == (MODE == "keras3"), (MODE, keras.__name__)  # keras.ops: Keras 3's
Variable = keras.Variable if MODE == "keras3" else tf.Variable
import kolo.tensorflow  # noqa: E402  (DistributedGradientTape)

tf.get_logger().setLevel("ERROR")
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
MEAN = (N + 1) / 2.0  # the mean over ranks of rank r's factor r + 1
SUM = N * (N + 1) / 2.0
checks = 0


def check(ok, what):
    global checks
    if not ok:
        raise AssertionError("rank %d (%s): %s" % (R, MODE, what))
    checks += 1


def close(got, want, what, tol=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol),
          "%s: got %s, want %s" % (what, got.tolist(), want.tolist()))


def make_vars():
    """w (dense gradient), e (an embedding: a sparse gradient, row 1 only), loc (made local
    where a check registers it)."""
    return tuple(Variable(np.zeros(shape, np.float32)) for shape in ([2], [3, 2], [1]))


def loss_fn(w, e, loc):
    def loss():
        return float(R + 1) * (tf.reduce_sum(tf.convert_to_tensor(w)) + tf.reduce_sum(tf.gather(e, [1]))
                               + tf.reduce_sum(tf.convert_to_tensor(loc)))
    return loss


def opt_vars(o):
    v = o.variables
    return list(v() if callable(v) else v)


def sgd():
    return keras.optimizers.SGD(learning_rate=1.0)


def e_with_row1(v):
    want = np.zeros([3, 2])
    want[1] = v
    return want


# ---- _compute_gradients then apply_gradients: reduced once (op=Sum shows a second reduction)
for how in ("eager", "function"):
    w, e, loc = make_vars()
    variables = [w, e, loc]
    opt = hvd.DistributedOptimizer(sgd(), op=hvd.Sum)

    def compute_apply():
        pairs = opt._compute_gradients(loss_fn(w, e, loc), var_list=variables)
        opt.apply_gradients(pairs)
        return [g for g, _ in pairs]
    f = compute_apply if how == "eager" else tf.function(compute_apply)
    grads = f()
    close(grads[0], [SUM, SUM], "_compute_gradients returns the reduced gradient (%s)" % how)
    close(w, [-SUM, -SUM], "compute then apply: w reduced once (%s)" % how)
    close(e, e_with_row1(-SUM), "compute then apply: the embedding's sparse gradient (%s)" % how)
    close(loc, [-SUM], "compute then apply: loc (%s)" % how)

    # apply_gradients alone, with a plain tape's gradients: reduced there, once
    w, e, loc = make_vars()
    variables = [w, e, loc]
    opt = hvd.DistributedOptimizer(sgd(), op=hvd.Sum)

    def tape_apply():
        with tf.GradientTape() as tape:
            loss = loss_fn(w, e, loc)()
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    (tape_apply if how == "eager" else tf.function(tape_apply))()
    close(w, [-SUM, -SUM], "apply_gradients with a tape's gradients: reduced once (%s)" % how)
    close(e, e_with_row1(-SUM), "apply_gradients: the embedding (%s)" % how)

# ---- backward_passes_per_step: every Nth pass updates with the reduced sum (or mean)
PASSES, STEPS = 3, 7
for how in ("eager", "function"):
    for average in (False, True):
        w, e, loc = make_vars()
        variables = [w, e, loc]
        opt = hvd.DistributedOptimizer(sgd(), backward_passes_per_step=PASSES, sparse_as_dense=True,
                                       average_aggregated_gradients=average)
        opt.register_local_var(loc)

        def step():
            pairs = opt._compute_gradients(loss_fn(w, e, loc), var_list=variables)
            opt.apply_gradients(pairs)
            return [g for g, _ in pairs]
        f = step if how == "eager" else tf.function(step)
        what = "backward_passes_per_step=%d average=%s %s" % (PASSES, average, how)
        for i in range(STEPS):
            grads = f()
            updates = (i + 1) // PASSES
            per_update = PASSES / (PASSES if average else 1)
            close(w, [-updates * per_update * MEAN] * 2, "%s: w after pass %d" % (what, i + 1))
            close(e, e_with_row1(-updates * per_update * MEAN), "%s: e after pass %d" % (what, i + 1))
            # the local variable: this rank's own gradient, divided by the size (scale_local_gradients)
            close(loc, [-updates * per_update * (R + 1) / N], "%s: local loc after pass %d" % (what, i + 1))
            check(int(opt._agg_helper.counter.numpy()) == (i + 1) % PASSES,
                  "%s: counter %d after pass %d" % (what, int(opt._agg_helper.counter.numpy()), i + 1))
            check(int(opt.iterations.numpy()) == i + 1,
                  "%s: iterations %d after pass %d (every pass counts)" % (what, int(opt.iterations.numpy()), i + 1))
            if (i + 1) % PASSES:  # between updates: this rank's own running sum
                close(grads[0], [((i % PASSES) + 1) * (R + 1)] * 2, "%s: local sum after pass %d" % (what, i + 1))

    # a sparse gradient cannot be summed locally unless made dense
    w, e, loc = make_vars()
    opt = hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2)
    try:
        opt._compute_gradients(loss_fn(w, e, loc), var_list=[w, e, loc])
        check(False, "a sparse gradient with backward_passes_per_step=2 and no sparse_as_dense was summed")
    except ValueError as err:
        check("sparse_as_dense" in str(err), "the error names sparse_as_dense: %s" % err)

# ---- worker-local layers: PartialDistributedOptimizer, and the tape's local sources
keras.utils.set_random_seed(3 + R)  # different weights on every rank: different gradients
model = keras.Sequential([keras.Input([3]), keras.layers.Dense(4), keras.layers.Dense(2)])
x = np.random.default_rng(R).normal(size=[5, 3]).astype(np.float32)
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_mean(model(x) ** 2)
weights = model.trainable_weights
local_grads = [np.asarray(g) for g in tape.gradient(loss, weights)]
every = hvd.allgather_object(local_grads)
popt = hvd.PartialDistributedOptimizer(sgd(), local_layers=[model.layers[0]])
got = popt._compute_gradients(loss, weights, tape=tape)
for i, (g, v) in enumerate(got):
    check(v is weights[i], "PartialDistributedOptimizer keeps the variables' order")
    if i < len(model.layers[0].trainable_weights):
        close(g, local_grads[i] / N, "local layer's gradient %d: this rank's, divided by the size" % i)
    else:
        close(g, np.mean([ev[i] for ev in every], axis=0), "shared layer's gradient %d: the mean" % i)
dtape = kolo.tensorflow.DistributedGradientTape(tape)
dtape.register_local_source(weights[0])
got = dtape.gradient(loss, weights)
close(got[0], local_grads[0] / N, "the tape's local source: this rank's gradient, divided by the size")
close(got[2], np.mean([ev[2] for ev in every], axis=0), "the tape's other gradients: the mean")
dtape = kolo.tensorflow.DistributedGradientTape(tape, scale_local_gradients=False)
dtape.register_local_source(weights[0])
close(dtape.gradient(loss, weights)[0], local_grads[0], "scale_local_gradients=False: the local gradient as is")
del tape

# ---- model.fit with backward_passes_per_step=2: the same weights everywhere, every batch counted
keras.utils.set_random_seed(7 + R)
m = keras.Sequential([keras.Input([4]), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
fopt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2)
m.compile(optimizer=fopt, loss="mse")
xs = np.random.default_rng(R).normal(size=[48, 4]).astype(np.float32)
ys = xs.sum(1, keepdims=True)
h = m.fit(xs, ys, batch_size=8, epochs=2, verbose=0, shuffle=False,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
check(np.isfinite(h.history["loss"]).all(), "fit's losses: %s" % h.history["loss"])
ws = hvd.allgather_object([np.asarray(v) for v in m.weights])
check(all(np.array_equal(a, b) for w_ in ws[1:] for a, b in zip(ws[0], w_)), "fit: the same weights on every rank")
check(int(fopt.iterations.numpy()) == 12, "fit: iterations %d, want 12 (every batch)" % int(fopt.iterations.numpy()))
check(int(fopt._agg_helper.counter.numpy()) == 0, "fit: 12 batches end a round")

# ---- KerasState: sync takes rank 0's, restore the last commit, commit keeps the new
state = hvd.elastic.KerasState(m, batch=10 + R, epoch=20 + R)
check(state.optimizer is fopt, "KerasState takes the model's optimizer")
for v in list(m.weights) + opt_vars(fopt):
    v.assign(np.full(v.shape, R + 1, v.dtype.name if hasattr(v.dtype, "name") else v.dtype))
state.sync()
check(state.batch == 10 and state.epoch == 20, "sync: rank 0's batch and epoch")
close(m.weights[0], np.ones(m.weights[0].shape), "sync: rank 0's weights")
close(opt_vars(fopt)[-1], np.ones(opt_vars(fopt)[-1].shape), "sync: rank 0's optimizer variables")
for v in m.weights:
    v.assign(np.full(v.shape, 5, np.float32))
state.batch = 11
state.restore()
check(state.batch == 10, "restore: the batch of the last commit")
close(m.weights[0], np.ones(m.weights[0].shape), "restore: the weights of the last commit")
for v in m.weights:
    v.assign(np.full(v.shape, 5, np.float32))
state.batch, state.epoch = 12, 21
state.commit()
state.restore()
check(state.batch == 12 and state.epoch == 21, "commit, restore: the committed values")
close(m.weights[0], np.full(m.weights[0].shape, 5), "commit, restore: the committed weights")
# restore and sync start a new aggregation round (fopt sums 2 passes)
for what in ("restore", "sync"):
    m.train_on_batch(xs[:8], ys[:8])
    check(int(fopt._agg_helper.counter.numpy()) == 1, "one pass into a round before the %s" % what)
    getattr(state, what)()
    check(int(fopt._agg_helper.counter.numpy()) == 0, "%s starts a new aggregation round" % what)
    check(all(not np.any(np.asarray(acc)) for _, acc in fopt._agg_helper._sums.values()),
          "%s clears the aggregated sums" % what)

# ---- the elastic callbacks in fit: commits every batches_per_commit batches and at epoch ends
commits = []
state.commit = (lambda c=state.commit: (commits.append((state.epoch, state.batch)), c())[1])
state.batch, state.epoch = 0, 1
seen = []


class Record(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        seen.append(state.batch)


cbs = [hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state), Record(),
       hvd.elastic.CommitStateCallback(state, batches_per_commit=4)]
m.fit(xs, ys, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=cbs)
check(seen == list(range(6)) * 2, "UpdateBatchStateCallback: state.batch is the batch: %s" % seen)
check(state.epoch == 3 and state.batch == 0,
      "after 2 epochs from epoch 1: epoch %d batch %d" % (state.epoch, state.batch))
# every 4th batch counted across epochs (batch 3; 1 and 5 of the second epoch) and every epoch's end
check(commits == [(1, 3), (2, 0), (2, 1), (2, 5), (3, 0)], "CommitStateCallback's commits (epoch, batch): %s" % commits)

print("TF-KERAS-OPT-OK rank=%d mode=%s checks=%d" % (R, MODE, checks), flush=True)
