"""kill -9 of one rank inside a TensorFlow allreduce, for test_tensorflow.py:

    KOLO_PROGRESS_TIMEOUT_SECONDS=15 bin/kolo run -np 2 .venv/tf/bin/python \\
        python/tests/kolo_tensorflow/tf_kill_worker.py

Every rank allreduces a 4 MiB float32 tensor in a loop, eagerly; at op KILL_AT the victim (the
last rank) SIGKILLs itself just before submitting, while the others are inside that op. Each
survivor prints "TF-KILL-RESULT rank=R elapsed_ms=MS err=ERROR". As kill_worker.py does for
kolo.torch, the victim's work runs in a child of the rank the launcher started, which outlives it:
what is measured is kolo's own detection, not the launcher stopping the job.
"""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KILL_AT = 5
LINGER = float(os.environ.get("KOLO_PROGRESS_TIMEOUT_SECONDS", "60")) + 15


def main():
    victim = int(os.environ["KOLO_SIZE"]) - 1
    if int(os.environ["KOLO_RANK"]) == victim and "--child" not in sys.argv:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"])
        child.wait()
        print("victim's process ended (%s)" % ("SIGKILL" if child.returncode == -signal.SIGKILL else child.returncode),
              flush=True)
        time.sleep(LINGER)
        sys.exit(1)
    sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import kolo.tensorflow as hvd
    hvd.init()
    t = tf.ones([1 << 20])
    for i in range(KILL_AT + 1000):
        if hvd.rank() == victim and i == KILL_AT:
            time.sleep(0.5)  # the others are inside op KILL_AT by now
            print("rank %d: SIGKILL before op %d" % (hvd.rank(), i), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            hvd.allreduce(t, op=hvd.Sum, name="kill.t")
        except hvd.HorovodInternalError as e:
            # a lost rank: tf.errors.UnknownError, as Horovod's ops raise it, and HorovodInternalError
            print("TF-KILL-RESULT rank=%d op=%d elapsed_ms=%.0f unknown=%d err=%s"
                  % (hvd.rank(), i, (time.monotonic() - t0) * 1e3, isinstance(e, tf.errors.UnknownError),
                     str(e).replace("\n", " | ")), flush=True)
            os._exit(0)  # the job is broken; leave without the shutdown barrier
    print("TF-KILL-RESULT rank=%d op=none elapsed_ms=0 unknown=0 err=none" % hvd.rank(), flush=True)


if __name__ == "__main__":
    main()
