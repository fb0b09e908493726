"""``static``: one container per service, each with a fixed memory partition.

What you get by running every runtime as its own always-on container (docker compose,
systemd units) and sizing each one's memory share by its estimate: the partitions are
handed out at time 0 in priority order (higher first, then policy order), first fit,
until ``plan_bytes`` is used up. A service that got no partition is never started and
its requests are refused (``insufficient_capacity``: the service is not running).
Nothing is ever unloaded; requests wait only for a free slot (``max_concurrency``, no
queue limit).

The partitions are bookkeeping, not hardware limits: the containers share the device,
and a runtime that outgrows its estimate takes the memory from the device's slack. If
the device is really full its load fails (out of memory); the container restarts with
Docker's backoff (``RESTART_FIRST_S``, doubling up to ``RESTART_MAX_S``, reset once a
start succeeds), and requests that arrive while it is down fail. (Hard partitions such as
MIG would instead fail every runtime whose true peak exceeds its estimate.)
"""

from __future__ import annotations

from bench.sim.harness import Slots, System, World
from bench.sim.trace import TraceRequest

RESTART_FIRST_S = 0.1  # docker's restart policy: 100 ms, doubling, capped at a minute
RESTART_MAX_S = 60.0


class Static(System):
    name = "static"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        order = list(self.setup.policy.services)
        ranked = sorted(
            self.setup.services.values(), key=lambda s: (-s.priority, order.index(s.name))
        )
        self.running: list[str] = []
        left = self.setup.plan_bytes
        for info in ranked:
            if info.estimate <= left:
                self.running.append(info.name)
                left -= info.estimate
        self.slots = {
            name: Slots(self, self.setup.services[name].max_concurrency) for name in self.running
        }
        self.down: set[str] = set()
        self.delay = dict.fromkeys(self.running, RESTART_FIRST_S)

    def begin(self) -> None:
        for name in self.running:
            self._start(name)

    def _start(self, name: str) -> None:
        bench = self.setup.services[name].bench
        now = self.clock.now
        self.down.discard(name)
        self.rec.load(name, now)
        fail_at = self.device.place(name, now, bench.true_peak, bench.load_s)
        if fail_at is None:
            self.clock.after(bench.load_s, self._ready, name)
        else:
            self.clock.at(fail_at, self._out_of_memory, name)

    def _ready(self, name: str) -> None:
        self.delay[name] = RESTART_FIRST_S
        self.rec.ready(name)
        self.slots[name].open()

    def _out_of_memory(self, name: str) -> None:
        self.device.remove(name, self.clock.now)
        self.rec.oom(name, self.clock.now)
        self.slots[name].fail_all("oom")
        self.down.add(name)
        self.clock.after(self.delay[name], self._start, name)
        self.delay[name] = min(RESTART_MAX_S, self.delay[name] * 2)

    def arrive(self, req: TraceRequest, service: str) -> None:
        if service not in self.slots:
            self.rec.refused(req.id, "insufficient_capacity", self.clock.now)
            return
        if service in self.down:
            self.rec.failed(req.id, "oom", self.clock.now)
            return
        self.slots[service].submit(req)
