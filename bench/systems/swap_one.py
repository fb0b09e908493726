"""``swap-one``: llama-swap's default, one group in which one model is resident at a time.

Modelled on llama-swap's ``ProcessGroup.ProxyRequest`` with ``swap: true``: every request
passes the group's lock in arrival order. A request for the resident model goes straight
to it. A request for another model *holds the lock* while it stops the resident one,
which first waits for that model's in-flight requests (those queued at the runtime and
those waiting for its load included), then takes ``unload_s``; then the new model
becomes current, the lock is released and the request goes to it, starting its load.
Everything behind a swap waits for it, whatever model it wants.

A model's process takes ``CONCURRENCY_LIMIT`` requests (llama-swap's default
``concurrencyLimit``); one more is answered 429 (reported as ``queue_full``). Inside that
limit the runtime serves ``max_concurrency`` of the policy at once (its own slots, as
``llama-server -np``) and queues the rest. No TTL: a model stays until swapped out (the
default ``ttl: 0``). A load that runs out of memory fails the requests waiting for it
(llama-swap answers 502); the next request for the model starts it again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from service.replay.harness import Slots, System, World
from service.replay.trace import TraceRequest

CONCURRENCY_LIMIT = 10


@dataclass(slots=True)
class _Process:
    slots: Slots
    phase: str = "stopped"  # stopped | loading | ready | stopping
    gen: int = 0


class SwapOne(System):
    name = "swap-one"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.procs = {
            name: _Process(Slots(self, info.max_concurrency, self._finished))
            for name, info in self.setup.services.items()
        }
        self.owner: dict[str, str] = {}  # request id -> service, for _finished
        self.current: str | None = None  # llama-swap's lastUsedProcess
        self.lock_queue: deque[tuple[TraceRequest, str]] = deque()
        self.swap: tuple[TraceRequest, str] | None = None  # the request holding the lock

    def arrive(self, req: TraceRequest, service: str) -> None:
        self.owner[req.id] = service
        self.lock_queue.append((req, service))
        self._pump()

    def _pump(self) -> None:
        while self.lock_queue and self.swap is None:
            req, service = self.lock_queue.popleft()
            if service == self.current:
                self._proxy(req, service)
                continue
            self.swap = (req, service)
            self._stop_current()

    def _stop_current(self) -> None:
        """The swap's first step; re-run whenever a request of the current model ends."""
        current = self.current
        if current is None or self.procs[current].phase == "stopped":
            self._swapped()
            return
        proc = self.procs[current]
        if len(proc.slots) > 0 or proc.phase == "stopping":
            return
        proc.phase = "stopping"
        proc.gen += 1
        proc.slots.ready = False
        self.box.freeze(current, self.clock.now)
        unload_s = self.setup.services[current].bench.unload_s
        self.clock.after(unload_s, self._stopped, current, proc.gen)

    def _stopped(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen:
            return
        self.box.remove(service, self.clock.now)
        proc.phase = "stopped"
        self._swapped()

    def _swapped(self) -> None:
        assert self.swap is not None
        req, service = self.swap
        self.swap = None
        self.current = service
        self._proxy(req, service)
        self._pump()

    def _proxy(self, req: TraceRequest, service: str) -> None:
        proc = self.procs[service]
        if len(proc.slots) >= CONCURRENCY_LIMIT:
            self.rec.refused(req.id, "queue_full", self.clock.now)
            return
        if proc.phase == "stopped":
            self._load(service)
        proc.slots.submit(req)

    def _load(self, service: str) -> None:
        proc, bench, now = self.procs[service], self.setup.services[service].bench, self.clock.now
        proc.phase = "loading"
        proc.gen += 1
        self.rec.load(service, now, devices=list(self.home(service)[0]))
        fail_at = self.box.place(service, now, bench.true_peak, bench.load_s, *self.home(service))
        if fail_at is None:
            self.clock.after(bench.load_s, self._ready, service, proc.gen)
        else:
            self.clock.at(fail_at, self._out_of_memory, service, proc.gen)

    def _ready(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen == gen and proc.phase == "loading":
            proc.phase = "ready"
            self.rec.ready(service)
            proc.slots.open()

    def _out_of_memory(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen or proc.phase != "loading":
            return
        self.box.remove(service, self.clock.now)
        self.rec.oom(service, self.clock.now)
        proc.phase = "stopped"
        proc.slots.fail_all("oom")
        if self.swap is not None and self.current == service:
            self._stop_current()

    def _finished(self, rid: str) -> None:
        service = self.owner.pop(rid)
        if self.swap is not None and self.current == service:
            self._stop_current()
