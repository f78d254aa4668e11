"""Ctrl-C reaches a rank blocked in a collective that never completes (rank 1 does not submit it):

    bin/kolo run -np 2 /usr/bin/python3 python/tests/interrupt_worker.py

Rank 0 sends itself SIGINT after 1 s and must see KeyboardInterrupt within a few seconds (waits are
short slices, so Python handles the signal between them). Then both ranks finish normally.
"""

import os
import signal
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402

hvd.init()
if hvd.rank() == 0:
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        hvd.allreduce(torch.ones(4), name="never matched")
        print("FAIL: the allreduce completed", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        took = time.monotonic() - start
        if took > 5:
            print("FAIL: KeyboardInterrupt after %.1f s" % took, file=sys.stderr)
            sys.exit(1)
        print("ok interrupted after %.2f s" % took, flush=True)
hvd.barrier()  # the interrupted op is still pending on rank 0; other ops go on
hvd.shutdown()
