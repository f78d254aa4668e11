#!/usr/bin/env python3
"""Elastic training of examples/pytorch_mnist.py's CNN on Fashion-MNIST with kolo's hvd.elastic API.

    bin/kolo run -np 4 --min-np 2 --max-np 4 -H localhost:2,127.0.0.1:2 \
        /usr/bin/python3 examples/pytorch_mnist_elastic.py

The shape of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py: the training function is
wrapped in hvd.elastic.run, its state (model, optimizer, ElasticSampler, epoch, batch, step) is a
hvd.elastic.TorchState committed every --batches-per-commit steps, and a reset callback sets the
learning rate for the new world size. When a worker is lost the survivors go back to the last
commit, form a smaller world and go on; the sampler splits the samples the epoch has not yet
processed among them, so every sample of an epoch is trained on once. --batch-size is per rank,
so the global batch, and with it the learning rate (--lr x ranks, as in Horovod), follows the
world size. With --global-batch-size G instead, the global batch and the learning rate stay as
they are and each rank takes G / ranks samples a step: the sampler deals the epoch's order
round-robin, so step k's global batch is the same samples on 4 ranks or 2, and a job that lost a
worker does the computation an uninterrupted one does, up to the order of floating-point sums.

Data, model and evaluation are examples/pytorch_mnist.py's (imported from it). With the same
--seed a run is the same computation each time up to the order of floating-point sums (one
torch thread per rank, the model initialised from the seed, the sampler's shuffle seeded).

--kill-at-step S --kill-rank R make the worker started as rank R (HOROVOD_RANK at its start)
SIGKILL itself before global step S, to try a failure; only a worker started for the job's
first round does it, so it happens once per job. Rank 0 ends with one line:

    final test accuracy 89.35% after 2 epochs on 2 ranks (639 steps, 1 reset, 149 s)
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import kolo.torch as hvd
from pytorch_mnist import Net, Tensors, evaluate, load


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of MNIST-format IDX files (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples per rank per step (default: %(default)s)")
    p.add_argument("--global-batch-size", type=int, default=0,
                   help="samples per step over all ranks, split evenly whatever the world size; "
                        "overrides --batch-size and keeps --lr as given (0: off)")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0,
                   help="end each epoch after this many steps (0: when the sampler has given "
                        "every sample)")
    p.add_argument("--max-train-samples", type=int, default=0,
                   help="train on the first N training samples only (0: all 60,000)")
    p.add_argument("--max-test-samples", type=int, default=0,
                   help="evaluate on the first N test samples only (0: all)")
    p.add_argument("--lr", type=float, default=1.5e-3,
                   help="Adam learning rate per rank: the optimizer's is this x the world size "
                        "(with --global-batch-size: the optimizer's)")
    p.add_argument("--lr-decay", type=float, default=0.6,
                   help="multiply the learning rate by this after each epoch")
    p.add_argument("--batches-per-commit", type=int, default=10,
                   help="commit the state every N steps (what a failure rolls back to)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--kill-at-step", type=int, default=-1,
                   help="the worker started as --kill-rank SIGKILLs itself before this global "
                        "step (counted from 0 over all epochs; -1: never)")
    p.add_argument("--kill-rank", type=int, default=1)
    args = p.parse_args()
    if args.batches_per_commit < 1 or args.batch_size < 1:
        p.error("--batches-per-commit and --batch-size must be positive")
    return args


def main():
    args = parse_args()
    # Who this process was at its start: the kill option names a worker by its first rank, and
    # only workers started for the job's first round (every worker, outside elastic mode) kill.
    start_rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("KOLO_RANK", "0")))
    first_round = os.environ.get("KOLO_ELASTIC_ROUND", "1") == "1"
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "t10k")
    if args.max_train_samples:
        x_train, y_train = x_train[:args.max_train_samples], y_train[:args.max_train_samples]
    if args.max_test_samples:
        x_test, y_test = x_test[:args.max_test_samples], y_test[:args.max_test_samples]
    train_set = Tensors(x_train, y_train)
    # The elastic sampler: this rank's share of what the epoch has left, re-split after a reset.
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)

    def local_batch():
        if args.global_batch_size:
            return max(1, args.global_batch_size // hvd.size())
        return args.batch_size

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # No broadcast here: the state's first sync gives every rank rank 0's model and optimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def set_lr(epoch):
        scale = 1 if args.global_batch_size else hvd.size()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * scale * args.lr_decay ** epoch

    set_lr(0)

    resets = [0]

    def on_state_reset():
        # After a reset the world may have another size: scale the learning rate to it (with
        # --global-batch-size the lr stays, and the loader's batch follows the size instead).
        resets[0] += 1
        set_lr(state.epoch)
        if hvd.rank() == 0:
            print("reset %d: now %d ranks, global batch %d, lr %g (epoch %d, step %d)"
                  % (resets[0], hvd.size(), local_batch() * hvd.size(),
                     optimizer.param_groups[0]["lr"], state.epoch, state.step), flush=True)

    def maybe_kill(step):
        if step == args.kill_at_step and start_rank == args.kill_rank and first_round:
            print("start rank %d (rank %d): killing myself before step %d"
                  % (start_rank, hvd.rank(), step), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            # A loader per pass: after a reset the sampler has re-split what the epoch has
            # left, and with --global-batch-size this rank's batch has changed too.
            loader = torch.utils.data.DataLoader(train_set, batch_size=local_batch(),
                                                 sampler=sampler)
            for data, target in loader:
                if args.max_steps and state.batch >= args.max_steps:
                    break
                maybe_kill(state.step)
                optimizer.zero_grad()
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
                sampler.record_batch(state.batch, local_batch())
                if hvd.rank() == 0 and state.batch % args.log_interval == 0:
                    print("epoch %d step %d (%d/%d samples) loss %.4f on %d ranks"
                          % (state.epoch, state.batch, sampler.processed_num, len(train_set),
                             loss.item(), hvd.size()), flush=True)
                state.batch += 1
                state.step += 1
                if state.step % args.batches_per_commit == 0:
                    state.commit()
            # Next epoch: set_epoch at the end, not the start, so that a reset in the middle of
            # an epoch keeps what the sampler has recorded.
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            set_lr(state.epoch)
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, step=0)
    state.register_reset_callbacks([on_state_reset])
    if hvd.rank() == 0:
        print("training on %d ranks: global batch %d (%d per rank), lr %g, %d epochs of %d samples"
              % (hvd.size(), local_batch() * hvd.size(), local_batch(),
                 optimizer.param_groups[0]["lr"], args.epochs, len(train_set)), flush=True)
        if args.global_batch_size and args.global_batch_size % hvd.size():
            print("note: global batch %d does not split over %d ranks: %d per rank"
                  % (args.global_batch_size, hvd.size(), local_batch()), flush=True)
    start = time.time()
    train(state)

    acc, test_loss = evaluate(model, x_test, y_test, args.test_batch_size)
    if hvd.rank() == 0:
        print("test loss %.4f on %d samples" % (test_loss, len(y_test)), flush=True)
        print("final test accuracy %.2f%% after %d epochs on %d ranks "
              "(%d steps, %d reset%s, %.0f s)"
              % (acc, state.epoch, hvd.size(), state.step, resets[0],
                 "" if resets[0] == 1 else "s", time.time() - start), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
