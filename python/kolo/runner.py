"""kolo.run: run a Python function on np ranks and return every rank's result, like horovod.run.

The driver pickles (function, args, kwargs), starts ``kolo run -np N python -c <worker>`` with the
pickle in the environment (or, when it is too large for one and every rank runs on this host, in a
private temporary file), and reads each rank's pickled return value (or exception) back from a
marker line on that rank's stdout, so nothing needs a filesystem shared between hosts. Which rank
a failed job's failure traces back to comes from the outcome kolo run writes to a private file
(--outcome-file), not from its summary on stderr.

Functions are pickled by reference (module and name) unless cloudpickle is installed. A function
defined in the driver script itself works the way multiprocessing's spawn mode does: each worker
imports the script under the name ``__mp_main__``, so the script must start its work under
``if __name__ == "__main__":``. Lambdas and closures need cloudpickle.
"""

import base64
import io
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

try:  # cloudpickle, an optional dependency, also pickles lambdas and closures; plain pickle is the fallback.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the installation
    _pickler = pickle

_PAYLOAD_ENV = "KOLO_RUN_PAYLOAD"
_PAYLOAD_FILE_ENV = "KOLO_RUN_PAYLOAD_FILE"
_MARKER = "\x1ekolo.run:"
# Linux limits one environment string to 128 KiB; leave room for the name.
_MAX_PAYLOAD = 120 << 10
# Once every rank has sent its result, the job only has to shut kolo down (its shutdown barrier
# waits at most 30 s) and exit: kolo.run waits this long for that, then stops the job and names the
# ranks that had not finished. Then, once kolo run has exited, it waits this long for the rest of
# its output.
_EXIT_WAIT = 60.0
_OUTPUT_WAIT = 10.0
# How long a stopped job gets to exit on SIGTERM before kolo.run kills the launcher.
_KILL_WAIT = 10.0
_PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")


def _kolo_binary():
    """Finds the kolo launcher: $KOLO_BIN, the one shipped in the package (kolo/lib/kolo, as the
    `kolo` command runs it), bin/kolo of the source tree this package is in, then PATH."""
    if os.environ.get("KOLO_BIN"):
        return os.environ["KOLO_BIN"]
    from kolo import _cli
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (_cli.shipped_binary(),  # an installed wheel, or `make lib` in a checkout
                      os.path.join(here, os.pardir, os.pardir, "bin", "kolo")):  # source tree
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    found = shutil.which("kolo")
    if found:
        return found
    raise RuntimeError("kolo.run: cannot find the kolo launcher: set KOLO_BIN, put kolo on PATH, "
                       "or build it with `make build` in the source tree")


def _main_path():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


