"""The benchmark simulator (``bench.replay``): exact outcomes on a tiny hand-made trace.

Three on-demand services of one priority share a simulated device on which any two fit
(9 GiB to plan with, 4 + 4 + 3 GiB of estimates). Each test spells out, step by step,
what the system under test must do with four requests, and checks the counts and
latencies that follow. No sleeps: the simulator runs on a virtual clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import replay, targets
from bench.live import (
    LiveResponse,
    LiveRun,
    compare,
    compress,
    decision_sequence,
    demo_runtimes,
    drive,
    lcs_ratio,
    live_setup,
    sim_events_after_start,
)
from bench.systems import FIXED_SYSTEMS, SYSTEMS, LruCount
from bench.traces.generate import ModelSpec, TraceParams, generate, zipf_shares
from service.domain import ServiceKind
from service.policy import load_policy
from service.replay.benchdata import parse_bench_data
from service.replay.device import SimDevice
from service.replay.harness import run_system
from service.replay.metrics import REQUEST_KEYS, RUN_KEYS
from service.replay.setup import Setup, build_setup
from service.replay.trace import TraceRequest, dump_trace, parse_trace
from service.units import GIB

REPO_ROOT = Path(__file__).resolve().parents[2]

POLICY = """
version: 1
device: {backend: host, budget: 10GiB, headroom: 1GiB, sample_interval: 1s}
defaults:
  idle_ttl: 60s
  max_concurrency: 2
  queue: {max: 2, timeout: 30s}
  restart: {max_retries: 1, backoff: 1s, max_backoff: 1s}
services:
  a: {kind: chat, models: [model-a], command: [x], memory: {estimate: 4GiB}}
  b: {kind: chat, models: [model-b], command: [x], memory: {estimate: 4GiB}}
  c: {kind: embedding, models: [model-c], command: [x], memory: {estimate: 3GiB}}
