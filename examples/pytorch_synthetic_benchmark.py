#!/usr/bin/env python3
"""Training throughput on synthetic data, like Horovod's pytorch_synthetic_benchmark.py.

    bin/kolo run -np 2 /usr/bin/python3 examples/pytorch_synthetic_benchmark.py --model mlp

Prints samples/sec per rank for each iteration (--num-batches-per-iter steps), then the mean and
its spread (1.96 standard deviations, as Horovod prints it) per rank and in total.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import kolo.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp",
                   help="mlp (see --mlp-sizes), cnn (the MNIST example's), or a torchvision "
                        "model name such as resnet50 when torchvision is installed")
    p.add_argument("--mlp-sizes", default="784,2048,2048,10",
                   help="layer widths of the mlp model (default: %(default)s, 23 MB of gradients)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    p.add_argument("--bf16-allreduce", action="store_true", help="send gradients as bfloat16")
    p.add_argument("--fusion-groups", type=int, default=0,
                   help="allreduce gradients in this many groups (DistributedOptimizer groups=)")
    return p.parse_args()


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def build(args):
    """Returns the model, one batch of its input and the number of classes."""
    if args.model == "mlp":
        sizes = [int(s) for s in args.mlp_sizes.split(",")]
        return mlp(sizes), torch.randn(args.batch_size, sizes[0]), sizes[-1]
    if args.model == "cnn":
        return CNN(), torch.randn(args.batch_size, 1, 28, 28), 10
    try:
        from torchvision import models
    except ImportError:
        raise SystemExit("--model %s needs torchvision, which is not installed; use mlp or cnn"
                         % args.model)
    return getattr(models, args.model)(), torch.randn(args.batch_size, 3, 224, 224), 1000


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)

    model, data, classes = build(args)
    target = torch.randint(0, classes, (args.batch_size,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.none
    if args.fp16_allreduce:
        compression = hvd.Compression.fp16
    elif args.bf16_allreduce:
        compression = hvd.Compression.bf16
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         groups=args.fusion_groups or None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    log("Model: %s (%.1f MB of gradients)" % (args.model, grads / 1e6))
    log("Batch size: %d per rank" % args.batch_size)
    log("Number of ranks: %d, %d thread(s) each" % (hvd.size(), args.threads))
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f samples/sec per rank" % (i, rate))
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log("Samples/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total samples/sec on %d rank(s): %.1f +-%.1f"
        % (hvd.size(), hvd.size() * mean, hvd.size() * conf))


if __name__ == "__main__":
    main()