def _encode_payload(func, args, kwargs):
    if getattr(func, "__module__", None) == "__main__" and _pickler is pickle and not _main_path():
        raise ValueError("kolo.run: %r is defined in an interactive session; without cloudpickle "
                         "the function must live in a module or script file" % (func,))
    try:
        blob = _pickler.dumps((func, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise ValueError("kolo.run: cannot pickle the function or its arguments (%s); define it "
                         "at module level, or install cloudpickle for lambdas and closures"
                         % e) from e
    outer = pickle.dumps({"sys_path": list(sys.path), "main": _main_path(), "blob": blob})
    return base64.b64encode(outer).decode("ascii")


def _payload_env(payload, local):
    """The environment entry that carries payload to the workers, and a file to remove afterwards
    (or None). An environment variable holds at most _MAX_PAYLOAD bytes; a larger payload goes
    through a 0600 temporary file, which only ranks on this host can read."""
    if len(payload) <= _MAX_PAYLOAD:
        return (_PAYLOAD_ENV, payload), None
    if not local:
        raise ValueError("kolo.run: the pickled function and arguments take %d bytes, more than the "
                         "%d an environment variable may hold, and the job runs on other hosts too; "
                         "pass large data through files the hosts share" % (len(payload), _MAX_PAYLOAD))
    fd, path = tempfile.mkstemp(prefix="kolo-run-", suffix=".payload")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write(payload)
    return (_PAYLOAD_FILE_ENV, path), path


def run(func, args=(), kwargs=None, np=1, hosts=None, hostfile=None, env=None, executable=None,
        verbose=False, start_timeout=None, output_filename=None, extra_args=()):
    """Runs func(*args, **kwargs) on np ranks and returns the list of results, by rank.

    hosts ("h1:2,h2:2") and hostfile are passed to kolo run; env (a dict) is added to the workers'
    environment; executable is the Python to run (default: this one); start_timeout is in seconds;
    extra_args are more kolo run flags (e.g. ["--fusion-threshold-mb", "32"]). If any rank raises
    or dies, every rank is stopped and RuntimeError names the first rank that failed, with its
    traceback. If every rank has returned but the job has not ended a minute later (a rank kept
    alive by a thread that is not a daemon, say), the job is stopped and RuntimeError names the
    ranks that had not exited.
    """
    payload = _encode_payload(func, args, kwargs)
    (payload_name, payload_value), payload_file = _payload_env(payload, _local_only(hosts, hostfile))
    # kolo run writes the job's outcome (--outcome-file) here: which rank failed first, as data.
    outcome_dir = tempfile.mkdtemp(prefix="kolo-outcome-")  # mode 0700
    try:
        return _run(payload_name, payload_value, np, hosts, hostfile, env, executable, verbose,
                    start_timeout, output_filename, extra_args,
                    os.path.join(outcome_dir, "outcome.json"))
    finally:
        if payload_file:
            os.unlink(payload_file)
        shutil.rmtree(outcome_dir, ignore_errors=True)


def _local_only(hosts, hostfile):
    """Whether every rank runs on this host: no -H and no hostfile, or only local names in -H."""
    if hostfile:
        return False
    if not hosts:
        return True
    return all(_is_local(_host_name(h.strip())) for h in hosts.split(",") if h.strip())


def _host_name(item):
    """The host of one -H item, "host", "host:slots" or "[ipv6]:slots", as kolo run reads it
    (launch.parseHostSlots in internal/launch/hosts.go)."""
    if item.startswith("["):
        end = item.find("]")
        return item[1:end] if end >= 0 else item
    return item.rpartition(":")[0] if ":" in item else item


def _is_local(name):
    """Whether host name designates this machine: the names launch.IsLocal (internal/launch/hosts.go)
    takes for the launching machine, which kolo run starts ranks on without ssh."""
    return name in ("localhost", "127.0.0.1", "::1", "localhost.localdomain", socket.gethostname())


def _run(payload_name, payload_value, np, hosts, hostfile, env, executable, verbose, start_timeout,
         output_filename, extra_args, outcome_file):
    cmd = [_kolo_binary(), "run", "-np", str(int(np)), "--outcome-file", outcome_file]
    if hosts:
        cmd += ["-H", hosts]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    if verbose:
        cmd += ["--verbose"]
    if start_timeout is not None:
        cmd += ["--start-timeout", "%gs" % start_timeout]
    if output_filename:
        cmd += ["--output-filename", output_filename]
    child_env = dict(os.environ)
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env[payload_name] = payload_value
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child_env["PYTHONPATH"] = os.pathsep.join(
        [pkg_root] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    forward = [payload_name, "PYTHONPATH"] + sorted((env or {}).keys())
    for name in forward:
        cmd += ["-x", name]
    cmd += list(extra_args)
    cmd += [executable or sys.executable, "-c", "from kolo.runner import _worker_main; _worker_main()"]

    results, errors, stderr_tail = {}, {}, []
    finished = set()  # ranks whose Python code has ended after their result (the "exit" marker)
    nranks = int(np)
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    overdue = threading.Event()  # the job outlived _EXIT_WAIT after the last result: stopped

    def stop_overdue_job():
        # Whether kolo run has exited, not whether the main thread's proc.wait() has returned yet:
        # a job that ended just before the timer fired has finished normally.
        if proc.poll() is not None:
            return
        overdue.set()
        proc.terminate()  # kolo run stops every rank on SIGTERM
        try:
            proc.wait(_KILL_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()  # the ranks die with it (they are started with a parent-death signal)

    exit_timer = threading.Timer(_EXIT_WAIT, stop_overdue_job)
    exit_timer.daemon = True

    def read_stdout():
        for line in proc.stdout:
            i = line.find(_MARKER)
            if i < 0:
                sys.stdout.write(line)
                continue
            before = line[:i]
            if _PREFIX.sub("", before):  # output the rank printed without a newline
                sys.stdout.write(before + "\n")
            kind, rank, data = line[i + len(_MARKER):].strip().split(":", 2)
            if kind == "exit":
                finished.add(int(rank))
                continue
            # Decoded after the job: a thread that raised here would stop draining the pipe.
            (results if kind == "ok" else errors)[int(rank)] = data
            if len(results) + len(errors) == nranks and exit_timer.ident is None:
                exit_timer.start()
        sys.stdout.flush()

    def read_stderr():
        for line in proc.stderr:
            sys.stderr.write(line)
            stderr_tail.append(line)
            del stderr_tail[:-200]
        sys.stderr.flush()

    readers = [threading.Thread(target=read_stdout, name="standard output", daemon=True),
               threading.Thread(target=read_stderr, name="standard error", daemon=True)]
    for t in readers:
        t.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # kolo run stops every rank on SIGTERM
        proc.wait()
        raise
    finally:
        exit_timer.cancel()
        # Bounded: a process the ranks started may hold the pipes open after kolo run exits, and
        # a reader blocks while this process's own sys.stdout does.
        deadline = time.monotonic() + _OUTPUT_WAIT
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
    unread = [t.name for t in readers if t.is_alive()]
    if overdue.is_set() and not errors:  # (a rank's error explains more than the hang)
        hung = sorted(r for r in results if r not in finished)
        e = RuntimeError(
            "kolo.run: every rank returned its result, but %s %g s later, so the job was stopped"
            % (("%s had not exited (a thread that is not a daemon, or an atexit handler, keeps it "
                "alive)" % _ranks(hung)) if hung else
               "kolo run had not ended (a process the ranks started may still hold its output open)",
               _EXIT_WAIT))
        e.ranks = hung
        raise e
    if code != 0 or errors:
        raise _failure(code, {r: _loads(d) for r, d in errors.items()}, "".join(stderr_tail),
                       _read_outcome(outcome_file))
    missing = [r for r in range(nranks) if r not in results]
    if missing and unread:
        e = RuntimeError(
            "kolo.run: the job succeeded, but the result of %s was never read: kolo run's %s was "
            "still being read %g s after it exited (this process's own %s may block, or a process "
            "the ranks started holds the pipe open)"
            % (_ranks(missing), " and ".join(unread), _OUTPUT_WAIT, " or ".join(
                "sys.stdout" if n == "standard output" else "sys.stderr" for n in unread)))
        e.ranks = missing
        raise e
    if missing:
        raise RuntimeError("kolo.run: the job succeeded but ranks %s returned no result" % missing)
    return [_loads(results[r]) for r in range(nranks)]


def _ranks(ranks):
    return ("rank %d" % ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class _DriverUnpickler(pickle.Unpickler):
    """Resolves classes the workers knew as __mp_main__.X (defined in the driver script) to the
    driver's __main__.X."""

    def find_class(self, module, name):
        if module == "__mp_main__":
            module = "__main__"
        return super().find_class(module, name)


def _loads(data):
    return _DriverUnpickler(io.BytesIO(base64.b64decode(data))).load()


def _read_outcome(path):
    """The job's outcome kolo run wrote to path (docs/launcher.md, "The outcome file"), or None when
    it wrote none (it failed before the job started, or was killed)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _failure(code, errors, stderr, outcome):
    """The RuntimeError for a failed job: the rank kolo run traced the failure to (the outcome's
    first_failed), else the lowest rank that raised, with its exception; else kolo run's own
    last words."""
    first_failed = (outcome or {}).get("first_failed")
    first = first_failed["rank"] if first_failed else (min(errors) if errors else None)
    if first in errors:
        err = errors[first]
        exc = None
        if err.get("exception"):
            try:
                exc = _DriverUnpickler(io.BytesIO(err["exception"])).load()
            except Exception:
                exc = None
        e = RuntimeError("kolo.run: rank %d raised %s\n%s" % (first, err["summary"],
                                                            err["traceback"].rstrip()))
        e.rank = first
        if exc is not None:
            e.__cause__ = exc
        return e
    summary = stderr.strip().splitlines()[-3:] if stderr.strip() else []
    e = RuntimeError("kolo.run: the job failed (kolo run exit status %d)%s" % (
        code, (": " + " | ".join(summary)) if summary else ""))
    e.rank = first
    return e


def _rank():
    """This rank, as the launcher numbers it (KOLO_RANK, or Horovod's name for it)."""
    return os.environ.get("KOLO_RANK", os.environ.get("HOROVOD_RANK", "0"))


def _emit(kind, value):
    """Writes the marker line of kind "ok" (value is the result), "err" (value describes the
    exception) or "exit" (this rank's code has ended; value is None) to the driver. Raises if
    value cannot be pickled; an output nobody reads any more is not an error."""
    data = base64.b64encode(pickle.dumps(value)).decode("ascii")
    try:
        sys.stdout.flush()  # what the rank printed comes before the marker
        # Through the file descriptor, so it is one write even if sys.stdout was replaced.
        os.write(1, ("%s%s:%s:%s\n" % (_MARKER, kind, _rank(), data)).encode("ascii"))
    except (OSError, ValueError):  # a closed pipe, or a sys.stdout the script closed
        pass


def _load_main(path):
    """Imports the driver script as __mp_main__ so functions pickled as __main__.f resolve."""
    import runpy
    import types
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _worker_main():
    payload = os.environ.get(_PAYLOAD_ENV)
    if not payload and os.environ.get(_PAYLOAD_FILE_ENV):
        with open(os.environ[_PAYLOAD_FILE_ENV]) as f:
            payload = f.read()
    if not payload:
        sys.exit("kolo.runner: neither %s nor %s is set; this entry point is started by kolo.run"
                 % (_PAYLOAD_ENV, _PAYLOAD_FILE_ENV))
    outer = pickle.loads(base64.b64decode(payload))
    for p in reversed(outer["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        if outer["main"] and os.path.exists(outer["main"]):
            _load_main(outer["main"])
        func, args, kwargs = pickle.loads(outer["blob"])
        result = func(*args, **kwargs)
    except BaseException as e:  # report SystemExit and KeyboardInterrupt too, then fail
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        from kolo import _lib
        _lib.report_failure(e)  # tell the launcher and the other ranks why, as the exception hook does
        try:
            exc = pickle.dumps(e)
        except Exception:
            # A class that came by value with a cloudpickled function is not the module's own:
            # cloudpickle sends it back by value, and the driver, which sent it, gets its own.
            try:
                exc = _pickler.dumps(e)
            except Exception:
                exc = None
        _emit("err", {"summary": "%s: %s" % (type(e).__name__, e), "traceback": tb,
                      "exception": exc})
        sys.stderr.flush()
        os._exit(1)
    try:
        _emit("ok", result)
    except Exception as e:
        sys.stderr.write("kolo.run: rank result cannot be pickled: %s\n" % e)
        sys.stderr.flush()
        os._exit(1)
    # Says that this rank's own code has ended: the interpreter runs atexit handlers once every
    # thread that is not a daemon has. Registered last, it runs before kolo's own shutdown.
    import atexit
    atexit.register(_emit, "exit", None)
