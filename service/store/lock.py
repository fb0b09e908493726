"""One daemon per database: an exclusive lock file beside the SQLite file.

Two daemons on one database would each take the other's runtimes for orphans of a dead
daemon and kill them at startup. The second one is refused instead, by an advisory
``flock`` on ``<database>.lock`` that the kernel releases when the holder dies, even by
SIGKILL, so a crashed daemon never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from service.errors import StoreError


class DatabaseLock:
    def __init__(self, database: Path) -> None:
        self.path = Path(f"{database}.lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot create the lock file {self.path} beside the database: "
                f"{exc.strerror or exc}; the database directory must be writable"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise StoreError(
                f"{database} is in use by another vramd (pid {holder}); stop it first, "
                "or give this one its own database with --db"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
