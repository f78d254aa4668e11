"""kolo.run's waits are bounded: a rank that hangs after returning its result, or output nobody can
read, ends in an error that says what kolo.run waited for instead of hanging the driver. The rank
a failed job's error names is the one kolo run's outcome file (--outcome-file) names.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_run.py
"""

import os
import socket
import sys
import time

from test_ops import ROOT
from test_training import _driver


def _runner():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from kolo import runner
    finally:
        sys.path.pop(0)
    return runner


def test_local_hosts_are_the_ones_kolo_run_starts_without_ssh():
    # kolo.run may hand a large payload through a local file only when every rank runs here: the
    # names launch.IsLocal takes for this machine, read from -H as kolo run reads them.
    runner = _runner()
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


def test_the_first_failed_rank_is_the_outcome_files():
    # Two ranks raised; the outcome names the rank the failure began with, though another one is
    # lower. Nothing is read from kolo run's stderr.
    runner = _runner()
    errors = {r: {"summary": "E%d: r%d" % (r, r), "traceback": "tb %d" % r, "exception": None}
              for r in (0, 2)}
    e = runner._failure(1, errors, "", {"exit_code": 1, "first_failed": {"rank": 2, "host": "h"}})
    assert e.rank == 2 and str(e).startswith("kolo.run: rank 2 raised E2: r2\ntb 2"), (e.rank, str(e))
    # Without an outcome (kolo run failed before the job, or was killed): the lowest rank that raised.
    assert runner._failure(1, errors, "", None).rank == 0
    # The rank that failed first raised nothing (it was killed): kolo run's last words.
    e = runner._failure(137, errors, "a\nb\nc\nd\n", {"first_failed": {"rank": 1}})
    assert e.rank == 1 and str(e) == "kolo.run: the job failed (kolo run exit status 137): b | c | d", str(e)


def test_kolo_run_names_the_rank_its_outcome_file_names():
    rc, out = _driver("""
        import kolo
        from kolo import runner

        class Custom(Exception):
            pass

        def boom():
            import torch, kolo.torch as hvd
            hvd.init()
            if hvd.rank() == 2:
                raise Custom("rank two exploded")
            hvd.allreduce(torch.ones(1), name="never")  # fails on ranks 0 and 1: they raise too

        if __name__ == "__main__":
            read = []
            real = runner._read_outcome
            runner._read_outcome = lambda path: read.append(real(path)) or read[-1]
            try:
                kolo.run(boom, np=3)
            except RuntimeError as e:
                outcome, = read
                assert outcome["first_failed"]["rank"] == 2, outcome
                assert outcome["first_failed"]["report"]["kind"] == "exception", outcome
                assert [r["exit_code"] for r in outcome["ranks"]] == [1, 1, 1], outcome
                assert e.rank == 2, e.rank
                assert "rank 2 raised Custom: rank two exploded" in str(e), e
                assert isinstance(e.__cause__, Custom), repr(e.__cause__)
                print("ok named from the outcome")
    """)
    assert rc == 0 and "ok named from the outcome" in out, out
