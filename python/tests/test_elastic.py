"""Elastic training end to end: `kolo run` in elastic mode starting python/tests/elastic_worker.py
on two host names of this machine (localhost and 127.0.0.1 are two hosts to kolo, as in
Horovod's own elastic tests), with workers failing by exception and by SIGKILL, hosts added and
removed by a discovery script, and the ways a job must end: all ranks failed, below --min-np past
the timeout, the reset limit.

Each test reads the workers' JSON-lines log and checks what the issue asks: survivors keep their
process, no committed step is lost, every rank ends with bit-identical parameters, and every
sample of an epoch is processed exactly once.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_elastic.py
"""

import collections
import json
import os
import secrets
import subprocess
import time

import pytest

from test_ops import HERE, KOLO, PY, env, run

WORKER = os.path.join(HERE, "elastic_worker.py")


def elastic_run(tmp_path, flags, worker_args, timeout=240):
    log = tmp_path / "log.jsonl"
    start = time.monotonic()
    rc, out = run([KOLO, "run"] + flags + [PY, WORKER, "--log", str(log)] + worker_args,
                  timeout=timeout)
    took = time.monotonic() - start
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return rc, out, records, took


def wait_serving(port, node, timeout=30):
    """Waits until node's rendezvous accepts connections on port: a second node started earlier
    would find nothing there and host the rendezvous itself."""
    import socket
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert node.poll() is None, "the first node exited before it served the rendezvous"
            assert time.monotonic() < deadline, "nothing serves the rendezvous on port %d after %d s" % (port, timeout)
            time.sleep(0.02)


def committed_indices(records):
    """The samples each epoch processed for good. Every rank of a round takes each step
    together, and the state the next round starts from is a commit of this round: the commit
    count the next round starts at (its lowest; the job's end for the last round) says which of
    this round's batches made it. A batch after that commit was rolled back and is redone; a
    batch of a worker that was then removed still counts, since its gradients are in the
    committed step."""
    rounds = sorted({r["round"] for r in records})
    kept = {}
    for this, nxt in zip(rounds, rounds[1:] + [None]):
        if nxt is None:
            kept[this] = max(r["commits"] for r in records if r["kind"] == "done")
        else:
            kept[this] = min(r["commits"] for r in records if r["round"] == nxt)
    done = collections.defaultdict(list)  # epoch -> sample indices
    for r in records:
        if r["kind"] == "batch" and r["commits"] < kept[r["round"]]:
            done[r["epoch"]].extend(r["indices"])
    return done


def check_exactly_once(records, epochs, samples):
    done = committed_indices(records)
    for e in range(epochs):
        got = collections.Counter(done[e])
        twice = sorted(i for i, n in got.items() if n > 1)
        missing = sorted(set(range(samples)) - set(got))
        assert not twice and not missing, "epoch %d: processed twice %s, never %s" % (e, twice, missing)


def check_identical_end(records, size):
    ends = [r for r in records if r["kind"] == "done"]
    assert len(ends) == size, ends
    assert len({r["checksum"] for r in ends}) == 1, "parameters differ at the end: %s" % ends
    assert {r["size"] for r in ends} == {size}, ends
    return ends


def pids_by_start_rank(records):
    pids = collections.defaultdict(set)
    for r in records:
        pids[r["start_rank"]].add(r["pid"])
    return pids


