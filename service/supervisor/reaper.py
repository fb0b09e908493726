"""Startup reaping of runtimes that a previous daemon left running."""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil


class ReapOutcome(enum.StrEnum):
    REAPED = "reaped"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class OrphanRecord:
    pid: int
    pgid: int
    proc_start_time: float
    key: str = ""


@dataclass(frozen=True, slots=True)
class ReapResult:
    record: OrphanRecord
    outcome: ReapOutcome
    pids: tuple[int, ...] = ()
    detail: str = ""


# psutil derives a start time from the boot time and clock ticks: the same process reads
# the same value in every daemon, to well under this.
START_TIME_TOLERANCE_S = 0.05


def not_the_same_process(pid: int, start_time: float) -> str:
    """Empty if ``pid`` is alive and is the process that started at ``start_time``;
    else why not (gone, exited, or the pid now belongs to another program)."""
    try:
        proc = psutil.Process(pid)
        status, started = proc.status(), proc.create_time()
    except psutil.Error:
        return f"pid {pid} is gone"
    if status == psutil.STATUS_ZOMBIE:
        return f"pid {pid} has exited"
    if abs(started - start_time) > START_TIME_TOLERANCE_S:
        return f"pid {pid} now belongs to another program ({proc.name()})"
    return ""


def reap_orphans(
    records: Iterable[OrphanRecord],
    *,
    grace_s: float = 2.0,
    tolerance_s: float = START_TIME_TOLERANCE_S,
) -> list[ReapResult]:
    """SIGTERM what is still ours, wait up to ``grace_s`` (all records together), SIGKILL.

    The daemon records every runtime's pid, process group and kernel start time in SQLite
    before the runtime counts as started. If the daemon dies without stopping them (SIGKILL,
    OOM killer, power cut of the service manager only), those runtimes keep running and keep
    holding device memory that the new daemon would count as foreign. At startup the new
    daemon hands the records of instances that were never marked stopped to
    ``reap_orphans``, which stops what is still ours (docs/operations.md, "Security defaults").

    "Still ours" is decided by the start time, not the pid: pids are recycled, and killing
    whatever process now has an old pid would be worse than leaking. So:

    - the leader pid alive with a matching start time (±``tolerance_s``): ours;
    - the leader pid alive with another start time: a stranger; nothing is touched;
    - members of the recorded group created at or after the recorded start time: the
      orphan's children, ours even when the leader itself is gone (a process group id stays
      reserved while any member lives, so a group with members is still the original one).

    Blocking and synchronous: it runs once at startup, before the event loop serves anything.
    """
    found: list[tuple[OrphanRecord, list[psutil.Process], str]] = []
    for record in records:
        members, detail = _ours(record, tolerance_s)
        found.append((record, members, detail))

    everyone = [p for _, members, _ in found for p in members]
    _signal(everyone, signal.SIGTERM)
    _wait_dead(everyone, grace_s)
    # Rescan: a member may have forked while it was shutting down.
    survivors = [p for record, _, _ in found for p in _ours(record, tolerance_s)[0]]
    _signal(survivors, signal.SIGKILL)
    _wait_dead(survivors, 1.0)

    results = []
    for record, members, detail in found:
        if members:
            pids = tuple(sorted(p.pid for p in members))
            results.append(ReapResult(record, ReapOutcome.REAPED, pids, detail))
        else:
            results.append(ReapResult(record, ReapOutcome.GONE, (), detail))
    return results


def _ours(record: OrphanRecord, tolerance_s: float) -> tuple[list[psutil.Process], str]:
    """The live processes of ``record`` that are provably ours, and why if there are none."""
    if record.pgid <= 1 or record.pgid == os.getpgrp():
        return [], f"refusing to touch process group {record.pgid}"
    leader = _live(record.pid)
    if leader is not None:
        started = _create_time(leader)
        if started is None or abs(started - record.proc_start_time) > tolerance_s:
            return [], f"pid {record.pid} now belongs to another process"
    members: dict[int, psutil.Process] = {}
    if leader is not None:
        members[leader.pid] = leader
    earliest = record.proc_start_time - tolerance_s
    for proc in psutil.process_iter():
        if proc.pid in members or proc.pid == os.getpid():
            continue
        try:
            if os.getpgid(proc.pid) != record.pgid:
                continue
        except OSError:
            continue
        started = _create_time(proc)
        if started is not None and started >= earliest and _live(proc.pid) is not None:
            members[proc.pid] = proc
    if not members:
        return [], "no process left"
    return list(members.values()), ""


def _live(pid: int) -> psutil.Process | None:
    """The process with ``pid`` unless it is gone or a zombie (already dead, not reaped)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _create_time(proc: psutil.Process) -> float | None:
    try:
        return proc.create_time()
    except psutil.Error:
        return None


def _signal(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        # psutil checks the start time again before signalling, so a pid recycled since
        # the scan is not hit.
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while pending:
        pending = [p for p in pending if _still_running(p)]
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def _still_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
