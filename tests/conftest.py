"""Fixtures shared by every suite."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_release():
    """tests/tiny_release.py, loaded by path: an installed distribution (smdebug_rulesconfig) shadows the name `tests`."""
    spec = importlib.util.spec_from_file_location("shiplift_tiny_release", Path(__file__).with_name("tiny_release.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
