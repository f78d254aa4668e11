"""Every kolo.tensorflow op at 2+ ranks, eagerly and inside tf.function, against numpy references
computed from every rank's inputs (each rank can compute them all: inputs depend on the rank
only); gradients of the ops; DistributedGradientTape and DistributedOptimizer training to the same
weights on every rank; process sets; a shape mismatch last. For test_tensorflow.py:

    bin/kolo run -np 2 .venv/tf/bin/python python/tests/kolo_tensorflow/tf_ops_worker.py

Each rank prints "TF-OPS-OK rank=R checks=N" at the end; a failed check raises.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kolo.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")  # the retracing warnings of the many small functions here
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

hvd.init()
R, N = hvd.rank(), hvd.size()
checks = 0


def check(ok, what):
    global checks
    if not ok:
        raise AssertionError("rank %d: %s" % (R, what))
    checks += 1


def close(got, want, what, tol=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol),
          "%s: got %s, want %s" % (what, got.tolist(), want.tolist()))


def modes(fn):
    """fn eagerly and as a tf.function (traced once per call here)."""
    return [("eager", fn), ("function", tf.function(fn))]


def inp(r, shape, dtype):
    """Rank r's input: small positive integers, exact in every dtype."""
    k = int(np.prod(shape))
    return ((np.arange(k) % 3 + r + 1).reshape(shape)).astype(dtype)


# ---- topology and build queries
check(hvd.is_initialized() and 0 <= R < N and N >= 2, "topology %d of %d" % (R, N))
check(hvd.local_rank() == R and hvd.local_size() == N and hvd.cross_size() == 1 and hvd.cross_rank() == 0,
      "local/cross ranks")
check(hvd.is_homogeneous() and not hvd.mpi_enabled() and not hvd.mpi_built() and not hvd.gloo_enabled()
      and hvd.nccl_built() == 0 and not hvd.mpi_threads_supported() and hvd.tensorflow_built(), "build queries")
check(int(hvd.rank_op()) == R and int(hvd.size_op()) == N, "rank_op/size_op")

# ---- allreduce: dtypes x ops, eager and in tf.function
REDUCE = {hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}
for dt in ["int32", "int64", "float16", "float32", "float64", "bfloat16", "uint8", "int8", "int16"]:
    tdt = tf.as_dtype(dt)
    for shape in [(), (5,), (2, 3)]:
        x = tf.constant(inp(R, shape, np.float64), dtype=tdt) if dt == "bfloat16" else tf.constant(inp(R, shape, dt))
        allin = np.stack([inp(r, shape, np.float64) for r in range(N)])
        ops = dict(REDUCE)
        if tdt.is_floating:
            ops[hvd.Average] = np.mean
        for op, ref in ops.items():
            for mode, f in modes(lambda t, op=op: hvd.allreduce(t, op=op)):
                got = f(x)
                check(got.dtype == tdt and got.shape == x.shape, "allreduce %s %s shape %s" % (dt, mode, got.shape))
                close(tf.cast(got, tf.float64), ref(allin, axis=0), "allreduce %s op %d %s %s" % (dt, op, shape, mode),
                      tol=1e-2 if dt in ("float16", "bfloat16") else 1e-6)

x = tf.constant(inp(R, (4,), np.float32))
allin = np.stack([inp(r, (4,), np.float64) for r in range(N)])
for mode, f in modes(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)):
    close(f(x), allin.sum(0) * 1.5, "pre/postscale " + mode)
for mode, f in modes(lambda t: hvd.allreduce(t, compression=hvd.Compression.fp16)):
    got = f(x)
    check(got.dtype == tf.float32, "fp16 compression keeps float32")
    close(got, allin.mean(0), "fp16 compression " + mode, tol=1e-3)
