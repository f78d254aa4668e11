#!/usr/bin/env python3
"""Train a small CNN on MNIST-format data with kolo's horovod.torch API.

    bin/kolo run -np 2 /usr/bin/python3 examples/pytorch_mnist.py

Reads IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]) from --data-dir; the default is
Fashion-MNIST from Debian's dataset-fashion-mnist package. Any MNIST directory works.

Every rank sees the same sequence of global batches (one shuffle per epoch, seeded), each rank
taking its slice, so with the same --global-batch-size the run on 1, 2 or 4 ranks is the same
computation up to the order of floating-point sums.
"""

import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import kolo.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of MNIST-format IDX files (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples per rank per step (default: %(default)s); the learning rate "
                        "scales with the number of ranks, as in Horovod's examples")
    p.add_argument("--global-batch-size", type=int, default=0,
                   help="samples per step over all ranks, split evenly; overrides --batch-size "
                        "and keeps --lr as given (use it to compare runs on different -np)")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop each epoch after this many steps (0: whole epoch)")
    p.add_argument("--max-test-samples", type=int, default=0,
                   help="evaluate on the first N test samples only (0: all)")
    p.add_argument("--lr", type=float, default=1.5e-3,
                   help="Adam learning rate for a global batch of --batch-size")
    p.add_argument("--lr-decay", type=float, default=0.6,
                   help="multiply the learning rate by this after each epoch")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader worker processes per rank (forked)")
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    p.add_argument("--log-interval", type=int, default=100)
    return p.parse_args()


def read_idx(path):
    """Reads an IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("no %s[.gz] in %s (install dataset-fashion-mnist, or pass "
                            "--data-dir DIR with MNIST IDX files)" % (stem, data_dir))


def load(data_dir, split):
    images = read_idx(find(data_dir, "%s-images-idx3-ubyte" % split))
    labels = read_idx(find(data_dir, "%s-labels-idx1-ubyte" % split))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.2860) / 0.3530  # Fashion-MNIST's mean and std; fine for MNIST too
    return x, torch.from_numpy(labels.astype(np.int64))


class Tensors(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's slice of each global batch of a seeded per-epoch shuffle."""

    def __init__(self, n, global_batch, rank, size, seed):
        if global_batch % size:
            raise ValueError("global batch %d does not split evenly over %d ranks"
                             % (global_batch, size))
        self.n, self.global_batch, self.rank, self.size = n, global_batch, rank, size
        self.local = global_batch // size
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n // self.global_batch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        perm = torch.randperm(self.n, generator=g).tolist()
        for b in range(len(self)):
            start = b * self.global_batch + self.rank * self.local
            yield perm[start:start + self.local]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2, bias=False)
        # Batch statistics over the global batch, so 1, 2 or 4 ranks normalize alike.
        self.bn1 = hvd.SyncBatchNorm(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2, bias=False)
        self.bn2 = hvd.SyncBatchNorm(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def evaluate(model, x, y, batch):
    """Accuracy and mean loss over the test set, each rank scoring its own shard."""
    model.eval()
    shard = slice(hvd.rank(), len(y), hvd.size())
    xs, ys = x[shard], y[shard]
    loss = correct = 0.0
    with torch.no_grad():
        for i in range(0, len(ys), batch):
            out = model(xs[i:i + batch])
            loss += F.nll_loss(out, ys[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == ys[i:i + batch]).sum().item()
    totals = hvd.allreduce(torch.tensor([loss, correct, float(len(ys))], dtype=torch.float64),
                           name="test.totals", op=hvd.Sum)
    model.train()
    return 100.0 * totals[1].item() / totals[2].item(), totals[0].item() / totals[2].item()


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if args.global_batch_size:
        global_batch, lr = args.global_batch_size, args.lr
    else:
        global_batch, lr = args.batch_size * hvd.size(), args.lr * hvd.size()
    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "t10k")
    if args.max_test_samples:
        x_test, y_test = x_test[:args.max_test_samples], y_test[:args.max_test_samples]
    sampler = GlobalBatchSampler(len(y_train), global_batch, hvd.rank(), hvd.size(), args.seed)
    loader = torch.utils.data.DataLoader(Tensors(x_train, y_train), batch_sampler=sampler,
                                         num_workers=args.workers)

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    # The wrapped optimizer shares its param_groups, so schedulers work on it unchanged.
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=args.lr_decay)
    if hvd.rank() == 0:
        print("training on %d rank(s): global batch %d (%d per rank), lr %g, %d epoch(s), data %s"
              % (hvd.size(), global_batch, global_batch // hvd.size(), lr, args.epochs,
                 args.data_dir), flush=True)

    start = time.time()
    samples = 0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        for step, (data, target) in enumerate(loader):
            if args.max_steps and step >= args.max_steps:
                break
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            samples += global_batch
            if hvd.rank() == 0 and step % args.log_interval == 0:
                print("epoch %d step %d/%d loss %.4f" % (epoch, step, len(sampler), loss.item()),
                      flush=True)
        scheduler.step()
        acc, test_loss = evaluate(model, x_test, y_test, args.test_batch_size)
        if hvd.rank() == 0:
            elapsed = time.time() - start
            print("epoch %d: test accuracy %.2f%% test loss %.4f (%.0f s, %.0f samples/s)"
                  % (epoch, acc, test_loss, elapsed, samples / elapsed), flush=True)
    if hvd.rank() == 0:
        print("final: ranks=%d global_batch=%d epochs=%d test_accuracy=%.2f"
              % (hvd.size(), global_batch, args.epochs, acc), flush=True)


if __name__ == "__main__":
    sys.exit(main())
