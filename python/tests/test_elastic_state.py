"""hvd.elastic's state, sampler and run loop (kolo.elastic, kolo.torch.elastic), in one process:
hvd.init() without a launcher is a world of one rank. One test runs 3 ranks under `kolo run` (a
plain job, not elastic) to check the sync from several survivors.

    make lib && PYTHONPATH=python /usr/bin/python3 -m pytest -q python/tests/test_elastic_state.py
"""

import copy
import os
import random
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))  # as `make test-python` runs it: no PYTHONPATH

import kolo.torch as hvd  # noqa: E402
from kolo import elastic as common  # noqa: E402
from kolo.torch.elastic import sampler as sampler_mod  # noqa: E402
from kolo.torch.elastic import state as state_mod  # noqa: E402


@pytest.fixture(autouse=True)
def one_rank():
    hvd.init()
    yield
    hvd.shutdown()


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.BatchNorm1d(16),
                               torch.nn.Linear(16, 3))


def _step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _flat(obj, path=""):
    """{path: value} of a nested state_dict, tensors and other values alike."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, "%s/%s" % (path, k)))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flat(v, "%s/%d" % (path, i)))
        return out
    return {path: obj}


def _assert_identical(got, want):
    got, want = _flat(got), _flat(want)
    assert sorted(got) == sorted(want)
    for k in want:
        if torch.is_tensor(want[k]):
            assert torch.is_tensor(got[k]) and got[k].dtype == want[k].dtype, k
            assert got[k].shape == want[k].shape, k
            # bit for bit (equal also for NaNs: compare the bytes)
            assert got[k].reshape(-1).view(torch.uint8).equal(
                want[k].reshape(-1).view(torch.uint8)), k
        else:
            assert got[k] == want[k], k


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
}


# ---- ObjectState ----------------------------------------------------------------------------

def test_object_state_commit_restore_sync():
    s = common.ObjectState(hvd.broadcast_object, hvd.rank, epoch=1, batch=2, name="x")
    assert (s.epoch, s.batch, s.name) == (1, 2, "x")
    s.epoch, s.batch = 7, 8
    s.restore()
    assert (s.epoch, s.batch) == (1, 2)
    s.epoch, s.batch = 7, 8
    s.commit()
    s.epoch = 9
    s.restore()
    assert (s.epoch, s.batch) == (7, 8)
    s.epoch = 10  # sync sends the saved state (Horovod's semantics): the uncommitted 10 is dropped
    s.sync()
    assert (s.epoch, s.batch, s.name) == (7, 8, "x")


def test_torch_state_as_horovods_test():
    """horovod's test/single/test_torch_elastic.py test_elastic_state, on one rank."""
    model1 = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model1.load_state_dict({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2)})
    model2 = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model2.load_state_dict({"0.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
                            "0.bias": torch.zeros(2)})
    optimizer = torch.optim.SGD(model1.parameters(), lr=0.001)
    state = hvd.elastic.TorchState(model1, optimizer, batch=20, epoch=10)
    state.sync()
    for w in state.model.state_dict().values():
        assert torch.equal(w, torch.ones_like(w))
    assert (state.batch, state.epoch) == (20, 10)

    model1.load_state_dict(model2.state_dict())
    state.batch, state.epoch = 21, 11
    state.restore()
    for w in model1.state_dict().values():
        assert torch.equal(w, torch.ones_like(w))
    assert (state.batch, state.epoch) == (20, 10)

    model1.load_state_dict(model2.state_dict())
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    for w1, w2 in zip(model1.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(w1, w2)
    assert (state.batch, state.epoch) == (21, 11)


# ---- TorchState: commit and restore ---------------------------------------------------------

@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_restore_is_bit_identical(opt):
    torch.manual_seed(1)
    model = _mlp()
    optimizer = OPTIMIZERS[opt](model.parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    for i in range(3):
        _step(model, optimizer, i)
    state.epoch = 1
    state.commit()
    want_model = copy.deepcopy(model.state_dict())
    want_opt = copy.deepcopy(optimizer.state_dict())
    for i in range(3, 6):
        _step(model, optimizer, i)
    optimizer.param_groups[0]["lr"] = 123.0
    state.epoch = 2
    state.restore()
    _assert_identical(model.state_dict(), want_model)
    _assert_identical(optimizer.state_dict(), want_opt)
    assert state.epoch == 1

    # Training on from the restored state is training on from the commit, and a second restore
    # (no commit between) still gives the commit: the optimizer does not share the snapshot.
    twin = copy.deepcopy(model)
    twin_opt = OPTIMIZERS[opt](twin.parameters())
    twin_opt.load_state_dict(copy.deepcopy(want_opt))
    for i in range(6, 9):
        _step(model, optimizer, i)
        _step(twin, twin_opt, i)
    _assert_identical(model.state_dict(), twin.state_dict())
    _assert_identical(optimizer.state_dict(), twin_opt.state_dict())
    state.restore()
    _assert_identical(model.state_dict(), want_model)
    _assert_identical(optimizer.state_dict(), want_opt)


def test_restore_to_a_commit_with_empty_optimizer_state():
    torch.manual_seed(2)
    model = _mlp()
    optimizer = OPTIMIZERS["sgd-momentum"](model.parameters())
    state = hvd.elastic.TorchState(model, optimizer)
    state.commit()  # before the first step: no momentum buffers yet
    want_model = copy.deepcopy(model.state_dict())
    for i in range(2):
        _step(model, optimizer, i)
    assert optimizer.state_dict()["state"]
    state.restore()
    assert optimizer.state_dict()["state"] == {}
    _assert_identical(model.state_dict(), want_model)
    _step(model, optimizer, 0)  # and training goes on from there
    assert optimizer.state_dict()["state"]


@pytest.mark.parametrize("opt", ["sgd-momentum", "adam"])
def test_commit_copies_into_the_same_buffers(opt):
    torch.manual_seed(3)
    model = _mlp()
    optimizer = OPTIMIZERS[opt](model.parameters())
    state = hvd.elastic.TorchState(model, optimizer)
    _step(model, optimizer, 0)
    state.commit()  # the optimizer's state appeared: its buffers are allocated now

    def buffers():
        return {"%s.%s" % (n, p): b for n in ("model", "optimizer")
                for p, b in state._handlers[n].snapshot.buffers()}

    first = {k: b.data_ptr() for k, b in buffers().items()}
    assert len(first) >= len(model.state_dict()) + len(list(model.parameters()))
    for i in range(1, 4):
        _step(model, optimizer, i)
        state.commit()
        now = buffers()
        assert {k: b.data_ptr() for k, b in now.items()} == first
        for k, v in model.state_dict().items():  # and they hold the committed values
            assert torch.equal(now["model." + k], v)
        for k, v in _flat(optimizer.state_dict()).items():
            if torch.is_tensor(v):
                assert torch.equal(now["optimizer" + k.replace("/", ".")], v), k


def test_snapshot_reallocates_only_what_changed():
    snap = state_mod.Snapshot()
    snap.save({"a": torch.zeros(3), "b": torch.zeros(2, 2), "n": 5})
    ptr = {p: b.data_ptr() for p, b in snap.buffers()}
    snap.save({"a": torch.ones(3), "b": torch.ones(4), "c": torch.ones(1), "n": 6})
    got = dict(snap.buffers())
    assert got["a"].data_ptr() == ptr["a"] and torch.equal(got["a"], torch.ones(3))
    assert got["b"].shape == (4,) and sorted(got) == ["a", "b", "c"]
    assert snap.value()["n"] == 6
    snap.save({"a": torch.ones(3, dtype=torch.float64)})
    assert dict(snap.buffers())["a"].dtype == torch.float64 and sorted(dict(snap.buffers())) == ["a"]


def test_spec_and_adopt_give_a_newcomer_the_structure():
    """What a newcomer does in sync, without the broadcasts: adopt rank 0's structure, receive
    into its buffers (here: copied), restore. It had no optimizer state at all."""
    torch.manual_seed(4)
    model = _mlp()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    for i in range(2):
        _step(model, optimizer, i)
    survivor = hvd.elastic.TorchState(model, optimizer)
    fresh = _mlp()
    fresh_opt = OPTIMIZERS["adam"](fresh.parameters())
    newcomer = hvd.elastic.TorchState(fresh, fresh_opt)
    import pickle
    for name in ("model", "optimizer"):
        spec = pickle.loads(pickle.dumps(survivor._handlers[name].snapshot.spec()))
        newcomer._handlers[name].snapshot.adopt(spec)
        src = dict(survivor._handlers[name].snapshot.buffers())
        for path, buf in newcomer._handlers[name].snapshot.buffers():
            buf.copy_(src[path])
        newcomer._handlers[name].restore()
    _assert_identical(fresh.state_dict(), model.state_dict())
    _assert_identical(fresh_opt.state_dict(), optimizer.state_dict())


def test_setattr_of_a_handled_value_saves_it():
    model = _mlp()
    state = hvd.elastic.TorchState(model)
    other = _mlp()
    state.model = other
    assert state._handlers["model"].value is other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    want = copy.deepcopy(other.state_dict())
    state.restore()
    assert not all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), want.values()))