close(hvd.allreduce(x, average=False), allin.sum(0), "average=False")
# large enough for the eager path that writes into a tensor TensorFlow allocated
big = inp(R, (1 << 15, 3), np.float32)
close(hvd.allreduce(tf.constant(big), op=hvd.Sum), sum(inp(r, (1 << 15, 3), np.float64) for r in range(N)),
      "large allreduce")
close(hvd.broadcast(tf.constant(big), 1 % N), inp(1 % N, (1 << 15, 3), np.float64), "large broadcast")
close(tf.function(lambda t: hvd.allreduce(t, op=hvd.Max))(tf.constant(big)),
      np.max([inp(r, (1 << 15, 3), np.float64) for r in range(N)], axis=0), "large allreduce in tf.function")
close(hvd.allreduce(tf.Variable(x)), allin.mean(0), "allreduce of a variable")
close(hvd.allreduce(x, name="named.allreduce", op=hvd.Max), allin.max(0), "named allreduce")

# IndexedSlices: an allgather of values and indices; dense through sparse_as_dense in the tape
sl = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (R + 1), tf.constant([R]), dense_shape=tf.constant([N, 2]))
red = hvd.allreduce(sl, op=hvd.Sum)
check(isinstance(red, tf.IndexedSlices), "IndexedSlices stay IndexedSlices")
close(tf.convert_to_tensor(red), [[1.0 * (r + 1), 2.0 * (r + 1)] for r in range(N)], "IndexedSlices sum")
red = hvd.allreduce(sl)
close(red.values, [[(r + 1) / N, 2.0 * (r + 1) / N] for r in range(N)], "IndexedSlices average")

# grouped_allreduce
for mode, f in modes(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum)):
    a, b = f(tf.constant(inp(R, (3,), np.float32)), tf.constant(inp(R, (2, 2), np.int32)))
    close(a, sum(inp(r, (3,), np.float64) for r in range(N)), "grouped a " + mode)
    close(b, sum(inp(r, (2, 2), np.float64) for r in range(N)), "grouped b " + mode)
    check(b.dtype == tf.int32, "grouped keeps dtypes")

# ---- allgather, ragged first dimension, every dtype incl. bool
for dt in ["float32", "float64", "int32", "int64", "uint8", "float16", "bool"]:
    for mode, f in modes(hvd.allgather):
        x = tf.constant(inp(R, (R + 1, 3), dt if dt != "bool" else np.int64) % 2 == 0) if dt == "bool" \
            else tf.constant(inp(R, (R + 1, 3), dt))
        got = f(x)
        want = np.concatenate([inp(r, (r + 1, 3), np.int64) for r in range(N)])
        if dt == "bool":
            want = want % 2 == 0
        check(got.dtype == x.dtype, "allgather dtype %s" % dt)
        close(tf.cast(got, tf.float64), want, "allgather %s %s" % (dt, mode))


@tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
def gather_sig(t):
    out = hvd.allgather(t)
    check(out.shape.as_list() == [None, 3], "allgather static shape %s" % out.shape)
    return out


close(gather_sig(tf.ones([R + 2, 3])), np.ones([sum(r + 2 for r in range(N)), 3]), "allgather, traced with None")
got = hvd.grouped_allgather([tf.fill([R + 1], R), tf.fill([1, 2], float(R))])
close(got[0], np.concatenate([[r] * (r + 1) for r in range(N)]), "grouped_allgather a")
close(got[1], [[float(r)] * 2 for r in range(N)], "grouped_allgather b")

# ---- broadcast from every root
for root in range(N):
    for dt in ["float32", "int64", "bool", "bfloat16"]:
        for mode, f in modes(lambda t, root=root: hvd.broadcast(t, root)):
            base = inp(R, (2, 2), np.int64)
            x = tf.constant(base % 2 == 0) if dt == "bool" else tf.cast(tf.constant(base), dt)
            want = inp(root, (2, 2), np.int64)
            want = want % 2 == 0 if dt == "bool" else want
            close(tf.cast(f(x), tf.float64), want, "broadcast %s root %d %s" % (dt, root, mode))
