"""Broadcast of variables and of Python objects, as horovod.tensorflow.functions.

Variables go to the engine together (kolo._ops.run_many: one submission each, fused by the engine)
and are assigned once every broadcast completed; objects are pickled and broadcast or gathered as
bytes (kolo._objects, framework-free). Eager only, except broadcast_variables, which in a graph
(tf.function's or a TensorFlow 1 one) builds one op that broadcasts every variable.
"""

import numpy as np
import tensorflow as tf

from kolo import _ops
from kolo._objects import allgather_object, broadcast_object, broadcast_object_fn  # noqa: F401
from kolo.tensorflow import mpi_ops
from kolo.tensorflow.mpi_ops import _host, _psid, global_process_set


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns root_rank's values to variables (a list of tf.Variable) on every rank. Eagerly the
    variables' broadcasts are submitted together, matched across ranks by their order; inplace
    is accepted for Horovod's signature (the assignment is in place either way)."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    if not tf.executing_eagerly():
        return _broadcast_group(variables, root_rank, process_set)
    psid = _psid(process_set)
    # tf.Variable or a Keras 3 variable (which tf.convert_to_tensor reads)
    arrays = [np.asarray(_host(tf.convert_to_tensor(v))) for v in variables]
    sent = [a.view(np.uint8) if a.dtype == np.bool_ else a for a in arrays]
    outs = _ops.run_many(np, _ops.BROADCAST, sent, [None] * len(sent), root=root_rank, psid=psid)
    for v, a, o in zip(variables, arrays, outs):
        v.assign(o.view(a.dtype))
    return None


def _broadcast_group(variables, root_rank, process_set):
    """broadcast_variables in a graph: one op that submits every variable's broadcast together
    and assigns the results. It is outside the order of the graph's other kolo ops
    (mpi_ops._numpy_function, ordered=False): a script runs it on its own, before training, and
    it must need nothing the training step needs (its placeholders) nor be run again by it."""
    psid = _psid(process_set)
    values = [tf.convert_to_tensor(v) for v in variables]
    names = [mpi_ops._op_name(None, "HorovodBroadcast", t) for t in values]

    def fn(*arrays):
        arrays = [np.asarray(a) for a in arrays]
        sent = [a.view(np.uint8) if a.dtype == np.bool_ else a for a in arrays]
        outs = _ops.run_many(np, _ops.BROADCAST, sent, names, root=root_rank, psid=psid)
        return tuple(o.view(a.dtype) for o, a in zip(outs, arrays))

    outs = mpi_ops._numpy_function(fn, values, [t.dtype for t in values], names[0], ordered=False)
    assigns = []
    for v, t, o in zip(variables, values, outs):
        o.set_shape(t.shape)
        assigns.append(v.assign(o))
    return tf.group(*assigns)