"""
BENCH = "{a: {load_s: 2, unload_s: 1}, b: {load_s: 2, unload_s: 1}, c: {load_s: 2, unload_s: 1}}"
TRACE = """
{"t": 0, "model": "model-a", "duration_s": 1, "stream": true}
{"t": 0.5, "model": "model-b", "duration_s": 1, "stream": false}
{"t": 10, "model": "model-c", "duration_s": 1, "stream": false}
{"t": 20, "model": "model-a", "duration_s": 1, "stream": false}
"""


def setup_for(bench: str = BENCH, policy: str = POLICY) -> Setup:
    return build_setup(load_policy(policy), parse_bench_data(bench))


def run(name: str, setup: Setup | None = None, trace: str = TRACE) -> tuple[dict[str, Any], Any]:
    result = run_system(SYSTEMS[name], setup or setup_for(), parse_trace(trace.splitlines()))
    return result.summary, result


def test_setup_plans_with_vramds_budget_on_a_slightly_larger_device() -> None:
    setup = setup_for()
    assert setup.plan_bytes == 9 * GIB  # min(budget, total) - headroom
    assert setup.device_total == 12 * GIB  # budget + headroom + 1 GiB of slack
    assert setup.services["a"].bench.true_peak == 4 * GIB  # no true_peak: the estimate


def test_vramd_evicts_the_least_recently_used_then_the_cheaper_reload() -> None:
    # a and b fit together. c (t=10) needs 3 GiB with 1 free: both are idle, a was
    # used less recently (t=3 vs 3.5): a goes. a again (t=20) needs 4 GiB with 2 free:
    # b (4 GiB) and c (3 GiB) each cover it; b frees more bytes per second of reload.
    summary, result = run("vramd")
    assert summary["served"] == 4
    assert summary["refused_total"] == 0
    assert summary["cold_starts"] == 4
    assert summary["cold_requests"] == 4
    assert summary["evictions"] == 2
    assert summary["oom_loads"] == 0
    loads = [(e["t"], e["service"]) for e in result.events if e["kind"] == "load"]
    assert loads == [(0.0, "a"), (0.5, "b"), (11.0, "c"), (21.0, "a")]
    evicted = [(e["t"], e["data"]["victims"]) for e in result.events if e["kind"] == "evict"]
    assert evicted == [(10.0, ["a"]), (20.0, ["b"])]
    assert summary["latency_s"] == {"p50": pytest.approx(3.5), "p99": pytest.approx(4.0)}
    assert summary["slo_attainment"] == 1.0  # within 5 x 1 s + 2 s of load


def test_swap_one_waits_for_in_flight_requests_before_each_swap() -> None:
    # a loads (0-2) and serves r0 (2-3); b's swap waits for it, unloads a (3-4), loads b
    # (4-6), serves r1 (6-7). c and a again: unload 1 s, load 2 s, serve 1 s each.
    summary, result = run("swap-one")
    loads = [(e["t"], e["service"]) for e in result.events if e["kind"] == "load"]
    assert loads == [(0.0, "a"), (4.0, "b"), (11.0, "c"), (21.0, "a")]
    assert summary["served"] == 4
    assert summary["cold_starts"] == 4
    # Latencies 3, 6.5 (r1: 0.5 -> 7), 4, 4; p99 interpolates between 4 and 6.5.
    assert summary["latency_s"]["p99"] == pytest.approx(4 + 0.97 * 2.5)


def test_swap_one_answers_429_past_the_concurrency_limit() -> None:
    lines = ['{"t": 0, "model": "model-a", "duration_s": 5, "stream": false}'] * 12
    summary, _ = run("swap-one", trace="\n".join(lines))
    assert summary["served"] == 10
    assert summary["refused"] == {"queue_full": 2}


def test_lru_count_never_overlaps_loads_and_unloads_by_name_when_memory_is_short() -> None:
    # b arrives while a loads: Ollama puts it back in the queue every 0.25 s until a
    # is ready (t=2). c does not fit by estimates (4 + 4 + 3 > 9): the first idle
    # runner by name (a) is unloaded first; for a again, b.
    summary, result = run("lru-count")
    loads = [(e["t"], e["service"]) for e in result.events if e["kind"] == "load"]
    assert loads == [(0.0, "a"), (2.0, "b"), (11.0, "c"), (21.0, "a")]
    assert summary["served"] == 4
    assert summary["cold_starts"] == 4
    # Latencies 3, 4.5 (r1: 0.5 -> 5), 4, 4.
    assert summary["latency_s"]["p99"] == pytest.approx(4 + 0.97 * 0.5)


def test_lru_count_answers_503_past_its_queue() -> None:
    class SmallQueue(LruCount):
        max_queue = 2

    # r0 keeps a busy until t=17. At t=10 c needs room: b is idle and unloads (10-11);
    # meanwhile c and the first extra b request fill the queue (2 here), and the two
    # after it are answered 503 at once.
    trace = TRACE.replace(
        '"model-a", "duration_s": 1, "stream": true', '"model-a", "duration_s": 15'
    )
    trace += "\n".join(
        f'{{"t": {10 + i / 10}, "model": "model-b", "duration_s": 1}}' for i in range(1, 4)
    )
    summary = run_system(SmallQueue, setup_for(), parse_trace(trace.splitlines())).summary
    assert summary["refused"] == {"queue_full": 2}
    assert summary["served"] == 5


def test_static_partitions_by_estimate_and_refuses_what_does_not_fit() -> None:
    summary, result = run("static")
    assert [e["service"] for e in result.events if e["kind"] == "load"] == ["a", "b"]
    assert summary["served"] == 3
    assert summary["refused"] == {"insufficient_capacity": 1}
    assert summary["cold_starts"] == 2
    assert summary["cold_requests"] == 2  # r0 and r1 came while a and b were loading


def test_unbounded_loads_everything_once() -> None:
    summary, _ = run("unbounded")
    assert summary["served"] == 4
    assert summary["cold_starts"] == 3
    assert summary["latency_s"]["p50"] == pytest.approx(1.75)  # 3, 2.5, 1, 1


def test_device_fails_a_load_whose_true_peak_does_not_fit_what_is_free() -> None:
    device = SimDevice(total=10 * GIB)
    assert device.place("a", 0.0, 6 * GIB, load_s=2.0) is None
    # b claims 6 GiB with 4 free: it ramps at 3 GiB/s and hits the wall after 4/6 of
    # its load.
    fail_at = device.place("b", 1.0, 6 * GIB, load_s=2.0)
    assert fail_at is not None
    assert fail_at == pytest.approx(1.0 + 2.0 * 4 / 6)
    assert device.footprint("b", fail_at) == 4 * GIB
    device.remove("b", fail_at)
    assert device.used(10.0) == 6 * GIB
    # Byte-seconds: a ramps 0-2 s then holds 6 GiB; b ramped to 4 GiB over 4/3 s.
    expected = 6 * GIB * (1.0 + 8.0) + 4 * GIB * (4 / 3) / 2
    assert device.byte_seconds(10.0) == pytest.approx(expected)


def test_vramd_counts_out_of_memory_retries_then_fails_the_waiting_request() -> None:
    # a's real footprint (13 GiB) is above the whole device (12 GiB): the load fails,
    # the supervisor retries once (max_retries 1) and gives up; r0 is refused.
    setup = setup_for("{a: {load_s: 2, true_peak: 13GiB}}")
    trace = '{"t": 0, "model": "model-a", "duration_s": 1, "stream": false}'
    summary, result = run("vramd", setup, trace)
    assert summary["oom_loads"] == 2
    assert summary["cold_starts"] == 2
    assert summary["failed_oom"] == 1
    assert summary["served"] == 0
    assert [e["kind"] for e in result.events] == ["load", "oom", "load", "oom", "reject"]
    for name in ("lru-count", "swap-one"):
        summary, _ = run(name, setup, trace)
        assert (summary["oom_loads"], summary["failed_oom"]) == (1, 1), name


def test_vramd_learns_a_true_peak_above_the_estimate() -> None:
    # a really takes 6 GiB (estimate 4). Once measured, vramd charges 6 GiB: with a
    # resident, b (4 GiB) no longer fits beside it (6 + 4 > 9) and a is evicted for it.
    setup = setup_for("{a: {load_s: 2, true_peak: 6GiB}}")
    trace = """
    {"t": 0, "model": "model-a", "duration_s": 1, "stream": false}
    {"t": 10, "model": "model-b", "duration_s": 1, "stream": false}
    """
    summary, result = run("vramd", setup, trace)
    assert summary["oom_loads"] == 0
    assert [e["data"]["victims"] for e in result.events if e["kind"] == "evict"] == [["a"]]


def test_a_baseline_request_served_past_its_queue_timeout_is_not_within_it() -> None:
    # Two slots on a, three 40 s requests at once: the third waits 40 s for a slot, past
    # the 30 s queue.timeout. lru-count serves it late; vramd answers 503 at 30 s.
    trace = '{"t": 0, "model": "model-a", "duration_s": 40, "stream": false}\n' * 3
    lru, _ = run("lru-count", trace=trace)
    assert (lru["served"], lru["served_past_timeout"], lru["served_within_timeout"]) == (3, 1, 2)
    assert lru["by_service"]["a"]["share_within_timeout"] == pytest.approx(2 / 3)
    vramd, _ = run("vramd", trace=trace)
    assert (vramd["served"], vramd["served_within_timeout"]) == (2, 2)
    assert vramd["refused"] == {"queue_timeout": 1}


def test_out_of_memory_loads_after_a_service_was_ready_are_counted_apart() -> None:
    # lru-count trusts estimates (4 GiB each). a (6 GiB really) is ready once, expires
    # after its keep-alive; b (7 GiB) loads; a again fits b's estimate but not its true
    # peak (12 - 7 < 6): an out-of-memory load of a service whose peak had been seen.
    setup = setup_for("{a: {load_s: 2, true_peak: 6GiB}, b: {load_s: 2, true_peak: 7GiB}}")
    trace = """
    {"t": 0, "model": "model-a", "duration_s": 1, "stream": false}
    {"t": 400, "model": "model-b", "duration_s": 100, "stream": false}
    {"t": 405, "model": "model-a", "duration_s": 1, "stream": false}
    """
    summary, _ = run("lru-count", setup, trace)
    assert (summary["oom_loads"], summary["oom_loads_after_ready"]) == (1, 1)
    assert summary["by_service"]["a"]["oom_loads"] == 1
    assert summary["failed_oom"] == 1
    # vramd's out-of-memory loads of a service never ready are still being learned.
    setup = setup_for("{a: {load_s: 2, true_peak: 13GiB}}")
    one = '{"t": 0, "model": "model-a", "duration_s": 1, "stream": false}'
    summary, _ = run("vramd", setup, one)
    assert (summary["oom_loads"], summary["oom_loads_after_ready"]) == (2, 0)


def test_figures_per_priority_over_unpinned_services() -> None:
    policy = POLICY.replace(
        "memory: {estimate: 3GiB}}", "memory: {estimate: 3GiB}, residency: pinned}"
    )
    summary, _ = run("unbounded", setup_for(policy=policy))
    # c is pinned: the priority class (all three at 100) holds 4 requests, the unpinned 3.
    assert summary["by_priority"]["100"]["requests"] == 4
    assert summary["by_priority_unpinned"]["100"]["requests"] == 3


TWO_GPUS = """
version: 1
device: {backend: host, gpus: [0, 1], budget: 10GiB, headroom: 1GiB, sample_interval: 1s}
defaults: {idle_ttl: 60s, max_concurrency: 2, queue: {max: 2, timeout: 30s}}
services:
  a: {kind: chat, models: [model-a], command: [x], memory: {estimate: 6GiB}}
  b: {kind: chat, models: [model-b], command: [x], memory: {estimate: 6GiB}}
  ab: {kind: chat, models: [model-ab], command: [x], memory: {estimate: 6GiB}, span: 2}
