"""An elastic training script for kolo's elastic tests (started by `kolo run` in elastic mode;
it also runs in a plain job and in one process without a launcher). Modelled on the semantics of
Horovod's test/integration/data/elastic_torch_main.py, with a sampler and a log that let a test
check what the job did:

* hvd.elastic.run around the training loop, a TorchState(model, optimizer, sampler, epoch,
  batch, commits), an ElasticSampler over a generated dataset of --samples samples (default
  --batches-per-epoch x --batch-size: a world of one rank takes --batches-per-epoch batches per
  epoch, a world of n about 1/n of that). An epoch ends when the sampler has given every sample.
* --log FILE (JSON lines, appended, one write per line) gets, from every rank:
    {"kind": "sync", ...}    each time the state was synced (the loop (re)starts)
    {"kind": "batch", ..., "indices": [...]}  the samples a batch processed, padding repeats
                             left out; they count only if the rank's next "commit" follows
    {"kind": "commit", ..., "processed_num": n, "checksum": "..."}  after each commit's save
    {"kind": "exit", ...}    just before a scheduled exit
    {"kind": "done", ..., "checksum": "..."}  at the end
  Every record has pid, start_rank, rank, size, round, epoch, batch, commits and time (Unix
  seconds). checksum is the sha256 of the model's parameters (concatenated bytes, in
  parameters() order): equal on every rank after each commit, as data-parallel replicas must be.
* --exit-schedule '{"(epoch, batch)": [start ranks]}' (Horovod's format) makes the workers whose
  start rank (HOROVOD_RANK when the process started) is listed leave before processing batch
  `batch` of epoch `epoch`: --exit-mode exception raises RuntimeError (the exception hook tells
  the other ranks), kill sends SIGKILL to the process. Each scheduled exit happens once in the
  job (the log remembers it), so a worker started later in the same place does not repeat it.
* --device (KOLO_TEST_DEVICE by default, else cpu): where the model, its gradients, the optimizer's
  state and the batches live; with cuda, each rank takes GPU KOLO_LOCAL_RANK modulo the GPUs
  there are (scripts/gpu_check.sh's elastic step). The log's checksums are of the same bytes
  either way.

    PYTHONPATH=python kolo run --min-np 2 --max-np 3 ... python python/tests/elastic_worker.py --log /tmp/l.jsonl
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

import torch

import kolo.torch as hvd
from kolo import _lib


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="kolo elastic test worker")
    p.add_argument("--log", required=True, help="JSON-lines log every rank appends to")
    p.add_argument("--exit-schedule", default="{}",
                   help='JSON {"(epoch, batch)": [start ranks]}: who leaves where')
    p.add_argument("--exit-mode", choices=["exception", "kill"], default="exception")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches-per-epoch", type=int, default=10)
    p.add_argument("--batches-per-commit", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank and batch")
    p.add_argument("--samples", type=int, default=None,
                   help="dataset size (default: batches-per-epoch x batch-size)")
    p.add_argument("--batch-wait", type=float, default=0.0, help="seconds to sleep per batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=os.environ.get("KOLO_TEST_DEVICE", "cpu"),
                   help="cpu or cuda: where the model and the batches live")
    args = p.parse_args(argv)
    args.exit_schedule = {_key(k): set(v) for k, v in json.loads(args.exit_schedule or "{}").items()}
    if args.samples is None:
        args.samples = args.batches_per_epoch * args.batch_size
    if args.batches_per_commit < 1 or args.batch_size < 1 or args.samples < 1:
        p.error("--batches-per-commit, --batch-size and --samples must be positive")
    return args


def _key(text):
    """"(1, 2)" or "[1, 2]" -> (1, 2)."""
    parts = text.strip().strip("()[]").split(",")
    if len(parts) != 2:
        raise SystemExit("elastic_worker: --exit-schedule key %r is not (epoch, batch)" % text)
    return int(parts[0]), int(parts[1])


class Samples(torch.utils.data.Dataset):
    """n generated samples (x, label, index), the same in every process for a seed."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    start_rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("KOLO_RANK", "0")))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("elastic_worker: --device %s, but torch sees no GPU" % args.device)
    if device.type == "cuda" and device.index is None:  # rank r on GPU r, before kolo starts
        device = torch.device("cuda", int(os.environ.get("KOLO_LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    hvd.init()

    torch.manual_seed(args.seed + 1000 + hvd.rank())  # replicas differ until the first sync
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    lr = 0.01
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    dataset = Samples(args.samples, args.seed)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    def log(kind, state, **extra):
        record = dict(kind=kind, pid=os.getpid(), start_rank=start_rank, rank=hvd.rank(),
                      size=hvd.size(), round=_lib.elastic_round(), epoch=state.epoch,
                      batch=state.batch, commits=state.commits, time=time.time())
        record.update(extra)
        with open(args.log, "a") as f:
            f.write(json.dumps(record) + "\n")

    def exited_before(epoch, batch):
        try:
            with open(args.log) as f:
                for line in f:
                    r = json.loads(line)
                    if (r.get("kind") == "exit" and r["start_rank"] == start_rank
                            and (r["epoch"], r["batch"]) == (epoch, batch)):
                        return True
        except FileNotFoundError:
            pass
        return False

    def check_exit(state):
        key = (state.epoch, state.batch)
        if start_rank not in args.exit_schedule.get(key, ()) or exited_before(*key):
            return
        log("exit", state, mode=args.exit_mode)
        if args.exit_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("scheduled exit at epoch %d batch %d: start rank %d (rank %d)"
                           % (state.epoch, state.batch, start_rank, hvd.rank()))

    def commit(state):
        state.commits += 1
        state.save()  # what commit() does, with the log between its two halves
        log("commit", state, processed_num=sampler.processed_num, checksum=checksum(model))
        state.check_host_updates()

    @hvd.elastic.run
    def train(state):
        log("sync", state, processed_num=sampler.processed_num, checksum=checksum(model))
        while state.epoch < args.epochs:
            position = 0  # of this rank's samples in this pass of the sampler
            for batch_idx, (x, y, idx) in enumerate(loader):
                check_exit(state)
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                real = max(0, min(len(idx), sampler.num_real_samples - position))
                position += len(idx)
                log("batch", state, indices=idx[:real].tolist())
                sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if args.batch_wait > 0:
                    time.sleep(args.batch_wait)
                if state.batch % args.batches_per_commit == 0:
                    commit(state)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            commit(state)
        return state

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, commits=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    log("done", state, checksum=checksum(model), device=str(next(model.parameters()).device))
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
