"""One whole line at a time to stdout or stderr, flushed: a supervisor may be tailing it.

Handler threads and the main thread all write; the lock keeps their lines whole.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

_LOG_LOCK = threading.Lock()


def log(line: str, stream: TextIO | None = None) -> None:
    """One whole line to stdout (or ``stream``), flushed: a supervisor may be tailing it."""
    out = stream or sys.stdout
    with _LOG_LOCK:
        out.write(line + "\n")
        out.flush()
