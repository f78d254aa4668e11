"""The exceptions elastic scripts catch, as Horovod spells their module: kolo's own classes."""

from kolo._lib import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
