"""Process trees and their host memory: which processes are one instance, and what they hold."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil

from service.domain import InstanceMemory

PROC = "/proc"
# Where /proc/PID/stat can be read directly; elsewhere psutil does the work.
LINUX_PROC = sys.platform.startswith("linux") and os.path.isdir(PROC)
PSS_MAX_AGE_S = 10.0


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """Parent and process-group links of every visible process, taken in one pass."""

    pids: frozenset[int]
    children: Mapping[int, tuple[int, ...]]
    groups: Mapping[int, tuple[int, ...]]
    # Each process's start time (clock ticks since boot, Linux): a pid and its start time
    # name one process, where a pid alone may be reused. Empty where not known.
    started: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def scan(cls) -> ProcessTable:
        links = _proc_links() if LINUX_PROC else _psutil_links()
        pids: set[int] = set()
        children: defaultdict[int, list[int]] = defaultdict(list)
        groups: defaultdict[int, list[int]] = defaultdict(list)
        started: dict[int, int] = {}
        for pid, ppid, pgid, start in links:
            pids.add(pid)
            if ppid is not None and ppid != pid:
                children[ppid].append(pid)
            if pgid is not None:
                groups[pgid].append(pid)
            if start is not None:
                started[pid] = start
        return cls(
            pids=frozenset(pids),
            children={ppid: tuple(pids) for ppid, pids in children.items()},
            groups={pgid: tuple(pids) for pgid, pids in groups.items()},
            started=started,
        )

    def tree(self, root: int) -> tuple[int, ...]:
        """``root`` (if alive), its process group and all their descendants; root first.

        Empty when neither the root nor any member of its group exists any more.
        """
        seeds = [root, *self.groups.get(root, ())]
        seen: set[int] = set()
        while seeds:
            pid = seeds.pop()
            if pid in seen:
                continue
            seen.add(pid)
            seeds.extend(self.children.get(pid, ()))
        alive = seen & self.pids
        rest = sorted(alive - {root})
        return (root, *rest) if root in alive else tuple(rest)


@dataclass(frozen=True, slots=True)
class TreeSample:
    """One instance's processes and their host footprint at one moment."""

    pids: tuple[int, ...]
    host_bytes: int


def sample_trees(
    roots: Mapping[str, int], footprints: Footprints | None = None
) -> dict[str, TreeSample]:
    """Every instance's tree and footprint, from one scan of the process table.

    Every key asked for is answered; a key whose processes are all gone gets
    ``TreeSample(pids=(), host_bytes=0)``. ``footprints`` (a probe's own) spares reading
    the PSS of processes whose memory has not moved; without it every PSS is read.

    An instance is the process its supervisor spawned (a process-group leader) plus whatever
    that process started. Runtimes fork workers (vLLM engine cores, Python multiprocessing,
    llama.cpp RPC servers), and a worker whose parent exits is re-parented to init: it drops
    out of ``children()`` while it still holds memory and still sits in the instance's process
    group. So a tree here is the root's descendants *and* the members of its process group
    (and their descendants). Both sets come from one pass over the process table per reading,
    rather than one ``psutil.Process.children(recursive=True)`` walk (itself a full scan) per
    instance.

    Host footprint is PSS (proportional set size) where the kernel offers it: a page shared by
    N processes counts 1/N to each, so forked workers that share copy-on-write pages, and the
    shared libraries every process maps, are counted once per tree instead of once per
    process as RSS would. RSS is the fallback where PSS is unavailable (not Linux) or access
    to ``smaps_rollup`` is denied (another user's process).

    Processes may exit at any moment between the scan and the measurement; a vanished process
    simply contributes nothing. Nothing here raises for that.

    What a reading costs, since one runs every ``device.sample_interval`` for the daemon's
    whole life: on Linux the scan reads ``/proc/PID/stat`` once per process (parent, process
    group and start time in one read; psutil's ``process_iter`` read it three times and
    ``os.getpgid`` added a call). And reading PSS makes the kernel walk the process's page
    tables (~4 ms for a runtime holding 400 MiB, every sample, for every process of every
    tree), so ``Footprints`` keeps each process's last PSS and reads it again only when its
    RSS (``/proc/PID/statm``, one counter) has moved, or ``PSS_MAX_AGE_S`` has passed: a
    runtime that allocates or frees is measured afresh each sample, an idle one every few
    seconds. PSS can also move while RSS does not (a process sharing its pages starts or
    exits); the age bound is how stale that can be.
    """
    if not roots:
        return {}
    table = ProcessTable.scan()
    trees = {key: table.tree(root) for key, root in roots.items()}
    if footprints is None:
        return {key: TreeSample(pids, host_footprint(pids)) for key, pids in trees.items()}
    return footprints.sample(trees, table)


