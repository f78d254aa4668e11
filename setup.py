"""Builds the Go parts of the kolo Python package (metadata is in pyproject.toml).

build_py puts two files into the package's lib/ directory:
  libkolo.so   the engine, `go build -buildmode=c-shared ./capi` (needs cgo: a C compiler)
  kolo         the `kolo` command, `go build ./cmd/kolo` (static, CGO_ENABLED=0)
With Go available (on PATH, in $GO, or /usr/local/go/bin) they are built from this checkout;
otherwise the ones `make lib` left in python/kolo/lib/ are used, and without those the build fails
and says why. The wheel is tagged py3-none-<platform>: it holds native code but no Python
extension, so one wheel serves every Python 3 and every torch version.
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - building without wheel installed
    bdist_wheel = None

ROOT = os.path.dirname(os.path.abspath(__file__))
PREBUILT = os.path.join(ROOT, "python", "kolo", "lib")
ARTIFACTS = ("libkolo.so", "kolo")


def find_go():
    for cand in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def go_build(go, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ)
    subprocess.check_call([go, "build", "-buildmode=c-shared",
                           "-o", os.path.join(out_dir, "libkolo.so"), "./capi"], cwd=ROOT, env=env)
    os.remove(os.path.join(out_dir, "libkolo.h"))  # cgo's header: nothing here compiles against it
    env["CGO_ENABLED"] = "0"
    subprocess.check_call([go, "build", "-o", os.path.join(out_dir, "kolo"), "./cmd/kolo"],
                          cwd=ROOT, env=env)


class BuildPy(build_py):
    """build_py, plus the engine library and the kolo command in kolo/lib/."""

    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "kolo", "lib")
        if getattr(self, "editable_mode", False):
            out = PREBUILT  # an editable install imports python/kolo itself
        go = find_go()
        if go:
            go_build(go, out)
            return
        missing = [a for a in ARTIFACTS if not os.path.exists(os.path.join(PREBUILT, a))]
        if missing:
            raise SystemExit(
                "kolo: Go was not found (PATH, $GO, /usr/local/go/bin) and %s not prebuilt in %s. "
                "Install Go 1.26 and a C compiler, run `make lib` where they exist, or install a kolo "
                "wheel, which needs neither." % (", ".join(missing), PREBUILT))
        if os.path.abspath(out) != PREBUILT:
            os.makedirs(out, exist_ok=True)
            for a in ARTIFACTS:
                shutil.copy2(os.path.join(PREBUILT, a), os.path.join(out, a))


class BinaryDistribution(Distribution):
    """Native code inside: a platform wheel, its files at the wheel's root (platlib)."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPy}

if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """A platform wheel that any Python 3 can install (no Python extension inside)."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