v = tf.Variable(inp(R, (3,), np.float32))
hvd.broadcast_([v], root_rank=1 % N)
close(v, inp(1 % N, (3,), np.float32), "broadcast_ in place")
# in a TensorFlow 1 graph, the returned tensors run the broadcast and the assignment
for use_resource in (False, True):
    with tf.Graph().as_default():
        gv = tf.compat.v1.Variable(inp(R, (3,), np.float32), use_resource=use_resource)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, = hvd.broadcast_([gv], root_rank=1 % N)
            close(sess.run(got), inp(1 % N, (3,), np.float32), "broadcast_ in a graph (resource %s)" % use_resource)
            close(sess.run(gv), inp(1 % N, (3,), np.float32), "broadcast_'s variable in a graph")

# ---- alltoall with splits (returned as Horovod returns them) and without
for mode, f in modes(lambda t, s: hvd.alltoall(t, splits=s)):
    # rank r sends (r + d + 1) rows to rank d, row values 100 r + d
    splits = [R + d + 1 for d in range(N)]
    rows = np.concatenate([np.full([R + d + 1, 2], 100 * R + d) for d in range(N)]).astype(np.float32)
    out, rsplits = f(tf.constant(rows), tf.constant(splits, dtype=tf.int32))
    want = np.concatenate([np.full([r + R + 1, 2], 100 * r + R) for r in range(N)])
    close(out, want, "alltoall " + mode)
    check(rsplits.dtype == tf.int32, "alltoall received splits dtype %s" % rsplits.dtype)
    close(rsplits, [r + R + 1 for r in range(N)], "alltoall received splits " + mode)
out = hvd.alltoall(tf.constant(np.arange(2 * N) + 10 * R))
close(out, np.concatenate([[10 * r + 2 * R, 10 * r + 2 * R + 1] for r in range(N)]), "alltoall even")

