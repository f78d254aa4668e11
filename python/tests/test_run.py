"""kolo.run's waits are bounded: a rank that hangs after returning its result, or output nobody can
read, ends in an error that says what kolo.run waited for instead of hanging the driver.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_run.py
"""

import os
import socket
import sys
import time

from test_ops import ROOT
from test_training import _driver


def test_local_hosts_are_the_ones_kolo_run_starts_without_ssh():
    # kolo.run may hand a large payload through a local file only when every rank runs here: the
    # names launch.IsLocal takes for this machine, read from -H as kolo run reads them.
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from kolo import runner
    finally:
        sys.path.pop(0)
    for hosts in (None, "", "localhost", "localhost:2,127.0.0.1:2", "[::1]:2", "[::1]", "::1:2",
                  "localhost.localdomain:4", "%s:2, localhost" % socket.gethostname()):
        assert runner._local_only(hosts, None), hosts
    for hosts in ("otherhost", "localhost:2,otherhost:2", "[fe80::1]:2"):
        assert not runner._local_only(hosts, None), hosts
    assert not runner._local_only(None, "/some/hostfile")


def test_a_rank_that_hangs_after_returning_is_named():
    start = time.monotonic()
    rc, out = _driver("""
        import threading, time
        import kolo
        from kolo import runner

        def work():
            import os
            rank = int(os.environ["KOLO_RANK"])
            if rank == 1:  # not a daemon: the interpreter waits for it before exiting
                threading.Thread(target=time.sleep, args=(3600,)).start()
            return rank

        if __name__ == "__main__":
            runner._EXIT_WAIT = 3
            t0 = time.monotonic()
            try:
                kolo.run(work, np=3)
            except RuntimeError as e:
                took = time.monotonic() - t0
                assert e.ranks == [1], (e.ranks, str(e))
                assert "rank 1 had not exited" in str(e) and "3 s later" in str(e), e
                assert took < 30, took
                print("ok hang named after %.1f s" % took)
    """, timeout=90)
    assert rc == 0 and "ok hang named" in out, out
    assert time.monotonic() - start < 90


def test_a_reader_that_cannot_write_does_not_hang_the_driver():
    rc, out = _driver("""
        import os, sys, threading, time
        import kolo
        from kolo import runner

        class Blocked:
            # A sys.stdout whose writes never return (a full pipe nobody reads).
            def write(self, s):
                threading.Event().wait()
            def flush(self):
                pass

        def work():
            print("hello from the rank")  # relayed through the driver's sys.stdout: blocks
            return 42

        if __name__ == "__main__":
            runner._OUTPUT_WAIT = 2
            real = sys.stdout
            sys.stdout = Blocked()
            t0 = time.monotonic()
            try:
                kolo.run(work, np=1)
            except RuntimeError as e:
                took = time.monotonic() - t0
                msg = str(e)
                assert e.ranks == [0], (e.ranks, msg)
                assert "result of rank 0 was never read" in msg and "standard output" in msg, msg
                assert "sys.stdout" in msg, msg
                real.write("ok reader bounded after %.1f s\\n" % took)
                real.flush()
    """, timeout=90)
    assert rc == 0 and "ok reader bounded" in out, out
