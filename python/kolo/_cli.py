"""The `kolo` command of a pip-installed kolo: runs the Go binary shipped in the package (kolo/lib/kolo),
which is the same version as the engine library beside it."""

import os
import sys


def shipped_binary():
    """Where a wheel (or `make lib`) puts the Go launcher: kolo/lib/kolo."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "kolo")


def main():
    exe = shipped_binary()
    if not os.access(exe, os.X_OK):
        sys.exit("kolo: the kolo command is missing from this installation (%s); reinstall kolo, or "
                 "build it with `make lib` in a kolo checkout" % exe)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
