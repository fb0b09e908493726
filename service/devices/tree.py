"""Process trees and their host memory: which processes are one instance, and what they hold.

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
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """Parent and process-group links of every visible process, taken in one pass."""

    pids: frozenset[int]
    children: Mapping[int, tuple[int, ...]]
    groups: Mapping[int, tuple[int, ...]]

    @classmethod
    def scan(cls) -> ProcessTable:
        pids: set[int] = set()
        children: defaultdict[int, list[int]] = defaultdict(list)
        groups: defaultdict[int, list[int]] = defaultdict(list)
        # process_iter skips processes that vanish while it reads them.
        for proc in psutil.process_iter(["ppid"]):
            pid = proc.pid
            pids.add(pid)
            ppid = proc.info.get("ppid")
            if ppid is not None and ppid != pid:
                children[ppid].append(pid)
            pgid = _pgid(pid)
            if pgid is not None:
                groups[pgid].append(pid)
        return cls(
            pids=frozenset(pids),
            children={ppid: tuple(pids) for ppid, pids in children.items()},
            groups={pgid: tuple(pids) for pgid, pids in groups.items()},
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


def sample_trees(roots: Mapping[str, int]) -> dict[str, TreeSample]:
    """Every instance's tree and footprint, from one scan of the process table.

    Every key asked for is answered; a key whose processes are all gone gets
    ``TreeSample(pids=(), host_bytes=0)``.
    """
    if not roots:
        return {}
    table = ProcessTable.scan()
    samples = {}
    for key, root in roots.items():
        pids = table.tree(root)
        samples[key] = TreeSample(pids=pids, host_bytes=host_footprint(pids))
    return samples


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


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or not ours to ask about
        return None
