#!/usr/bin/env python3
"""What an elastic commit costs: kolo's TorchState.save (copy_ into buffers allocated at the
first commit) against Horovod's, which deep-copies the model's and the optimizer's state_dict on
every commit (horovod/torch/elastic/state.py: copy.deepcopy(state_dict()), reimplemented here as
exactly that). One process, CPU, no launcher.

    make lib && PYTHONPATH=python /usr/bin/python3 bench/elastic_commit.py

Workloads: an MLP 784-2048-2048-10 with SGD and momentum, and a small CNN (two 3x3 convolutions,
two linear layers: PyTorch's MNIST example) with Adam, each trained a few steps first so that the
optimizer holds its state. Each repeat times --commits commits of each method, the methods in
alternating order (noise hits both alike); the table gives the per-commit time, median and range
over --repeats repeats. Both keep one saved copy alive, as a commit does: Horovod's replaces the
previous copy (freed, then allocated again), kolo's copies over it. The commit's other half,
check_host_updates, is one small broadcast in both and is timed apart (kolo only).
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import kolo.torch as hvd  # noqa: E402


def mlp():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), (32, 1, 28, 28)


def cnn():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(9216, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), (32, 1, 28, 28)


WORKLOADS = [("MLP 784-2048-2048-10, SGD momentum", mlp), ("CNN (MNIST example), Adam", cnn)]


def state_bytes(model, optimizer):
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for st in optimizer.state_dict()["state"].values():
        n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return n


def train(model, optimizer, shape, steps=3):
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(*shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def per_commit(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def bench(name, make, args):
    torch.manual_seed(0)
    model, optimizer, shape = make()
    train(model, optimizer, shape)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    saved = {}

    def horovod():
        saved["model"] = copy.deepcopy(model.state_dict())
        saved["optimizer"] = copy.deepcopy(optimizer.state_dict())

    methods = {"kolo": state.save, "horovod": horovod, "check": state.check_host_updates}
    for fn in methods.values():  # warm-up: first allocations, first broadcast
        per_commit(fn, 2)
    times = {k: [] for k in methods}
    for r in range(args.repeats):
        order = ["kolo", "horovod"] if r % 2 == 0 else ["horovod", "kolo"]
        for k in order + ["check"]:
            times[k].append(per_commit(methods[k], args.commits))
    return state_bytes(model, optimizer), times


def ms(xs):
    return "%.2f ms (%.2f-%.2f)" % (1e3 * statistics.median(xs), 1e3 * min(xs), 1e3 * max(xs))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--commits", type=int, default=10, help="commits timed per repeat and method")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (copies use them)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    hvd.init()
    print("torch %s, %d thread(s), %d repeats x %d commits; per commit: median (min-max)\n"
          % (torch.__version__, args.threads, args.repeats, args.commits))
    print("| workload | state | Horovod deepcopy | kolo TorchState.save | speed-up | check_host_updates (1 rank) |")
    print("|---|---|---|---|---|---|")
    for name, make in WORKLOADS:
        nbytes, t = bench(name, make, args)
        print("| %s | %.1f MB | %s | %s | %.1fx | %s |" % (
            name, nbytes / 1e6, ms(t["horovod"]), ms(t["kolo"]),
            statistics.median(t["horovod"]) / statistics.median(t["kolo"]), ms(t["check"])))
    hvd.shutdown()


if __name__ == "__main__":
    main()