"""


@pytest.mark.parametrize("system", ["vramd", "lru-count", "static"])
def test_a_second_big_model_goes_on_the_second_device(system: str) -> None:
    # Two devices of 9 GiB to plan with: a takes 6 on one, b does not fit beside it.
    setup = setup_for("{a: {load_s: 2}, b: {load_s: 2}}", TWO_GPUS.replace("  ab:", "  # ab:"))
    assert (setup.devices, setup.plan_bytes) == (2, 9 * GIB)
    trace = """
    {"t": 0, "model": "model-a", "duration_s": 30, "stream": false}
    {"t": 0.5, "model": "model-b", "duration_s": 30, "stream": false}
    """
    summary, result = run(system, setup, trace)
    loads = {e["service"]: e["data"]["devices"] for e in result.events if e["kind"] == "load"}
    assert loads == {"a": [0], "b": [1]}
    assert summary["served"] == 2 and summary["evictions"] == 0


def test_a_span_service_holds_its_share_on_each_device() -> None:
    # ab (span 2, 6 GiB: 3 per device) fits beside a (6 on device 0) with 3 left there.
    bench = "{a: {load_s: 2}, b: {load_s: 2}, ab: {load_s: 2, true_peak: 6GiB}}"
    trace = """
    {"t": 0, "model": "model-a", "duration_s": 30, "stream": false}
    {"t": 5, "model": "model-ab", "duration_s": 1, "stream": false}
    """
    for system in ("vramd", "static"):
        summary, result = run(system, setup_for(bench, TWO_GPUS), trace)
        loads = {e["service"]: e["data"]["devices"] for e in result.events if e["kind"] == "load"}
        assert loads["ab"] == [0, 1], system
        assert summary["served"] == 2 and summary["oom_loads"] == 0, system


def test_runs_are_deterministic() -> None:
    first, _ = run("vramd")
    second, _ = run("vramd")
    assert first == second


# ----------------------------------------------------------------- the trace generator

MODELS = [ModelSpec(f"m{i}", f"s{i}", ServiceKind.CHAT) for i in range(10)]


def test_generator_is_deterministic_by_seed() -> None:
    params = TraceParams(alpha=0.9, cv=4.0, seed=7, duration=600.0)
    groups = [["s3", "s4"], ["s5", "s6", "s7"]]
    one = dump_trace(generate(MODELS, params, groups))
    assert one == dump_trace(generate(MODELS, params, groups))
    other = TraceParams(alpha=0.9, cv=4.0, seed=8, duration=600.0)
    assert one != dump_trace(generate(MODELS, other, groups))
    reread = parse_trace(one.splitlines())
    assert all(0 <= r.t < 600 for r in reread)
    assert [r.t for r in reread] == sorted(r.t for r in reread)


def test_generator_follows_the_requested_popularity_skew() -> None:
    params = TraceParams(alpha=2.1, cv=1.0, seed=3, duration=20_000.0, rate=1.0, diurnal=0.0)
    requests = generate(MODELS, params, [])
    counts = Counter(r.model for r in requests)
    total = sum(counts.values())
    assert total == pytest.approx(20_000, rel=0.05)
    shares = zipf_shares(10, 2.1)
    for rank in range(3):
        assert counts[f"m{rank}"] / total == pytest.approx(shares[rank], abs=0.02)
    assert counts["m0"] > counts["m1"] > counts["m2"]


def test_generator_burstiness_grows_with_cv() -> None:
    def gap_cv(cv: float) -> float:
        params = TraceParams(alpha=0.0, cv=cv, seed=1, duration=20_000.0, diurnal=0.0)
        times = [r.t for r in generate(MODELS[:1], params, [])]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = sum(gaps) / len(gaps)
        var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
        return float(var**0.5 / mean)

    assert gap_cv(1.0) == pytest.approx(1.0, abs=0.15)
    assert gap_cv(4.0) > 2.5


# ----------------------------------------------------------------- the command


def test_json_report_has_the_documented_keys(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "b.yaml").write_text(BENCH)
    (tmp_path / "t.jsonl").write_text(TRACE)
    out, md = tmp_path / "out" / "r.json", tmp_path / "r.md"
    argv = ["--policy", str(tmp_path / "p.yaml"), "--trace", str(tmp_path / "t.jsonl")]
    argv += ["--bench-data", str(tmp_path / "b.yaml"), "--json", str(out), "--markdown", str(md)]
    assert replay.main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report) == {
        "trace", "policy", "bench_data", "requests", "horizon_s", "device", "priorities",
        "residencies", "policies", "targets", "why_lost", "tuning", "costs",
    }  # fmt: skip
    assert [t["name"] for t in report["targets"]] == list(targets.NAMES)
    assert list(report["policies"]) == [
        "vramd", *FIXED_SYSTEMS, "swap-one", "lru-count", "static", "unbounded"
    ]  # fmt: skip
    assert report["tuning"] == []  # a trace shorter than the first round
    assert set(report["costs"]) >= {"loads", "lru_count_loads", "top_p99", "slo_unbounded"}
    for figures in report["policies"].values():
        assert set(RUN_KEYS) | {"wall_s"} == set(figures)
        for cls in figures["by_priority"].values():
            assert set(REQUEST_KEYS) == set(cls)
        assert set(figures["latency_s"]) == set(figures["queue_s"]) == {"p50", "p99"}
    assert "| vramd | 4/4 |" in md.read_text()


def test_unknown_policy_name_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "t.jsonl").write_text(TRACE)
    argv = ["--policy", str(tmp_path / "p.yaml"), "--trace", str(tmp_path / "t.jsonl")]
    assert replay.main([*argv, "--policies", "vramd,k8s"]) == 2


def test_committed_inputs_are_valid() -> None:
    bench_dir = REPO_ROOT / "bench"
    for name in ("ten-services", "ten-services-tiered"):
        setup = replay.load_setup(
            bench_dir / "policies" / f"{name}.yaml",
            bench_dir / "policies" / "ten-services.bench.yaml",
        )
        estimates = sum(s.estimate for s in setup.services.values())
        assert len(setup.services) == 10
        budget = setup.policy.device.budget
        assert budget is not None and 2 <= estimates / budget <= 3
    for trace in sorted((bench_dir / "traces").glob("*.jsonl")):
        assert trace.stat().st_size < 1_000_000
        requests = parse_trace(trace.read_text().splitlines())
        assert {setup.service_of(r.model) for r in requests} <= set(setup.services)
    demo = load_policy((bench_dir / "policies" / "live-demo.yaml").read_text())
    assert set(demo_runtimes(demo)) == set(setup.services)


# ----------------------------------------------------------------- the live check

DAEMON_EVENTS: list[dict[str, Any]] = [  # as GET /api/events returns them (trimmed)
    {"id": 41, "kind": "load", "service": "a", "message": "starting a", "data": {}},
    {"id": 42, "kind": "state", "service": "a", "message": "a: starting -> ready", "data": {}},
    {"id": 43, "kind": "load", "service": "b", "message": "starting b", "data": {}},
    {"id": 44, "kind": "evict", "service": "c", "message": "c needs", "data": {"victims": ["a"]}},
    {"id": 45, "kind": "load", "service": "c", "message": "starting c", "data": {}},
    {
        "id": 46,
        "kind": "reject",
        "service": "c",
        "message": "refused",
        "data": {"code": "queue_full"},
    },
    {"id": 47, "kind": "evict", "service": "a", "message": "a needs", "data": {"victims": ["c"]}},
    {"id": 48, "kind": "load", "service": "a", "message": "starting a", "data": {}},
]


def test_compare_reports_agreement_on_recorded_data() -> None:
    responses = [
        LiveResponse("r0", "a", 200, None, 3.0, True),
        LiveResponse("r1", "b", 200, None, 3.0, True),
        LiveResponse("r2", "c", 429, "queue_full", 0.0, False),
        LiveResponse("r3", "a", 200, None, 4.0, True),
    ]
    _, sim = run("vramd")
    report = compare(LiveRun(responses, DAEMON_EVENTS), sim.events, sim.summary)
    assert report["cold_starts"]["live"] == report["cold_starts"]["sim"] == 4
    assert report["cold_starts"]["by_service"]["c"] == {"live": 1, "sim": 1}
    assert report["refusals"] == {"live": {"queue_full": 1}, "sim": {}, "agreement": 0.0}
    assert report["served"] == {"live": 3, "sim": 4}
    assert report["order"]["live"] == ["load:a", "load:b", "evict:a", "load:c", "evict:c", "load:a"]
    assert report["order"]["sim"] == ["load:a", "load:b", "evict:a", "load:c", "evict:b", "load:a"]
    assert report["order"]["lcs_ratio"] == pytest.approx(5 / 6, abs=1e-4)


def test_lcs_ratio() -> None:
    assert lcs_ratio([], []) == 1.0
    assert lcs_ratio(["x"], []) == 0.0
    assert lcs_ratio(list("abcd"), list("abcd")) == 1.0
    assert lcs_ratio(list("abcd"), list("acbd")) == pytest.approx(0.75)
    assert decision_sequence([{"kind": "evict", "data": {"victims": ["b", "a"]}}]) == [
        "evict:a",
        "evict:b",
    ]


def test_sim_events_after_start_drops_the_startup_loads() -> None:
    events = [
        {"t": 0, "kind": "load", "service": "chat", "data": {"reason": "pinned"}},
        {"t": 0, "kind": "load", "service": "a", "data": {"reason": "1 request(s) waiting"}},
    ]
    assert [e["service"] for e in sim_events_after_start(events)] == ["a"]


LIVE_POLICY = """
version: 1
device: {backend: host, budget: 512MiB, headroom: 32MiB}
services:
  a:
    kind: chat
    models: [model-a]
    command: ["${PYTHON}", -m, service.demo_runtime, --port, "${PORT}", --memory, 64MiB,
              --load-seconds, "0.5", --latency-ms, "200", --chunk-delay-ms, "10"]
    memory: {estimate: 80MiB}
  c:
    kind: embedding
    models: [model-c]
    command: ["${PYTHON}", -m, service.demo_runtime, --port, "${PORT}", --latency-ms, "20"]
    memory: {estimate: 32MiB}
