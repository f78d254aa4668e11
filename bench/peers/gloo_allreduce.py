"""torch.distributed allreduce (Gloo, or NCCL with --backend nccl) timed like `kolo bench`. Started
once per rank by bench/compare.py with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set. With --device cuda rank r's tensors are on GPU r (modulo the GPUs there are); NCCL ranks that
share a GPU need NCCL_HOSTIDs of their own (scripts/nccl_hostid_python.sh), else NCCL refuses them."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def main():
    a = common.parse_args()
    torch.set_num_threads(1)
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = a.sizes
    res = common.measure(
        "allreduce", n, sizes, a.iters, a.warmup,
        make_buffer=lambda nb: torch.ones(max(nb // 4, 1), dtype=torch.float32, device=a.device),
        run_once=lambda t: dist.all_reduce(t),
        sync=torch.cuda.synchronize if a.device.startswith("cuda") else None,
        barrier=dist.barrier,
    )
    if rank == 0:
        common.write(a.json, "allreduce", n, a.iters, res)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
