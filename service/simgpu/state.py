"""The shared state of the simulated GPUs: one JSON file that every process reads."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

ENV = "VRAMD_SIMULATED_GPUS"
VERSION = 1
MiB = 2**20
DEFAULT_CONTEXT_BYTES = 16 * MiB
DEFAULT_RELEASE_LAG = 0.5

Kind = Literal["compute", "graphics"]


class StateError(Exception):
    """The state file is missing, unreadable, or not a simulated-GPU state."""


@dataclass
class Device:
    name: str
    total: int
    reserved: int
    pci_bus_id: str
    uuid: str
    max_block: int | None = None

    @property
    def usable(self) -> int:
        return self.total - self.reserved


@dataclass
class Allocation:
    id: int
    pid: int
    start_time: float
    device: int
    bytes: int
    kind: Kind = "compute"
    context: bool = False  # the CUDA context a process's first allocation on a device brings
    died_at: float | None = None


@dataclass
class ScriptedError:
    error: str  # an NVML error name: GPU_IS_LOST, NVML_ERROR_GPU_IS_LOST, NVMLError_GpuIsLost
    calls: int


@dataclass
class State:
    """The daemon's probe (through ``service.simgpu.nvml``), demo runtimes that hold "device
    memory", foreign holders and gpucheck's children are separate processes, so what the
    "driver" knows lives in a file named by ``VRAMD_SIMULATED_GPUS``:

    - ``devices``, in PCI bus order (a device's place in the list is its NVML index): name,
      total, the memory the driver reserves for itself, PCI bus id, UUID, and an optional
      ``max_block``: the largest contiguous block an allocation can get while another process
      holds memory on the device (fragmentation: out-of-memory with more free in total).
    - ``fastest_first``: CUDA's default numbering, NVML indexes fastest first. CUDA ordinal
      ``i`` is ``fastest_first[i]`` unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    - ``allocations``: pid and process start time (a reused pid is not the old process),
      device, bytes, ``compute`` or ``graphics``, and ``died_at`` once the process is seen
      gone. Each process's first allocation on a device comes with a context allocation of
      ``context_bytes``, as a CUDA context costs memory before any tensor does.
    - ``release_lag``: seconds a dead process's allocations stay listed after the simulation
      first sees it gone; NVML keeps listing a process until the driver has torn its context
      down, and that is what vramd's settle barrier waits for.
    - ``errors``: scripted NVML failures, a function name -> an NVML error name and how many
      of the next calls raise it.
    - ``hang_until``: a wall-clock time before which every NVML call blocks, as calls into a
      driver that stopped answering do (a GPU fallen off the bus hangs ``nvidia-smi``).

    Writers take an exclusive ``flock`` on a side file (``PATH.lock``; the state file itself
    is replaced on every write, so it cannot carry the lock), read, change, write a temporary
    file and rename it over the state. Readers take no lock: a rename is atomic, so they see
    the old file or the new one, never a torn one. Only the standard library is imported
    here, so the demo runtime still starts fast.
    """

    devices: list[Device]
    fastest_first: list[int]
    release_lag: float = DEFAULT_RELEASE_LAG
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    allocations: list[Allocation] = field(default_factory=list)
    errors: dict[str, ScriptedError] = field(default_factory=dict)
    next_id: int = 1
    hang_until: float = 0.0

    def used(self, device: int) -> int:
        """Bytes held on ``device``: live allocations and dead ones still listed."""
        return sum(a.bytes for a in self.allocations if a.device == device)

    def free(self, device: int) -> int:
        return max(0, self.devices[device].usable - self.used(device))

    def largest_block(self, device: int, pid: int) -> int:
        """The largest allocation ``pid`` can get on ``device`` now.

        ``max_block`` applies while another process holds memory there: their
        allocations are what splits the free memory. On a device nobody else holds, the
        free memory is one block again, so a load retried after evictions can fit.
        """
        free = self.free(device)
        limit = self.devices[device].max_block
        shared = any(a.device == device and a.pid != pid for a in self.allocations)
        return min(free, limit) if limit is not None and shared else free

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> State:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise StateError(f"not a simulated-GPU state (version {VERSION})")
        try:
            return cls(
                devices=[Device(**d) for d in data["devices"]],
                fastest_first=[int(i) for i in data["fastest_first"]],
                release_lag=float(data["release_lag"]),
                context_bytes=int(data["context_bytes"]),
                allocations=[Allocation(**a) for a in data["allocations"]],
                errors={k: ScriptedError(**v) for k, v in data["errors"].items()},
                next_id=int(data["next_id"]),
                hang_until=float(data.get("hang_until", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed simulated-GPU state: {exc!r}") from exc


def new_state(
    totals: Sequence[int],
    *,
    reserved: int = 0,
    release_lag: float = DEFAULT_RELEASE_LAG,
    context_bytes: int = DEFAULT_CONTEXT_BYTES,
    fastest_first: Sequence[int] | None = None,
    max_block: Sequence[int | None] | None = None,
    names: Sequence[str] | None = None,
) -> State:
    """A state with no allocations; ``fastest_first`` defaults to PCI order."""
    if not totals:
        raise ValueError("at least one GPU is needed")
    count = len(totals)
    order = list(range(count)) if fastest_first is None else [int(i) for i in fastest_first]
    if sorted(order) != list(range(count)):
        raise ValueError(f"fastest-first order {order} is not a permutation of 0..{count - 1}")
    blocks = list(max_block) if max_block is not None else [None] * count
    if len(blocks) != count:
        raise ValueError(f"{len(blocks)} max-block values for {count} GPUs")
    if any(reserved >= total for total in totals):
        raise ValueError("the driver reserve must be smaller than every GPU's total")
    devices = [
        Device(
            name=names[index] if names else f"Simulated GPU {index} ({total // 2**30} GiB)",
            total=total,
            reserved=reserved,
            pci_bus_id=f"00000000:{index + 1:02X}:00.0",
            uuid=f"GPU-{uuid.uuid4()}",
            max_block=blocks[index],
        )
        for index, total in enumerate(totals)
    ]
    return State(devices, order, release_lag=release_lag, context_bytes=context_bytes)


# --- processes -------------------------------------------------------------------------


def start_time(pid: int) -> float | None:
    """When ``pid`` started, in a unit stable for the process's life; None once it is gone.

    Linux: the start time in clock ticks from ``/proc/PID/stat`` (an integer, unlike
    psutil's ``create_time``, which is derived from a boot time that can shift by a
    second). A zombie counts as gone: its memory is already being torn down.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return _psutil_start_time(pid)
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return float(fields[19])


def _psutil_start_time(pid: int) -> float | None:
    import psutil  # only where /proc is unreadable; the demo runtime avoids the import

    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def own_start_time() -> float:
    started = start_time(os.getpid())
    assert started is not None  # this process is running
    return started


def settle(state: State, now: float) -> bool:
    """Mark allocations of processes now gone, drop those past the release lag.

    True when the state changed (the caller then writes it back).
    """
    changed = False
    alive: dict[tuple[int, float], bool] = {}
    for alloc in state.allocations:
        if alloc.died_at is None:
            key = (alloc.pid, alloc.start_time)
            if key not in alive:
                started = start_time(alloc.pid)
                # Half a unit: /proc ticks match exactly, psutil's seconds may wobble.
                alive[key] = started is not None and abs(started - alloc.start_time) < 0.5
            if not alive[key]:
                alloc.died_at = now
                changed = True
    kept = [
        a for a in state.allocations if a.died_at is None or now < a.died_at + state.release_lag
    ]
    if len(kept) != len(state.allocations):
        state.allocations = kept
        changed = True
    return changed


# --- the file --------------------------------------------------------------------------


class StateFile:
    """The state at ``path``: ``read`` without a lock, ``update`` under one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StateFile:
        path = environ.get(ENV)
        if not path:
            raise StateError(f"{ENV} is not set: no simulated GPUs")
        return cls(path)

    def write(self, state: State) -> None:
        """Replace the whole state (``init``)."""
        with self._locked():
            self._replace(state)

    def read(self) -> State:
        """The state as last written, not settled: what the file says."""
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise StateError(f"cannot read simulated-GPU state {self.path}: {exc}") from exc
        try:
            return State.from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise StateError(f"simulated-GPU state {self.path} is not JSON: {exc}") from exc

    def current(self) -> State:
        """The state with dead processes accounted for, written back if that changed it."""
        state = self.read()
        probe = State.from_json(state.to_json())
        if not settle(probe, time.time()):
            return state
        with self.update() as fresh:
            return fresh

    @contextlib.contextmanager
    def update(self) -> Iterator[State]:
        """Read, settle and yield the state under the lock; write it back on a clean exit."""
        with self._locked():
            state = self.read()
            settle(state, time.time())
            yield state
            self._replace(state)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # flock, not lockf: flock locks belong to the open file, so two threads of one
        # process (a runtime's request handlers) exclude each other too.
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _replace(self, state: State) -> None:
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(state.to_json(), out, indent=1)
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
