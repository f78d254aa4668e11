"""horovod.tensorflow.util's helpers, which scripts and Horovod's own tests import: whether ops run
eagerly, and variables to and from hashable references."""

import tensorflow as tf


def _executing_eagerly():
    """Whether ops run eagerly here (False inside tf.function and in graph mode)."""
    return tf.executing_eagerly()


def _make_subgraph(f):
    return tf.function(f)


def _cache(f):
    """f memoized by its arguments and by whether it runs eagerly (a graph's ops are not an eager
    call's)."""
    cache = {}

    def wrapper(*args):
        key = (args, _executing_eagerly())
        if key not in cache:
            cache[key] = f(*args)
        return cache[key]

    return wrapper


def vars_to_refs(variables):
    """Variables (nested lists) as hashable references, in tuples."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The inverse of vars_to_refs."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