# ---- reducescatter
for mode, f in modes(lambda t: hvd.reducescatter(t, op=hvd.Sum)):
    rows = 2 * N + 1
    x = tf.constant(inp(R, (rows, 2), np.float32))
    full = sum(inp(r, (rows, 2), np.float64) for r in range(N))
    start = sum(rows // N + (1 if r < rows % N else 0) for r in range(R))
    mine = rows // N + (1 if R < rows % N else 0)
    close(f(x), full[start:start + mine], "reducescatter " + mode)
close(hvd.reducescatter(tf.ones([N, 2])), np.ones([1, 2]), "reducescatter average")

# ---- barrier, broadcast_variables, objects
hvd.barrier()
tf.function(lambda: hvd.barrier())()
vs = [tf.Variable(tf.fill([2], float(R))), tf.Variable(R, dtype=tf.int64), tf.Variable(R % 2 == 0)]
hvd.broadcast_variables(vs, root_rank=0)
close(vs[0], [0.0, 0.0], "broadcast_variables float")
check(int(vs[1]) == 0 and bool(vs[2]), "broadcast_variables int and bool")
check(hvd.broadcast_object({"r": R, "l": [R] * 3} if R == 0 else None, 0) == {"r": 0, "l": [0, 0, 0]},
      "broadcast_object")
check(hvd.allgather_object(("x", R)) == [("x", r) for r in range(N)], "allgather_object")
check(hvd.broadcast_object_fn(root_rank=1 % N)(R) == 1 % N, "broadcast_object_fn")

# ---- gradients of the ops (Horovod's registrations)
for mode, run in [("eager", lambda f, *a: f(*a)), ("function", lambda f, *a: tf.function(f)(*a))]:
    def allreduce_grad(v):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.allreduce(v * v, op=hvd.Sum))
        return tape.gradient(y, v)
    v = tf.Variable([1.0, 2.0]) * (R + 1)
    v = tf.Variable(v)
    # d/dv sum(allreduce_sum(v^2)) = allreduce_sum(1) * 2v = 2N v
    close(run(allreduce_grad, v), 2 * N * np.array([1.0, 2.0]) * (R + 1), "allreduce gradient " + mode)

    def avg_grad(v):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.allreduce(v))
        return tape.gradient(y, v)
    close(run(avg_grad, v), [1.0, 1.0], "allreduce average gradient " + mode)

    def gather_grad(v):
        with tf.GradientTape() as tape:
            g = hvd.allgather(v)
            y = tf.reduce_sum(g * tf.range(1, tf.shape(g)[0] + 1, dtype=tf.float32)[:, None])
        return tape.gradient(y, v)
    gv = tf.Variable(tf.ones([R + 1, 2]))
    start = sum(r + 1 for r in range(R))
    close(run(gather_grad, gv), np.repeat(np.arange(start + 1, start + R + 2)[:, None], 2, 1), "allgather gradient " + mode)

    def bcast_grad(v):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.broadcast(v, 0) * 3.0)
        return tape.gradient(y, v)
    close(run(bcast_grad, tf.Variable([1.0, 1.0])), [3.0, 3.0] if R == 0 else [0.0, 0.0], "broadcast gradient " + mode)

    def a2a_grad(v):
        with tf.GradientTape() as tape:
            out, _ = hvd.alltoall(v, splits=[1] * N)
            y = tf.reduce_sum(out * tf.range(1, N + 1, dtype=tf.float32))
        return tape.gradient(y, v)
    # rank R's row d goes to rank d, where it is row R: its weight there is R + 1
    close(run(a2a_grad, tf.Variable(tf.ones([N]))), [R + 1.0] * N, "alltoall gradient " + mode)

    def rs_grad(v):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.reducescatter(v, op=hvd.Sum) * (R + 1))
        return tape.gradient(y, v)
    # Horovod's convention: Sum's gradient is the gathered gradient times the set's size
    close(run(rs_grad, tf.Variable(tf.ones([N]))), [N * (r + 1.0) for r in range(N)], "reducescatter gradient " + mode)

# ---- process sets: a set of the last rank only, and one of ranks 0 and 1 where N > 2
ps = hvd.add_process_set([N - 1])
check(ps.process_set_id not in (None, 0) and ps.size() == 1, "add_process_set")
check(ps.included() == (R == N - 1) and ps.rank() == (0 if R == N - 1 else None), "process set rank")
if R == N - 1:
    close(hvd.allreduce(tf.constant([2.0, 3.0]), op=hvd.Sum, process_set=ps), [2.0, 3.0], "allreduce in a set")
    close(tf.function(lambda t: hvd.allgather(t, process_set=ps))(tf.constant([5])), [5], "allgather in a set")
close(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum), [float(N)], "the global set after a set's op")
# Gradients reduced in a set, called on every rank: a rank outside it, like the set of one rank,
# keeps its own gradients and submits nothing, as Horovod's; the tape and TensorFlow 1's optimizer.
v = tf.Variable([float(R + 1)])
with tf.GradientTape() as tape:
    loss = v * v
close(hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [v])[0], [2.0 * (R + 1)], "a set's tape")
for name, pset, want in [("global", hvd.global_process_set, (N + 1) / 2.0), ("set", ps, R + 1.0)]:
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=[0.0], use_resource=False)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), process_set=pset)
        check(isinstance(opt, tf.compat.v1.train.Optimizer), "a TF1 DistributedOptimizer is a TF1 optimizer")
        train = opt.minimize(-w * float(R + 1))  # the gradient -(R + 1), averaged in pset
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            close(sess.run(w), [want], "tf.compat.v1.train.Optimizer in the %s process set" % name)
check(hvd.remove_process_set(ps) and ps.process_set_id is None, "remove_process_set")
# A set id the engine does not know: ValueError, eagerly at the call, in a graph when the op is made
fake = hvd.ProcessSet([0])
fake.process_set_id = 99
for where in ("eager", "graph"):
    try:
        if where == "graph":
            with tf.Graph().as_default():
                hvd.allreduce(tf.ones([1]), process_set=fake)
        else:
            hvd.allreduce(tf.ones([1]), process_set=fake)
        check(False, "an op of an unknown set id was made (%s)" % where)
    except ValueError as e:
        check("99" in str(e), "the unknown set's error names it (%s): %s" % (where, e))

