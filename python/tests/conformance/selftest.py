"""Cases that fail on purpose, for test_conformance's check of the runner itself (not in
runner.MODULES): a failure on one rank is reported with that rank only, an exception on one rank
while the others wait in a collective costs the stall deadline and is reported, an xfail case is
reported as such, the job still works after them, and a case that hangs on one rank ends the job
at its deadline with that rank's stack."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance.case import case


@case()
def passes(ctx):
    ctx.check(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == ctx.size, "allreduce")


@case()
def fails_on_the_last_rank(ctx):
    ctx.check(ctx.rank != ctx.size - 1, "deliberate failure on the last rank")


@case()
def raises_on_rank_0_while_the_others_wait(ctx):
    if ctx.rank == 0:
        raise RuntimeError("deliberate exception on rank 0")
    hvd.allreduce(torch.ones(1), name="selftest.waits")  # rank 0 never submits it


@case(xfail="deliberate")
def expected_to_fail(ctx):
    ctx.check(False, "deliberate failure of an xfail case")


@case()
def the_job_goes_on(ctx):
    ctx.next_op_works("the failed cases", stop=False)


@case(deadline=2)
def hangs_on_rank_1(ctx):
    if ctx.rank == 1:
        time.sleep(60)


@case()
def never_runs(ctx):
    pass
