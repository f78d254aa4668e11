#!/usr/bin/env python3
"""TensorFlow training throughput: kolo.tensorflow against tf.distribute.MultiWorkerMirroredStrategy,
side by side in one run, with one process as the scaling baseline.

    .venv/tf/bin/python bench/tf_compare.py --np 2 --repeats 3
    .venv/tf/bin/python bench/tf_compare.py --model MobileNetV2 --image-size 96 --batch 16

The step is Horovod's tensorflow2_synthetic_benchmark.py's: a keras.applications model (or the
default small CNN), synthetic images and labels, SGD, the step in tf.function. kolo wraps the tape
in hvd.DistributedGradientTape and runs under `kolo run -np N`; MultiWorkerMirroredStrategy runs N
worker processes on loopback (TF_CONFIG, its ring collectives over gRPC) with the same per-worker
batch, so both average the same gradients. Every process gets the same number of TensorFlow threads
(--threads, default: the CPUs divided among the workers). Each measurement is one fresh job:
warm-up steps, then --steps timed steps; img/s counts every worker's images. The setups run in
turn, --repeats times, so slow drift on a shared machine hits all of them alike; the table gives
the median and the range, and each setup's ratio to kolo's median.

With --horovod-python PY (an interpreter whose TensorFlow has Horovod 0.28.1 built in, its
horovodrun beside it) the setup horovod runs the same step with `import horovod.tensorflow as hvd`
under `horovodrun --gloo`; run this script with the same TensorFlow (e.g. .venv/tf-oldest for
TensorFlow 2.12) so that only the data-parallel layer differs.

Worker mode (what the jobs run): --worker single|kolo|mwms|horovod.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KOLO = os.path.join(ROOT, "bin", "kolo")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(tf, name, image_size):
    if name == "cnn":
        # A small CNN (about 1.2 M parameters, 4.7 MB of float32 gradients): a step whose
        # communication is a visible share of its time on a small CPU machine.
        return tf.keras.Sequential([
            tf.keras.layers.Input((image_size, image_size, 3)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(1000, activation="softmax"),
        ])
    from tensorflow.keras import applications
    return getattr(applications, name)(weights=None, input_shape=(image_size, image_size, 3))


def worker(args):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.random.set_seed(1)

    if args.worker in ("kolo", "horovod"):
        if args.worker == "kolo":
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import kolo.tensorflow as hvd
        else:
            import horovod.tensorflow as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif args.worker == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        size = strategy.num_replicas_in_sync
    else:
        rank, size = 0, 1

    data = tf.random.uniform([args.batch, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch, 1], minval=0, maxval=999, dtype=tf.int64)

    if args.worker == "mwms":
        with strategy.scope():
            model = build_model(tf, args.model, args.image_size)
            opt = tf.keras.optimizers.SGD(0.01)

        def replica_step():
            with tf.GradientTape() as tape:
                probs = model(data, training=True)
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, probs))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces, averaging

        @tf.function
        def step():
            strategy.run(replica_step)
    else:
        model = build_model(tf, args.model, args.image_size)
        opt = tf.keras.optimizers.SGD(0.01)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                probs = model(data, training=True)
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, probs))
            if args.worker in ("kolo", "horovod"):
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        if args.worker in ("kolo", "horovod"):
            step()
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    for _ in range(args.warmup):
        step()
    barrier(args.worker, tf, locals())
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    barrier(args.worker, tf, locals())
    took = time.perf_counter() - t0
    if rank == 0:
        params = sum(int(tf.size(v)) for v in model.trainable_variables)
        print("RESULT " + json.dumps({"img_s": args.batch * args.steps * size / took, "params": params}), flush=True)


def barrier(kind, tf, scope):
    """Every worker has finished its steps: kolo's barrier, or a small all-reduce through the strategy."""
    if kind == "kolo":
        import kolo.tensorflow as hvd
        hvd.barrier()
    elif kind == "horovod":
        import horovod.tensorflow as hvd
        hvd.allreduce(tf.constant(1.0), name="barrier")
    elif kind == "mwms":
        strategy = scope["strategy"]
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)


def run_setup(args, setup):
    base = [sys.executable, os.path.abspath(__file__), "--worker", setup, "--model", args.model,
            "--image-size", str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    if setup == "single":
        procs = [subprocess.Popen(base, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    elif setup == "kolo":
        procs = [subprocess.Popen([KOLO, "run", "-np", str(args.np), "--oversubscribe"] + base, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    elif setup == "horovod":
        py = args.horovod_python
        run = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", str(args.np), "-H", "localhost:%d" % args.np,
               "--gloo", py] + base[1:]
        procs = [subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    else:
        ports = [free_port() for _ in range(args.np)]
        procs = []
        for i in range(args.np):
            tf_config = {"cluster": {"worker": ["127.0.0.1:%d" % p for p in ports]}, "task": {"type": "worker", "index": i}}
            procs.append(subprocess.Popen(base, env=dict(env, TF_CONFIG=json.dumps(tf_config)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit("%s: no result within %d s" % (setup, args.timeout))
        outs.append(out)
        if p.returncode != 0:
            raise SystemExit("%s failed (exit %d):\n%s" % (setup, p.returncode, out[-3000:]))
    for out in outs:
        for line in out.splitlines():
            if "RESULT " in line:
                return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit("%s printed no result:\n%s" % (setup, "\n".join(o[-2000:] for o in outs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=["single", "kolo", "mwms", "horovod"])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--model", default="cnn", help="cnn, or a keras.applications name (ResNet50, MobileNetV2, ...)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="images per worker and step")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="TensorFlow threads per process (default: CPUs / np)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--setups", default="single,kolo,mwms")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--horovod-python", help="an interpreter with Horovod built for its TensorFlow: adds the setup horovod")
    args = ap.parse_args()
    if args.horovod_python and args.setups == ap.get_default("setups"):
        args.setups += ",horovod"
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // max(1, args.np))
    if args.worker:
        worker(args)
        return

    setups = args.setups.split(",")
    rates = {s: [] for s in setups}
    params = None
    for r in range(args.repeats):
        for s in setups:
            res = run_setup(args, s)
            rates[s].append(res["img_s"])
            params = res["params"]
            print("repeat %d %-6s %8.1f img/s" % (r + 1, s, res["img_s"]), file=sys.stderr, flush=True)

    import tensorflow as tf
    print("model %s, %s parameters, %dx%d images, batch %d per worker, %d steps after %d warm-up, "
          "%d TensorFlow threads per process, %d CPUs, TensorFlow %s; %d repeats, setups alternated"
          % (args.model, format(params, ","), args.image_size, args.image_size, args.batch, args.steps,
             args.warmup, args.threads, os.cpu_count(), tf.__version__, args.repeats))
    print()
    print("| setup | workers | img/s median | range | vs kolo |")
    print("|---|---|---|---|---|")
    ref = statistics.median(rates["kolo"]) if "kolo" in rates else None
    names = {"single": "one process", "kolo": "kolo.tensorflow (kolo run)", "mwms": "MultiWorkerMirroredStrategy",
             "horovod": "Horovod 0.28.1 (horovodrun --gloo)"}
    for s in setups:
        med = statistics.median(rates[s])
        ratio = "%.2fx" % (med / ref) if ref else "-"
        print("| %s | %d | %.1f | %.1f-%.1f | %s |" % (names[s], 1 if s == "single" else args.np, med,
                                                     min(rates[s]), max(rates[s]), ratio))


if __name__ == "__main__":
    main()
