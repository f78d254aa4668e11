#!/usr/bin/env python3
"""Training throughput: kolo's DistributedOptimizer against torch DistributedDataParallel over Gloo
(or NCCL), side by side in one run, with a single process as the scaling baseline.

    python3 bench/ddp_compare.py --np 2 --batches 16,64 --repeats 3
    KOLO_PYTHON=$PWD/scripts/nccl_hostid_python.sh python3 bench/ddp_compare.py --model resnet50 \
        --device cuda --backend nccl --setups single,kolo,ddp --batches 32   # ranks sharing one GPU

Same model (MLP 784-2048-2048-10 by default: 23 MB of float32 gradients; --model resnet50: ResNet-50
on 224x224 images, 1000 classes, torchvision's if installed, else the same network defined here:
25.6 M parameters either way), same synthetic data, same SGD, one torch thread per rank
(OMP_NUM_THREADS=1). Each measurement is one fresh job: warm-up steps, then --steps timed steps
between two barriers on rank 0; samples/sec counts every rank's samples. The setups are run in
turn, --repeats times, so slow drift on a shared machine hits all of them alike; the table
reports the median and the range. On --device cuda each step ends with torch.cuda.synchronize()
(the phases are then host time: launching forward and backward, and the optimizer step's wait).

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
PY = os.environ.get("KOLO_PYTHON") or "/usr/bin/python3"  # KOLO_PYTHON: a Python with torch elsewhere

from compare import free_port  # noqa: E402  (bench/compare.py, beside this script)


def resnet50(torch):
    """ResNet-50 (He et al. 2015, v1.5: stride in the 3x3 convolution), torchvision's layout and
    initialization, 1000 classes; torchvision's own when it is installed."""
    try:
        import torchvision
        return torchvision.models.resnet50(), "torchvision.models.resnet50"
    except ImportError:
        pass
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + idt)

    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model, "ResNet-50 defined in bench/ddp_compare.py (torchvision absent)"


def build(args, torch):
    torch.manual_seed(1234)
    if args.model == "resnet50":
        model, args.model_name = resnet50(torch)
        x = torch.randn(args.batch, 3, args.image_size, args.image_size)
        y = torch.randint(0, 1000, (args.batch,))
        return model.to(args.device), x.to(args.device), y.to(args.device)
    sizes = [int(s) for s in args.mlp_sizes.split(",")]
    args.model_name = "MLP " + "-".join(map(str, sizes))
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.randn(args.batch, sizes[0])
    y = torch.randint(0, sizes[-1], (args.batch,))
    return model.to(args.device), x.to(args.device), y.to(args.device)


def worker(args):
    if args.bind and args.worker == "single":
        # The one-process baseline on one CPU, as kolo run --bind-to core places rank 0 when the
        # ranks fill the machine; set before torch starts threads, which inherit it.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank, size = 0, 1
    cuda = args.device == "cuda"
    if cuda:
        # Rank r on GPU r; ranks share GPUs where there are fewer GPUs than ranks.
        torch.cuda.set_device(int(os.environ.get("KOLO_LOCAL_RANK", "0")) % torch.cuda.device_count())
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
        dist.init_process_group(args.backend, init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=size)
        model, x, y = build(args, torch)
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.cuda.current_device()] if cuda else None)
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
        if cuda:
            torch.cuda.synchronize()
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
                                      "backward_ms": ms[1], "opt_step_ms": ms[2], "model": args.model_name,
                                      "parameters": sum(p.numel() for p in model.parameters()),
                                      "cpu_ms": 1000 * cpu / args.steps}), flush=True)
    if args.worker == "ddp":
        torch.distributed.destroy_process_group()


