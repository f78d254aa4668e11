"""Keras training with kolo's Keras API, for test_tensorflow.py. With argument "keras3", standalone
Keras 3 through kolo.keras; "keras2", standalone Keras 2 (``import keras`` before TensorFlow 2.16)
through kolo.keras; "tf-keras", Keras 2 as tf.keras through kolo.tensorflow.keras (tf-keras where
TF_USE_LEGACY_KERAS=1 makes it tf.keras, or TensorFlow's own Keras before 2.16):

    bin/kolo run -np 2 .venv/tf/bin/python python/tests/kolo_tensorflow/tf_keras_worker.py keras3

Every rank starts from its own random weights and trains on its own data with model.fit, the
DistributedOptimizer, a SyncBatchNormalization layer and the callbacks (broadcast, metric average,
warmup, schedule); at the end the weights (the batch norm's moving statistics too) and the logged
metrics are the same on every rank, and the learning rate is what the
callbacks set. Prints "TF-KERAS-OK rank=R mode=M".
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

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()


def check(ok, what):
    if not ok:
        raise AssertionError("rank %d (%s): %s" % (R, MODE, what))


keras.utils.set_random_seed(10 + R)  # different weights on every rank: the callback must fix them
import kolo.tensorflow  # noqa: E402  (SyncBatchNormalization, on this process's tf.keras)
model = keras.Sequential([keras.Input([4]), keras.layers.Dense(8, activation="relu"),
                          kolo.tensorflow.SyncBatchNormalization(), keras.layers.Dense(1)])
LR = 0.02
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9))
model.compile(optimizer=opt, loss="mse", metrics=["mae"])
rng = np.random.default_rng(R)
x = rng.normal(size=[32, 4]).astype(np.float32)
y = x.sum(1, keepdims=True)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=2, verbose=0),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=lambda epoch: 0.1, start_epoch=2),
]
hist = model.fit(x, y, batch_size=8, epochs=3, callbacks=callbacks, verbose=0, shuffle=False)
losses = hist.history["loss"]
check(losses[-1] < losses[0], "loss falls: %s" % losses)
every = hvd.allgather_object(([w.numpy() if hasattr(w, "numpy") else np.asarray(w) for w in model.weights],
                              hist.history))
check(all(np.array_equal(a, b) for w, _ in every[1:] for a, b in zip(every[0][0], w)),
      "the same weights on every rank")
check(all(h["loss"] == every[0][1]["loss"] and h["mae"] == every[0][1]["mae"] for _, h in every),
      "metrics averaged: %s" % [h["loss"] for _, h in every])
lrs = hist.history["lr"]
check(abs(lrs[1] - LR) < 1e-6 and abs(lrs[2] - 0.1 * LR) < 1e-7, "learning rates by epoch %s" % lrs)
check(lrs[0] < LR, "warmup starts lower: %s" % lrs)
# save, load_model (the optimizer distributed again, its state kept), train on
import tempfile  # noqa: E402
path = os.path.join(tempfile.mkdtemp(), "m.keras")
model.save(path)
loaded = hvd.load_model(path)
check(isinstance(loaded.optimizer, kolo.tensorflow.keras._DistributedOptimizer),
      "load_model's optimizer is distributed: %s" % (type(loaded.optimizer).__mro__,))
check(int(loaded.optimizer.iterations) == int(model.optimizer.iterations), "optimizer state carried over")
loaded.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
every = hvd.allgather_object([np.asarray(w) for w in loaded.weights])
check(all(np.array_equal(a, b) for w in every[1:] for a, b in zip(every[0], w)),
      "the same weights on every rank after training the loaded model")
print("TF-KERAS-OK rank=%d mode=%s losses=%s lrs=%s" % (R, MODE, losses, lrs), flush=True)
