"""Shared set-up of the Python tests.

The tests start jobs of 3 to 8 ranks on machines with fewer CPUs (2 on the machines they were
written on): kolo run refuses that unless asked, so every job a test starts may oversubscribe.
Tests that strip KOLO_* from the environment they give kolo run set it themselves.
"""
import os

import pytest

os.environ["KOLO_OVERSUBSCRIBE"] = "1"


@pytest.fixture(autouse=True)
def _own_directory(tmp_path, monkeypatch):
    """Each test runs in a directory of its own: what a failed job leaves in the current directory
    (kolo-flight-<job>.json) stays out of the source tree and apart from other tests'."""
    monkeypatch.chdir(tmp_path)
