#!/usr/bin/env python3
"""Allreduce latency from Python: kolo.torch called each way a script calls it (--forms:
hvd.allreduce_, allreduce_async then synchronize, hvd.allreduce named and unnamed, and hvd.allreduce
of a tensor that requires a gradient, through the autograd Function) side by side with
torch.distributed on Gloo (and on NCCL, --peers), and kolo's Go API (`kolo bench`) as the floor the
binding adds to. Same machine, same sizes, one run, one table.

    make build lib && /usr/bin/python3 bench/python_latency.py --np 2 --sizes 4 --rounds 3
    KOLO_PYTHON=python3 python3 bench/python_latency.py --device cuda --sizes 4,4MiB,64MiB  # a GPU machine
    KOLO_PYTHON=$PWD/scripts/nccl_hostid_python.sh python3 bench/python_latency.py --device cuda \
        --forms allreduce_ --peers nccl,gloo --sizes 4,4MiB,64MiB   # ranks sharing one GPU (NCCL_HOSTID)

Each round runs every peer once (in turn, so that machine noise hits them alike) and takes the
median per-op wall time of --iters ops after warm-up; the table shows, per peer, the median over
rounds and the best round (on a shared machine, the best round is the one other work disturbed
least). Float32 sum, warm buffers. A second table gives kolo.torch's op time over each peer's
(below 1: kolo is faster), the median of the rounds' ratios and their range.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import compare  # noqa: E402  (run, bench_gloo, human, env_setting, MALLOC_ENV, PY)

KOLO = os.path.join(ROOT, "bin", "kolo")

# The peer's --form values, as the table names them.
FORMS = {
    "allreduce_": "hvd.allreduce_(t, name=...)",
    "async+sync": "hvd.synchronize(hvd.allreduce_async(t, name=...))",
    "allreduce": "hvd.allreduce(t, name=...)",
    "unnamed": "hvd.allreduce(t)",
    "grad": "hvd.allreduce(t, name=...) of a tensor that requires a gradient",
}


def bench_kolo_torch(args, out, form, extra=None):
    env = {"PYTHONPATH": os.path.join(ROOT, "python"), "OMP_NUM_THREADS": "1", "KOLO_OVERSUBSCRIBE": "1"}
    env.update(extra or {})
    compare.run([KOLO, "run", "-np", str(args.np), compare.PY, os.path.join(HERE, "peers", "kolo_torch_allreduce.py"),
                 "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", out,
                 "--device", args.device, "--form", form], env=env)


def bench_kolo_go(args, out):
    compare.run([KOLO, "bench", "allreduce", "-np", str(args.np), "--sizes", args.sizes,
                 "--iters", str(args.iters), "--warmup", str(args.warmup), "--json", out])


def table(hdr, rows):
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    print("  ".join(h.rjust(w) for h, w in zip(hdr, widths)))
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", default="4")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the per-round medians as JSON here")
    p.add_argument("--device", default="cpu",
                   help="where kolo.torch's and Gloo's tensors live: cuda times a GPU tensor's op until its "
                        "result is back on the GPU (torch.cuda.synchronize), every rank on the same GPU; "
                        "kolo Go stays in host memory, the floor the staging adds to")
    p.add_argument("--kolo-env", metavar="VAR=VALUE",
                   help="also run kolo.torch's first form with this variable set, as a peer of its own (alternated "
                        "with the others), to compare a setting: e.g. KOLO_CUDA_PINNED=0")
    p.add_argument("--peers", default="gloo,go",
                   help="the peers beside kolo.torch: gloo and nccl (torch.distributed on that backend, tensors on "
                        "--device), go (kolo bench, host memory); default gloo,go")
    p.add_argument("--forms", default=",".join(FORMS),
                   help="the ways to call kolo.torch's allreduce, each a peer: %s (default: all)"
                        % ", ".join("%s (%s)" % kv for kv in FORMS.items()))
    args = p.parse_args()
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    for f in forms:
        if f not in FORMS:
            p.error("unknown form %r (want %s)" % (f, ", ".join(FORMS)))

    others = {"gloo": ("gloo", compare.bench_gloo),
              "nccl": ("nccl", lambda a, o: compare.bench_gloo(a, o, backend="nccl")),
              "go": ("kolo Go", bench_kolo_go)}
    wanted = [x.strip() for x in args.peers.split(",") if x.strip()]
    for x in wanted:
        if x not in others:
            p.error("unknown peer %r (want %s)" % (x, ", ".join(others)))
    if "nccl" in wanted and args.device == "cpu":
        p.error("the nccl peer needs --device cuda")
    peers = [("kolo.torch " + f, lambda a, o, f=f: bench_kolo_torch(a, o, f)) for f in forms]
    peers += [others[x] for x in wanted]
    first = peers[0][0]
    if args.kolo_env:
        env = compare.env_setting(p, args.kolo_env)
        peers.insert(len(forms), ("%s %s" % (first, args.kolo_env), lambda a, o: bench_kolo_torch(a, o, forms[0], env)))
    rounds = {name: {} for name, _ in peers}  # name -> bytes -> [median per round]
    missing = {}
    tmp = tempfile.mkdtemp(prefix="kolo-pylat-")
    for rnd in range(args.rounds):
        # Each round starts with the next peer, so that no peer always runs right after the same one.
        for name, fn in peers[rnd % len(peers):] + peers[:rnd % len(peers)]:
            if name in missing:
                continue
            out = os.path.join(tmp, "%s-%d.json" % (re.sub(r"[^\w.=-]", "_", name), rnd))
            try:
                fn(args, out)
                with open(out) as f:
                    for r in json.load(f)["results"]:
                        rounds[name].setdefault(r["bytes"], []).append(r["median_us"])
            except Exception as e:  # a missing peer is reported, the others still run
                missing[name] = str(e).splitlines()[0] if str(e) else type(e).__name__

    def med(name, nbytes):
        v = rounds.get(name, {}).get(nbytes)
        return statistics.median(v) if v else None

    def best(name, nbytes):
        v = rounds[name].get(nbytes)
        return min(v) if v else None

    names = [name for name, _ in peers]
    with_go = "kolo Go" in names
    print("# allreduce float32 sum from Python, np=%d, tensors on %s, median per op of %d ops; median and best "
          "of %d rounds%s" % (args.np, args.device, args.iters, args.rounds,
                              "; binding cost: %s minus kolo Go" % first if with_go else ""))
    short = lambda name: name[len("kolo.torch "):] if name.startswith("kolo.torch ") else name  # noqa: E731
    cost = ["binding cost us" if args.device == "cpu" else "binding + staging us"] if with_go else []
    hdr = ["size"] + ["%s us" % short(n) for n in names] + cost + ["best: %s" % short(names[0])] + \
        [short(n) for n in names[1:]]
    rows = []
    fmt = lambda x: "%.1f" % x if x else "-"  # noqa: E731
    sizes = sorted(set(b for n in names for b in rounds[n]))
    for nbytes in sizes:
        go = med("kolo Go", nbytes)
        k = med(first, nbytes)
        rows.append([compare.human(nbytes)] + [fmt(med(n, nbytes)) for n in names] +
                    (["%.1f" % (k - go) if k and go else "-"] if with_go else []) +
                    [fmt(best(n, nbytes)) for n in names])
    table(hdr, rows)
    # Each round's ratio pairs runs made minutes apart at most, in the same state of the machine.
    print("# op time ratio %s / peer (below 1: kolo.torch is faster): median of the rounds' ratios (range); "
          "each side's range over the rounds in us" % first)
    hdr = ["size"] + ["/ %s" % short(n) for n in names[1:]] + ["%s range" % short(n) for n in names]
    rows = []
    for nbytes in sizes:
        row = [compare.human(nbytes)]
        for n in names[1:]:
            pairs = [k / o for k, o in zip(rounds[first].get(nbytes, []), rounds[n].get(nbytes, [])) if o]
            row.append("%.2fx (%.2f-%.2f)" % (statistics.median(pairs), min(pairs), max(pairs)) if pairs else "-")
        for n in names:
            v = rounds[n].get(nbytes)
            row.append("%.1f-%.1f" % (min(v), max(v)) if v else "-")
        rows.append(row)
    table(hdr, rows)
    for name in rounds:
        for nbytes, v in sorted(rounds[name].items()):
            print("# %s %s per round: %s" % (name, compare.human(nbytes), " ".join("%.1f" % x for x in v)))
    for name, why in missing.items():
        print("# %s: not measured: %s" % (name, why))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "rounds": rounds, "missing": missing}, f, indent=2)
    return 0 if rounds[first] else 1


if __name__ == "__main__":
    sys.exit(main())