# ---- A TensorFlow 1 training loop as Horovod's TF1 examples write it: placeholders fed at every
# step, and the broadcast of the global variables made after the training op (run by
# BroadcastGlobalVariablesHook in MonitoredTrainingSession, or by hand) or before it. The
# broadcast is one op outside the order of the graph's other kolo ops: run on its own it needs no
# feed (it would run the step's allreduce, and so need the placeholders, if it came after them in
# that order), and a step does not run it again (a broadcast made first would otherwise be sent
# again at every step: as many ops a step whichever came first).
step_ops = {}
for when in ("hook", "after", "before"):
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.random_normal_initializer(seed=R))
        bcast = hvd.broadcast_global_variables(0) if when == "before" else None
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = opt.minimize(tf.reduce_mean(tf.square(tf.matmul(x, w) - y)), global_step=step)
        hooks = [hvd.BroadcastGlobalVariablesHook(0)] if when == "hook" else []
        if when == "after":
            bcast = hvd.broadcast_global_variables(0)
        shift_w = w.assign_add(tf.fill([4, 1], float(R)))  # the ranks' weights then differ by R
        feed_rng = np.random.default_rng(R)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            if bcast is not None:
                sess.run(bcast)
            w0 = sess.run(w)
            if when == "before":
                sess.run(shift_w)
            done = hvd.rank_stats()["ops_done"]
            for _ in range(5):
                sess.run(train, feed_dict={x: feed_rng.normal(size=(8, 4)), y: feed_rng.normal(size=(8, 1))})
            step_ops[when] = hvd.rank_stats()["ops_done"] - done
            w5, steps = sess.run([w, step])
    check(steps == 5, "TF1 loop (%s): 5 steps, global step %s" % (when, steps))
    first = hvd.allgather(tf.constant(w0.reshape(1, 4))).numpy()
    close(first, np.tile(first[0], (N, 1)), "TF1 loop (%s): rank 0's weights after the broadcast" % when)
    last = hvd.allgather(tf.constant(w5.reshape(1, 4))).numpy()
    shift = 1.0 if when == "before" else 0.0  # the same averaged updates on weights shifted by R
    close(last - last[0], np.outer(np.arange(N) * shift, np.ones(4)),
          "TF1 loop (%s): the weights after 5 steps, less rank 0's" % when, tol=1e-4)
check(step_ops["before"] == step_ops["after"] == step_ops["hook"] > 0,
      "TF1 loop: the ops of 5 steps, whenever the broadcast was made: %s" % step_ops)

# ---- DistributedGradientTape: a manual loop, every rank its own data, same weights after
tf.keras.utils.set_random_seed(1 + R)  # different initial weights: the broadcast must fix them
model = tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(8, activation="relu"),
                             tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.05)
hvd.broadcast_variables(model.variables, root_rank=0)
rng = np.random.default_rng(R)
xs = rng.normal(size=[32, 4]).astype(np.float32)
ys = xs.sum(1, keepdims=True)


@tf.function
def tape_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


losses = [float(tape_step(xs, ys)) for _ in range(20)]
check(losses[-1] < losses[0], "tape training lowers the loss: %s" % losses[::5])
ws = hvd.allgather_object([w.numpy() for w in model.weights])
check(all(np.array_equal(a, b) for w in ws[1:] for a, b in zip(ws[0], w)), "tape: the same weights on every rank")

