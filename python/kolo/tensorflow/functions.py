"""Broadcast of variables and of Python objects, as horovod.tensorflow.functions.

Variables go to the engine together (kolo._ops.run_many: one submission each, fused by the engine)
and are assigned once every broadcast completed; objects are pickled and broadcast or gathered as
bytes. Eager only, except broadcast_variables, which inside tf.function builds one broadcast op
per variable.
"""

import io
import pickle

import numpy as np
import tensorflow as tf

from kolo import _ops
from kolo.tensorflow import mpi_ops
from kolo.tensorflow.mpi_ops import _host, _psid, global_process_set

try:  # cloudpickle also pickles lambdas and closures; plain pickle is the fallback.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the installation
    _pickler = pickle


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


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (pickled; obj on other ranks is ignored). The default
    name is the same on every rank ("broadcast_object"), whatever the type of obj."""
    name = name or "broadcast_object"
    psid = _psid(process_set)
    root = mpi_ops.rank() == root_rank
    payload = _dumps(obj) if root else b""
    sz = _ops.run(np, _ops.BROADCAST, np.array([len(payload)], dtype=np.int64), name + ".sz", root=root_rank,
                  psid=psid)
    buf = np.frombuffer(payload, dtype=np.uint8) if root else np.zeros(int(sz[0]), dtype=np.uint8)
    got = _ops.run(np, _ops.BROADCAST, buf, name + ".t", root=root_rank, psid=psid)
    return obj if root else pickle.loads(got.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument as broadcast_object does."""
    def _bcast(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return _bcast


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order (pickled)."""
    name = name or "allgather_object"
    psid = _psid(process_set)
    payload = _dumps(obj)
    sizes = _ops.run(np, _ops.ALLGATHER, np.array([len(payload)], dtype=np.int64), name + ".sz", psid=psid)
    gathered = _ops.run(np, _ops.ALLGATHER, np.frombuffer(payload, dtype=np.uint8), name + ".t", psid=psid).tobytes()
    out, start = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[start:start + n]))
        start += n
    return out
