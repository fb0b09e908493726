"""``static``: one container per service, each with a fixed memory partition.

What you get by running every runtime as its own always-on container (docker compose,
systemd units) and sizing each one's memory share by its estimate: the partitions are
handed out at time 0 in priority order (higher first, then policy order), first fit
over the devices (the lowest-indexed device with ``plan_bytes`` left for it; a service
with ``span: N`` takes the first N devices that each have room for its share), until
nothing more fits. A service that got no partition is never started and its requests
are refused (``insufficient_capacity``: the service is not running).
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

from itertools import combinations

from service.replay.harness import Slots, System, World
from service.replay.trace import TraceRequest
from service.scheduler.rules import share_of

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
        self.placed: dict[str, tuple[int, ...]] = {}
        left = [self.setup.plan_bytes] * len(self.box)
        for info in ranked:
            shares = self.setup.rules[info.name].shares
            parts = [share_of(info.estimate, shares, i) for i in range(len(shares))]
            for devices in combinations(range(len(left)), len(parts)):
                if all(part <= left[d] for d, part in zip(devices, parts, strict=True)):
                    for d, part in zip(devices, parts, strict=True):
                        left[d] -= part
                    self.running.append(info.name)
                    self.placed[info.name] = devices
                    break
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
        self.rec.load(name, now, devices=list(self.placed[name]))
        shares = self.setup.rules[name].shares
        fail_at = self.box.place(
            name, now, bench.true_peak, bench.load_s, self.placed[name], shares
        )
        if fail_at is None:
            self.clock.after(bench.load_s, self._ready, name)
        else:
            self.clock.at(fail_at, self._out_of_memory, name)

    def _ready(self, name: str) -> None:
        self.delay[name] = RESTART_FIRST_S
        self.rec.ready(name)
        self.slots[name].open()

    def _out_of_memory(self, name: str) -> None:
        self.box.remove(name, self.clock.now)
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
