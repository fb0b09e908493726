"""The command line the model writers share: ``python -m MODULE --out PATH [--seed N]``.

Standard library only, as the writers themselves at import (they run in the installer's
tools environment or vLLM's).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def run_writer(
    module: str,
    write: Callable[[argparse.Namespace], object],
    argv: list[str] | None,
    *,
    options: Callable[[argparse.ArgumentParser], object] = lambda parser: None,
) -> int:
    """Parse ``--out``, ``--seed`` and what ``options`` adds, ``write(args)``, then print
    the size written (a file, or every file of a directory)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--out", type=Path, required=True, help="the file or directory to write")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    options(parser)
    args = parser.parse_args(argv)
    write(args)
    out: Path = args.out
    files = [out] if out.is_file() else [path for path in out.rglob("*") if path.is_file()]
    print(f"{out}: {sum(path.stat().st_size for path in files):,} bytes")
    return 0
