"""horovod.tensorflow.keras.elastic on kolo: KerasState, the elastic state of a Keras model and
its optimizer, and the callbacks that keep it current during model.fit (CommitStateCallback,
UpdateBatchStateCallback, UpdateEpochStateCallback), for TensorFlow's Keras (tf.keras);
kolo.keras.elastic makes the same on standalone Keras 3 (make_callbacks).

The state is kolo.tensorflow.elastic's TensorFlowKerasState (a commit copies the model's and the
optimizer's variables to host memory, a restore assigns them back, a sync broadcasts rank 0's);
hvd.elastic.run around the training function resets the job as kolo.elastic says.
"""

import tensorflow as tf

from kolo.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer (the model's compiled one if not given) and any other
    values (keyword arguments, kept as attributes: batch and epoch for the callbacks)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super(KerasState, self).__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


def make_callbacks(keras):
    """The elastic callback classes on keras (a module with keras.callbacks.Callback), as a dict."""

    class CommitStateCallback(keras.callbacks.Callback):
        """Commits state every batches_per_commit batches (at the batch's end) and at the end of
        every epoch."""

        def __init__(self, state, batches_per_commit=1):
            super(CommitStateCallback, self).__init__()
            self.state = state
            self.batches_per_commit = batches_per_commit
            self.batches_remaining = batches_per_commit

        def on_train_begin(self, logs=None):
            # Every rank counts from here after a reset, so that they commit at the same batches.
            self.batches_remaining = self.batches_per_commit

        def on_batch_end(self, batch, logs=None):
            self.batches_remaining -= 1
            if self.batches_remaining == 0:
                self.state.commit()
                self.batches_remaining = self.batches_per_commit

        def on_epoch_end(self, epoch, logs=None):
            self.state.commit()

    class UpdateBatchStateCallback(keras.callbacks.Callback):
        """Keeps state.batch at the number of the batch last finished in this epoch (0 at an
        epoch's end). With steps_per_epoch, the first epoch after a reset runs only the batches
        the state had not done."""

        def __init__(self, state):
            super(UpdateBatchStateCallback, self).__init__()
            self.state = state
            self.steps_per_epoch = None

        def on_train_begin(self, logs=None):
            self.steps_per_epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.params.get("steps"):
                if self.steps_per_epoch is None:
                    self.steps_per_epoch = self.params.get("steps")
                self.params["steps"] = self.steps_per_epoch - self.state.batch

        def on_batch_end(self, batch, logs=None):
            self.state.batch = batch

        def on_epoch_end(self, epoch, logs=None):
            self.state.batch = 0

    class UpdateEpochStateCallback(keras.callbacks.Callback):
        """Keeps state.epoch at the number of epochs finished, counted across resets: the epochs
        of each fit (numbered from 0, as fit numbers them without initial_epoch) after those the
        state had when it began. Fit the remaining ones: epochs=total - state.epoch."""

        def __init__(self, state):
            super(UpdateEpochStateCallback, self).__init__()
            self.state = state
            self.initial_epoch = self.state.epoch

        def on_train_begin(self, logs=None):
            self.initial_epoch = self.state.epoch

        def on_epoch_end(self, epoch, logs=None):
            # + 1: the epoch is done, and a reset after state.batch went back to 0 must not run it again
            self.state.epoch = self.initial_epoch + epoch + 1

    return {c.__name__: c for c in (CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback)}


_classes = make_callbacks(tf.keras)
CommitStateCallback = _classes["CommitStateCallback"]
UpdateBatchStateCallback = _classes["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _classes["UpdateEpochStateCallback"]

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
