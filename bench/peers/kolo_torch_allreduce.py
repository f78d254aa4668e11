"""kolo.torch (the Python binding) allreduce timed like `kolo bench`: hvd.allreduce_ on a float32
tensor, in place, from Python. Started by bench/python_latency.py under `kolo run`."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "python"))
import common  # noqa: E402
import kolo.torch as hvd  # noqa: E402


def main():
    a = common.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    sizes = a.sizes
    res = common.measure(
        "allreduce", hvd.size(), sizes, a.iters, a.warmup,
        make_buffer=lambda nb: torch.ones(max(nb // 4, 1), dtype=torch.float32, device=a.device),
        run_once=lambda t: hvd.allreduce_(t, op=hvd.Sum, name="bench"),
        sync=torch.cuda.synchronize if a.device.startswith("cuda") else None,
        barrier=hvd.barrier,
    )
    if hvd.rank() == 0:
        common.write(a.json, "allreduce", hvd.size(), a.iters, res)
    hvd.shutdown()


if __name__ == "__main__":
    main()
