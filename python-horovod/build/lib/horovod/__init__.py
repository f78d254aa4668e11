"""Horovod's import paths, served by kolo (the kolo-horovod package, `pip install kolo[horovod]`).

``import horovod.torch as hvd`` gives kolo.torch, ``horovod.tensorflow`` kolo.tensorflow,
``horovod.tensorflow.keras`` kolo.tensorflow.keras and ``horovod.keras`` kolo.keras, with every
submodule below them (``horovod.torch.elastic``, ``horovod.tensorflow.util``, ...): the module
objects are kolo's own, so that a script mixing both spellings shares one engine, one set of
process sets and one elastic state. The rest of the package (``horovod.run``, ``horovod.runner``,
``horovod.common``) holds the few names outside the frameworks that scripts and Horovod's own test
helpers import.
"""

import importlib
import importlib.abc
import importlib.util
import sys

import kolo
from kolo.runner import run  # noqa: F401  (horovod.run, Horovod's Python launcher API)

# Horovod's API level that kolo serves, and kolo's own version after the "+".
__version__ = "0.28.1+kolo." + kolo.__version__

# The frameworks whose modules are kolo's: horovod.<name>[.<sub>...] is kolo.<name>[.<sub>...].
FRAMEWORKS = ("torch", "tensorflow", "keras")


class _KoloAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds horovod.<framework>... and loads it as the kolo module of the same path."""

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in FRAMEWORKS:
            return None
        target_name = "kolo." + ".".join(parts[1:])
        try:
            found = importlib.util.find_spec(target_name)
        except ImportError:
            return None
        if found is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, is_package=found.submodule_search_locations is not None)
        spec.loader_state = target_name
        return spec

    def create_module(self, spec):
        return importlib.import_module(spec.loader_state)

    def exec_module(self, module):
        # The module is kolo's and already ran; importing it under its Horovod name runs nothing
        # again. Its __name__ and __spec__ stay kolo's.
        pass


if not any(isinstance(f, _KoloAlias) for f in sys.meta_path):
    sys.meta_path.insert(0, _KoloAlias())
