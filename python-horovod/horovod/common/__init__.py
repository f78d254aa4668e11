"""horovod.common: the exceptions scripts catch (horovod.common.exceptions)."""
