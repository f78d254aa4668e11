"""horovod.runner.util.threads' two helpers, which Horovod's test utilities import
(test/utils/common.py), with Horovod's signatures."""

import threading


def _check_args(args):
    if not isinstance(args, tuple):
        raise ValueError("args must be a tuple, not %s; for a single argument use (arg,)" % type(args))


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Runs target(*args) in a thread started before this returns it. silent: an exception in
    target ends the thread without being printed."""
    _check_args(args)
    fn = target
    if silent:
        def fn(*a):
            try:
                target(*a)
            except BaseException:
                pass
    thread = threading.Thread(target=fn, args=args, name=name)
    thread.daemon = daemon
    thread.start()
    return thread


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True, silent=False):
    """Runs func(*args) in a thread once event is set, unless stop is set first (checked every
    check_stop_interval_s). A thread that is not a daemon needs stop, or it may never end."""
    if event is None:
        raise ValueError("event must not be None")
    _check_args(args)
    if not daemon and stop is None:
        raise ValueError("stop must be given when daemon is False")

    def wait_then_run():
        if stop is None:
            event.wait()
        else:
            while not event.wait(check_stop_interval_s):
                if stop.is_set():
                    return
            if stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_run, daemon=daemon, silent=silent)
