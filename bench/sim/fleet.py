"""Many simulated vramd nodes behind one router, on one virtual clock.

A fleet is ``N`` copies of the simulated daemon ``bench.replay`` runs
(``service.replay.vramd``), each on its own simulated box of the policy's size, all on
one ``VirtualClock`` and recording into one ``Recorder``: every request of the trace
ends in exactly one outcome, whichever node it went to, and the figures are those of
``service.replay.metrics`` over the whole trace (``mem_avg_fraction``: the nodes' average).

Each node speaks the metric protocol the Gateway API inference extension's endpoint
picker scrapes (``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``, ``vllm:lora_requests_info``); ``node_metrics`` reads it
from the node's scheduler as a pure function of its state:

- ``waiting``: requests held but not in service (queued for a slot, for a load, for
  memory); ``running``: requests in service.
- ``kv_usage``: the share of the node's budget charged to resident services (vramd's
  fallback when its runtimes report no KV gauge, as none do here).
- ``running_models``: the model names of ready services; ``waiting_models``: those of
  services loading, or with requests or a load waiting (for a load, for memory);
  ``max_models``: every model name the node serves.

These are the daemon's own /metrics semantics (``vllm:num_requests_waiting`` and the
rest, docs/api.md), read from the same scheduler views and ledger.

The picker scrapes every ``scrape_s`` (50 ms by default) and routes on its last scrape.
A request arriving at ``t`` is routed on the nodes' metrics as they were at the last
multiple of ``scrape_s`` at or before ``t``; since the trace is known, the fleet takes
only the scrapes some request reads. ``scrape_s=0`` routes on the state at arrival.

A router sees the request, its index in the trace and the scrape, and names a node.
Requests for a model no node serves are refused ``model_not_found`` before routing.
Per node the fleet counts the requests routed there and the loads it started; per
request, where it went by the scrape it was routed on (``PLACEMENTS``): to a node
running its model, away from every node running it, to a node where it waits to load,
away from every node where it waits (none running it), or cold (none running it, none
waiting).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.domain import InstanceState
from service.replay.clock import VirtualClock
from service.replay.harness import DRAIN_LIMIT_S, World
from service.replay.metrics import Recorder, summarize
from service.replay.setup import Setup
from service.replay.trace import TraceRequest
from service.replay.vramd import Vramd
from service.scheduler import Start

SCRAPE_S = 0.05  # the picker's default metrics refresh interval
PLACEMENTS = ("to_running", "away_from_running", "to_waiting", "away_from_waiting", "to_cold")


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """What the picker reads from one node's /metrics."""

    waiting: int
    running: int
    kv_usage: float
    running_models: frozenset[str]
    waiting_models: frozenset[str]
    max_models: int


class FleetNode(Vramd):
    """The simulated daemon, counting the loads it starts (each ``Start`` is one)."""

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.loads = 0

    def start(self, action: Start) -> None:
        self.loads += 1
        super().start(action)


def node_metrics(node: Vramd) -> NodeMetrics:
    """The node's metric protocol, read from its scheduler now (as the daemon's
    /metrics reads its kernel: service views and the ledger of every device)."""
    scheduler = node.scheduler
    waiting = running = 0
    running_models: set[str] = set()
    waiting_models: set[str] = set()
    for name in scheduler.service_names():
        view = scheduler.service_view(name)
        waiting += view.queued
        running += view.in_flight
        models = node.setup.policy.services[name].models
        if view.state == InstanceState.READY:
            running_models.update(models)
        elif view.state == InstanceState.STARTING or view.queued or view.waiting_for_memory:
            waiting_models.update(models)
    budget = charged = 0
    for device in scheduler.devices():
        ledger = scheduler.ledger_view(device)
        if ledger is not None:
            budget += ledger.budget
            charged += sum(ledger.charges.values())
    return NodeMetrics(
        waiting=waiting,
        running=running,
        kv_usage=min(1.0, charged / budget) if budget > 0 else 0.0,
        running_models=frozenset(running_models),
        waiting_models=frozenset(waiting_models),
        max_models=len(node.setup.models),
    )


