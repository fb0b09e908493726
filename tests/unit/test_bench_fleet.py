"""bench.fleet: a trace over simulated vramd nodes behind the endpoint picker's scorers.

The fleet runs on ``bench/traces/fleet-small.jsonl`` (301 requests over five minutes on
the ten-services policy). ``affinity`` is the picker's scorers at the weights of the
configuration vramd ships (``deploy/kubernetes/inferencepool.yaml``: LoRA affinity
decides before load); with the picker's own default weights (``picker-default``) the
comparison with round robin goes either way on traces this short (docs/benchmarks.md,
"Many machines (bench.fleet)").
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.fleet import build_report, replay_fleet
from bench.replay import load_setup
from bench.sim.fleet import FleetNode, FleetResult, NodeMetrics, node_metrics
from bench.sim.routers import (
    PICKER_DEFAULT,
    AffinityRouter,
    RoundRobinRouter,
    Weights,
    affinity_scores,
)
from service.api.router_metrics import kv_cache_usage, resident_models
from service.kernel.views import NodeLoad, ServiceLoad
from service.replay.harness import World
from service.replay.setup import Setup
from service.replay.trace import TraceRequest, load_trace

BENCH = Path(__file__).resolve().parents[2] / "bench"
POLICY = BENCH / "policies" / "ten-services.yaml"
BENCH_DATA = BENCH / "policies" / "ten-services.bench.yaml"
TRACE = BENCH / "traces" / "fleet-small.jsonl"
NODES = 3
ROUTERS = ("affinity", "picker-default", "round-robin")


@pytest.fixture(scope="module")
def setup() -> Setup:
    return load_setup(POLICY, BENCH_DATA)


@pytest.fixture(scope="module")
def trace() -> list[TraceRequest]:
    return load_trace(TRACE)


@pytest.fixture(scope="module")
def results(setup: Setup, trace: list[TraceRequest]) -> dict[str, FleetResult]:
    return replay_fleet(setup, trace, NODES, ROUTERS)


def test_affinity_loads_fewer_models_than_round_robin(
    results: dict[str, FleetResult],
) -> None:
    first, robin = results["affinity"].summary, results["round-robin"].summary
    assert first["cold_starts"] < robin["cold_starts"]
    assert first["served_within_timeout"] >= robin["served_within_timeout"]


@pytest.mark.parametrize("router", ROUTERS)
def test_every_request_is_accounted_for_once(
    results: dict[str, FleetResult], trace: list[TraceRequest], router: str
) -> None:
    result = results[router]
    fig = result.summary
    assert fig["requests"] == len(trace)
    assert fig["unfinished"] == 0
    failed = fig["failed_oom"] + fig["killed"]
    assert fig["served"] + failed + fig["refused_total"] == len(trace)
    assert sum(result.routed) == len(trace)
    assert sum(result.placement.values()) == len(trace)
    assert sum(result.loads) == fig["cold_starts"]


def test_routing_is_deterministic(
    setup: Setup, trace: list[TraceRequest], results: dict[str, FleetResult]
) -> None:
    again = replay_fleet(setup, trace, NODES, ("affinity",))["affinity"]
    first = results["affinity"]
    assert again.summary == first.summary
    assert (again.routed, again.loads, again.placement) == (
        first.routed,
        first.loads,
        first.placement,
    )


def test_the_report_holds_every_router_and_the_targets(
    setup: Setup, trace: list[TraceRequest], results: dict[str, FleetResult]
) -> None:
    names = {"trace": TRACE.name, "policy": POLICY.name, "bench_data": BENCH_DATA.name}
    report = build_report(
        setup, trace, results, nodes=NODES, names=names, weights=Weights(), seed=0, scrape_s=0.05
    )
    assert report["nodes"] == NODES and set(report["routers"]) == set(ROUTERS)
    nodes = report["routers"]["round-robin"]["nodes"]
    assert [n["routed"] for n in nodes] == results["round-robin"].routed
    checked = {(t["router"], t["name"]): t["met"] for t in report["targets"]}
    assert set(checked) == {(r, n) for r in ROUTERS[:2] for n in ("cold", "served")}
    assert checked["affinity", "served"]


def busy_node(setup: Setup) -> FleetNode:
    """A node at 30.5 s: chat (pinned) and embed (preloaded) ready, chat's 8 slots busy
    and 2 more chats queued, the coder loading for its one request."""
    chats = [TraceRequest(f"c{i}", 30.0, "llama-3.1-8b", 100.0) for i in range(10)]
    coder = TraceRequest("k0", 30.0, "qwen2.5-coder-7b", 5.0)
    world = World(setup, [*chats, coder], unlimited=False)
    node = FleetNode(world)
    node.begin()
    for req in [*chats, coder]:
        service = setup.service_of(req.model)
        assert service is not None
        world.clock.at(req.t, node.arrive, req, service)
    world.clock.run(until=30.5)
    return node


def test_node_metrics_read_the_node_as_the_picker_would(setup: Setup) -> None:
    node = busy_node(setup)
    metrics = node_metrics(node)
    assert {"llama-3.1-8b", "default", "bge-m3"} <= metrics.running_models
    assert "qwen2.5-coder-7b" in metrics.waiting_models
    assert "qwen2.5-coder-7b" not in metrics.running_models
    assert metrics.running == 8  # chat's max_concurrency
    assert metrics.waiting == 3  # two chats for a slot, the coder for its load
    assert metrics.max_models == len(setup.models)
    ledger = node.scheduler.ledger_view(0)
    assert ledger is not None
    assert metrics.kv_usage == pytest.approx(sum(ledger.charges.values()) / ledger.budget)
    assert node.loads == 3  # chat (pinned), embed (preload), coder


def test_node_metrics_agree_with_the_daemons_metrics(setup: Setup) -> None:
    """The daemon's /metrics (service.api.router_metrics) on the same scheduler state."""
    node = busy_node(setup)
    scheduler = node.scheduler
    services = []
    for name in scheduler.service_names():
        view = scheduler.service_view(name)
        models = tuple(setup.policy.services[name].models)
        loads = (view.in_flight, view.queued, view.waiting_for_memory)
        services.append(ServiceLoad(models, view.state, *loads, kv_usage=None))
    ledger = scheduler.ledger_view(0)
    assert ledger is not None
    load = NodeLoad(tuple(services), ledger.budget, sum(ledger.charges.values()))
    running, waiting = resident_models(load.services)
    metrics = node_metrics(node)
    assert (sorted(metrics.running_models), sorted(metrics.waiting_models)) == (running, waiting)
    assert metrics.kv_usage == kv_cache_usage(load)


