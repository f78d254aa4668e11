#!/usr/bin/env python3
"""Allreduce latency from TensorFlow against kolo.torch: the same 2-rank job size, the same sizes,
alternated in one run, one table.

    make build lib && .venv/tf/bin/python bench/tf_latency.py --np 2 --sizes 4,4MiB --rounds 3

Forms: kolo.tensorflow's hvd.allreduce called eagerly, and inside a tf.function; kolo.torch's
hvd.allreduce (Debian's /usr/bin/python3 with torch, or KOLO_PYTHON). Each round runs every
form once as a fresh `kolo run -np N` job, in turn, so machine noise hits them alike; a job times
--iters named Sum allreduces of float32 after --warmup, and reports the median per-op wall time on
rank 0. The table gives each form's median over rounds, its range, and its ratio to kolo.torch's
(the issue's target: within 2x).

With --horovod-python PY (an interpreter whose TensorFlow has Horovod 0.28.1 built in, and its
horovodrun beside it), the forms hvd-eager and hvd-function run the same calls with
`import horovod.tensorflow as hvd` under `horovodrun --gloo`: Horovod's compiled op beside
kolo's. Compare kolo there with the same TensorFlow (run this script with that TensorFlow's
interpreter, e.g. .venv/tf-oldest for TensorFlow 2.12).

The forms tf-eager-floor and tf-function-floor time the same loop with no collective in it (an
eager `x + 1`, and a tf.function returning `x + 1`): TensorFlow's own cost per call on the same
machine and load, the floor under any op reached from TensorFlow.

Worker mode (what the jobs run): --worker FORM, one of FORMS.
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
KOLO = os.path.join(ROOT, "bin", "kolo")
TORCH_PY = os.environ.get("KOLO_PYTHON", "/usr/bin/python3")


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def human(n):
    for u, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, u)
    return "%d B" % n


def worker(args):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    n = max(1, args.bytes // 4)
    times = []
    if args.worker == "torch":
        import torch
        import kolo.torch as hvd
        hvd.init()
        t = torch.ones(n)

        def op(i):
            hvd.allreduce(t, op=hvd.Sum, name="lat")
    else:
        import tensorflow as tf
        if args.worker.startswith("hvd-"):
            import horovod.tensorflow as hvd
        else:
            import kolo.tensorflow as hvd
        hvd.init()
        t = tf.ones([n])
        if args.worker == "tf-eager-floor":
            def op(i):
                return t + 1
        elif args.worker == "tf-function-floor":
            @tf.function
            def fn(x):
                return x + 1

            def op(i):
                fn(t)
        elif args.worker in ("tf-eager", "hvd-eager"):
            def op(i):
                hvd.allreduce(t, op=hvd.Sum, name="lat")
        else:
            @tf.function
            def fn(x):
                return hvd.allreduce(x, op=hvd.Sum, name="lat")

            def op(i):
                fn(t)
    for i in range(args.warmup):
        op(i)
    for i in range(args.iters):
        t0 = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"median_s": statistics.median(times)}), flush=True)
    hvd.shutdown()


def run(args, form, nbytes):
    py = TORCH_PY if form == "torch" else sys.executable
    launch = [KOLO, "run", "-np", str(args.np), "--oversubscribe"]
    if form.startswith("hvd-"):
        py = args.horovod_python
        launch = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", str(args.np), "-H",
                  "localhost:%d" % args.np, "--gloo"]
    cmd = launch + [py, os.path.abspath(__file__), "--worker", form,
                    "--bytes", str(nbytes), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit("%s at %s failed (exit %d):\n%s" % (form, human(nbytes), p.returncode, p.stdout[-3000:]))
    for line in p.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])["median_s"]
    raise SystemExit("%s printed no result:\n%s" % (form, p.stdout[-3000:]))


FORMS = ["tf-eager-floor", "tf-eager", "tf-function-floor", "tf-function", "torch", "hvd-eager", "hvd-function"]


def fmt(s):
    return "%.0f µs" % (s * 1e6) if s < 1e-3 else "%.2f ms" % (s * 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=FORMS)
    ap.add_argument("--bytes", type=int, default=4)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes", default="4,4MiB")
    ap.add_argument("--forms", default="tf-eager-floor,tf-eager,tf-function-floor,tf-function,torch",
                    help="comma-separated, of " + ",".join(FORMS))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--horovod-python", help="an interpreter with Horovod built for its TensorFlow: adds the forms "
                                              "hvd-eager and hvd-function")
    args = ap.parse_args()
    if args.horovod_python and args.forms == ap.get_default("forms"):
        args.forms += ",hvd-eager,hvd-function"
    if args.worker:
        worker(args)
        return
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        ap.error("unknown form(s) %s: the forms are %s" % (",".join(unknown), ",".join(FORMS)))
    res = {(f, s): [] for f in forms for s in sizes}
    for r in range(args.rounds):
        for s in sizes:
            for f in forms:
                res[(f, s)].append(run(args, f, s))
                print("round %d %-12s %8s %s" % (r + 1, f, human(s), fmt(res[(f, s)][-1])), file=sys.stderr, flush=True)
    import tensorflow as tf
    print("%d ranks, named Sum allreduce of float32, median per-op time of %d ops after %d warm-up per job, "
          "%d rounds alternated, %d CPUs, TensorFlow %s" % (args.np, args.iters, args.warmup, args.rounds,
                                                          os.cpu_count(), tf.__version__))
    print()
    print("| form | size | median | range | vs kolo.torch |")
    print("|---|---|---|---|---|")
    names = {"tf-eager-floor": "TensorFlow alone, eager `x + 1`",
             "tf-function-floor": "TensorFlow alone, tf.function `x + 1`", "tf-eager": "kolo.tensorflow, eager", "tf-function": "kolo.tensorflow, tf.function",
             "torch": "kolo.torch", "hvd-eager": "Horovod 0.28.1, eager", "hvd-function": "Horovod 0.28.1, tf.function"}
    for s in sizes:
        for f in forms:
            v = res[(f, s)]
            ratio = "-"
            if "torch" in forms:
                rs = [a / b for a, b in zip(v, res[("torch", s)])]
                ratio = "%.1fx (%.1f-%.1f)" % (statistics.median(rs), min(rs), max(rs))
            print("| %s | %s | %s | %s-%s | %s |" % (names[f], human(s), fmt(statistics.median(v)), fmt(min(v)),
                                                    fmt(max(v)), ratio))


if __name__ == "__main__":
    main()
