"""Horovod's local gradient aggregation (``backward_passes_per_step``) for kolo.tensorflow's Keras
optimizers: the gradients of N backward passes are summed on this rank, and only every Nth pass
reduces the sum across ranks and lets the optimizer update.

State lives in TensorFlow variables (a counter and one accumulator per gradient), and the choice
of step is a tf.cond on the counter, so the same code runs eagerly and inside tf.function (as in
model.fit): every rank counts alike, so every rank reduces at the same pass. The reduction itself
is the caller's function; this module only counts, sums and clears.
"""

import tensorflow as tf


class LocalGradientAggregationHelper(object):
    """Sums gradients locally over backward_passes_per_step passes (compute_gradients), reducing
    the sum with reduce_fn(grads, variables) on the last pass of each round and clearing it; then
    apply_gradients updates on that pass only. counter is the number of passes summed so far in
    the current round (0 right after a reduction).

    average_aggregated_gradients divides the reduced sum by backward_passes_per_step. Sparse
    gradients (tf.IndexedSlices) are summed dense, which needs sparse_as_dense, as in Horovod."""

    def __init__(self, backward_passes_per_step, reduce_fn, sparse_as_dense, average_aggregated_gradients):
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.reduce_fn = reduce_fn
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        with tf.init_scope():
            self.counter = tf.Variable(0, trainable=False, dtype=tf.int32, name="aggregation_counter")
        # id(variable) -> (variable, its accumulator): the variable kept so that its id stays its own
        self._sums = {}

    def _dense(self, grad):
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                                 "`sparse_as_dense` is False.")
            return tf.convert_to_tensor(grad)
        return grad

    def _accumulator(self, variable, grad):
        entry = self._sums.get(id(variable))
        if entry is None:
            with tf.init_scope():  # made once, outside any tf.function being traced
                acc = tf.Variable(tf.zeros(variable.shape, grad.dtype), trainable=False,
                                  name="aggregated_gradient")
            entry = self._sums[id(variable)] = (variable, acc)
        return entry[1]

    def compute_gradients(self, grads, variables):
        """Adds grads (one per variable, None for none) to the sums and counts the pass. Returns
        the reduced sums on the round's last pass, else this rank's sums so far."""
        grads, variables = list(grads), list(variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        accs = []
        for i in present:
            g = self._dense(grads[i])
            acc = self._accumulator(variables[i], g)
            acc.assign_add(g)
            accs.append(acc)
        self.counter.assign_add(1)
        sums = [a.read_value() for a in accs]
        kept = [variables[i] for i in present]

        def reduce_and_clear():
            reduced = self.reduce_fn(sums, kept)
            if self.average_aggregated_gradients:
                reduced = [r / self.backward_passes_per_step for r in reduced]
            reduced = [tf.convert_to_tensor(r) for r in reduced]
            with tf.control_dependencies(reduced):
                clears = [a.assign(tf.zeros_like(a)) for a in accs] + [self.counter.assign(0)]
            with tf.control_dependencies(clears):
                return [tf.identity(r) for r in reduced]

        if sums:
            out = tf.cond(tf.equal(self.counter, self.backward_passes_per_step), reduce_and_clear, lambda: sums)
            out = list(out) if isinstance(out, (list, tuple)) else [out]
        else:  # no gradient at all: still a pass, and a round still ends
            tf.cond(tf.equal(self.counter, self.backward_passes_per_step),
                    lambda: self.counter.assign(0), lambda: tf.identity(self.counter))
            out = []
        result = [None] * len(grads)
        for i, r in zip(present, out):
            result[i] = r
        return result

    def reset(self):
        """Starts a new round: the counter at 0, the sums cleared (an elastic state does this
        on restore and sync, so that every rank of a new world counts from the same pass)."""
        self.counter.assign(0)
        for _, acc in self._sums.values():
            acc.assign(tf.zeros_like(acc))

    def apply_gradients(self, apply_fn, skip_fn):
        """apply_fn() on the pass that ended a round (the counter back at 0), else skip_fn():
        what the optimizer does on a pass that does not update (count its iteration). Returns
        whether this pass updated, a bool tensor. What the two functions return is dropped: tf.cond
        needs its branches to return alike, and an optimizer's own apply_gradients need not return
        what counting an iteration does (a Keras 2 legacy optimizer's, OptimizerV2's, returns an
        Operation in a graph, which tf.cond makes a bool, where iterations.assign_add is an int64)."""

        def update():
            apply_fn()
            return tf.constant(True)

        def skip():
            skip_fn()
            return tf.constant(False)
        return tf.cond(tf.equal(self.counter, 0), update, skip)
