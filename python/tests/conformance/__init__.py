"""kolo.torch's conformance suite: horovod.torch's contract, case by case, on every rank of one job.

One module per API area (allreduce.py, grouped.py, ..., errors.py) holds plain functions marked
with case.case; runner.py runs every case of every module, in the same order on every rank, inside
one `kolo run -np N` job, and prints a machine-readable report that ../test_conformance.py turns
into pytest results (at 2 and 3 ranks). Run a part of it by hand:

    make build lib
    KOLO_STALL_CROSSED_TIME_SECONDS=3 PYTHONPATH=python bin/kolo run -np 3 /usr/bin/python3 \\
        python/tests/conformance/runner.py allreduce errors.duplicate_name_in_flight

KOLO_TEST_DEVICE=cuda runs every case on CUDA tensors (device.py; default cpu).

Nothing here may import kolo or torch at module level except the case modules themselves (the
pytest side imports runner.py for its list of modules).
"""