def metrics(
    *, waiting: int = 0, kv: float = 0.4, running: tuple[str, ...] = (), max_models: int = 11
) -> NodeMetrics:
    return NodeMetrics(waiting, 0, kv, frozenset(running), frozenset(), max_models)


def test_affinity_prefers_the_node_running_the_model() -> None:
    resident, other = metrics(running=("coder",)), metrics(running=("flux",))
    assert _best([resident, other], "coder", PICKER_DEFAULT) == 0
    idle = metrics(kv=0.0)
    assert _best([resident, idle], "coder", Weights()) == 0


def test_picker_default_weights_trade_residency_for_free_memory() -> None:
    """Residency's 0.2 edge at weight 1 is outweighed by a kv gap over 0.1 at weight 2."""
    resident, emptier = metrics(kv=0.6, running=("coder",)), metrics(kv=0.3)
    assert _best([resident, emptier], "coder", PICKER_DEFAULT) == 1
    assert _best([resident, emptier], "coder", Weights()) == 0


@pytest.mark.parametrize("weights", [PICKER_DEFAULT, Weights()])
def test_between_nodes_running_the_model_the_less_loaded_wins(weights: Weights) -> None:
    busy, quiet = metrics(waiting=3, running=("coder",)), metrics(running=("coder",))
    assert _best([busy, quiet], "coder", weights) == 1


def test_lora_scores_follow_the_picker() -> None:
    running = metrics(running=("coder",), max_models=2)
    room = metrics(running=("flux",), max_models=2)
    full_waiting = NodeMetrics(0, 0, 0.4, frozenset({"flux"}), frozenset({"coder"}), 2)
    full = NodeMetrics(0, 0, 0.4, frozenset({"flux", "sdxl"}), frozenset(), 2)
    lora_only = Weights(queue=0, kv=0, lora=1)
    scores = affinity_scores([running, room, full_waiting, full], "coder", lora_only)
    assert scores == [1.0, 0.8, 0.6, 0.0]


def test_ties_are_broken_by_a_seeded_random_choice() -> None:
    same = [metrics()] * 4
    req = TraceRequest("r0", 0.0, "coder", 1.0)
    picks = [AffinityRouter(seed=7).pick(req, 0, same) for _ in range(3)]
    assert len(set(picks)) == 1
    router = AffinityRouter(seed=7)
    assert len({router.pick(req, 0, same) for _ in range(40)}) > 1


def test_round_robin_sends_request_i_to_node_i_mod_n() -> None:
    req = TraceRequest("r0", 0.0, "coder", 1.0)
    nodes = [metrics()] * 3
    assert [RoundRobinRouter().pick(req, i, nodes) for i in range(5)] == [0, 1, 2, 0, 1]


def _best(nodes: list[NodeMetrics], model: str, weights: Weights) -> int:
    scores = affinity_scores(nodes, model, weights)
    return scores.index(max(scores))


def test_affinitys_weights_are_those_of_the_shipped_picker_configuration() -> None:
    manifests = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    documents = yaml.safe_load_all((manifests / "inferencepool.yaml").read_text())
    (configmap,) = [d for d in documents if d and d["metadata"]["name"] == "vramd-epp"
                    and d["kind"] == "ConfigMap"]  # fmt: skip
    (config,) = [yaml.safe_load(text) for text in configmap["data"].values()]
    (profile,) = config["schedulingProfiles"]
    weights = {ref["pluginRef"]: ref.get("weight") for ref in profile["plugins"]}
    shipped = Weights()
    assert weights["lora-affinity-scorer"] == shipped.lora
    assert weights["queue-scorer"] == shipped.queue
    assert weights["kv-cache-utilization-scorer"] == shipped.kv