# ---- sync: roots --------------------------------------------------------------------------

@pytest.mark.parametrize("counts,roots", [
    ([-1, -1, -1], [0]),             # the job's start: everyone's own random state, rank 0's wins
    ([5, 5, -1, 5], [0, 1, 3]),      # newcomer 2
    ([6, 5, 6, -1], [0, 2]),         # rank 1 failed before its 6th commit
    ([5, 6, 6], [0]),                # rank 0 behind: its commit is the job's (as Horovod's)
    ([-1, 4, 4, 3], [1, 2]),         # rank 0 a newcomer: the newest commit held
    ([0], [0]),
])
def test_sync_roots(counts, roots):
    assert state_mod.sync_roots(counts) == roots


def test_assign_roots_spreads_bytes():
    # The MLP of the benchmark: round-robin by index would send every weight from one root.
    sizes = [2048 * 784 * 4, 2048 * 4, 2048 * 2048 * 4, 2048 * 4, 10 * 2048 * 4, 10 * 4]
    got = state_mod.assign_roots(sizes, [0, 2])
    load = {0: 0, 2: 0}
    for s, r in zip(sizes, got):
        load[r] += s
    assert got[2] != got[0] and max(load.values()) == 2048 * 2048 * 4
    assert state_mod.assign_roots([], [3]) == []
    assert state_mod.assign_roots([1, 1, 1], [4]) == [4, 4, 4]
    rnd = random.Random(0)
    for _ in range(50):
        sizes = [rnd.randrange(0, 1000) for _ in range(rnd.randrange(0, 20))]
        roots = sorted(rnd.sample(range(8), rnd.randrange(1, 5)))
        got = state_mod.assign_roots(sizes, roots)
        assert got == state_mod.assign_roots(list(sizes), list(roots))  # deterministic
        assert set(got) <= set(roots)