def instance_memory(
    trees: Mapping[str, TreeSample], device_bytes: Mapping[str, Mapping[int, int]]
) -> dict[str, InstanceMemory]:
    """A GPU probe's answer per instance: its bytes on each device, its tree's host bytes.

    An instance with no process left holds nothing, even when the figure is a stale one.
    """
    out = {}
    for key, tree in trees.items():
        per_device = dict(device_bytes.get(key, {})) if tree.pids else {}
        out[key] = InstanceMemory(
            device_bytes=sum(per_device.values()),
            host_bytes=tree.host_bytes,
            pids=tree.pids,
            per_device=per_device,
        )
    return out


class Footprints:
    """Each process's last PSS, reused while its RSS stays put (the module docstring).

    One per probe, shared by the threads that read it (the sampler's, a sleep's).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # pid -> (start time, RSS pages, footprint bytes, when it was read)
        self._seen: dict[int, tuple[int | None, int, int, float]] = {}

    def sample(
        self, trees: Mapping[str, tuple[int, ...]], table: ProcessTable
    ) -> dict[str, TreeSample]:
        with self._lock:
            now = self._clock()
            samples = {
                key: TreeSample(
                    pids=pids,
                    host_bytes=sum(
                        self._footprint(pid, table.started.get(pid), now) for pid in pids
                    ),
                )
                for key, pids in trees.items()
            }
            # Forget the processes that are gone; keep those another caller asks about.
            self._seen = {pid: seen for pid, seen in self._seen.items() if pid in table.pids}
            return samples

    def _footprint(self, pid: int, start: int | None, now: float) -> int:
        rss = _rss_pages(pid) if LINUX_PROC else None
        if rss is None:  # gone, or no statm to compare with: read it as it is
            self._seen.pop(pid, None)
            return _process_footprint(pid)
        last = self._seen.get(pid)
        if last is not None and start is not None:
            last_start, last_rss, footprint, read_at = last
            if last_start == start and last_rss == rss and now - read_at < PSS_MAX_AGE_S:
                return footprint
        footprint = _process_footprint(pid)
        self._seen[pid] = (start, rss, footprint, now)
        return footprint


def host_footprint(pids: Iterable[int]) -> int:
    """Sum of PSS (RSS where PSS cannot be read) over ``pids``; vanished ones count 0."""
    return sum(_process_footprint(pid) for pid in pids)


def _process_footprint(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        try:
            pss = getattr(proc.memory_full_info(), "pss", None)
        except psutil.AccessDenied:
            pss = None
        if pss is not None:
            return int(pss)
        return int(proc.memory_info().rss)
    except psutil.Error:
        # NoSuchProcess (which includes ZombieProcess: a zombie holds no memory) or a
        # process we may not even read statm for.
        return 0


# (pid, parent, process group, start time); None where it could not be read.
Link = tuple[int, int | None, int | None, int | None]


def _proc_links() -> list[Link]:
    """Every process's links from ``/proc/PID/stat``, one read each (Linux)."""
    links: list[Link] = []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        data = _read_small(f"{PROC}/{name}/stat")
        if data is None:  # gone since the listing
            continue
        # "pid (comm) state ppid pgrp ... starttime ...": comm may hold spaces and
        # parentheses, so the fields are counted from its last ")".
        fields = data[data.rfind(b")") + 2 :].split()
        try:
            links.append((int(name), int(fields[1]), int(fields[2]), int(fields[19])))
        except (IndexError, ValueError):
            links.append((int(name), None, None, None))
    return links


def _psutil_links() -> list[Link]:
    links: list[Link] = []
    # process_iter skips processes that vanish while it reads them.
    for proc in psutil.process_iter(["ppid"]):
        links.append((proc.pid, proc.info.get("ppid"), _pgid(proc.pid), None))
    return links


def _rss_pages(pid: int) -> int | None:
    data = _read_small(f"{PROC}/{pid}/statm")
    try:
        return None if data is None else int(data.split()[1])
    except (IndexError, ValueError):
        return None


def _read_small(path: str) -> bytes | None:
    """A /proc file of one short line, in one read (no buffered file object: ~2x faster)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or not ours to ask about
        return None
