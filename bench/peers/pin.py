#!/usr/bin/env python3
"""Runs a command pinned to one CPU chosen by the local rank: `pin.py CPUS CMD...`, where CPUS is a
comma-separated CPU per local rank (0,0,0,1: local ranks 0-2 on CPU 0, 3 on CPU 1). The local rank
comes from kolo run's KOLO_LOCAL_RANK or mpirun's OMPI_COMM_WORLD_LOCAL_RANK. bench/small_ops.py
--placements uses it to put both peers' ranks on the vCPUs the same way."""
import os
import sys


def main():
    cpus = [int(c) for c in sys.argv[1].split(",")]
    rank = os.environ.get("KOLO_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"))
    if rank is None:
        sys.exit("pin.py: no local rank in the environment (KOLO_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK)")
    if int(rank) >= len(cpus):
        sys.exit(f"pin.py: local rank {rank} has no CPU in {sys.argv[1]}")
    os.sched_setaffinity(0, {cpus[int(rank)]})  # inherited by the command and every thread it starts
    os.execvp(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