# eager tape, its gradients against the mean of every rank's local gradient
with tf.GradientTape() as tape:
    loss = tf.reduce_mean((model(xs) - ys) ** 2)
local = tape.gradient(loss, model.trainable_variables)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean((model(xs) - ys) ** 2)
reduced = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
every = hvd.allgather_object([g.numpy() for g in local])
for i, g in enumerate(reduced):
    close(g, np.mean([e[i] for e in every], axis=0), "DistributedGradientTape gradient %d" % i, tol=1e-5)

# worker-local sources (Keras 3 variables, inside tf.function too): not reduced, divided by the
# size (scale_local_gradients, Horovod's default) or kept; PartialDistributedGradientTape's layers
for scale in (True, False):
    @tf.function
    def partial_grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xs) - ys) ** 2)
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
        tape.register_local_source(model.layers[0].kernel)
        return tape.gradient(loss, model.trainable_variables)
    for i, g in enumerate(partial_grads()):
        want = local[i] / (N if scale else 1) if i == 0 else np.mean([e[i] for e in every], axis=0)
        close(g, want, "a local source's gradient %d (scale_local_gradients=%s)" % (i, scale), tol=1e-5)
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_mean((model(xs) - ys) ** 2)
ptape = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[1])
loc, glob = ptape.get_local_and_global_gradients(loss, model.trainable_variables)
check(len(loc) == 2 and len(glob) == 2, "local and global gradients: %d, %d" % (len(loc), len(glob)))
for (v_, g), i in zip(loc, (2, 3)):
    close(g, local[i] / N, "PartialDistributedGradientTape local gradient %d" % i, tol=1e-5)

# sparse gradients (an embedding's): gathered as IndexedSlices, or reduced dense with sparse_as_dense
emb = tf.Variable(tf.ones([2 * N, 3]))
for sparse_as_dense in (False, True):
    @tf.function
    def emb_grad(ids):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(tf.gather(emb, ids)) * (R + 1)
        return hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense, op=hvd.Sum).gradient(y, emb)
    g = emb_grad(tf.constant([R, N + R]))
    check(isinstance(g, tf.IndexedSlices) != sparse_as_dense, "embedding gradient type %s" % type(g))
    want = np.zeros([2 * N, 3])
    for r in range(N):
        want[[r, N + r]] += r + 1
    close(tf.convert_to_tensor(g), want, "embedding gradient, sparse_as_dense=%s" % sparse_as_dense)

# ---- SyncBatchNormalization: the statistics of every rank's batch, eagerly and in tf.function
bx = inp(R, (3 + R, 4), np.float32) * np.arange(1, 5, dtype=np.float32)
every_x = np.concatenate([inp(r, (3 + r, 4), np.float64) * np.arange(1, 5) for r in range(N)])
bn = hvd.SyncBatchNormalization(epsilon=1e-3)
for mode, f in modes(lambda t: bn(t, training=True)):
    want = (bx - every_x.mean(0)) / np.sqrt(every_x.var(0) + 1e-3)
    close(f(tf.constant(bx)), want, "SyncBatchNormalization " + mode, tol=1e-4)

# ---- DistributedOptimizer with model.fit (Keras 3), and backward_passes_per_step
for passes in (1, 2):
    tf.keras.utils.set_random_seed(7 + R)
    m = tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(4, activation="tanh"), tf.keras.layers.Dense(1)])
    dopt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01), backward_passes_per_step=passes)
    m.compile(optimizer=dopt, loss="mse")
    hvd.broadcast_variables(m.variables, root_rank=0)
    h = m.fit(xs, ys, batch_size=8, epochs=2, verbose=0, shuffle=False)
    check(h.history["loss"][-1] < h.history["loss"][0] * 1.5, "fit runs: %s" % h.history["loss"])
    ws = hvd.allgather_object([w.numpy() for w in m.weights])
    check(all(np.array_equal(a, b) for w in ws[1:] for a, b in zip(ws[0], w)),
          "DistributedOptimizer(backward_passes_per_step=%d): the same weights on every rank" % passes)
    check(int(dopt.iterations) == 8, "optimizer iterations %d: every batch, as Horovod counts" % int(dopt.iterations))

