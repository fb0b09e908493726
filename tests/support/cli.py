"""The ``vramd`` command in tests: in this process (typer's ``CliRunner``) or as a process.

Both drop the test's own ``VRAMD_*`` settings, add ``env``, and set a wide terminal
(rich tables are as wide as the terminal; there is none here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from typer.testing import CliRunner

from service.cli import app

from .daemon import REPO_ROOT

VRAMD = [sys.executable, "-m", "service.cli"]


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def vramd(*args: str, **env: str) -> Ran:
    """``vramd ARGS`` in this process; an exception that is not an exit fails the test
    (a user would see it as a traceback)."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("VRAMD_")}
    result = CliRunner().invoke(app, list(args), env={**unset, "COLUMNS": "200", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    return Ran(result.exit_code, result.stdout, result.stderr)


def cli_env(**env: str) -> dict[str, str]:
    """The environment of a real ``vramd`` process: this one's, without ``VRAMD_*``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")}
    return {**environ, "COLUMNS": "200", **env}


def vramd_process(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m service.cli ARGS`` as a real process, from the repository root."""
    return subprocess.run(
        [*VRAMD, *args], capture_output=True, text=True, cwd=REPO_ROOT, env=cli_env(**env),
        timeout=60,
    )  # fmt: skip
