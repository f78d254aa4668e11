"""What one small op costs the binding, in counts that machine load does not change: the Python
functions it runs and its calls into the library, for each common way to call allreduce (and the
other synchronous calls), against the budget below. Wall-clock timings of a 4-byte op are too
noisy on a shared machine to guard it (bench/python_latency.py measures those); these counts are
exact, and a change that adds a call fails here naming it.

    make lib build && /usr/bin/python3 -m pytest -q python/tests/test_op_cost.py

The budget is what each form costs now. Lower it when a change saves a call; raise it only for a
call that must be there, saying why in the commit.
"""

import json

from test_ops import single

# Per call form: the Python functions one op runs (each once, unless listed twice) and the library
# functions it calls, with the number of arguments each takes (name/n). A synchronous call is one
# call into the library (kolo_enqueue waits its first slice); an async op and its synchronize are
# two. kolo_enqueue takes its op as one block: ctypes converts each argument with a Python call.
BUDGET = {
    "allreduce_": (["allreduce_", "_reduce_op", "_run", "_submit", "_stage", "_device_id", "op_block",
                    "_issue", "result"],
                   ["kolo_enqueue/2"]),
    "allreduce_async+synchronize": (["allreduce_async", "_reduce_op", "_enqueue", "_submit", "_stage",
                                     "_device_id", "op_block", "_issue", "synchronize", "wait", "result"],
                                    ["kolo_enqueue/2", "kolo_wait/3"]),
    "allreduce": (["allreduce", "_compress", "_allreduce", "_reduce_op", "_run", "_submit", "_stage",
                   "_device_id", "op_block", "_issue", "result", "_decompress"],
                  ["kolo_enqueue/2"]),
    "allreduce unnamed": (["allreduce", "_compress", "_allreduce", "_reduce_op", "_run", "_submit", "_stage",
                           "_device_id", "name_arg", "op_block", "_issue", "result", "_decompress"],
                          ["kolo_enqueue/2"]),
    "broadcast_": (["broadcast_", "_run", "_submit", "_stage", "_device_id", "op_block", "_issue", "result"],
                   ["kolo_enqueue/2"]),
    "barrier": (["barrier", "_process_set_id", "op_block", "_issue"], ["kolo_enqueue/2"]),
}

# Runs each form a few times, then once under a profile hook that records the Python functions
# called (not C functions: which of those torch's methods are differs between torch versions) and
# with a stand-in for the library that records the calls into it.
COUNT = """
    import json, sys, torch, kolo.torch as hvd
    from kolo import _lib
    hvd.init()
    t = torch.ones(1)
    forms = {
        "allreduce_": lambda: hvd.allreduce_(t, op=hvd.Sum, name="a"),
        "allreduce_async+synchronize": lambda: hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum, name="b")),
        "allreduce": lambda: hvd.allreduce(t, op=hvd.Sum, name="c"),
        "allreduce unnamed": lambda: hvd.allreduce(t, op=hvd.Sum),
        "broadcast_": lambda: hvd.broadcast_(t, root_rank=0, name="d"),
        "barrier": lambda: hvd.barrier(),
    }

    # Stands in for the library, recording each call and how many arguments ctypes converted for
    # it (each costs a Python call inside ctypes).
    class Counting(object):

        def __init__(self, lib, calls):
            self._lib, self._calls = lib, calls

        def __getattr__(self, name):
            fn = getattr(self._lib, name)

            def counted(*args):
                self._calls.append("%s/%d" % (name, len(args)))
                return fn(*args)
            return counted

    got = {}
    for form, op in forms.items():
        for _ in range(5):
            op()
        py, lib = [], []

        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name not in ("__getattr__", "counted"):
                py.append(frame.f_code.co_name)

        real, _lib.C = _lib.C, Counting(_lib.C, lib)
        sys.setprofile(hook)
        op()
        sys.setprofile(None)
        _lib.C = real
        got[form] = (py[1:], lib)  # py[0] is the lambda
    assert _lib.C.kolo_handles() == 0, _lib.C.kolo_handles()
    hvd.shutdown()
    print("COUNTS " + json.dumps(got))
"""


def _counts():
    rc, out = single(COUNT)
    line = [ln for ln in out.splitlines() if ln.startswith("COUNTS ")]
    assert rc == 0 and line, out
    return json.loads(line[0][len("COUNTS "):])


def _excess(got, budget):
    """The names in got beyond budget (a name listed once in budget may appear once)."""
    left = list(budget)
    extra = []
    for name in got:
        if name in left:
            left.remove(name)
        else:
            extra.append(name)
    return extra


def test_small_ops_stay_within_their_call_budget():
    counts = _counts()
    problems = []
    for form, (py_budget, lib_budget) in BUDGET.items():
        py, lib = counts[form]
        extra_py, extra_lib = _excess(py, py_budget), _excess(lib, lib_budget)
        if extra_py or extra_lib:
            problems.append("%s: %d Python calls (budget %d), added: %s; %d library calls (budget %d), added: %s\n"
                            "    Python calls: %s\n    library calls: %s"
                            % (form, len(py), len(py_budget), extra_py or "none", len(lib), len(lib_budget),
                               extra_lib or "none", " ".join(py), " ".join(lib)))
    assert not problems, "small ops cost more calls than their budget:\n" + "\n".join(problems)
