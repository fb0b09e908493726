"""A runtime's output: two files it appends to, followed into its log ring.

A runtime writes its stdout and stderr to files of its own (``<dir>/<name>.out`` and
``.err``, opened ``O_APPEND``), never to a pipe: a pipe's reading end lives in the daemon,
and a runtime whose daemon died would get SIGPIPE (or block) on its next log line. A file
outlives the daemon, and the next one goes on reading it where it left off
(docs/operations.md, "Restarts and upgrades").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.supervisor.logs import LineSplitter, LogRing, Stream

logger = logging.getLogger("vramd.supervisor")

READ_CHUNK = 65536
POLL_S = 0.1  # where inotify is not available
KEEP_BYTES = 256 * 1024  # left in the file behind the reader, for an adopting daemon
TRIM_STEP = 4 * 1024 * 1024  # punch once this much more has been read
_IN_MODIFY = 0x2
_FALLOC_FL_KEEP_SIZE = 0x1
_FALLOC_FL_PUNCH_HOLE = 0x2

STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_serial = itertools.count()


@dataclass(frozen=True, slots=True)
class OutputFiles:
    """Where one runtime process writes: ``<base>.out`` and ``<base>.err``."""

    base: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> OutputFiles:
        """New files in ``directory`` for a process of ``name`` (a unique base path)."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        stem = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(_serial)}"
        return cls(directory / stem)

    def path(self, stream: Stream) -> Path:
        return self.base.with_name(f"{self.base.name}.{'out' if stream == 'stdout' else 'err'}")

    def open_for_runtime(self) -> tuple[int, int]:
        """Descriptors for the runtime's stdout and stderr (the caller closes its copies)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out = os.open(self.path("stdout"), flags, 0o640)
        try:
            return out, os.open(self.path("stderr"), flags, 0o640)
        except BaseException:
            os.close(out)
            raise

    def remove(self) -> None:
        for stream in STREAMS:
            with contextlib.suppress(FileNotFoundError):
                self.path(stream).unlink()


class _Stream:
    """One file being followed: its descriptor, how far it is read, its splitter."""

    def __init__(self, path: Path, splitter: LineSplitter, *, from_end: bool) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.splitter = splitter
        self.offset = 0
        self.trimmed = 0
        self.skip_partial = False
        if from_end:
            size = os.fstat(self.fd).st_size
            self.offset = max(0, size - KEEP_BYTES)
            self.trimmed = self.offset
            self.skip_partial = self.offset > 0

    def read(self) -> None:
        while True:
            data = os.pread(self.fd, READ_CHUNK, self.offset)
            if not data:
                break
            self.offset += len(data)
            if self.skip_partial:  # the first line read back from the middle is a tail
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                data, self.skip_partial = data[cut + 1 :], False
            self.splitter.feed(data.replace(b"\0", b""))  # a punched hole reads as zeros
        if self.offset - KEEP_BYTES - self.trimmed >= TRIM_STEP:
            self._trim(self.offset - KEEP_BYTES)

    def _trim(self, upto: int) -> None:
        upto -= upto % 4096
        length = upto - self.trimmed
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        if _libc.fallocate(self.fd, mode, ctypes.c_long(self.trimmed), ctypes.c_long(length)):
            # Opened read-only: punch through a writable descriptor.
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if _libc.fallocate(fd, mode, ctypes.c_long(self.trimmed), ctypes.c_long(length)):
                    err = ctypes.get_errno()
                    logger.warning("cannot trim %s: %s", self.path, os.strerror(err))
                    self.trimmed = upto  # do not retry on every read
                    return
            finally:
                os.close(fd)
        self.trimmed = upto

    def close(self) -> None:
        self.splitter.flush()
        os.close(self.fd)


class OutputFollower:
    """Follows a runtime's two output files into ``log`` until ``close``.

    ``from_end``: start near the end (an adopted runtime's earlier output was read by the
    daemon that started it; the last ``KEEP_BYTES`` are read back for context).

    ``OutputFollower`` reads what is appended, on the event loop, as the runtime writes it:
    inotify tells it when a file grew (where the kernel has it; otherwise it polls every
    ``POLL_S``). Lines go to the ring through a ``LineSplitter`` per stream. Disk use stays
    bounded without losing a line: the part already read, but for the last ``KEEP_BYTES``
    (what a daemon adopting the runtime reads back), is punched out of the file
    (``FALLOC_FL_PUNCH_HOLE``), so the file keeps its length but not its blocks.
    """

    def __init__(
        self, files: OutputFiles, log: LogRing, now: Callable[[], float], *, from_end: bool = False
    ) -> None:
        self.files = files
        self._streams = [
            _Stream(files.path(s), LineSplitter(s, log, now), from_end=from_end) for s in STREAMS
        ]
        self._loop = asyncio.get_running_loop()
        self._inotify = _watch([s.path for s in self._streams])
        self._timer: asyncio.TimerHandle | None = None
        if self._inotify is not None:
            self._loop.add_reader(self._inotify, self._notified)
        else:
            self._timer = self._loop.call_later(POLL_S, self._poll)
        self.read()

    def read(self) -> None:
        """Read whatever was appended since the last read."""
        for stream in self._streams:
            try:
                stream.read()
            except OSError as exc:
                logger.warning("cannot read %s: %s", stream.path, exc)

    def _notified(self) -> None:
        assert self._inotify is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._inotify, 4096):
                pass
        self.read()

    def _poll(self) -> None:
        self.read()
        self._timer = self._loop.call_later(POLL_S, self._poll)

    def close(self, *, remove: bool) -> None:
        """Read the rest, stop following; ``remove`` the files (the process is gone)."""
        if not self._streams:
            return
        self.read()
        if self._inotify is not None:
            self._loop.remove_reader(self._inotify)
            os.close(self._inotify)
            self._inotify = None
        if self._timer is not None:
            self._timer.cancel()
        for stream in self._streams:
            stream.close()
        self._streams = []
        if remove:
            self.files.remove()


def _watch(paths: list[Path]) -> int | None:
    """An inotify descriptor told of every write to ``paths``; None where unavailable."""
    try:
        fd: int = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except AttributeError:
        return None
    if fd < 0:
        return None
    for path in paths:
        if _libc.inotify_add_watch(fd, os.fsencode(path), _IN_MODIFY) < 0:
            os.close(fd)
            return None
    return fd
