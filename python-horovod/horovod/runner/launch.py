"""The ``horovodrun`` command: ``kolo run`` with the same arguments (kolo run takes horovodrun's
flags). ``horovodrun --check-build`` therefore prints kolo's build, which names kolo."""

import os
import sys

from kolo._cli import shipped_binary


def main():
    exe = shipped_binary()
    if not os.access(exe, os.X_OK):
        sys.exit("horovodrun: kolo's launcher is missing from this installation (%s); reinstall kolo" % exe)
    os.execv(exe, [exe, "run"] + sys.argv[1:])


if __name__ == "__main__":
    main()
