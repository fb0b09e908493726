"""HostProbe against real processes holding real memory (no fakes: psutil reads /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from service.devices import HostProbe, create_probe, tree
from service.devices.tree import Footprints, ProcessTable, host_footprint, sample_trees

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


# --- what a reading costs: /proc read directly, PSS read again only when it can have moved --

# Holds 50 MiB, then 100 MiB more on each line read from stdin.
GROWS = """
import sys
blocks = []
def hold(mib):
    block = bytearray(mib * 2**20)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    blocks.append(block)
hold(50)
print("ready", flush=True)
for _ in sys.stdin:
    hold(100)
    print("grown", flush=True)
"""


# Holds 100 MiB; forks a child that shares it (and sleeps) on a line from stdin.
FORKS = """
import os, sys, time
block = bytearray(100 * 2**20)
for offset in range(0, len(block), 4096):
    block[offset] = 1
print("ready", flush=True)
sys.stdin.readline()
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
print("forked", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not tree.LINUX_PROC, reason="reads /proc")
def test_scan_reads_parent_and_group_past_an_odd_command_name(tmp_path: Path) -> None:
    # The command name sits in parentheses in /proc/PID/stat and may hold both.
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [str(odd), "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert psutil.Process(proc.pid).name() == "a) b (c"
        table = ProcessTable.scan()
        assert proc.pid in table.children[os.getpid()]
        assert table.groups[proc.pid] == (proc.pid,)
        assert table.started[proc.pid] > 0
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


@contextlib.contextmanager
def talking_child(script: str) -> Iterator[subprocess.Popen[str]]:
    """``script`` in its own process group, told what to do on stdin and answering on
    stdout; killed with its group afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def tell(proc: subprocess.Popen[str], command: str, answer: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == answer


def test_a_footprint_follows_memory_that_grows_at_once() -> None:
    footprints = Footprints(clock=lambda: 0.0)  # the clock stands still: no re-read by age
    with talking_child(GROWS) as proc:
        before = sample_trees({"x": proc.pid}, footprints)["x"].host_bytes
        again = sample_trees({"x": proc.pid}, footprints)["x"].host_bytes
        tell(proc, "more", "grown")
        after = sample_trees({"x": proc.pid}, footprints)["x"].host_bytes
    assert before >= 50 * MiB
    assert again == before
    assert after - before >= 95 * MiB


@pytest.mark.skipif(not tree.LINUX_PROC, reason="reads /proc")
def test_a_footprint_is_read_again_once_it_is_old() -> None:
    # After a fork the parent shares its pages with the child: its PSS halves while its
    # RSS stays put, which only the age bound notices.
    now = [0.0]
    footprints = Footprints(clock=lambda: now[0])
    with talking_child(FORKS) as proc:
        alone = footprints.sample({"x": (proc.pid,)}, ProcessTable.scan())["x"].host_bytes
        tell(proc, "fork", "forked")
        now[0] += tree.PSS_MAX_AGE_S
        later = footprints.sample({"x": (proc.pid,)}, ProcessTable.scan())["x"].host_bytes
        shared = pss(proc.pid)
    assert alone >= 95 * MiB
    assert shared <= alone * 0.6
    assert abs(later - shared) <= shared * 0.10
