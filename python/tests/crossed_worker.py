"""Ranks whose calls go different ways: rank 0 raises in its own code before an unnamed allreduce
that the other ranks make, catches it, and moves on to the next call. Every rank must get an
error within the crossed-calls deadline (KOLO_STALL_CROSSED_TIME_SECONDS, set short by the test)
naming what the others wait on, and then unnamed and named ops must work again: the ranks'
numbering of unnamed calls, which drifted apart, is back in step."""

import sys
import time

import torch

import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
deadline = float(sys.argv[1])


def fail(msg):
    sys.stderr.write("rank %d FAIL: %s\n" % (r, msg))
    sys.exit(1)


hvd.allreduce(torch.ones(1), name="warm")
start = time.time()
try:
    if r == 0:
        # The skipped call: rank 0 goes on to a named broadcast the others never reach.
        hvd.broadcast(torch.ones(1), 0, name="rank0 went on")
    else:
        hvd.allreduce(torch.ones(2))
    fail("no error")
except hvd.HorovodInternalError as e:
    took = time.time() - start
    if took > deadline + 3:
        fail("the error took %.1f s, deadline %.1f s" % (took, deadline))
    want = 'broadcast "broadcast.rank0 went on"' if r != 0 else 'allreduce "noname.'
    if "calls went different ways" not in str(e) or want not in str(e):
        fail("error does not say what the others wait on: %s" % e)
# In step again: unnamed and named calls work.
for i in range(3):
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum)
    if got.tolist() != [float(n)] * 3:
        fail("unnamed allreduce %d after the failure: %s" % (i, got.tolist()))
got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="named after")
if got.item() != n:
    fail("named allreduce after the failure: %s" % got)
hvd.shutdown()
print("ok crossed rank %d in %.1fs" % (r, took))
