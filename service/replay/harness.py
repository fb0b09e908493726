"""One simulated run: a world (clock, device, recorder) and a system that lives in it."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from service.errors import ErrorCode
from service.replay.clock import VirtualClock
from service.replay.device import SimBox
from service.replay.metrics import Recorder, summarize
from service.replay.setup import Setup
from service.replay.trace import TraceRequest

# A run stops this long after the last arrival even if requests are still open (they are
# reported as unfinished): a system that deadlocks must not hang the benchmark.
DRAIN_LIMIT_S = 6 * 3600.0


class World:
    """One box on a clock, recording into a recorder: its own unless given them (the
    nodes of ``bench.sim.fleet`` share one clock and one recorder)."""

    def __init__(
        self,
        setup: Setup,
        trace: Sequence[TraceRequest],
        *,
        unlimited: bool,
        clock: VirtualClock | None = None,
        rec: Recorder | None = None,
    ) -> None:
        self.setup = setup
        self.trace = trace
        self.clock = VirtualClock() if clock is None else clock
        self.box = SimBox(setup.devices, None if unlimited else setup.device_total)
        self.rec = Recorder(setup, trace) if rec is None else rec
        self.horizon = max((r.t for r in trace), default=0.0)

    @property
    def now(self) -> float:
        return self.clock.now

    @property
    def done(self) -> bool:
        """Every request answered and the trace over: periodic timers may stop."""
        return self.rec.unresolved == 0 and self.clock.now >= self.horizon


class System:
    """Base of every simulated system; subclasses set ``name`` and override the hooks."""

    name: ClassVar[str] = ""
    unlimited_memory: ClassVar[bool] = False

    def __init__(self, world: World) -> None:
        self.world = world
        self.setup = world.setup
        self.clock = world.clock
        self.box = world.box
        self.rec = world.rec

    def begin(self) -> None:
        """Time 0: load what the system loads before any request."""

    def home(self, service: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Where a system that does not choose devices runs ``service``: device 0, or the
        first ``span`` devices (its policy's shares on each) for one that spans several."""
        shares = self.setup.rules[service].shares
        count = min(len(shares), len(self.box))
        if count < len(shares):
            shares = (1.0 / count,) * count
        return tuple(range(count)), shares

    def arrive(self, req: TraceRequest, service: str) -> None:
        raise NotImplementedError


S = TypeVar("S", bound=System)


@dataclass(frozen=True, slots=True)
class RunResult:
    system: str
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    wall_s: float


def simulate(system_cls: type[S], setup: Setup, trace: Sequence[TraceRequest]) -> S:
    """Run ``trace`` against a new ``system_cls`` to its end; the system after the run.

    A system (``bench.systems``) is told two things: ``begin()`` at time 0 and
    ``arrive(req, service)`` for each request of the trace whose model a service serves
    (other models are refused ``model_not_found`` here, as vramd's router does before the
    scheduler hears of them). Everything else it does by scheduling callbacks on the world's
    clock. ``Slots`` is the request side of a runtime that the baselines share: a fixed
    number of requests in service, the rest waiting in arrival order.
    """
    world = World(setup, trace, unlimited=system_cls.unlimited_memory)
    system = system_cls(world)

    def arrive(req: TraceRequest) -> None:
        service = setup.service_of(req.model)
        if service is None:
            world.rec.refused(req.id, ErrorCode.MODEL_NOT_FOUND, world.now)
        else:
            system.arrive(req, service)

    system.begin()
    for req in trace:
        world.clock.at(req.t, arrive, req)
    world.clock.run(until=world.horizon + DRAIN_LIMIT_S)
    return system


def run_system(system_cls: type[System], setup: Setup, trace: Sequence[TraceRequest]) -> RunResult:
    started = time.perf_counter()
    world = simulate(system_cls, setup, trace).world
    summary = summarize(
        world.rec, byte_seconds=world.box.byte_seconds(world.horizon), horizon=world.horizon
    )
    return RunResult(system_cls.name, summary, world.rec.events, time.perf_counter() - started)


class Slots:
    """A runtime's request slots: ``size`` requests in service at once, the rest queued.

    Closed while the runtime is not ready; ``fail_all`` ends every request it holds (its
    process died). ``on_finish(rid)`` is called after each request is served.
    """

    def __init__(
        self, system: System, size: int, on_finish: Callable[[str], None] | None = None
    ) -> None:
        self.system = system
        self.size = size
        self.on_finish = on_finish
        self.waiting: deque[TraceRequest] = deque()
        self.busy: set[str] = set()
        self.ready = False
        self.ready_since = 0.0
        self._gen = 0

    def __len__(self) -> int:
        """Requests held: in service or waiting for a slot."""
        return len(self.waiting) + len(self.busy)

    def submit(self, req: TraceRequest) -> None:
        self.waiting.append(req)
        self._fill()

    def open(self) -> None:
        self.ready = True
        self.ready_since = self.system.clock.now
        self._fill()

    def fail_all(self, reason: str) -> None:
        now = self.system.clock.now
        for rid in sorted(self.busy):
            self.system.rec.failed(rid, reason, now)
        for req in self.waiting:
            self.system.rec.failed(req.id, reason, now)
        self.busy.clear()
        self.waiting.clear()
        self.ready = False
        self._gen += 1

    def _fill(self) -> None:
        clock = self.system.clock
        while self.ready and self.waiting and len(self.busy) < self.size:
            req = self.waiting.popleft()
            self.busy.add(req.id)
            self.system.rec.granted(req.id, clock.now, ready_since=self.ready_since)
            clock.after(req.duration_s, self._finish, req.id, self._gen)

    def _finish(self, rid: str, gen: int) -> None:
        if gen != self._gen or rid not in self.busy:
            return
        self.busy.discard(rid)
        self.system.rec.served(rid, self.system.clock.now)
        if self.on_finish is not None:
            self.on_finish(rid)
        self._fill()
