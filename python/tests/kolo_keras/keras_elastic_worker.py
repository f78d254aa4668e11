"""An elastic Keras job on the JAX or torch backend (KERAS_BACKEND), for test_keras.py:
hvd.elastic.run around model.fit with the DistributedOptimizer, a KerasState and the elastic
callbacks (epoch, batch, a commit every second batch and at every epoch's end). Three workers,
each starting from its own random weights on its own data (the state's first sync makes them rank
0's); the worker on 127.0.0.1 (start rank 2) SIGKILLs itself at the end of batch KILL_BATCH of
epoch KILL_EPOCH, one batch after the last commit (batch 1); the two survivors' next step fails,
they restore that commit (undoing batch 2's update), re-form as a world of two and fit the
remaining epochs:

    bin/kolo run -np 3 --min-np 2 --max-np 3 -H localhost:2,127.0.0.1:1 \\
        .venv/jax/bin/python python/tests/kolo_keras/keras_elastic_worker.py

Each worker that finishes prints "KERAS-ELASTIC-DONE start_rank=S size=N epoch=E resets=R
restored=E.B restored_equal=OK iterations=I checksum=SHA": the epoch and batch of the commit it went
back to, whether the variables right after the restore equal those it committed there (model and
optimizer, bit for bit), the optimizer's step count, and a hash of every model and optimizer
variable at the end (the test compares the survivors').
"""

import hashlib
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kolo.keras as hvd  # noqa: E402

if keras.backend.backend() == "torch":
    import torch
    torch.set_num_threads(1)  # three ranks on two busy cores

EPOCHS, KILL_EPOCH, KILL_BATCH, BATCH = 3, 1, 2, 8
START_RANK = int(os.environ["KOLO_RANK"])
hvd.init()
keras.utils.set_random_seed(START_RANK)  # different weights: the state's sync makes them rank 0's
model = keras.Sequential([keras.Input([4]), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.5)), loss="mse")
x = np.random.default_rng(START_RANK).normal(size=[48, 4]).astype(np.float32)  # 6 batches of 8
y = x.sum(1, keepdims=True)


def variables():
    return list(model.variables) + list(model.optimizer.variables)


def checksum():
    h = hashlib.sha256()
    for v in variables():
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets = []  # not in the state: a sync after the reset callbacks would take rank 0's count
restored = []
committed = [None]
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
_save, _restore = state.save, state.restore


def save():
    _save()  # on JAX this put fit's state into the variables: they are the committed values now
    committed[0] = checksum()


def restore():
    _restore()
    restored.append("%d.%d" % (state.epoch, state.batch))
    restored.append("OK" if checksum() == committed[0] else "DIFFERENT")


state.save, state.restore = save, restore


class KillAt(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        if START_RANK == 2 and state.epoch == KILL_EPOCH and batch == KILL_BATCH:
            print("start rank 2: SIGKILL after batch %d of epoch %d" % (batch, state.epoch), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=2), KillAt()]


@hvd.elastic.run
def train(state):
    state.model.fit(x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0,
                    shuffle=False)


train(state)
assert all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in model.weights), "weights not finite"
restored += ["none", "none"]
steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
print("KERAS-ELASTIC-DONE start_rank=%d size=%d epoch=%d resets=%d restored=%s restored_equal=%s iterations=%d "
      "checksum=%s" % (START_RANK, hvd.size(), state.epoch, len(resets), restored[0], restored[1], steps, checksum()),
      flush=True)
