"""Process sets and the timeline through kolo.torch, in real processes started by bin/kolo run.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_process_sets.py
"""

import json
import os

import pytest

from test_ops import HERE, KOLO, PY, run


@pytest.mark.parametrize("how", ["add", "init"])
def test_process_sets(how):
    args = ["init"] if how == "init" else []
    rc, out = run([KOLO, "run", "-np", "3", PY, os.path.join(HERE, "process_sets_worker.py")] + args)
    assert rc == 0, out
    for scenario in ("registered", "independent", "ops", "errors", "remove", "leaks"):
        assert "ok " + scenario in out, out


def rows(path):
    """Per row label (tensor name), the names of its events, from a trace that must parse."""
    with open(path) as f:
        events = json.load(f)
    label, names = {}, {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "process_name":
            label[e["pid"]] = e["args"]["name"]
    for e in events:
        if e["ph"] != "M":
            names.setdefault(label.get(e["pid"], "(global)"), []).append(e.get("name", "E"))
    return names


def test_timeline(tmp_path):
    first, second = str(tmp_path / "env.json"), str(tmp_path / "runtime.json")
    rc, out = run([KOLO, "run", "-np", "2", "--timeline-filename", first, PY,
                   os.path.join(HERE, "timeline_worker.py"), second])
    assert rc == 0 and out.count("ok timeline") == 2, out
    env = rows(first)
    # Ops are named in the timeline as the engine matches them: "<kind>.<name>", as in Horovod.
    assert "NEGOTIATE_ALLREDUCE" in env["allreduce.from.env"], env
    assert "KOLO_ALLREDUCE" in env["allreduce.from.env"], env
    assert "allreduce.rt.0" not in env, "the first timeline kept recording after start_timeline replaced it"
    rt = rows(second)
    for name in ("allreduce.rt.0", "allreduce.rt.1", "allreduce.rt.2"):
        ev = rt[name]
        for want in ("NEGOTIATE_ALLREDUCE", "rank 0", "rank 1", "ALLREDUCE", "QUEUE", "KOLO_ALLREDUCE"):
            assert want in ev, (name, ev)
    assert "KOLO_ALLGATHER" in rt["allgather.rt.gather"], rt
    assert "KOLO_BROADCAST" in rt["broadcast.rt.bcast"], rt
    assert "CYCLE_START" in rt["(global)"], rt
    assert "allreduce.after.stop" not in rt, "recorded after stop_timeline"
    assert sorted(os.listdir(tmp_path)) == ["env.json", "runtime.json"], "only rank 0 writes"
