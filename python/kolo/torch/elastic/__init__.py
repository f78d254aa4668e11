"""Elastic training for kolo.torch, as horovod.torch.elastic: hvd.elastic.run, TorchState and
ElasticSampler (see kolo.elastic for how a reset works, and docs/elastic.md)."""

from kolo._lib import HorovodInternalError, HostsUpdatedInterrupt, KoloInternalError  # noqa: F401
from kolo.elastic import ObjectState, State, run_fn  # noqa: F401
from kolo.torch.elastic.sampler import ElasticSampler  # noqa: F401
from kolo.torch.elastic.state import TorchState  # noqa: F401
from kolo.torch.mpi_ops import init, shutdown


def run(func):
    """Decorator for an elastic training function func(state, ...), whose first argument is a
    State (a TorchState, usually). The state is synced before func runs; when a collective fails
    (HorovodInternalError) the state goes back to its last commit, and when workers are added or
    removed (HostsUpdatedInterrupt, raised by state.commit()) it is kept; either way this worker
    leaves its world, joins the next, runs the state's reset callbacks, and calls func again.

    func must not start with a collective of its own: a newcomer could be running it while the
    survivors sync the state, and the two would wait on each other."""
    return run_fn(func, shutdown, init)


__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
