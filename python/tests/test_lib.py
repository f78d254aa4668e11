"""kolo._lib, the ctypes binding of the C ABI (capi/): its one signature table against the header
cgo writes beside the library, and what a bad argument from Python does (an exception, never a
dead interpreter).

    make lib build && /usr/bin/python3 -m pytest python/tests/test_lib.py
"""

import ctypes
import os
import re
import sys

from test_ops import LIB, ROOT, single

PACKAGE = os.path.join(ROOT, "python", "kolo")
HEADER = os.path.join(PACKAGE, "lib", "libkolo.h")

# The C types capi's exports use, as the header spells them, and the ctypes types that may stand
# for them (pointers go as void* or as bytes through char*).
_POINTERS = (ctypes.c_void_p, ctypes.c_char_p)
_C_TYPES = {
    "void": (None,),
    "int": (ctypes.c_int,),
    "int64_t": (ctypes.c_int64,),
    "uint64_t": (ctypes.c_uint64,),
    "double": (ctypes.c_double,),
}


def _header_functions():
    """{name: (return type, [parameter types])} of every kolo_ function in the header."""
    assert os.path.exists(HEADER), "run `make lib` first (it writes %s)" % HEADER
    with open(HEADER) as f:
        text = f.read()
    funcs = {}
    for ret, name, params in re.findall(r"^extern\s+([\w\s\*]+?)\s*\b(kolo_\w+)\((.*?)\);", text, re.M):
        types = []
        for p in params.split(","):
            p = p.strip()
            if p in ("", "void"):
                continue
            types.append(re.sub(r"\s*\b\w+$", "", p).replace(" ", ""))  # drop the parameter name
        funcs[name] = (ret.replace(" ", ""), types)
    return funcs


def _allowed(c_type):
    return _POINTERS if c_type.endswith("*") else _C_TYPES[c_type]


def _signatures():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        from kolo import _lib
    finally:
        sys.path.pop(0)
    return _lib._SIGNATURES


def test_signature_table_matches_the_header():
    header = _header_functions()
    table = _signatures()
    assert sorted(table) == sorted(header), (
        "in the header, not in _lib._SIGNATURES: %s; in the table, not exported: %s"
        % (sorted(set(header) - set(table)), sorted(set(table) - set(header))))
    for name, (ret, params) in sorted(header.items()):
        restype, argtypes = table[name]
        assert restype in _allowed(ret), "%s returns %s, table says %s" % (name, ret, restype)
        assert len(argtypes) == len(params), "%s takes %d arguments, table says %d" % (
            name, len(params), len(argtypes))
        for i, (c, py) in enumerate(zip(params, argtypes)):
            assert py in _allowed(c), "%s argument %d is %s, table says %s" % (name, i, c, py)


def test_signatures_are_declared_only_in_lib():
    offenders = []
    for d, _, files in os.walk(PACKAGE):
        for f in files:
            path = os.path.join(d, f)
            if not f.endswith(".py") or path == os.path.join(PACKAGE, "_lib.py"):
                continue
            with open(path) as fh:
                for n, line in enumerate(fh, 1):
                    if re.search(r"\b(argtypes|restype|CDLL)\b", line):
                        offenders.append("%s:%d: %s" % (os.path.relpath(path, ROOT), n, line.strip()))
    assert not offenders, "ctypes signatures outside kolo/_lib.py:\n" + "\n".join(offenders)


def test_bad_arguments_raise_instead_of_killing_python():
    # What a buggy caller could hand the library: before capi checked its arguments, such calls
    # were a Go panic, which kills the interpreter. capi's Go tests cover every check; these show
    # that both ways a refusal reaches Python (a failed handle, -1 with kolo_last_error) come back
    # as an ordinary error, on a fresh call and on a completed op, and the engine works on.
    assert os.path.exists(LIB), "run `make lib` first"
    rc, out = single("""
        import torch, kolo.torch as hvd
        from kolo import _lib
        from kolo.torch import mpi_ops
        hvd.init()
        C = _lib.C

        def refused(h, want):
            assert h < 0, h
            err = _lib.take_error(-h)
            assert isinstance(err, ValueError) and want in str(err), (want, err)

        def failed(rc, want):
            assert rc == -1, rc
            msg = _lib.last_error()
            assert want in msg, (want, msg)

        block = mpi_ops._op_block(1, 0, 0, 99, (), 1, 0, 1.0, 1.0, None, 0, -1, 0, None)
        refused(C.kolo_enqueue(block, len(block)), "argument dt = 99")
        refused(C.kolo_enqueue(block, 71), "argument size = 71")
        failed(C.kolo_enqueue_group(1, None, 0, 2, None, None, None, None, None, 1, 1.0, 1.0, 0, -1, -1, None),
               "argument handles = NULL")

        h = hvd.allgather_async(torch.ones(2, 3))
        op = mpi_ops._handle_map[h]
        assert _lib.wait(op.h) == _lib.OK
        failed(C.kolo_result_copy(op.h, None, 24), "argument dst = NULL")
        assert torch.equal(hvd.synchronize(h), torch.ones(2, 3))

        # Still alive, and the engine still works.
        assert hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist() == [1.0, 1.0, 1.0]
        assert C.kolo_handles() == 0, C.kolo_handles()
        hvd.shutdown()
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out


def test_init_raises_the_error_of_an_interrupted_init():
    # An init that Ctrl-C interrupted and that then failed: the next init() raises its error
    # rather than dropping it and starting over (which would wait a whole setup timeout for the
    # ranks again). A handle refused at once stands in for the failed init; the init after that
    # starts anew.
    rc, out = single("""
        import kolo.torch as hvd
        from kolo import _lib
        C = _lib._load()
        from kolo.torch import mpi_ops
        block = mpi_ops._op_block(1, 0, 0, 99, (), 1, 0, 1.0, 1.0, None, 0, -1, 0, None)
        h = C.kolo_enqueue(block, len(block))
        assert h < 0, h
        _lib._pending = (-h, "init")
        try:
            hvd.init()
            raise SystemExit("init dropped the failed init's error")
        except ValueError as e:  # the stand-in is a refused argument
            assert "argument dt = 99" in str(e), e
        assert _lib._pending is None and not hvd.is_initialized()
        hvd.init()
        assert hvd.is_initialized() and hvd.size() == 1
        assert C.kolo_handles() == 0, C.kolo_handles()
        hvd.shutdown()
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out
