"""Elastic training's framework-neutral half, as horovod.common.elastic: the State a training
function carries across resets, ObjectState for plain Python values, and run_fn, the loop that
hvd.elastic.run wraps around the training function.

A reset is Horovod's: the engine leaves the world (shutdown) and joins the next one (init), which
in an elastic `kolo run` job waits at the rendezvous for the next round that has this worker.
What starts a reset:

* KoloInternalError (HorovodInternalError): a collective failed, a rank was lost. The state goes
  back to the last commit (restore), and after the reset it is synced, since the new world may
  hold workers that have none.
* HostsUpdatedInterrupt: the launcher published a new round (workers added or removed).
  check_host_updates, which every commit runs, raises it on every rank at the same commit; the
  state is the one just committed, so nothing is restored, and a round that only removed workers
  skips the sync.

Nothing here knows tensors: kolo.torch.elastic supplies the broadcast and the torch state.
"""

import collections
import functools
import queue

from kolo import _lib
from kolo._lib import HorovodInternalError, HostsUpdatedInterrupt, KoloInternalError  # noqa: F401


class RoundNotices(object):
    """What Horovod's State._host_messages queue is for kolo: the notices of rounds newer than
    this worker's, each (round, removal_only). empty() and get() ask the engine first
    (kolo_elastic_update), so a script that polls empty() (as Horovod's elastic test does) sees a
    round as soon as the launcher publishes it; put() adds a notice by hand (Horovod's
    on_hosts_updated), which is how tests fake one. Outside an initialized elastic job the engine
    reports nothing."""

    def __init__(self):
        self._notices = collections.deque()
        self._newest_polled = 0

    def put(self, notice):
        self._notices.append(notice)

    def empty(self):
        self._poll()
        return not self._notices

    def get(self, block=False):
        self._poll()
        if not self._notices:
            raise queue.Empty()
        return self._notices.popleft()

    def _poll(self):
        if not _lib.is_initialized() or _lib._forked():
            return
        try:
            update = _lib.elastic_update()
        except ValueError:  # the engine is gone: the next collective says why
            return
        if update is not None and update[0] > self._newest_polled:
            self._newest_polled = update[0]
            self._notices.append(update)


class State(object):
    """State that a training function keeps across the resets of an elastic job.

    bcast_object(obj) returns rank 0's obj on every rank; get_rank() is this worker's rank.
    Subclasses say how to save, restore and sync their values.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = RoundNotices()
        # The newest round this worker acted on (Horovod's name: its driver numbered updates by
        # timestamp). Scripts may set it to 0 to act on any round newer than the worker's.
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions to call, in order, after every reset (before the state is synced): to
        rescale the learning rate to the new size, for example."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = RoundNotices()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, removal_only):
        """Notes that round `timestamp` was published; the next check_host_updates acts on it."""
        self._host_messages.put((timestamp, removal_only))

    def commit(self):
        """Saves the state (save), then raises HostsUpdatedInterrupt on every rank if the
        launcher published a new round (check_host_updates). Commits are what a failure rolls
        back to: commit as often as losing the batches since the last one costs more than the
        commit itself."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt if the launcher published a round newer than the last one
        acted on, on every rank at the same call: rank 0's view decides (a broadcast), since ranks
        learn of a round at slightly different times. Its skip_sync is set when every new round
        only removed workers."""
        prev = newest = self._last_updated_timestamp
        removal_only = True
        while not self._host_messages.empty():
            rnd, removal = self._host_messages.get()
            if rnd > prev:
                newest = max(newest, rnd)
                removal_only = removal_only and bool(removal)
        prev, self._last_updated_timestamp, removal_only = self._bcast_object(
            (prev, newest, removal_only))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(removal_only)

    def save(self):
        """Saves the state in host memory (what restore goes back to)."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last saved state, dropping changes made since."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state the same (rank 0's)."""
        raise NotImplementedError()

    def reset(self):
        """Adapts to the new world after a reset, before callbacks and sync."""
        pass


class ObjectState(State):
    """State of plain Python values, given as keyword arguments and kept as attributes.

    As in Horovod, save keeps references, not copies: rebind an attribute (state.epoch += 1)
    rather than mutating a saved object in place, or restore will not undo the change.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def run_fn(func, shutdown, init, take_error=None):
    """Wraps func(state, ...) in Horovod's elastic loop: sync the state, run func; on
    HorovodInternalError restore the last commit, on HostsUpdatedInterrupt keep the state; then
    leave this world (the binding's shutdown; an engine that had already failed is gone either
    way), join the next (init), state.on_reset(), and again. func's return value is returned; any
    other exception propagates.

    take_error is for a binding whose failed collective can reach the caller as the framework's
    own exception (TensorFlow's OpError out of a graph, JAX's runtime error out of a compiled
    step): it returns and forgets the kolo error the failed op left, or None. Such an exception
    counts as that kolo error; one no kolo op left propagates, as the script's own."""

    def call(state, *args, **kwargs):
        if take_error is None:
            return func(state, *args, **kwargs)
        take_error()  # one left from before belongs to no call of func
        try:
            return func(state, *args, **kwargs)
        except (HorovodInternalError, HostsUpdatedInterrupt):
            raise
        except Exception as e:
            err = take_error()
            if err is None:
                raise
            raise err from e

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return call(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            try:
                shutdown()
            except KoloInternalError:
                pass
            init()
            state.on_reset()

    return wrapper