@pytest.mark.parametrize("mode", ["exception", "kill"])
def test_a_failed_worker_leaves_the_survivors_training(tmp_path, mode):
    # Start rank 3 (127.0.0.1's second worker) fails at epoch 1, batch 2: its host is
    # blacklisted, its other worker stopped, and localhost's two workers go on as a world of 2.
    epochs, batches, bsz = 3, 32, 2  # 8 batches per epoch for each of 4 ranks
    rc, out, records, _ = elastic_run(
        tmp_path, ["-np", "4", "--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2"],
        ["--epochs", str(epochs), "--batches-per-epoch", str(batches), "--batch-size", str(bsz),
         "--exit-schedule", '{"(1, 2)": [3]}', "--exit-mode", mode])
    assert rc == 0, out
    assert "round 2: generation 2 (reset 1): lost 127.0.0.1[0] (host blacklisted), 127.0.0.1[1] (failed)" in out, out
    pids = pids_by_start_rank(records)
    assert len(pids[0]) == 1 and len(pids[1]) == 1, "a survivor was restarted: %s" % dict(pids)
    ends = check_identical_end(records, 2)
    assert {r["start_rank"] for r in ends} == {0, 1}, ends
    check_exactly_once(records, epochs, batches * bsz)
    # No committed step lost: the survivors synced once more, from a commit at or after the
    # batch before the failure (at most the batch in flight is redone).
    resync = [r for r in records if r["kind"] == "sync" and r["round"] == 2]
    assert {r["start_rank"] for r in resync} == {0, 1}, resync
    assert all((r["epoch"], r["batch"]) >= (1, 1) for r in resync), resync


def test_three_ranks_lose_one_to_sigkill_and_train_on_with_two(tmp_path):
    # The GPU check's elastic step (scripts/gpu_check.sh; KOLO_TEST_DEVICE=cuda puts the model
    # and batches on the GPU, where the ops take the device path): 127.0.0.1's only rank is
    # killed with SIGKILL at the start of epoch 1's second batch, while localhost's two are in
    # that batch's allreduce; they re-form as a world of 2 and train to the end, identical.
    device = os.environ.get("KOLO_TEST_DEVICE", "cpu")
    epochs, batches, bsz = 3, 12, 4  # 4 batches per epoch for each of 3 ranks, 6 for 2
    rc, out, records, took = elastic_run(
        tmp_path, ["-np", "3", "--min-np", "2", "--max-np", "3", "-H", "localhost:2,127.0.0.1:1"],
        ["--epochs", str(epochs), "--batches-per-epoch", str(batches), "--batch-size", str(bsz),
         "--exit-schedule", '{"(1, 1)": [2]}', "--exit-mode", "kill", "--device", device],
        timeout=float(os.environ.get("KOLO_ELASTIC_JOB_TIMEOUT", "240")))
    print(out)  # the job's log, NCCL's version lines included, for the GPU check's summary
    assert rc == 0, out
    assert "round 2: generation 2 (reset 1): lost 127.0.0.1[0] (failed); 2 ranks on 1 host" in out, out
    after = [r for r in records if r["round"] == 2]
    assert after and {r["size"] for r in after} == {2}, after
    trained = [r for r in after if r["kind"] == "batch"]
    assert {r["start_rank"] for r in trained} == {0, 1}, after
    ends = check_identical_end(records, 2)
    assert {r["start_rank"] for r in ends} == {0, 1}, ends
    pids = pids_by_start_rank(records)
    assert len(pids[0]) == 1 and len(pids[1]) == 1, "a survivor was restarted: %s" % dict(pids)
    check_exactly_once(records, epochs, batches * bsz)
    on = sorted({r["device"] for r in ends})
    assert all(d.split(":")[0] == device.split(":")[0] for d in on), (device, ends)
    print("ELASTIC-RESULT start rank 2 killed at epoch 1 batch 1; round 2 ran with 2 ranks: %d batches, %d commits;"
          " the survivors' weights are equal (sha256 %s) on %s; %.0f s"
          % (len(trained), sum(r["kind"] == "commit" for r in after), ends[0]["checksum"][:12], ",".join(on), took))


