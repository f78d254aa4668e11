"""Python objects broadcast and gathered across ranks as pickled bytes (horovod's
broadcast_object and allgather_object), framework-free: numpy arrays of bytes through kolo._ops.
kolo.tensorflow and kolo.keras re-export these; nothing here imports a framework.
"""

import io
import pickle

import numpy as np

from kolo import _lib, _ops
from kolo.process_sets import global_process_set

try:  # cloudpickle also pickles lambdas and closures; plain pickle is the fallback.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the installation
    _pickler = pickle


def process_set_id(process_set):
    """The engine's id of process_set; ValueError for a set that is not registered."""
    psid = process_set.process_set_id
    if psid is None:
        raise ValueError("process set %s is not registered (add_process_set)" % (process_set,))
    return psid


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (pickled; obj on other ranks is ignored). The default
    name is the same on every rank ("broadcast_object"), whatever the type of obj. session is
    accepted for horovod.tensorflow's signature."""
    name = name or "broadcast_object"
    psid = process_set_id(process_set)
    root = _lib.topology()[0] == root_rank
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
    psid = process_set_id(process_set)
    payload = _dumps(obj)
    sizes = _ops.run(np, _ops.ALLGATHER, np.array([len(payload)], dtype=np.int64), name + ".sz", psid=psid)
    gathered = _ops.run(np, _ops.ALLGATHER, np.frombuffer(payload, dtype=np.uint8), name + ".t", psid=psid).tobytes()
    out, start = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[start:start + n]))
        start += n
    return out
