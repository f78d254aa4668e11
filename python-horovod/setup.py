"""kolo-horovod carries kolo's version and requires exactly that kolo: the two are one release."""

import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def kolo_version():
    with open(os.path.join(HERE, "..", "python", "kolo", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


version = kolo_version()
setup(version=version, install_requires=["kolo==%s" % version])