def placement(metrics: Sequence[NodeMetrics], choice: int, model: str) -> str:
    """Where a request went, by the scrape it was routed on (``PLACEMENTS``)."""
    if model in metrics[choice].running_models:
        return "to_running"
    if any(model in m.running_models for m in metrics):
        return "away_from_running"
    if model in metrics[choice].waiting_models:
        return "to_waiting"
    if any(model in m.waiting_models for m in metrics):
        return "away_from_waiting"
    return "to_cold"


class Router(Protocol):
    name: str

    def pick(self, req: TraceRequest, index: int, metrics: Sequence[NodeMetrics]) -> int:
        """The node (an index into ``metrics``) that serves ``req``."""


@dataclass(frozen=True, slots=True)
class FleetResult:
    router: str
    summary: dict[str, Any]
    routed: list[int]
    loads: list[int]
    placement: dict[str, int]
    wall_s: float


class Fleet:
    """The nodes, the scrape the router reads, and the routing of each arrival."""

    def __init__(
        self,
        setup: Setup,
        trace: Sequence[TraceRequest],
        nodes: int,
        router: Router,
        *,
        scrape_s: float = SCRAPE_S,
    ) -> None:
        if nodes < 1:
            raise ValueError("a fleet has at least one node")
        self.setup = setup
        self.trace = trace
        self.router = router
        self.scrape_s = scrape_s
        self.clock = VirtualClock()
        self.rec = Recorder(setup, trace)
        self.worlds = [
            World(setup, trace, unlimited=False, clock=self.clock, rec=self.rec)
            for _ in range(nodes)
        ]
        self.nodes = [FleetNode(world) for world in self.worlds]
        self.horizon = max((r.t for r in trace), default=0.0)
        self.routed = [0] * nodes
        self.placement = dict.fromkeys(PLACEMENTS, 0)
        self.scraped: list[NodeMetrics] = []

    def scrape(self) -> None:
        self.scraped = [node_metrics(node) for node in self.nodes]

    def arrive(self, index: int, req: TraceRequest) -> None:
        service = self.setup.service_of(req.model)
        if service is None:
            self.rec.refused(req.id, "model_not_found", self.clock.now)
            return
        if self.scrape_s <= 0:
            self.scrape()
        choice = self.router.pick(req, index, self.scraped)
        self.routed[choice] += 1
        self.placement[placement(self.scraped, choice, req.model)] += 1
        self.nodes[choice].arrive(req, service)

    def run(self) -> FleetResult:
        started = time.perf_counter()
        for node in self.nodes:
            node.begin()
        scrapes: set[float] = set()
        for index, req in enumerate(self.trace):
            if self.scrape_s > 0:
                at = min(req.t, math.floor(req.t / self.scrape_s) * self.scrape_s)
                if at not in scrapes:
                    scrapes.add(at)
                    self.clock.at(at, self.scrape)
            self.clock.at(req.t, self.arrive, index, req)
        self.clock.run(until=self.horizon + DRAIN_LIMIT_S)
        held = sum(world.box.byte_seconds(self.horizon) for world in self.worlds)
        summary = summarize(self.rec, byte_seconds=held / len(self.nodes), horizon=self.horizon)
        return FleetResult(
            router=self.router.name,
            summary=summary,
            routed=list(self.routed),
            loads=[node.loads for node in self.nodes],
            placement=dict(self.placement),
            wall_s=time.perf_counter() - started,
        )


def run_fleet(
    setup: Setup,
    trace: Sequence[TraceRequest],
    nodes: int,
    router: Router,
    *,
    scrape_s: float = SCRAPE_S,
) -> FleetResult:
    """Replay ``trace`` over ``nodes`` simulated vramd nodes behind ``router``."""
    return Fleet(setup, trace, nodes, router, scrape_s=scrape_s).run()
