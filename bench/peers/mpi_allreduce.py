"""OpenMPI (mpi4py) allreduce on numpy float32 buffers, timed like `kolo bench`. Run under
mpirun by bench/compare.py."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def main():
    a = common.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    sizes = a.sizes
    out = {}

    def make(nb):
        buf = np.ones(max(nb // 4, 1), dtype=np.float32)
        out["r"] = np.empty_like(buf)
        return buf

    res = common.measure(
        "allreduce", n, sizes, a.iters, a.warmup,
        make_buffer=make,
        run_once=lambda b: comm.Allreduce(b, out["r"], op=MPI.SUM),
        barrier=comm.Barrier,
    )
    if rank == 0:
        common.write(a.json, "allreduce", n, a.iters, res)


if __name__ == "__main__":
    main()