def test_sync_in_one_rank_keeps_the_state_and_counts_commits():
    torch.manual_seed(5)
    model = _mlp()
    optimizer = OPTIMIZERS["sgd-momentum"](model.parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=3)
    assert state._commits == -1
    _step(model, optimizer, 0)  # after construction: the live state is what sync sends
    want_model = copy.deepcopy(model.state_dict())
    want_opt = copy.deepcopy(optimizer.state_dict())
    state.sync()
    assert state._commits == 0
    _assert_identical(model.state_dict(), want_model)
    _assert_identical(optimizer.state_dict(), want_opt)
    state.commit()
    state.commit()
    assert state._commits == 2
    _step(model, optimizer, 1)
    state.restore()
    state.sync()
    assert state._commits == 2 and state.epoch == 3
    _assert_identical(model.state_dict(), want_model)


def test_a_sync_that_fails_half_way_leaves_no_commit(monkeypatch):
    """A receiver whose sync failed holds part old, part received buffers: it must not be taken
    as a root afterwards."""
    state = hvd.elastic.TorchState(_mlp(), epoch=0)
    state.commit()
    state.commit()
    monkeypatch.setattr(state_mod, "allgather_object", lambda obj, name=None: [-1, 5])  # rank 0 (this one) a newcomer

    def fail(handlers, roots):
        assert roots == [1]
        raise hvd.HorovodInternalError("rank 1 lost")

    monkeypatch.setattr(state_mod, "_broadcast_snapshots", fail)
    with pytest.raises(hvd.HorovodInternalError):
        state.sync()
    assert state._commits == -1


