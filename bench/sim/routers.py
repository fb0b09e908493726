"""The routers in front of a fleet: the endpoint picker's stock scorers, and round robin.

``AffinityRouter`` scores every node as the Gateway API inference extension's endpoint
picker (EPP, now llm-d-router) does with its stock scorers, and picks the highest
weighted sum as its ``max-score-picker`` does:

- ``queue-scorer``: ``(max_waiting - waiting) / (max_waiting - min_waiting)`` over the
  candidates, 1 for every node when all queues are equal.
- ``kv-cache-utilization-scorer``: ``1 - kv_usage``.
- ``lora-affinity-scorer``: 1.0 when the request's model is running on the node; else
  0.8 when the node has room for one more (running + waiting names below its maximum);
  else 0.6 when the model is waiting to load there; else 0.

``affinity`` weighs the scorers as the picker configuration vramd ships does
(``deploy/kubernetes/inferencepool.yaml``): LoRA affinity 10, queue 1, KV cache 1.
LoRA affinity's 0.2 step between a node running the model and one with room, times 10,
covers the most the two load scorers can swing (1 + 1), so a node running the model
never scores below one without it, and load chooses among such nodes. ``--weights``
changes them. ``picker-default`` is the picker's own default profile (queue 2, KV cache
2; its prefix-cache scorer, 3, has nothing to tell nodes apart in a trace without
prompts) with LoRA affinity added at the weight a scorer gets when listed without one
(1). At those weights a node whose budget is charged 10 % more loses the model's
requests to an emptier one: vramd reports memory charged as its KV use when runtimes
report none, and a node that holds a model is charged for it.
Ties go to a uniformly random node among the best, as the picker's shuffle before its
stable sort does; the random stream is seeded, so a run is a pure function of its inputs.

``RoundRobinRouter`` sends request ``i`` of the trace to node ``i mod N``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.sim.fleet import NodeMetrics, Router
from service.replay.trace import TraceRequest

LORA_RUNNING = 1.0
LORA_ROOM = 0.8
LORA_WAITING = 0.6


@dataclass(frozen=True, slots=True)
class Weights:
    """The scorers' weights; the defaults are those of the configuration vramd ships."""

    queue: float = 1.0
    kv: float = 1.0
    lora: float = 10.0

    @classmethod
    def parse(cls, text: str) -> Weights:
        """``queue=1,kv=1,lora=10`` (any subset; the rest keep their defaults)."""
        default = cls()
        values = {"queue": default.queue, "kv": default.kv, "lora": default.lora}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in values:
                raise ValueError(f"weights are queue=, kv=, lora=; got {part!r}")
            values[key.strip()] = float(value)
        return cls(**values)

    def __str__(self) -> str:
        return f"queue={self.queue:g},kv={self.kv:g},lora={self.lora:g}"


def queue_scores(metrics: Sequence[NodeMetrics]) -> list[float]:
    """The queue scorer: shortest waiting queue 1, longest 0, linear between."""
    if not metrics:
        return []
    low = min(m.waiting for m in metrics)
    high = max(m.waiting for m in metrics)
    if high == low:
        return [1.0] * len(metrics)
    return [(high - m.waiting) / (high - low) for m in metrics]


def kv_score(metrics: NodeMetrics) -> float:
    return 1.0 - metrics.kv_usage


def lora_score(metrics: NodeMetrics, model: str) -> float:
    if model in metrics.running_models:
        return LORA_RUNNING
    if len(metrics.running_models) + len(metrics.waiting_models) < metrics.max_models:
        return LORA_ROOM
    if model in metrics.waiting_models:
        return LORA_WAITING
    return 0.0


def affinity_scores(
    metrics: Sequence[NodeMetrics], model: str, weights: Weights = Weights()
) -> list[float]:
    """Each node's weighted score for a request of ``model``."""
    return [
        weights.queue * queue + weights.kv * kv_score(m) + weights.lora * lora_score(m, model)
        for queue, m in zip(queue_scores(metrics), metrics, strict=True)
    ]


class AffinityRouter:
    name = "affinity"

    def __init__(self, weights: Weights = Weights(), seed: int = 0) -> None:
        self.weights = weights
        self.rng = random.Random(seed)

    def pick(self, req: TraceRequest, index: int, metrics: Sequence[NodeMetrics]) -> int:
        scores = affinity_scores(metrics, req.model, self.weights)
        best = max(scores)
        ties = [node for node, score in enumerate(scores) if score == best]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)


class RoundRobinRouter:
    name = "round-robin"

    def pick(self, req: TraceRequest, index: int, metrics: Sequence[NodeMetrics]) -> int:
        return index % len(metrics)


ROUTERS = ("affinity", "picker-default", "round-robin")
PICKER_DEFAULT = Weights(queue=2.0, kv=2.0, lora=1.0)


def make_router(name: str, *, weights: Weights = Weights(), seed: int = 0) -> Router:
    """A router by name; ``weights`` are ``affinity``'s (``picker-default`` has its own)."""
    if name == "affinity":
        return AffinityRouter(weights, seed)
    if name == "picker-default":
        router = AffinityRouter(PICKER_DEFAULT, seed)
        router.name = name
        return router
    if name == "round-robin":
        return RoundRobinRouter()
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
