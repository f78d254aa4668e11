"""kill -9 of one rank inside an allreduce, for test_kill.py:

    KOLO_PROGRESS_TIMEOUT_SECONDS=15 bin/kolo run -np 3 /usr/bin/python3 python/tests/kill_worker.py \\
        [--victim 1] [--bytes 16777216] [--device cpu|cuda]

Every rank allreduces a float32 tensor of --bytes on --device (KOLO_TEST_DEVICE by default) in a
loop. At op KILL_AT the victim submits the op (allreduce_async), waits half of what an op took in
warm-up, so that the others are inside the same op, and SIGKILLs itself. Each survivor prints

    KILL-RESULT rank=R op=I elapsed_ms=MS path=P err=ERROR

where MS runs from the start of the op that failed to its error, and P is the data path: host
for CPU tensors; for CUDA tensors nccl where hvd.nccl_built(), else staged (through host memory).
What is measured is kolo's own detection, not the launcher stopping the job: the victim's
process is a child of the rank the launcher started, which stays up for LINGER seconds after the
child died, as a lost host would leave the launcher in the dark.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 10
KILL_AT = 15
LINGER = float(os.environ.get("KOLO_PROGRESS_TIMEOUT_SECONDS", "60")) + 15


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--device", default=os.environ.get("KOLO_TEST_DEVICE", "cpu"))
    p.add_argument("--child", action="store_true", help="(internal) the victim's process that is killed")
    return p.parse_args()


def rank_of_env():
    return int(os.environ["KOLO_RANK"])


def linger():
    """The victim's rank as the launcher sees it: runs the real rank as a child and outlives it."""
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"] + sys.argv[1:])
    child.wait()
    sys.stdout.write("victim's rank process ended (%s); the launcher learns of it in %.0f s\n"
                     % ("SIGKILL" if child.returncode == -signal.SIGKILL else "exit %s" % child.returncode, LINGER))
    sys.stdout.flush()
    time.sleep(LINGER)
    sys.exit(1)


def main():
    a = args()
    if rank_of_env() == a.victim and not a.child:
        linger()
    sys.path.insert(0, os.path.join(HERE, os.pardir))
    import torch
    import kolo.torch as hvd
    torch.set_num_threads(1)
    if a.device == "cuda":  # rank r on GPU r, before kolo starts
        torch.cuda.set_device(int(os.environ.get("KOLO_LOCAL_RANK", "0")) % torch.cuda.device_count())
    hvd.init()
    rank = hvd.rank()
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    path = "host" if not a.device.startswith("cuda") else "nccl" if hvd.nccl_built() else "staged"
    t = torch.ones(max(a.bytes // 4, 1), dtype=torch.float32, device=a.device)
    took = []
    for i in range(KILL_AT + 1000):
        if rank == a.victim and i == KILL_AT:
            hvd.allreduce_async_(t, name="kill.t")
            pause = statistics.median(took) / 2
            time.sleep(pause)
            print("rank %d: SIGKILL %.1f ms into op %d (ops took %.1f ms)" % (rank, pause * 1e3, i, 2 * pause * 1e3),
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            hvd.allreduce_(t, name="kill.t")
            sync()
        except hvd.HorovodInternalError as e:
            elapsed = (time.monotonic() - t0) * 1e3
            print("KILL-RESULT rank=%d op=%d elapsed_ms=%.0f path=%s err=%s"
                  % (rank, i, elapsed, path, str(e).replace("\n", " | ")), flush=True)
            os._exit(0)  # the job is broken; leave without the shutdown barrier
        if i < WARMUP:
            t.fill_(1.0)
        else:
            took.append(time.monotonic() - t0)
            t.fill_(1.0)
    print("KILL-RESULT rank=%d op=none elapsed_ms=0 path=%s err=no op failed" % (rank, path), flush=True)


if __name__ == "__main__":
    main()
