"""``unbounded``: infinite memory, the latency floor.

Every service is loaded at time 0 and never unloaded, on a device that never runs out.
A request waits only for its service's first load (if it comes in the first seconds) and
for a free slot (``max_concurrency`` of the policy, in arrival order, no queue limit).
No real machine does better on the same trace with the same runtimes.
"""

from __future__ import annotations

from service.replay.harness import Slots, System, World
from service.replay.trace import TraceRequest


class Unbounded(System):
    name = "unbounded"
    unlimited_memory = True

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.slots = {
            name: Slots(self, info.max_concurrency) for name, info in self.setup.services.items()
        }

    def begin(self) -> None:
        for name, info in self.setup.services.items():
            self.rec.load(name, 0.0, devices=list(self.home(name)[0]))
            self.box.place(name, 0.0, info.bench.true_peak, info.bench.load_s, *self.home(name))
            self.clock.after(info.bench.load_s, self._ready, name)

    def _ready(self, name: str) -> None:
        self.rec.ready(name)
        self.slots[name].open()

    def arrive(self, req: TraceRequest, service: str) -> None:
        self.slots[service].submit(req)
