"""Broadcast of variables and of Python objects, as horovod.tensorflow.functions.

Variables go to the engine together (kolo._ops.run_many: one submission each, fused by the engine)
and are assigned once every broadcast completed; objects are pickled and broadcast or gathered as
bytes (kolo._objects, framework-free). Eager only, except broadcast_variables, which inside
tf.function builds one broadcast op per variable.
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
    if not tf.executing_eagerly():
        return tf.group(*[v.assign(mpi_ops.broadcast(v, root_rank, process_set=process_set)) for v in variables])
    if not variables:
        return None
    psid = _psid(process_set)
    # tf.Variable or a Keras 3 variable (which tf.convert_to_tensor reads)
    arrays = [np.asarray(_host(tf.convert_to_tensor(v))) for v in variables]
    sent = [a.view(np.uint8) if a.dtype == np.bool_ else a for a in arrays]
    outs = _ops.run_many(np, _ops.BROADCAST, sent, [None] * len(sent), root=root_rank, psid=psid)
    for v, a, o in zip(variables, arrays, outs):
        v.assign(o.view(a.dtype))
    return None
