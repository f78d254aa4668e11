"""kolo: distributed data-parallel training on a Go engine.

``import kolo.torch as hvd`` is horovod.torch's API; ``kolo run`` (horovodrun's flags) starts the
ranks. This top-level module stays light: it imports neither torch nor the engine library, so that
``kolo`` the command and framework-free tooling can import it cheaply.
"""

# The Go library (kolo.Version) and this package must agree; a Go test checks that they do, and
# init() checks the library it loads.
__version__ = "0.1.0"

from kolo._lib import HorovodInternalError, KoloForkError, KoloInternalError  # noqa: E402,F401
from kolo.runner import run  # noqa: E402,F401  (stdlib only: keeps this module light)
