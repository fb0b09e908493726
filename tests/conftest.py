"""Test-wide settings. Fixtures live beside the tests that use them (tests/support/).

Tests live by what they start: ``tests/unit`` nothing of their own (fake clocks, in-process
apps), ``tests/process`` real runtimes or CLI processes but no daemon, ``tests/e2e`` a
running daemon. Each gets the marker of its directory, so ``-m unit`` is the inner loop.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

KINDS = ("unit", "process", "e2e", "image")

# Property tests explore new inputs on developers' machines; CI replays a fixed sequence
# so that a red run is reproducible (a failure found locally becomes a regression test).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.path)).parent.name
        if kind in KINDS:
            item.add_marker(kind)
