"""A training loop that goes wrong on purpose, for test_training.py:

    bin/kolo run -np 2 /usr/bin/python3 python/tests/training_failure_worker.py MODE

MODE raise: rank 1 raises ValueError in its third step while rank 0 trains on (and blocks in
    optimizer.step() waiting for rank 1's gradients); rank 0 prints the error step() raises.
MODE ended: rank 1's script finishes after two steps (it leaves, exiting 0) while rank 0 trains
    on; rank 0's next step fails naming it.
MODE retry: rank 0 is interrupted in step() and calls step() again, which completes.
MODE hang: rank 1 stops submitting after two steps (sleeps); rank 0 blocks in
    optimizer.step() -> synchronize(). Rank 0 prints "blocked in synchronize" first, so the test
    knows when to press Ctrl-C.
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402

mode = sys.argv[1]
hvd.init()
if mode == "retry":
    # Ctrl-C while step() waits leaves the optimizer usable: calling step() again finishes.
    import signal
    import threading
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(4):
        if hvd.rank() == 1 and step == 2:
            time.sleep(3)  # rank 0 is interrupted while it waits for this rank's gradients
        opt.zero_grad()
        model(torch.ones(4, 10) * (hvd.rank() + step)).sum().backward()
        if hvd.rank() == 0 and step == 2:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                opt.step()
                raise SystemExit("FAIL: step() was not interrupted")
            except KeyboardInterrupt:
                pass
        opt.step()
    every = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()])[None])
    assert torch.equal(every[0], every[1]), every
    if hvd.rank() == 0:
        print("ok retry", flush=True)
    sys.exit(0)
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(10, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(1000):
    if hvd.rank() == 1 and step == 2:
        if mode == "raise":
            raise ValueError("rank 1 hit a bad batch at step %d" % step)
        if mode == "ended":
            print("rank 1 leaves early", flush=True)
            sys.exit(0)  # shutdown at exit
        time.sleep(3600)
    opt.zero_grad()
    # The peer's failure surfaces at this rank's next kolo call: in step()'s wait, or, when the
    # notice came first, in a gradient hook during backward.
    try:
        F.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 2, (4,))).backward()
        if hvd.rank() == 0 and step == 2:
            print("blocked in synchronize pid=%d" % os.getpid(), flush=True)
        opt.step()
    except hvd.HorovodInternalError as e:
        print("rank %d saw: %s" % (hvd.rank(), e), flush=True)
        raise
print("FAIL: rank %d finished training" % hvd.rank(), flush=True)