# ---- join: every rank joins, the last is a rank
last = int(hvd.join())
check(0 <= last < N, "join returned %d" % last)

# ---- a shape mismatch fails on every rank with tf.errors.FailedPreconditionError, as Horovod's
# ops raise it (not HorovodInternalError: hvd.elastic.run does not retry it), eagerly ...
try:
    hvd.allreduce(tf.ones([2 + R]), name="mismatch")
    check(False, "a mismatched allreduce returned")
except tf.errors.FailedPreconditionError as e:
    check("mismatched shapes" in str(e), "mismatch error says why: %s" % e)
    check(not isinstance(e, hvd.HorovodInternalError), "a mismatch is a HorovodInternalError")
    print("rank %d: mismatch: %s" % (R, str(e).splitlines()[0]), flush=True)

# ... inside tf.function, where a numpy function's exception would be an UnknownError: the
# message names the op (the reason goes to stderr) ...
try:
    tf.function(lambda t: hvd.allreduce(t, name="mismatch.fn"))(tf.ones([2 + R]))
    check(False, "a mismatched allreduce in tf.function returned")
except tf.errors.FailedPreconditionError as e:
    check("mismatch.fn" in str(e), "tf.function mismatch error names the op: %s" % e)

# ... and in a TensorFlow 1 graph; every mismatch (dtype, root) alike. The op after a failed one
# in a graph runs only if the failed one passed (no rank runs it after a mismatch).
for what, make in [("shape", lambda: hvd.allreduce(tf.ones([2 + R]))),
                   ("dtype", lambda: hvd.broadcast(tf.ones([3], dtype=tf.int32 if R else tf.float32), 0)),
                   ("root", lambda: hvd.broadcast(tf.ones([3]), R))]:
    with tf.Graph().as_default():
        out = make()
        after = hvd.allreduce(tf.ones([1]), name="graph.after." + what)
        with tf.compat.v1.Session() as sess:
            try:
                sess.run(after)
                check(False, "a graph's %s mismatch returned" % what)
            except tf.errors.FailedPreconditionError as e:
                check("HorovodAllreduce" in str(e) or "HorovodBroadcast" in str(e),
                      "graph %s mismatch error names the op: %s" % (what, str(e)[-600:]))
    for mode, f in modes(make):
        try:
            f()
            check(False, "a %s mismatch returned (%s)" % (what, mode))
        except tf.errors.FailedPreconditionError:
            check(True, "")

# An op whose arguments one rank refuses fails there with InvalidArgumentError; the others' with
# FailedPreconditionError (the ranks could not run it as submitted). Submitted again at once under
# the same name, it runs on every rank (the refusal had not been answered yet on the refusing rank).
for mode, f in modes(lambda t: hvd.allgather(t, name="refused.gather")):
    for _ in range(5):
        try:
            f(tf.ones([2, 2]) if R else tf.complex(tf.ones([2, 2]), 0.0))
            check(False, "a refused allgather returned (%s)" % mode)
        except tf.errors.InvalidArgumentError as e:
            check(R == 0, "rank %d was refused: %s" % (R, e))
        except tf.errors.FailedPreconditionError as e:
            check(R == 1 and ("rank 0 refused it" in str(e) or mode == "function"), "rank %d: %s" % (R, e))
        close(f(tf.ones([2, 2])), np.ones([2 * N, 2]), "allgather of a refused op's name (%s)" % mode)

# the job goes on after the failed ops
close(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum), [float(N)], "an allreduce after the mismatches")

print("TF-OPS-OK rank=%d checks=%d" % (R, checks), flush=True)
