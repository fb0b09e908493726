"""``lru-count``: Ollama's scheduler (``server/sched.go``, 0.3-0.4 era) with its defaults.

- At most ``MAX_LOADED`` runners per GPU (``OLLAMA_MAX_LOADED_MODELS``' default: 3 x
  the number of GPUs).
- A runner stays loaded ``KEEP_ALIVE_S`` after its last request (``keep_alive``, 5 min).
- Requests wait in one pending queue of ``MAX_QUEUE`` (``OLLAMA_MAX_QUEUE``); one more is
  answered 503 "server busy" (reported as ``queue_full``). The scheduler takes them one
  at a time, in order (``processPending``):
  - the model's runner is loaded or loading: the request is attached to it;
  - no runner is loaded: load it;
  - ``MAX_LOADED`` runners are loaded: pick one to unload (``findRunnerToUnload``:
    sorted by keep_alive, the first idle one, else the first; ties here by name), mark
    it to expire as soon as it is idle, and *wait* until it has unloaded: every request
    behind this one waits too, whatever model it wants;
  - otherwise, if another model is still loading, put the request back at the end of
    the queue after ``RESCHED_S`` (Ollama never overlaps loads on one GPU);
  - otherwise check memory against estimates: the new model's estimate must fit in a
    GPU's ``min(plan_bytes - estimates of the runners on it, what it reports free)``;
    of the GPUs where it fits, the one with the most free memory takes it
    (``pickBestFullFitByLibrary``). If it fits on no single GPU it is spread evenly
    over all of them, if each has room for its part. If it does not fit at all, pick
    one runner to unload and wait as above. (With nothing loaded, a model is loaded
    fit or not: on GPU 0, or spread over all of them if it is larger than one.)
- A runner serves ``max_concurrency`` of the policy at once (``OLLAMA_NUM_PARALLEL``) and
  queues the rest itself.
- A load that runs out of memory fails the requests attached to it (Ollama answers
  500); the runner is dropped and the next request for the model loads it again.

Not modelled: partial offload to the CPU when a model does not fit, reloads on changed
options, per-request keep_alive, the wait for VRAM to recover after an unload.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from service.replay.harness import Slots, System, World
from service.replay.trace import TraceRequest
from service.scheduler.rules import share_of

MAX_LOADED = 3
KEEP_ALIVE_S = 300.0
MAX_QUEUE = 512
RESCHED_S = 0.25

Placement = tuple[tuple[int, ...], tuple[float, ...]]  # GPUs, and the share on each


@dataclass(slots=True)
class _Runner:
    name: str
    slots: Slots
    parts: dict[int, int]  # GPU -> the part of its estimate charged there
    phase: str = "loading"  # loading | ready | unloading
    gen: int = 0
    idle_gen: int = 0  # bumped to cancel a pending keep-alive expiry
    unload_when_idle: bool = False


class LruCount(System):
    name = "lru-count"
    # Ollama's defaults, as class attributes so a test can shrink them in a subclass.
    max_loaded: ClassVar[int] = MAX_LOADED
    keep_alive_s: ClassVar[float] = KEEP_ALIVE_S
    max_queue: ClassVar[int] = MAX_QUEUE

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.runners: dict[str, _Runner] = {}
        self.pending: deque[tuple[TraceRequest, str]] = deque()
        self.waiting_on: str | None = None  # the runner whose unload blocks the queue

    def arrive(self, req: TraceRequest, service: str) -> None:
        if len(self.pending) >= self.max_queue:
            self.rec.refused(req.id, "queue_full", self.clock.now)
            return
        self.pending.append((req, service))
        self._pump()

    def _pump(self) -> None:
        while self.pending and self.waiting_on is None:
            req, service = self.pending[0]
            runner = self.runners.get(service)
            if runner is not None and runner.phase != "unloading":
                self.pending.popleft()
                self._attach(runner, req)
                continue
            if runner is not None:  # unloading: wait for it, then load afresh
                self.waiting_on = service
                return
            if not self.runners:
                self.pending.popleft()
                self._attach(self._load(service, self._fallback(service)), req)
                continue
            if len(self.runners) >= self.max_loaded * len(self.box):
                self._evict_one()
                return
            if any(r.phase == "loading" for r in self.runners.values()):
                self.pending.popleft()
                self.clock.after(RESCHED_S, self._requeue, req, service)
                continue
            placement = self._placement(service)
            if placement is not None:
                self.pending.popleft()
                self._attach(self._load(service, placement), req)
                continue
            self._evict_one()

    def _requeue(self, req: TraceRequest, service: str) -> None:
        self.pending.append((req, service))
        self._pump()

    def _placement(self, service: str) -> Placement | None:
        """The GPUs ``service``'s estimate fits on now, by the estimates of the runners
        there and the memory each GPU reports free; None if it fits nowhere."""
        now, count = self.clock.now, len(self.box)
        free = [
            min(
                self.setup.plan_bytes - sum(r.parts.get(d, 0) for r in self.runners.values()),
                self.setup.device_total - self.box.used(d, now),
            )
            for d in range(count)
        ]
        estimate = self.setup.services[service].estimate
        for d in sorted(range(count), key=lambda d: -free[d]):
            if estimate <= free[d]:
                return (d,), (1.0,)
        if count > 1:
            shares = self._spread(service)
            if all(share_of(estimate, shares, d) <= free[d] for d in range(count)):
                return tuple(range(count)), shares
        return None

    def _fallback(self, service: str) -> Placement:
        """Where a model goes on an empty box, fit or not."""
        placement = self._placement(service)
        if placement is not None:
            return placement
        if len(self.box) > 1 and self.setup.services[service].estimate > self.setup.plan_bytes:
            return tuple(range(len(self.box))), self._spread(service)
        return (0,), (1.0,)

    def _spread(self, service: str) -> tuple[float, ...]:
        """Its shares over every GPU: the policy's split when it spans them all, else even."""
        count, shares = len(self.box), self.setup.rules[service].shares
        return shares if len(shares) == count else (1.0 / count,) * count

    def _evict_one(self) -> None:
        going = sorted(r.name for r in self.runners.values() if r.phase == "unloading")
        if going:
            self.waiting_on = going[0]
            return
        # Every runner has the same keep_alive here, so the order is by name.
        ranked = sorted(self.runners.values(), key=lambda r: (self.keep_alive_s, r.name))
        idle = [r for r in ranked if len(r.slots) == 0]
        victim = idle[0] if idle else ranked[0]
        self.waiting_on = victim.name
        if len(victim.slots) == 0:
            self._unload(victim)
        else:
            victim.unload_when_idle = True

    def _attach(self, runner: _Runner, req: TraceRequest) -> None:
        runner.idle_gen += 1
        runner.slots.submit(req)

    def _load(self, service: str, placement: Placement) -> _Runner:
        info, now = self.setup.services[service], self.clock.now
        devices, shares = placement
        parts = {d: share_of(info.estimate, shares, i) for i, d in enumerate(devices)}
        runner = _Runner(service, Slots(self, info.max_concurrency), parts)
        runner.slots.on_finish = lambda _rid: self._finished(runner)
        self.runners[service] = runner
        self.rec.load(service, now, devices=list(devices))
        bench = info.bench
        fail_at = self.box.place(service, now, bench.true_peak, bench.load_s, devices, shares)
        if fail_at is None:
            self.clock.after(info.bench.load_s, self._ready, runner, runner.gen)
        else:
            self.clock.at(fail_at, self._out_of_memory, runner, runner.gen)
        return runner

    def _ready(self, runner: _Runner, gen: int) -> None:
        if runner.gen == gen and runner.phase == "loading":
            runner.phase = "ready"
            self.rec.ready(runner.name)
            runner.slots.open()

    def _out_of_memory(self, runner: _Runner, gen: int) -> None:
        if runner.gen != gen or runner.phase != "loading":
            return
        self.box.remove(runner.name, self.clock.now)
        self.rec.oom(runner.name, self.clock.now)
        runner.slots.fail_all("oom")
        self._gone(runner)

    def _finished(self, runner: _Runner) -> None:
        if len(runner.slots) > 0 or runner.phase != "ready":
            return
        if runner.unload_when_idle:
            self._unload(runner)
            return
        runner.idle_gen += 1
        self.clock.after(self.keep_alive_s, self._expire, runner, runner.idle_gen)

    def _expire(self, runner: _Runner, idle_gen: int) -> None:
        if runner.idle_gen == idle_gen and runner.phase == "ready" and len(runner.slots) == 0:
            self._unload(runner)

    def _unload(self, runner: _Runner) -> None:
        runner.phase = "unloading"
        runner.gen += 1
        runner.slots.ready = False
        self.box.freeze(runner.name, self.clock.now)
        unload_s = self.setup.services[runner.name].bench.unload_s
        self.clock.after(unload_s, self._unloaded, runner, runner.gen)

    def _unloaded(self, runner: _Runner, gen: int) -> None:
        if runner.gen == gen:
            self.box.remove(runner.name, self.clock.now)
            self._gone(runner)

    def _gone(self, runner: _Runner) -> None:
        if self.runners.get(runner.name) is runner:
            del self.runners[runner.name]
        if self.waiting_on == runner.name:
            self.waiting_on = None
        self._pump()