def measure(setup, args, batch):
    common = ["--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--mlp-sizes", args.mlp_sizes, "--groups", str(args.groups), "--model", args.model,
              "--image-size", str(args.image_size), "--device", args.device, "--backend", args.backend] + (
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
    last = ([ln for ln in p.stdout.splitlines() if ln.strip()] or ["no output"])[-1]
    raise RuntimeError("%s failed (exit %d): %s\n%s\n%s" % (setup, p.returncode, last[:300], " ".join(cmd),
                                                            p.stdout[-3000:]))


def driver(args):
    batches = [int(b) for b in args.batches.split(",")]
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    if args.kolo_also:
        setups.append("kolo+" + args.kolo_also)
    rates = {(b, s): [] for b in batches for s in setups}
    phases = {(b, s): [] for b in batches for s in setups}
    missing = {}  # setup -> why it has no figure (a failed job is reported, the others still run)
    model = None
    for r in range(args.repeats):
        for b in batches:
            # Rotate the order so no setup always runs first after the machine was idle.
            order = setups[r % len(setups):] + setups[:r % len(setups)]
            for s in order:
                if s in missing:
                    continue
                try:
                    res = measure(s, args, b)
                except Exception as e:
                    missing[s] = str(e)
                    print("repeat %d batch %d %s failed: %s" % (r, b, s, e), file=sys.stderr, flush=True)
                    continue
                model = model or "%s (%.1f M parameters)" % (res["model"], res["parameters"] / 1e6)
                rates[(b, s)].append(res["samples_per_sec"])
                print("repeat %d batch %d %-6s %7.1f samples/s (%.1f ms/step: forward %.1f, "
                      "backward %.1f, optimizer step %.1f; rank 0 CPU %.1f ms/step)"
                      % (r, b, s, res["samples_per_sec"], res["step_ms"], res["forward_ms"],
                         res["backward_ms"], res["opt_step_ms"], res["cpu_ms"]),
                      file=sys.stderr, flush=True)
                phases[(b, s)].append(res)
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    label = {"single": "1 process", "nocomm": "%d processes, no communication" % args.np,
             "kolo": "kolo DistributedOptimizer, %d ranks" % args.np,
             "ddp": "DDP (%s), %d ranks" % ({"gloo": "Gloo", "nccl": "NCCL"}[args.backend], args.np)}
    main = [s for s in ("single", "nocomm", "kolo", "ddp") if s in setups]
    both = "kolo" in setups and "ddp" in setups
    head = ("| batch/rank | " + " | ".join(label[s] for s in main) +
            (" | kolo / DDP (range over repeats)" if both else "") +
            (" | kolo scaling efficiency | DDP scaling efficiency" if "single" in setups else "") + " |")
    lines = ["model: %s on %s; samples/s: median (range over %d repeats)" % (model, args.device, args.repeats),
             head, "|" + "---:|" * (head.count("|") - 1)]

    def cell(b, s):
        v = rates[(b, s)]
        return "%.1f (%.1f-%.1f)" % (med[(b, s)], min(v), max(v)) if v else "-"

    def ratio(b, a, c):
        # Ratios within one repeat compare runs minutes apart, not a quiet one with a busy one.
        paired = [x / y for x, y in zip(rates[(b, a)], rates[(b, c)])]
        return "%.2fx (%.2f-%.2f)" % (med[(b, a)] / med[(b, c)], min(paired), max(paired)) if paired else "-"

    for b in batches:
        row = [str(b)] + [cell(b, s) for s in main]
        if both:
            row.append(ratio(b, "kolo", "ddp"))
        if "single" in setups:
            one = med.get((b, "single"))
            for s in ("kolo", "ddp"):
                v = med.get((b, s))
                row.append("%.2f" % (v / (args.np * one)) if v and one else "-")
        lines.append("| " + " | ".join(row) + " |")
    if args.kolo_also:
        v = "kolo+" + args.kolo_also
        lines += ["", "| batch/rank | kolo | kolo with %s | kolo / it (range over repeats) |" % args.kolo_also,
                  "|---:|---:|---:|---:|"]
        for b in batches:
            lines.append("| %d | %s | %s | %s |" % (b, cell(b, "kolo"), cell(b, v), ratio(b, "kolo", v)))
    lines += ["", "| batch/rank | setup | ms/step | forward | backward | optimizer step "
              "| rank 0 CPU ms/step |", "|---:|---|---:|---:|---:|---:|---:|"]
    for b in batches:
        for s in setups:
            runs = phases[(b, s)]
            if not runs:
                continue
            cells = [statistics.median(r[k] for r in runs)
                     for k in ("step_ms", "forward_ms", "backward_ms", "opt_step_ms", "cpu_ms")]
            lines.append("| %d | %s | %s |" % (b, s, " | ".join("%.1f" % c for c in cells)))
    for s, why in missing.items():
        lines.append("# %s: not measured: %s" % (s, why.splitlines()[0] if why else "failed"))
    table = "\n".join(lines)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "steps": args.steps, "model": model, "runs": {
                "%d/%s" % k: v for k, v in phases.items()}, "missing": missing, "table": table}, f, indent=1)
    return 1 if missing else 0


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
    p.add_argument("--model", default="mlp", choices=("mlp", "resnet50"),
                   help="mlp (--mlp-sizes) or resnet50 (torchvision's, else defined here; --image-size)")
    p.add_argument("--image-size", type=int, default=224, help="resnet50's input images: N x N")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model and data live")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="DDP's torch.distributed backend")
    p.add_argument("--setups", default="single,nocomm,kolo,ddp",
                   help="which setups to run, of single, nocomm, kolo, ddp (default: all)")
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
        return worker(args)
    for s in args.setups.split(","):
        if s.strip() not in ("single", "nocomm", "kolo", "ddp", ""):
            p.error("unknown setup %r (want single, nocomm, kolo, ddp)" % s)
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
