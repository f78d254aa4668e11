"""horovod.runner: ``run`` (Horovod's Python launcher API) is kolo.run; ``horovodrun`` is kolo run."""

from kolo.runner import run  # noqa: F401