def test_a_world_shrunk_to_one_rank_trains_on(tmp_path):
    # The survivor of a 2-rank job trains alone: the optimizer's hooks (installed in any elastic
    # world) still have their allreduces waited for.
    rc, out, records, _ = elastic_run(
        tmp_path, ["-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1"],
        ["--epochs", "2", "--batches-per-epoch", "12", "--exit-schedule", '{"(0, 3)": [1]}',
         "--exit-mode", "kill"])
    assert rc == 0, out
    ends = check_identical_end(records, 1)
    assert ends[0]["start_rank"] == 0, ends
    check_exactly_once(records, 2, 12 * 4)


def test_hosts_added_then_removed(tmp_path):
    # The discovery script prints what the test writes: localhost first, then 127.0.0.1 joins,
    # then localhost leaves. The job grows from 2 to 4 ranks without restarting anyone, then
    # shrinks to 127.0.0.1's two workers, which carry the state on.
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    log = tmp_path / "log.jsonl"
    p = subprocess.Popen([KOLO, "run", "-np", "2", "--min-np", "2", "--max-np", "4",
                          "--host-discovery-script", str(script), PY, WORKER, "--log", str(log),
                          "--epochs", "3", "--batches-per-epoch", "80", "--batch-size", "2",
                          "--batch-wait", "0.1"],
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def wait_for(pred, what, timeout=90):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if log.exists():
                    recs = [json.loads(l) for l in log.read_text().splitlines() if l.strip()]
                    if pred(recs):
                        return recs
                assert p.poll() is None, "kolo run ended early:\n" + p.communicate()[0]
                time.sleep(0.1)
            raise AssertionError("timed out waiting for " + what)

        wait_for(lambda rs: any(r["kind"] == "commit" and r["commits"] >= 3 for r in rs), "commits in round 1")
        hosts.write_text("localhost:2\n127.0.0.1:2\n")
        wait_for(lambda rs: any(r["kind"] == "commit" and r["size"] == 4 for r in rs), "a round of 4")
        hosts.write_text("127.0.0.1:2\n")
        out = p.communicate(timeout=180)[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    records = [json.loads(l) for l in log.read_text().splitlines() if l.strip()]
    assert p.returncode == 0, out
    sizes = []
    for r in records:
        if r["kind"] == "commit" and (not sizes or sizes[-1] != r["size"]):
            sizes.append(r["size"])
    assert sizes == [2, 4, 2], (sizes, out)
    pids = pids_by_start_rank(records)
    assert all(len(v) == 1 for v in pids.values()), "a worker was restarted: %s" % dict(pids)
    ends = check_identical_end(records, 2)
    assert {r["start_rank"] for r in ends} == {2, 3}, ends
    check_exactly_once(records, 3, 80 * 2)


def test_every_rank_failing_ends_the_job(tmp_path):
    rc, out, _, took = elastic_run(
        tmp_path, ["-np", "2", "--min-np", "1", "--max-np", "2", "-H", "localhost:1,127.0.0.1:1"],
        ["--epochs", "2", "--exit-schedule", '{"(0, 2)": [0, 1]}'])
    assert rc != 0, out
    assert "all ranks failed" in out, out
    assert took < 60, out


def test_below_min_np_fails_after_the_elastic_timeout(tmp_path):
    # 127.0.0.1's only worker dies: one slot is left, --min-np is 2, so the job waits for
    # --elastic-timeout (3 s) and then fails, saying why; the survivor is not left waiting.
    rc, out, records, took = elastic_run(
        tmp_path, ["-np", "2", "--min-np", "2", "-H", "localhost:1,127.0.0.1:1", "--elastic-timeout", "3"],
        ["--epochs", "3", "--batches-per-epoch", "20", "--exit-schedule", '{"(0, 3)": [1]}',
         "--exit-mode", "kill"])
    assert rc != 0, out
    assert "below min-np" in out, out
    assert took < 60, "took %.0f s:\n%s" % (took, out)


def test_reset_limit_ends_the_job(tmp_path):
    # Two failures at different times, --reset-limit 1: the second reset is refused.
    rc, out, _, _ = elastic_run(
        tmp_path, ["-np", "3", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1,%s:1" % os.uname().nodename,
                   "--reset-limit", "1"],
        ["--epochs", "3", "--batches-per-epoch", "12", "--exit-schedule", '{"(0, 2)": [2], "(1, 2)": [1]}'])
    assert rc != 0, out
    assert "reset limit reached" in out, out


def test_no_ssh_nodes_a_failed_worker_leaves_the_other_node_training(tmp_path):
    # Elastic mode without ssh: two `kolo run --rendezvous` nodes of two workers each on this
    # machine (hosts HOSTNAME and HOSTNAME-node2). The first serves the rendezvous and plans;
    # the second joins. Start rank 3, the second node's second worker, is killed at epoch 1,
    # batch 2: that node's host is blacklisted, its other worker stopped on its orders, and the
    # first node's two workers go on as a world of 2 with identical parameters. Both nodes
    # exit 0.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "log.jsonl"
    epochs, batches, bsz = 3, 32, 2
    flags = ["--rendezvous", "127.0.0.1:%d" % port, "--nnodes", "2", "--nproc-per-node", "2",
             "--min-np", "2", "--max-np", "4"]
    worker = [PY, WORKER, "--log", str(log), "--epochs", str(epochs), "--batches-per-epoch",
              str(batches), "--batch-size", str(bsz), "--exit-schedule", '{"(1, 2)": [3]}',
              "--exit-mode", "kill"]
    e = env()
    e["KOLO_SECRET"] = secrets.token_hex(32)
    nodes = []
    try:
        for i in range(2):
            nodes.append(subprocess.Popen([KOLO, "run"] + flags + worker, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
            if i == 0:
                wait_serving(port, nodes[0])
        outs = [p.communicate(timeout=240)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.communicate()
    host = socket.gethostname()
    assert [p.returncode for p in nodes] == [0, 0], "\n----\n".join(outs)
    assert "node 1 joined from 127.0.0.1: host %s-node2 with 2 slots" % host in outs[0], outs[0]
    lost = "round 2: generation 2 (reset 1): lost %s-node2[0] (host blacklisted), %s-node2[1] (failed)" % (host, host)
    assert lost in outs[0], outs[0]
    assert "joined the job at 127.0.0.1:%d as host %s-node2" % (port, host) in outs[1], outs[1]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    pids = pids_by_start_rank(records)
    assert len(pids[0]) == 1 and len(pids[1]) == 1, "a survivor was restarted: %s" % dict(pids)
    ends = check_identical_end(records, 2)
    assert {r["start_rank"] for r in ends} == {0, 1}, ends
    check_exactly_once(records, epochs, batches * bsz)


def test_mnist_elastic_example_survives_a_kill(tmp_path):
    # examples/pytorch_mnist_elastic.py end to end for a few steps: 2 ranks on two host names,
    # the worker started as rank 1 SIGKILLs itself before step 5 (after the commit at step 4),
    # the survivor resets to a world of one, trains to the end and prints the accuracy line.
    import re
    example = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples",
                           "pytorch_mnist_elastic.py")
    rc, out = run([KOLO, "run", "-np", "2", "--min-np", "1", "--max-np", "2",
                   "-H", "localhost:1,127.0.0.1:1", PY, example, "--epochs", "1",
                   "--max-steps", "8", "--batches-per-commit", "2", "--max-test-samples", "500",
                   "--log-interval", "1", "--kill-at-step", "5", "--kill-rank", "1"],
                  timeout=120)
    assert rc == 0, out
    assert "killing myself before step 5" in out, out
    assert "round 2: generation 2 (reset 1): lost 127.0.0.1[0] (failed)" in out, out
    assert "reset 1: now 1 ranks, global batch 64, lr 0.0015 (epoch 0, step 4)" in out, out
    assert re.search(r"final test accuracy \d+\.\d\d% after 1 epochs on 1 ranks "
                     r"\(8 steps, 1 reset, \d+ s\)", out), out
