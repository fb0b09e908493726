"""What every ``vramd`` command shares: the two consoles, the exit codes, one-line failures.

Exit codes: 0 success, 1 the thing asked for failed or is invalid (``EXIT_FAILED``), 2 usage
errors (typer's own), 3 the daemon is unreachable (``EXIT_UNREACHABLE``). An expected failure
prints one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console

EXIT_FAILED = 1
EXIT_UNREACHABLE = 3

# Piped output (scripts, `watch`, logs) gets wide tables rather than rich's 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """End the command with ``vramd: message`` on stderr and exit ``code``."""
    err.print(f"vramd: {message}", markup=False)
    raise typer.Exit(code)


def print_json(data: BaseModel | Sequence[BaseModel] | dict[str, object]) -> None:
    """An answer as the daemon sent it (keys sorted), models and lists of them too."""
    if isinstance(data, BaseModel):
        plain: object = data.model_dump(mode="json")
    elif isinstance(data, Sequence):
        plain = [item.model_dump(mode="json") for item in data]
    else:
        plain = data
    typer.echo(json.dumps(plain, indent=2, sort_keys=True))


def read_text(path: Path, what: str) -> str:
    """A UTF-8 file the user named (``what`` says which kind), or a one-line failure."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot read {what}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{path}: the {what} is not UTF-8 text")
