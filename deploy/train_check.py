#!/usr/bin/env python3
"""Runs examples/pytorch_mnist.py unchanged and then prints what the deployment tests check.

    kolo run ... python3 deploy/train_check.py [--example PATH] [example flags...]

Every rank prints, after training, one line

    kolo-check rank=R size=N params=<sha256 of every parameter's bytes, in order>

so a test can see that all ranks end with bit-identical parameters, and rank 0's "loss" lines (the
example prints them every --log-interval steps) show whether the loss fell. The model is found by
wrapping the example's Net class: the example itself stays what users run.
"""

import hashlib
import importlib.util
import os
import sys


def load_example(path):
    spec = importlib.util.spec_from_file_location("pytorch_mnist", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    argv = sys.argv[1:]
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                           "pytorch_mnist.py")
    if argv[:1] == ["--example"]:
        example, argv = argv[1], argv[2:]
    ex = load_example(example)

    models = []

    class RecordedNet(ex.Net):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            models.append(self)

    ex.Net = RecordedNet
    sys.argv = [example] + argv
    rc = ex.main()
    if len(models) != 1:
        print("kolo-check: expected the example to build one model, it built %d" % len(models),
              file=sys.stderr)
        return 1
    h = hashlib.sha256()
    for name, p in models[0].named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    hvd = ex.hvd
    print("kolo-check rank=%d size=%d params=%s" % (hvd.rank(), hvd.size(), h.hexdigest()),
          flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
