"""Test-wide settings. Fixtures live beside the tests that use them (tests/support/)."""

from __future__ import annotations

import os

from hypothesis import settings

# Property tests explore new inputs on developers' machines; CI replays a fixed sequence
# so that a red run is reproducible (a failure found locally becomes a regression test).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
