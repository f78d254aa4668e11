"""kolo.torch (the Python binding) allreduce timed like `kolo bench`, on a float32 tensor from Python,
in one of the ways a script calls it (--form, FORMS). Started by bench/python_latency.py under
`kolo run`."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "python"))
import common  # noqa: E402
import kolo.torch as hvd  # noqa: E402

# How a script calls allreduce: in place, async then synchronize, out of place, out of place
# unnamed, and out of place on a tensor that requires a gradient (through the autograd Function).
FORMS = {
    "allreduce_": lambda t: hvd.allreduce_(t, op=hvd.Sum, name="bench"),
    "async+sync": lambda t: hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum, name="bench")),
    "allreduce": lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench"),
    "unnamed": lambda t: hvd.allreduce(t, op=hvd.Sum),
    "grad": lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench"),
}


def main():
    a = common.parse_args(form=("allreduce_", sorted(FORMS)))
    torch.set_num_threads(1)
    if a.device == "cuda":  # rank r on GPU r, as the peers, before kolo starts
        torch.cuda.set_device(int(os.environ.get("KOLO_LOCAL_RANK", "0")) % torch.cuda.device_count())
    hvd.init()
    sizes = a.sizes
    res = common.measure(
        "allreduce", hvd.size(), sizes, a.iters, a.warmup,
        make_buffer=lambda nb: torch.ones(max(nb // 4, 1), dtype=torch.float32, device=a.device,
                                          requires_grad=a.form == "grad"),
        run_once=FORMS[a.form],
        sync=torch.cuda.synchronize if a.device.startswith("cuda") else None,
        barrier=hvd.barrier,
    )
    if hvd.rank() == 0:
        common.write(a.json, "allreduce", hvd.size(), a.iters, res)
    hvd.shutdown()


if __name__ == "__main__":
    main()