# ---- check_host_updates ---------------------------------------------------------------------

def test_check_host_updates_in_a_plain_job_raises_nothing():
    state = hvd.elastic.TorchState(_mlp(), epoch=0)
    assert state._host_messages.empty()
    for _ in range(3):
        state.commit()
        state.check_host_updates()
    # Horovod's elastic test script forgets the last round; with none published, nothing happens.
    state._last_updated_timestamp = 0
    state.commit()
    assert state._last_updated_timestamp == 0


def test_check_host_updates_raises_once_per_new_round():
    state = hvd.elastic.TorchState(_mlp(), epoch=0)
    state.on_hosts_updated(3, True)
    assert not state._host_messages.empty()
    with pytest.raises(hvd.elastic.HostsUpdatedInterrupt) as e:
        state.commit()
    assert e.value.skip_sync is True and state._last_updated_timestamp == 3
    state.commit()  # acted on: no second interrupt
    state.on_hosts_updated(2, False)  # older than the last acted on: ignored
    state.commit()
    state.on_hosts_updated(4, True)
    state.on_hosts_updated(5, False)  # one of the rounds added workers: they need the state
    with pytest.raises(hvd.elastic.HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is False and state._last_updated_timestamp == 5


def test_exceptions_where_horovod_has_them():
    assert hvd.HorovodInternalError is hvd.KoloInternalError
    assert hvd.elastic.HorovodInternalError is hvd.HorovodInternalError
    assert issubclass(hvd.elastic.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.elastic.HostsUpdatedInterrupt(True).skip_sync is True
    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler"):
        assert hasattr(hvd.elastic, name), name


# ---- the run loop ---------------------------------------------------------------------------

class _Recorder(common.State):
    def __init__(self):
        super().__init__(bcast_object=lambda obj: obj, get_rank=lambda: 0)
        self.log = []
        self.register_reset_callbacks([lambda: self.log.append("callback")])

    def save(self):
        self.log.append("save")

    def restore(self):
        self.log.append("restore")

    def sync(self):
        self.log.append("sync")

    def reset(self):
        self.log.append("reset-state")


def test_run_loop_control_flow():
    state = _Recorder()
    events = [hvd.HorovodInternalError("lost rank 1"), hvd.elastic.HostsUpdatedInterrupt(True),
              hvd.elastic.HostsUpdatedInterrupt(False), None]

    def reset():
        state.log.append("reset")

    def train(s, x):
        s.log.append("train")
        e = events.pop(0)
        if e is not None:
            raise e
        return x * 2

    train = common.run_fn(train, reset, lambda: None)  # shutdown logs the reset; init does nothing
    assert train(state, 21) == 42
    assert state.log == [
        "sync", "train",                                   # HorovodInternalError:
        "restore", "reset", "reset-state", "callback",     # restore, reset, callbacks,
        "sync", "train",                                   # sync; HostsUpdated(skip_sync):
        "reset", "reset-state", "callback", "train",       # no restore, no sync;
        "reset", "reset-state", "callback", "sync", "train",  # HostsUpdated: sync
    ]


def test_run_loop_lets_other_errors_through():
    state = _Recorder()
    train = common.run_fn(lambda s: 1 / 0, lambda: None, lambda: None)
    with pytest.raises(ZeroDivisionError):
        train(state)


def test_run_loop_takes_the_kolo_error_behind_a_framework_error():
    """take_error: a framework's exception (TensorFlow's OpError, JAX's runtime error) counts as
    the kolo error a failed op left behind; with none left it is the script's own, and
    propagates. An error left before func ran belongs to no call of it."""
    state = _Recorder()
    left = [hvd.HorovodInternalError("stale")]
    raised = [RuntimeError("a compiled step failed"), None]

    def take_error():
        return left.pop() if left else None

    def train(s):
        s.log.append("train")
        e = raised.pop(0)
        if e is not None:
            left.append(hvd.HorovodInternalError("rank 1 lost"))
            raise e
        return "done"

    assert common.run_fn(train, lambda: state.log.append("reset"), lambda: None, take_error)(state) == "done"
    assert state.log == ["sync", "train", "restore", "reset", "reset-state", "callback", "sync", "train"]
    with pytest.raises(RuntimeError, match="the script's own"):
        common.run_fn(lambda s: (_ for _ in ()).throw(RuntimeError("the script's own")),
                      lambda: None, lambda: None, take_error)(_Recorder())


def test_run_with_a_real_reset_restores_the_commit():
    """hvd.elastic.run in a one-rank job: the reset is a real shutdown and init."""
    torch.manual_seed(6)
    model = _mlp()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    state = hvd.elastic.TorchState(model, optimizer, batch=0, attempts=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    seen = []

    @hvd.elastic.run
    def train(state):
        state.attempts += 1  # not committed: restored to 0 at each failure
        seen.append((state.batch, state.attempts))
        while state.batch < 4:
            _step(model, optimizer, state.batch)
            state.batch += 1
            if state.batch == 2 and len(seen) == 1:
                raise hvd.HorovodInternalError("a rank was lost")
            state.commit()
        return state.batch

    assert train(state) == 4
    assert seen == [(0, 1), (1, 2)] and resets == [1]  # attempts 1 was committed at batch 1
    assert hvd.is_initialized() and hvd.size() == 1


def test_reset_swallows_the_failed_engines_shutdown():
    state = _Recorder()
    calls = []
    attempts = [hvd.HorovodInternalError("lost rank 1"), None]

    def failing_shutdown():
        calls.append("shutdown")
        raise hvd.KoloInternalError("engine already failed")

    def train(s):
        e = attempts.pop(0)
        if e is not None:
            raise e
        return "done"

    assert common.run_fn(train, failing_shutdown, lambda: calls.append("init"))(state) == "done"
    assert calls == ["shutdown", "init"]


# ---- ElasticSampler -------------------------------------------------------------------------

class _Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _as_rank(monkeypatch, r, n):
    """Makes the sampler module see rank r of n."""
    monkeypatch.setattr(sampler_mod, "rank", lambda: r)
    monkeypatch.setattr(sampler_mod, "size", lambda: n)


def _sampler_at(monkeypatch, dataset, r, n, state_dict=None, shuffle=True):
    _as_rank(monkeypatch, r, n)
    s = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=7)
    if state_dict is not None:
        s.load_state_dict(state_dict)
    return s


def test_sampler_as_horovods_test(monkeypatch):
    """horovod's test_elastic_sampler, on one rank."""
    dataset = list(range(8))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()
    assert (sampler.epoch, sampler.processed_num) == (0, 0)
    total = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, _ in enumerate(loader):
            sampler.record_batch(i, 2)
            assert sampler.processed_num == 2 * (i + 1)
            total += 1
    assert total == 8
    sampler.set_epoch(2)
    sampler.record_batch(0, 2)
    sampler.record_batch(1, 2)
    state.commit()
    sampler.record_batch(2, 2)
    state.restore()
    assert sampler.processed_num == 4
    sampler.record_batch(2, 2)
    state.commit()
    state.sync()
    assert sampler.processed_num == 6 and len(sampler) == 2
    assert len(list(loader)) == 1
    sampler.set_epoch(3)
    assert len(sampler) == 8


@pytest.mark.parametrize("n,size", [(0, 3), (1, 4), (2, 5), (10, 3), (7, 7), (13, 1)])
def test_sampler_pads_to_equal_lengths(monkeypatch, n, size):
    dataset = _Data(n)
    got, real = [], []
    for r in range(size):
        s = _sampler_at(monkeypatch, dataset, r, size)
        got.append(list(s))
        real += got[-1][:s.num_real_samples]
    assert len({len(g) for g in got}) == 1  # every rank the same number of samples
    assert sorted(real) == list(range(n))   # the real ones: each sample once


def _simulate(monkeypatch, n, sizes, batch_size, seed, shuffle=True):
    """Ranks stepping in lockstep through epochs of a dataset of n samples, the world's size
    changing after each round: a round ends with a failure (back to the last commit) or, at a
    commit, with new hosts (the state as committed). Returns, per epoch, the samples processed
    in batches that a commit kept, padding repeats left out."""
    rnd = random.Random(seed)
    dataset = _Data(n)
    committed = {"epoch": 0, "processed_num": 0}
    kept = {}  # epoch -> [sample]
    for size in sizes:
        samplers = [_sampler_at(monkeypatch, dataset, r, size, committed, shuffle)
                    for r in range(size)]
        iters = [iter(s) for s in samplers]
        pending = []
        position = 0  # of every rank's iteration
        failure = rnd.random() < 0.5
        steps = rnd.randrange(1, 6)
        for _ in range(steps):
            batches = []
            for s, it in zip(samplers, iters):
                batch = [i for _, i in zip(range(batch_size), it)]
                batches.append((s, batch))
            if not batches[0][1]:  # the epoch is over: commit, and the next one starts
                assert not any(b for _, b in batches)
                for e, i in pending:
                    kept.setdefault(e, []).append(i)
                epoch = samplers[0].epoch
                assert sorted(kept.get(epoch, [])) == list(range(n)), (epoch, size)
                for r, s in enumerate(samplers):
                    _as_rank(monkeypatch, r, size)  # reset() reads the rank again
                    s.set_epoch(epoch + 1)
                iters = [iter(s) for s in samplers]
                committed, pending, position = samplers[0].state_dict(), [], 0
                continue
            for s, batch in batches:
                real = max(0, min(len(batch), s.num_real_samples - position))
                pending += [(s.epoch, i) for i in batch[:real]]
                s.record_batch(0, batch_size)
            position += batch_size
            if rnd.random() < 0.6:  # commit
                for e, i in pending:
                    kept.setdefault(e, []).append(i)
                pending = []
                committed = copy.deepcopy(samplers[0].state_dict())
                assert all(s.state_dict() == committed for s in samplers)
        if not failure:  # hosts updated at the last commit: nothing to roll back
            pending = []
    return kept, committed


@pytest.mark.parametrize("seed", range(12))
def test_sampler_processes_every_sample_once_across_resets(monkeypatch, seed):
    rnd = random.Random(100 + seed)
    n = rnd.choice([1, 5, 37, 64, 101])
    sizes = [rnd.randrange(1, 7) for _ in range(40)]
    kept, _ = _simulate(monkeypatch, n, sizes, batch_size=rnd.choice([1, 3, 4]), seed=seed,
                        shuffle=seed % 2 == 0)
    finished = [e for e in kept if len(kept[e]) >= n]
    assert finished, "no epoch completed; make the simulation longer"
    for e, samples in kept.items():
        assert len(samples) == len(set(samples)), "epoch %d: a sample processed twice" % e
        assert set(samples) <= set(range(n))


def test_sampler_reset_on_removal_repartitions(monkeypatch):
    """A reset that only removed workers has no sync and no restore: TorchState.reset must
    repartition the sampler itself (Horovod's did not)."""
    dataset = _Data(24)
    s = _sampler_at(monkeypatch, dataset, 1, 4)
    state = hvd.elastic.TorchState(sampler=s)
    s.record_batch(0, 2)
    state.commit()
    _as_rank(monkeypatch, 1, 2)
    state.on_reset()
    assert (s.num_replicas, s.rank, len(s)) == (2, 1, 8)
    assert s.processed_num == 8


# ---- several survivors, under kolo run ----------------------------------------------------------

def _kolo():
    for path in (os.path.join(ROOT, "bin", "kolo"), os.path.join(ROOT, "python", "kolo", "lib", "kolo")):
        if os.path.exists(path):
            return path
    pytest.skip("no kolo command: run `make build` or `make lib`")


SYNC_WORKER = r"""
import torch, kolo.torch as hvd
from kolo.torch.elastic import state as state_mod
hvd.init()
r = hvd.rank()
# Ranks 0 and 2 hold commit 6 (the same state), rank 1 failed before its 6th commit (another
# state), rank 3 is a newcomer (its own random model, no optimizer state).
torch.manual_seed({0: 100, 1: 101, 2: 100, 3: 103}[r])
model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
state = hvd.elastic.TorchState(model, opt, epoch=10 + r)
if r != 3:
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    state._commits = {0: 6, 1: 5, 2: 6}[r]
before = hvd.allgather_object({"model": model.state_dict(), "opt": opt.state_dict()})[0]
sent = []
real = state_mod.mpi_ops.broadcast_async_
def spy(t, root, name=None, *args, **kw):
    if name and name.startswith(("kolo.elastic.sync.model.", "kolo.elastic.sync.optimizer.")):
        sent.append(root)  # a tensor of the state, not the pickled structure or objects
    return real(t, root, name, *args, **kw)
state_mod.mpi_ops.broadcast_async_ = spy
state.sync()
# What a sync from rank 0 alone gives: rank 0's state, everywhere.
for k, v in before["model"].items():
    assert torch.equal(model.state_dict()[k], v), k
assert opt.state_dict()["state"].keys() == before["opt"]["state"].keys()
for i, st in before["opt"]["state"].items():
    assert torch.equal(opt.state_dict()["state"][i]["momentum_buffer"], st["momentum_buffer"])
assert opt.state_dict()["param_groups"] == before["opt"]["param_groups"]
assert state.epoch == 10 and state._commits == 6, (state.epoch, state._commits)
assert set(sent) == {0, 2}, sent  # from both holders of commit 6, not from rank 1
print("rank %d roots %s" % (r, sorted(set(sent))))
del sent[:]
state.sync()  # now every rank holds commit 6: every rank sends
assert set(sent) == {0, 1, 2, 3}, sent
for k, v in before["model"].items():
    assert torch.equal(model.state_dict()[k], v), k
print("ok sync", r)
"""


def test_sync_from_several_survivors(tmp_path):
    from test_ops import env
    worker = tmp_path / "sync_worker.py"
    worker.write_text(SYNC_WORKER)
    p = subprocess.run([_kolo(), "run", "-np", "4", sys.executable, str(worker)], env=env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    assert p.stdout.count("ok sync") == 4 and p.stdout.count("roots [0, 2]") == 4, p.stdout


# ---- elastic_worker.py (the integration tests' script) in a plain job --------------------------

def test_elastic_worker_arguments():
    sys.path.insert(0, HERE)
    try:
        import elastic_worker
    finally:
        sys.path.remove(HERE)
    a = elastic_worker.parse_args(["--log", "x", "--exit-schedule", '{"(1, 2)": [0, 3], "[0, 5]": [1]}',
                                   "--exit-mode", "kill", "--epochs", "4", "--batches-per-epoch", "6",
                                   "--batches-per-commit", "2", "--seed", "9"])
    assert a.exit_schedule == {(1, 2): {0, 3}, (0, 5): {1}}
    assert (a.exit_mode, a.epochs, a.batches_per_commit, a.seed, a.samples) == ("kill", 4, 2, 9, 24)
    with pytest.raises(SystemExit):
        elastic_worker.parse_args(["--log", "x", "--exit-mode", "explode"])


def _records(path):
    import json
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_elastic_worker_in_a_plain_two_rank_job(tmp_path):
    from test_ops import env
    log = str(tmp_path / "log.jsonl")
    p = subprocess.run([_kolo(), "run", "-np", "2", sys.executable, os.path.join(HERE, "elastic_worker.py"),
                        "--log", log, "--epochs", "2", "--batches-per-epoch", "7", "--batch-size", "3"],
                       env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode == 0, p.stdout
    records = _records(log)
    for epoch in range(2):  # 21 samples, 2 ranks x 4 batches of 3: the 3 padding repeats left out
        got = [i for r in records if r["kind"] == "batch" and r["epoch"] == epoch for i in r["indices"]]
        assert sorted(got) == list(range(21)), (epoch, got)
    checksums = {}
    for r in records:
        if r["kind"] in ("commit", "done"):
            checksums.setdefault((r["kind"], r["commits"]), set()).add(r["checksum"])
    assert checksums and all(len(v) == 1 for v in checksums.values()), checksums
    assert sorted(r["rank"] for r in records if r["kind"] == "done") == [0, 1]
