#!/usr/bin/env python3
"""Training throughput: kolo's DistributedOptimizer against torch DistributedDataParallel over Gloo,
side by side in one run, with a single process as the scaling baseline.

    python3 bench/ddp_compare.py --np 2 --batches 16,64 --repeats 3

Same model (MLP 784-2048-2048-10 by default: 23 MB of float32 gradients), same synthetic data,
same SGD, one torch thread per rank (OMP_NUM_THREADS=1). Each measurement is one fresh job: warm-up
steps, then --steps timed steps between two barriers on rank 0; samples/sec counts every rank's
samples. The three setups are run in turn, --repeats times, so slow drift on a shared machine hits
all of them alike; the table reports the median and the range.

Worker mode (what the jobs run): --worker single|kolo|ddp.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"

from compare import free_port  # noqa: E402  (bench/compare.py, beside this script)


def build(args, torch):
    sizes = [int(s) for s in args.mlp_sizes.split(",")]
    torch.manual_seed(1234)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.randn(args.batch, sizes[0])
    y = torch.randint(0, sizes[-1], (args.batch,))
    return model, x, y


def worker(args):
    if args.bind and args.worker == "single":
        # The one-process baseline on one CPU, as kolo run --bind-to core places rank 0 when the
        # ranks fill the machine; set before torch starts threads, which inherit it.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank, size = 0, 1
    if args.worker in ("kolo", "nocomm"):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import kolo.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        model, x, y = build(args, torch)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if args.worker == "kolo":
            groups = args.groups or None
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           groups=groups)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # nocomm: the ranks train side by side without exchanging anything (the barriers only
        # line up the timing), the ceiling that contention for cores and memory leaves.
        barrier = hvd.barrier
    elif args.worker == "ddp":
        import torch.distributed as dist
        rank, size = int(os.environ["KOLO_RANK"]), int(os.environ["KOLO_SIZE"])
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=size)
        model, x, y = build(args, torch)
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        barrier = dist.barrier
    else:
        model, x, y = build(args, torch)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        barrier = lambda: None  # noqa: E731

    phases = [0.0, 0.0, 0.0]  # forward, backward, step (where kolo waits for its allreduces)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP's allreduces run and are waited for in here
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2)):
            phases[i] += d

    for _ in range(args.warmup):
        step()
    phases[:] = [0.0, 0.0, 0.0]
    barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        step()
    cpu = time.process_time() - c0  # every thread of this rank: torch, Gloo's, the Go engine's
    barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        ms = [1000 * p / args.steps for p in phases]
        print("RESULT " + json.dumps({"samples_per_sec": args.batch * size * args.steps / elapsed,
                                      "step_ms": 1000 * elapsed / args.steps, "forward_ms": ms[0],
                                      "backward_ms": ms[1], "opt_step_ms": ms[2],
                                      "cpu_ms": 1000 * cpu / args.steps}), flush=True)
    if args.worker == "ddp":
        torch.distributed.destroy_process_group()


def measure(setup, args, batch):
    common = ["--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--mlp-sizes", args.mlp_sizes, "--groups", str(args.groups)] + (
                  ["--bind"] if args.bind else [])
    me = os.path.abspath(__file__)
    env = dict(os.environ, OMP_NUM_THREADS="1", KOLO_OVERSUBSCRIBE="1")  # --np may exceed the CPUs, as torchrun's
    if setup.startswith("kolo+"):  # kolo with one more environment variable (--kolo-also)
        key, _, value = setup[len("kolo+"):].partition("=")
        env[key] = value
        setup = "kolo"
    if setup == "single":
        cmd = [PY, me, "--worker", "single"] + common
    else:
        cmd = [os.path.join(ROOT, "bin", "kolo"), "run", "-np", str(args.np)] + (
            ["--bind-to", "core"] if args.bind else []) + [PY, me,
               "--worker", setup, "--port", str(free_port())] + common
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    for line in p.stdout.splitlines() if p.returncode == 0 else ():  # a failed job has no result
        i = line.find("RESULT ")
        if i >= 0:
            return json.loads(line[i + len("RESULT "):])
    raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))


def driver(args):
    batches = [int(b) for b in args.batches.split(",")]
    setups = ["single", "nocomm", "kolo", "ddp"]
    if args.kolo_also:
        setups.append("kolo+" + args.kolo_also)
    rates = {(b, s): [] for b in batches for s in setups}
    phases = {(b, s): [] for b in batches for s in setups}
    for r in range(args.repeats):
        for b in batches:
            # Rotate the order so no setup always runs first after the machine was idle.
            order = setups[r % len(setups):] + setups[:r % len(setups)]
            for s in order:
                res = measure(s, args, b)
                rates[(b, s)].append(res["samples_per_sec"])
                print("repeat %d batch %d %-6s %7.1f samples/s (%.1f ms/step: forward %.1f, "
                      "backward %.1f, optimizer step %.1f; rank 0 CPU %.1f ms/step)"
                      % (r, b, s, res["samples_per_sec"], res["step_ms"], res["forward_ms"],
                         res["backward_ms"], res["opt_step_ms"], res["cpu_ms"]),
                      file=sys.stderr, flush=True)
                phases[(b, s)].append(res)
    med = {k: statistics.median(v) for k, v in rates.items()}
    lines = [
        "| batch/rank | 1 process | %d processes, no communication | kolo DistributedOptimizer, "
        "%d ranks | DDP (Gloo), %d ranks | kolo / DDP (range over repeats) "
        "| kolo scaling efficiency | DDP scaling efficiency |" % (args.np, args.np, args.np),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in batches:
        one, k, d = med[(b, "single")], med[(b, "kolo")], med[(b, "ddp")]

        def cell(s):
            v = rates[(b, s)]
            return "%.1f (%.1f-%.1f)" % (med[(b, s)], min(v), max(v))
        # Ratios within one repeat compare runs minutes apart, not a quiet one with a busy one.
        paired = [kv / dv for kv, dv in zip(rates[(b, "kolo")], rates[(b, "ddp")])]
        lines.append("| %d | %s | %s | %s | %s | %.2fx (%.2f-%.2f) | %.2f | %.2f |" % (
            b, cell("single"), cell("nocomm"), cell("kolo"), cell("ddp"), k / d, min(paired),
            max(paired),
            k / (args.np * one), d / (args.np * one)))
    if args.kolo_also:
        v = "kolo+" + args.kolo_also
        lines += ["", "| batch/rank | kolo | kolo with %s | kolo / it (range over repeats) |" % args.kolo_also,
                  "|---:|---:|---:|---:|"]
        for b in batches:
            paired = [a / c for a, c in zip(rates[(b, "kolo")], rates[(b, v)])]
            lines.append("| %d | %s | %s | %.2fx (%.2f-%.2f) |" % (
                b, "%.1f" % med[(b, "kolo")], "%.1f (%.1f-%.1f)" % (med[(b, v)], min(rates[(b, v)]),
                max(rates[(b, v)])), med[(b, "kolo")] / med[(b, v)], min(paired), max(paired)))
    lines += ["", "| batch/rank | setup | ms/step | forward | backward | optimizer step "
              "| rank 0 CPU ms/step |", "|---:|---|---:|---:|---:|---:|---:|"]
    for b in batches:
        for s in setups:
            runs = phases[(b, s)]
            cells = [statistics.median(r[k] for r in runs)
                     for k in ("step_ms", "forward_ms", "backward_ms", "opt_step_ms", "cpu_ms")]
            lines.append("| %d | %s | %s |" % (b, s, " | ".join("%.1f" % c for c in cells)))
    table = "\n".join(lines)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "steps": args.steps, "runs": {
                "%d/%s" % k: v for k, v in phases.items()}, "table": table}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", choices=["single", "nocomm", "kolo", "ddp"],
                   help="(internal) run one job")
    p.add_argument("--groups", type=int, default=0,
                   help="DistributedOptimizer groups= for the kolo setup (0: one per gradient)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--batches", default="16,64", help="batch sizes per rank")
    p.add_argument("--batch", type=int, default=16, help="(worker) batch size per rank")
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mlp-sizes", default="784,2048,2048,10")
    p.add_argument("--port", type=int, default=0, help="(worker) DDP's rendezvous port")
    p.add_argument("--bind", action="store_true",
                   help="bind every setup's ranks to cores of their own (kolo run --bind-to core; "
                   "the single process to one CPU)")
    p.add_argument("--kolo-also", metavar="VAR=VALUE",
                   help="also run kolo with this environment variable set, in the same rotation "
                   "(an A/B of a setting, e.g. GOMAXPROCS=2)")
    p.add_argument("--json", help="also write the raw rates here")
    args = p.parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
