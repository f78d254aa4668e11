"""Timeline through kolo.torch: run under `kolo run --timeline-filename FIRST` so that recording
starts at init; the worker then switches to the file given as its argument with start_timeline
and finishes it with stop_timeline.

    bin/kolo run -np 2 --timeline-filename /tmp/a.json /usr/bin/python3 timeline_worker.py /tmp/b.json
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402


def main():
    hvd.init()
    hvd.allreduce(torch.ones(4), name="from.env")
    hvd.start_timeline(sys.argv[1], mark_cycles=True)
    hs = [hvd.allreduce_async(torch.ones(8), name="rt.%d" % i) for i in range(3)]
    for h in hs:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(hvd.rank() + 1), name="rt.gather")
    hvd.broadcast(torch.ones(2), 1, name="rt.bcast")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(1), name="after.stop")
    try:
        hvd.start_timeline(os.path.join(sys.argv[1], "no", "such", "dir.json"))
        if hvd.rank() == 0:
            sys.exit("start_timeline accepted an unwritable path")
    except ValueError as e:
        assert "timeline" in str(e), e
    hvd.shutdown()
    print("ok timeline", flush=True)


if __name__ == "__main__":
    main()
