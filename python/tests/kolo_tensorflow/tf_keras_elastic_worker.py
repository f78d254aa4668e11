"""An elastic Keras job, for test_tensorflow.py: hvd.elastic.run around model.fit with the
DistributedOptimizer, a KerasState and the elastic callbacks (epoch, batch, commit). The worker
that started as rank 1 SIGKILLs itself at the end of batch KILL_BATCH of epoch KILL_EPOCH; the
survivor's fit fails, it restores its last commit, resets, and fits the remaining epochs alone.
With argument "keras3", Keras 3 through kolo.keras; "keras2", standalone Keras 2 (TensorFlow
before 2.16) through kolo.keras; "tf-keras", Keras 2 as tf.keras (tf-keras, or TensorFlow's own
before 2.16) through kolo.tensorflow.keras:

    bin/kolo run -np 2 --min-np 1 -H localhost:1,127.0.0.1:1 .venv/tf/bin/python \\
        python/tests/kolo_tensorflow/tf_keras_elastic_worker.py keras3

Each worker that finishes prints "TF-KERAS-ELASTIC-DONE start_rank=S size=N epoch=E resets=R
restored=B" (B: the epoch and batch of the commit it went back to).
"""

import os
import signal
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

EPOCHS, KILL_EPOCH, KILL_BATCH = 3, 1, 2
START_RANK = int(os.environ["KOLO_RANK"])
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
keras.utils.set_random_seed(START_RANK)  # different weights: the state's sync makes them rank 0's
model = keras.Sequential([keras.Input([4]), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.5)), loss="mse")
x = np.random.default_rng(START_RANK).normal(size=[48, 4]).astype(np.float32)  # 6 batches of 8
y = x.sum(1, keepdims=True)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets = []  # not in the state: a sync after the reset callbacks would take rank 0's count
restored = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
_restore = state.restore
state.restore = lambda: (_restore(), restored.append("%d.%d" % (state.epoch, state.batch)))


class KillAt(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        if START_RANK == 1 and state.epoch == KILL_EPOCH and batch == KILL_BATCH:
            print("start rank 1: SIGKILL after batch %d of epoch %d" % (batch, state.epoch), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state), KillAt()]


@hvd.elastic.run
def train(state):
    state.model.fit(x, y, batch_size=8, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0, shuffle=False)


train(state)
ws = [np.asarray(w) for w in model.weights]
assert all(np.isfinite(w).all() for w in ws), "weights not finite"
print("TF-KERAS-ELASTIC-DONE start_rank=%d size=%d epoch=%d resets=%d restored=%s"
      % (START_RANK, hvd.size(), state.epoch, len(resets), ",".join(restored) or "none"), flush=True)
