"""An elastic TensorFlow job, for test_tensorflow.py: hvd.elastic.run around a training loop of a
small Keras model (DistributedGradientTape in tf.function) with a TensorFlowKerasState; the worker
that started as rank 1 SIGKILLs itself before step KILL_AT, and the survivor restores its last
commit and trains on alone:

    bin/kolo run -np 2 --min-np 1 -H localhost:1,127.0.0.1:1 .venv/tf/bin/python \\
        python/tests/kolo_tensorflow/tf_elastic_worker.py

Each worker that finishes prints "TF-ELASTIC-DONE start_rank=S size=N step=K resets=R".
"""

import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kolo.tensorflow as hvd  # noqa: E402

STEPS, KILL_AT = 12, 5
START_RANK = int(os.environ["KOLO_RANK"])
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
tf.keras.utils.set_random_seed(START_RANK)
model = tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.01)
x = np.random.default_rng(START_RANK).normal(size=[16, 4]).astype(np.float32)
y = x.sum(1, keepdims=True)


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


step(x, y)  # the optimizer makes its variables, which the state then holds
state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
resets = []  # not in the state: a sync after the reset callbacks would take rank 0's count
state.register_reset_callbacks([lambda: resets.append(hvd.size())])


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if START_RANK == 1 and state.step == KILL_AT:
            print("start rank 1: SIGKILL before step %d" % state.step, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        step(x, y)
        state.step += 1
        state.commit()


train(state)
ws = hvd.allgather_object([w.numpy() for w in model.weights])
assert all(np.array_equal(a, b) for w in ws[1:] for a, b in zip(ws[0], w)), "weights differ"
print("TF-ELASTIC-DONE start_rank=%d size=%d step=%d resets=%d" % (START_RANK, hvd.size(), state.step, len(resets)),
      flush=True)
