"""Ctrl-C reaches a rank blocked in the engine waiting for a peer that does not come:

    bin/kolo run -np 2 /usr/bin/python3 python/tests/interrupt_worker.py [collective|shutdown|init|exit]

collective: rank 0 waits in an allreduce that rank 1 never submits.
shutdown:   rank 0 waits in shutdown()'s barrier while rank 1 sleeps before its own shutdown().
init:       rank 0 waits in init() for rank 1, which sleeps before its own init().
exit:       as shutdown, but rank 0 then exits without calling shutdown() again.

Rank 0 sends itself SIGINT 1 s into the wait and must see KeyboardInterrupt within a few seconds
(waits are short slices, so Python handles the signal between them), well before the peer comes.
Then it goes on as a script that caught the KeyboardInterrupt may: the interrupted shutdown or
init is still running in the engine, and calling it again waits for it; so does the shutdown at
exit (rank 1's shutdown barrier needs rank 0 there). Both ranks finish normally.
"""

import os
import signal
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "collective"
PEER_DELAY = 8.0  # how long rank 1 keeps rank 0 waiting in shutdown and init
LIMIT = 3.0       # rank 0 must be interrupted this soon after the signal (well before the peer)
RANK = int(os.environ["KOLO_RANK"])


def interrupted(what, fn):
    """Runs fn on rank 0 with SIGINT 1 s in; fails unless KeyboardInterrupt comes promptly."""
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        fn()
        print("FAIL: %s completed" % what, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        took = time.monotonic() - start
        if took > 1.0 + LIMIT:
            print("FAIL: KeyboardInterrupt in %s after %.1f s" % (what, took), file=sys.stderr)
            sys.exit(1)
        print("ok interrupted %s after %.2f s" % (what, took), flush=True)


if MODE == "collective":
    hvd.init()
    if RANK == 0:
        interrupted("allreduce", lambda: hvd.allreduce(torch.ones(4), name="never matched"))
    hvd.barrier()  # the interrupted op is still pending on rank 0; other ops go on
    hvd.shutdown()
elif MODE in ("shutdown", "init", "exit"):
    what = "init" if MODE == "init" else "shutdown"
    call = getattr(hvd, what)
    if what == "shutdown":
        hvd.init()
    if RANK == 0:
        interrupted(what, call)
    else:
        time.sleep(PEER_DELAY)
    if RANK != 0 or MODE != "exit":
        call()  # on rank 0, waits for the interrupted call, which completes once rank 1 comes
    if MODE == "init":  # the job works after an interrupted init
        y = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after init")
        assert y.tolist() == [2.0, 2.0], y
        hvd.shutdown()
    print("ok %s rank %d" % (MODE, RANK), flush=True)
else:
    sys.exit("unknown mode %r" % MODE)
