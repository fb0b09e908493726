"""HostProbe against real processes holding real memory (no fakes: psutil reads /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from service.devices import HostProbe, create_probe
from service.devices.tree import ProcessTable, host_footprint

MiB = 2**20

# Touch every page: bytearray's zeroed pages are not resident until written.
HOLD = """
import sys, time
block = bytearray({mib} * 2**20)
for offset in range(0, len(block), 4096):
    block[offset] = 1
print("ready", flush=True)
time.sleep(60)
"""

# Starts a leaf holding 100 MiB, prints its pid once the memory is held, then waits.
PARENT = """
import subprocess, sys, time
leaf = subprocess.Popen([sys.executable, "-c", {hold!r}], stdout=subprocess.PIPE)
leaf.stdout.readline()
print(leaf.pid, flush=True)
{after}
"""
WAIT = "time.sleep(60)"


def parent_of_leaf(after: str = WAIT) -> str:
    return PARENT.format(hold=HOLD.format(mib=100), after=after)


@contextlib.contextmanager
def spawn(code: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run ``code`` as a group leader (as the supervisor does); yield it and its first line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        yield proc, proc.stdout.readline().strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def pss(pid: int) -> int:
    return int(psutil.Process(pid).memory_full_info().pss)


@pytest.fixture
def probe() -> Iterator[HostProbe]:
    probe = HostProbe()
    yield probe
    probe.close()


def test_device_figures_are_the_machines_memory(probe: HostProbe) -> None:
    reading = probe.read({})
    assert reading.backend == "host"
    assert reading.degraded is None
    assert reading.instances == {}
    (device,) = reading.devices
    assert (device.index, device.name, device.managed) == (0, "host", 0)
    assert device.total > device.used > 0
    assert device.free > 0
    assert device.used + device.free == device.total


def test_instance_footprint_is_its_pss(probe: HostProbe) -> None:
    with spawn(HOLD.format(mib=200)) as (proc, line):
        assert line == "ready"
        reading = probe.read({"x": proc.pid})
        own = pss(proc.pid)
    memory = reading.instances["x"]
    assert memory.pids == (proc.pid,)
    assert memory.device_bytes == memory.host_bytes
    assert memory.host_bytes >= 190 * MiB
    assert abs(memory.host_bytes - own) <= own * 0.10
    assert reading.devices[0].managed == memory.host_bytes


def test_tree_counts_a_grandchild(probe: HostProbe) -> None:
    with spawn(parent_of_leaf()) as (proc, line):
        leaf = int(line)
        reading = probe.read({"x": proc.pid})
        both = pss(proc.pid) + pss(leaf)
    memory = reading.instances["x"]
    assert memory.pids == (proc.pid, leaf)
    assert memory.host_bytes >= 100 * MiB
    assert abs(memory.host_bytes - both) <= both * 0.10


def test_tree_keeps_an_orphaned_worker_through_its_process_group(probe: HostProbe) -> None:
    # root -> middle -> leaf, and middle exits: the leaf is re-parented away from the root
    # but still in the root's process group, still holding its memory.
    middle = parent_of_leaf(after="")
    root = f"""
import subprocess, sys, time
middle = subprocess.Popen([sys.executable, "-c", {middle!r}], stdout=subprocess.PIPE)
leaf = middle.stdout.readline().decode().strip()
middle.wait()
middle.stdout.close()
print(leaf, flush=True)
time.sleep(60)
"""
    with spawn(root) as (proc, line):
        leaf = int(line)
        assert leaf not in {child.pid for child in psutil.Process(proc.pid).children(True)}
        reading = probe.read({"x": proc.pid})
    assert leaf in reading.instances["x"].pids
    assert reading.instances["x"].host_bytes >= 100 * MiB


def test_missing_and_exited_instances_read_as_empty(probe: HostProbe) -> None:
    with spawn(HOLD.format(mib=10)) as (proc, _):
        first = probe.read({"x": proc.pid})
    after_exit = probe.read({"x": proc.pid, "ghost": 2**31 - 1})
    assert first.instances["x"].pids == (proc.pid,)
    assert after_exit.instances["x"].pids == ()
    assert after_exit.instances["x"].host_bytes == 0
    assert after_exit.instances["ghost"].host_bytes == 0
    assert after_exit.devices[0].managed == 0


def test_process_vanishing_between_scan_and_measure_counts_zero() -> None:
    with spawn(HOLD.format(mib=10)) as (proc, _):
        table = ProcessTable.scan()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert table.tree(proc.pid) == (proc.pid,)
    assert host_footprint(table.tree(proc.pid)) == 0


def test_create_probe_host_is_host_without_touching_nvml() -> None:
    probe = create_probe("host")
    try:
        assert isinstance(probe, HostProbe)
        assert probe.backend == "host"
    finally:
        probe.close()
