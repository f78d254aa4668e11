"""horovod.common.util's helpers that scripts and Horovod's tests import, with Horovod's behaviour."""

import contextlib
import os


def is_version_greater_equal_than(ver, target):
    """Whether version string ver is at least target ("major.minor.patch")."""
    from packaging import version
    if not (isinstance(ver, str) and isinstance(target, str)):
        raise ValueError("is_version_greater_equal_than takes strings, not %r and %r" % (ver, target))
    if len(target.split(".")) != 3:
        raise ValueError("the target version must be major.minor.patch, not %r" % target)
    return version.parse(ver) >= version.parse(target)


@contextlib.contextmanager
def env(**kwargs):
    """Sets the environment variables given (None: left alone) for the with block, then restores them."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update(kwargs)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def split_list(items, n):
    """items in n contiguous parts whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True
