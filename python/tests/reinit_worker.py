"""hvd.init() after the engine stopped on an error joins a new world: rank 1 aborts (as a rank
does that fails outside kolo), every rank's ops fail with its reason, then every rank calls init()
again and the job works. Also init()/shutdown()/init() in one process."""

import sys

import torch

import kolo.torch as hvd
from kolo import _lib

hvd.init()
r, n = hvd.rank(), hvd.size()


def fail(msg):
    sys.stderr.write("rank %d FAIL: %s\n" % (r, msg))
    sys.exit(1)


if hvd.allreduce(torch.ones(1), op=hvd.Sum).item() != n:
    fail("first allreduce")
if r == 1:
    _lib.abort("rank 1 gives up on this world")
try:
    hvd.allreduce(torch.ones(1), name="doomed")
    fail("no error after rank 1 aborted")
except hvd.HorovodInternalError as e:
    if "rank 1 gives up" not in str(e):
        fail("error does not carry rank 1's reason: %s" % e)
if not hvd.is_initialized():
    fail("not initialized after the failure (Horovod keeps is_initialized() true)")
hvd.init()  # a new world
if (hvd.rank(), hvd.size()) != (r, n):
    fail("rank/size after re-init %s" % ((hvd.rank(), hvd.size()),))
for i in range(2):
    if hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() != [n, n]:
        fail("allreduce %d in the new world" % i)
hvd.shutdown()
hvd.init()  # and again after a clean shutdown
if hvd.allreduce(torch.ones(1), op=hvd.Sum, name="last").item() != n:
    fail("allreduce after shutdown and init")
hvd.shutdown()
print("ok reinit rank %d" % r)