"""


def test_live_trace_is_compressed_with_the_demo_runtimes_timing() -> None:
    setup, timing = live_setup(build_setup(load_policy(LIVE_POLICY)))
    assert setup.services["a"].bench.load_s == 0.5
    assert setup.services["a"].bench.true_peak == 64 * 1024**2 + 16 * 1024**2
    trace = [
        TraceRequest("r0", 0.0, "model-a", 40.0, True),
        TraceRequest("r1", 5.0, "model-a", 40.0, False),
        TraceRequest("r2", 9.0, "model-c", 1.0, False),
        TraceRequest("r3", 30.0, "model-c", 1.0, False),
    ]
    short = compress(trace, speed=10, wall_s=2.0, setup=setup, timing=timing)
    assert [r.t for r in short] == [0.0, 0.5, 0.9]
    # 200 ms + 5 chunks x 10 ms when streamed; the embedding runtime's 20 ms.
    assert [r.duration_s for r in short] == pytest.approx([0.25, 0.2, 0.02])


def test_drive_sends_each_kind_to_its_route_and_reads_the_decision_log() -> None:
    setup = build_setup(load_policy(LIVE_POLICY))
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/events":
            since = int(request.url.params["since"])
            # Events 41 and 42 exist before the run starts; the rest appear during it.
            rows = [e for e in DAEMON_EVENTS if e["id"] > since and (since > 0 or e["id"] < 43)]
            return httpx.Response(200, json={"events": rows})
        seen.append((request.url.path, json.loads(request.content)))
        if request.url.path == "/v1/embeddings":
            error = {"error": {"message": "full", "type": "x", "code": "queue_full"}}
            return httpx.Response(429, json=error)
        return httpx.Response(200, json={"ok": True}, headers={"x-vramd-cold-start": "1"})

    transport = httpx.MockTransport(handler)
    trace = [
        TraceRequest("r0", 0.0, "model-a", 0.1, True),
        TraceRequest("r1", 0.0, "model-c", 0.1, False),
    ]

    async def go() -> LiveRun:
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://vramd") as client,
            httpx.AsyncClient(transport=transport, base_url="http://vramd") as admin,
        ):
            return await drive(client, admin, trace, setup)

    live = asyncio.run(go())
    assert sorted(path for path, _ in seen) == ["/v1/chat/completions", "/v1/embeddings"]
    chat_body = next(body for path, body in seen if path == "/v1/chat/completions")
    assert chat_body["model"] == "model-a" and chat_body["stream"] is True
    by_id = {r.request_id: r for r in live.responses}
    assert (by_id["r0"].status, by_id["r0"].code, by_id["r0"].cold) == (200, None, True)
    assert (by_id["r1"].status, by_id["r1"].code) == (429, "queue_full")
    assert [e["id"] for e in live.events] == [43, 44, 45, 46, 47, 48]


def test_vramd_model_puts_sleep_mode_services_to_sleep_and_wakes_them() -> None:
    # As in the eviction test, c evicts a at t=10 and a evicts b at t=20; but a and b
    # have vLLM's sleep mode: the evictions put them to sleep (unload_s), and a's
    # return at t=20 is a wake (wake_s 0.5 s) instead of a 2 s load -- the daemon's
    # own decisions (Stop(sleepable) -> InstanceAsleep, Start(wake=True)) on the pump.
    policy = POLICY.replace(
        "memory: {estimate: 4GiB}}", "memory: {estimate: 4GiB}, adapter: vllm, sleep: true}"
    )
    bench = "{a: {load_s: 2, wake_s: 0.5}, b: {load_s: 2, wake_s: 0.5}, c: {load_s: 2}}"
    summary, result = run("vramd", setup_for(bench, policy))
    assert summary["served"] == 4
    loads = [
        (e["t"], e["service"], e["data"].get("reason"))
        for e in result.events
        if e["kind"] == "load"
    ]
    assert [(t, s) for t, s, _ in loads] == [(0.0, "a"), (0.5, "b"), (11.0, "c"), (21.0, "a")]
    assert loads[-1][2] == "wake"
    # a's request at t=20 waits 1 s for b to fall asleep and 0.5 s for the wake, then
    # runs 1 s: 2.5 s instead of 4 s, so the median is 3.0 s (3.5 s without sleep mode).
    assert summary["latency_s"]["p50"] == pytest.approx(3.0)
    assert summary["evictions"] == 2
