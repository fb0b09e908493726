"""``bench.replay --live``: drive a running vramd with a short trace, compare with the simulator.

The daemon must be freshly started on a policy whose services all run the demo runtime
(``python -m service.demo_runtime``; ``bench/policies/live-demo.yaml`` is one, with the
ten benchmark services scaled down 32x in memory and 10x in time), and its pinned and
preloaded services should be ready before the run begins.

1. The trace is time-compressed (``--speed``: arrival times divided by it) and cut to
   ``--live-duration`` wall seconds. Each request's service time becomes what the demo
   runtime of its service really takes (``--latency-ms``, plus ``--chunks`` times
   ``--chunk-delay-ms`` when streamed): a demo runtime cannot be told how long to take.
2. The requests are sent at their times to ``POST /v1/...`` (the route of the model's
   kind, docs/policy.md), each on its own task; the status and error code of every
   response are kept.
3. The daemon's decision log since the start (``GET /api/events?since=ID``: ``load``,
   ``evict`` and ``reject`` events) is read back.
4. The simulator replays the same compressed trace on the same policy, with each
   runtime's load time and memory taken from its demo runtime flags (``demo_bench``).
5. ``compare`` reports the agreement: cold starts (total and per service), refusals by
   code, and the order of loads and evictions (a longest-common-subsequence ratio: 1.0
   means the same decisions in the same order).

6. With ``--tune``: the daemon runs a ``yielding: auto`` round at once (``POST
   /api/scheduler/tune``) and the simulator's tuner runs one on the arrivals of its own
   replay (``sim_tuning``); the report says which setting each chose, with the figures.

Exact agreement is not expected: the daemon samples real memory of real processes,
loads take a little longer than ``--load-seconds``, and HTTP adds milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from service.cli.client import EVENT_PAGE
from service.domain import ServiceKind
from service.kernel.tuning import ROUND_TIMEOUT_S
from service.policy import Policy
from service.replay import tuner
from service.replay.benchdata import RuntimeBench
from service.replay.harness import run_system, simulate
from service.replay.setup import Setup
from service.replay.trace import TraceRequest
from service.replay.vramd import Vramd
from service.scheduler import Tuning
from service.units import MIB, parse_size

# The demo runtime's own footprint (a Python interpreter, measured: 15-16 MiB) on top of --memory.
DEMO_OVERHEAD = 16 * MIB
DEMO_UNLOAD_S = 0.2


# --------------------------------------------------------------------- the trace side


def _flag(argv: Sequence[str], name: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


@dataclass(frozen=True, slots=True)
class DemoTiming:
    latency_s: float
    stream_extra_s: float


def demo_runtimes(policy: Policy) -> dict[str, tuple[RuntimeBench, DemoTiming]]:
    """Each service's demo runtime flags as bench data and request timing.

    Raises ``ValueError`` for a service that does not run ``service.demo_runtime``.
    """
    out: dict[str, tuple[RuntimeBench, DemoTiming]] = {}
    for name, svc in policy.services.items():
        argv = svc.command
        if "service.demo_runtime" not in argv:
            raise ValueError(f"service {name!r} does not run service.demo_runtime")
        memory = parse_size(_flag(argv, "--memory", "0") or "0")
        load_s = float(_flag(argv, "--load-seconds", "0") or 0)
        latency = float(_flag(argv, "--latency-ms", "0") or 0) / 1000
        chunks = int(_flag(argv, "--chunks", "5") or 5)
        delay = float(_flag(argv, "--chunk-delay-ms", "20") or 20) / 1000
        bench = RuntimeBench(
            load_s=load_s, true_peak=memory + DEMO_OVERHEAD, unload_s=DEMO_UNLOAD_S
        )
        out[name] = (bench, DemoTiming(latency, chunks * delay))
    return out


def compress(
    trace: Sequence[TraceRequest],
    *,
    speed: float,
    wall_s: float,
    setup: Setup,
    timing: Mapping[str, DemoTiming],
) -> list[TraceRequest]:
    """The first ``wall_s`` seconds of ``trace`` at ``speed``, with demo service times."""
    out = []
    for req in trace:
        t = req.t / speed
        if t >= wall_s:
            break
        service = setup.service_of(req.model)
        duration = req.duration_s / speed
        if service is not None:
            demo = timing[service]
            stream = req.stream and setup.services[service].kind is ServiceKind.CHAT
            duration = demo.latency_s + (demo.stream_extra_s if stream else 0.0)
        out.append(replace(req, t=t, duration_s=duration))
    return out


def request_for(kind: ServiceKind, model: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """The route and JSON body a client of this kind would send."""
    match kind:
        case ServiceKind.CHAT:
            messages = [{"role": "user", "content": "hello from bench.live"}]
            return "/v1/chat/completions", {"model": model, "messages": messages, "stream": stream}
        case ServiceKind.EMBEDDING:
            return "/v1/embeddings", {"model": model, "input": "hello from bench.live"}
        case ServiceKind.DIFFUSION:
            return "/v1/images/generations", {"model": model, "prompt": "a lighthouse", "n": 1}
        case ServiceKind.SPEECH:
            return "/v1/audio/speech", {"model": model, "input": "hello", "voice": "default"}
        case ServiceKind.RERANK:
            return "/v1/rerank", {"model": model, "query": "q", "documents": ["a", "b"]}
    raise ValueError(f"no route for kind {kind}")


# --------------------------------------------------------------------- the daemon side


@dataclass(frozen=True, slots=True)
class LiveResponse:
    request_id: str
    service: str | None
    status: int
    code: str | None  # the OpenAI error code, None on success
    latency_s: float
    cold: bool


@dataclass(frozen=True, slots=True)
class LiveRun:
    responses: list[LiveResponse]
    events: list[dict[str, Any]]  # the daemon's /api/events rows since the start


async def last_event_id(admin: httpx.AsyncClient) -> int:
    last = 0
    while True:
        resp = await admin.get("/api/events", params={"since": last, "limit": EVENT_PAGE})
        resp.raise_for_status()
        rows = resp.json()["events"]
        if not rows:
            return last
        last = max(int(row["id"]) for row in rows)
        if len(rows) < EVENT_PAGE:
            return last


async def events_since(admin: httpx.AsyncClient, since: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while True:
        resp = await admin.get("/api/events", params={"since": since, "limit": EVENT_PAGE})
        resp.raise_for_status()
        page = resp.json()["events"]
        rows += page
        if len(page) < EVENT_PAGE:
            return rows
        since = max(int(row["id"]) for row in page)


async def _send(client: httpx.AsyncClient, req: TraceRequest, setup: Setup) -> LiveResponse:
    service = setup.service_of(req.model)
    kind = setup.services[service].kind if service else ServiceKind.CHAT
    path, body = request_for(kind, req.model, req.stream)
    started = time.monotonic()
    code: str | None = None
    try:
        async with client.stream("POST", path, json=body) as resp:
            raw = await resp.aread()
            status = resp.status_code
            cold = resp.headers.get("x-vramd-cold-start") == "1"
    except httpx.HTTPError as exc:
        return LiveResponse(req.id, service, 0, f"transport:{type(exc).__name__}", 0.0, False)
    if status >= 400:
        try:
            code = json.loads(raw)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = f"http_{status}"
    return LiveResponse(req.id, service, status, code, time.monotonic() - started, cold)


async def drive(
    client: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    trace: Sequence[TraceRequest],
    setup: Setup,
) -> LiveRun:
    """Send ``trace`` (already compressed) in real time; collect responses and events."""
    mark = await last_event_id(admin)
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for req in trace:
        delay = start + req.t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_send(client, req, setup)))
    responses = list(await asyncio.gather(*tasks))
    return LiveRun(responses, await events_since(admin, mark))


# --------------------------------------------------------------------- the comparison


def decision_sequence(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """``load:svc`` and ``evict:svc`` in the order they happened (daemon or simulator)."""
    out = []
    for event in events:
        kind, service = event.get("kind"), event.get("service")
        if kind == "load" and service:
            out.append(f"load:{service}")
        elif kind == "evict":
            data = event.get("data") or {}
            out += [f"evict:{victim}" for victim in sorted(data.get("victims", []))]
    return out


def lcs_ratio(a: Sequence[str], b: Sequence[str]) -> float:
    """2 * |longest common subsequence| / (|a| + |b|); 1.0 for two empty sequences."""
    if not a and not b:
        return 1.0
    prev = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(prev[j] + 1 if x == y else max(prev[j + 1], row[j]))
        prev = row
    return 2 * prev[-1] / (len(a) + len(b))


def compare(
    live: LiveRun, sim_events: Sequence[Mapping[str, Any]], sim_summary: Mapping[str, Any]
) -> dict[str, Any]:
    """How far the daemon and the simulator agree on one trace (the ``--live`` report)."""
    live_loads = Counter(e["service"] for e in live.events if e.get("kind") == "load")
    sim_loads = Counter(e["service"] for e in sim_events if e.get("kind") == "load")
    live_refused = Counter(r.code for r in live.responses if r.code is not None)
    sim_refused = Counter(dict(sim_summary["refused"]))
    if sim_summary.get("failed_oom"):
        sim_refused["runtime_failed"] += sim_summary["failed_oom"]
    live_seq, sim_seq = decision_sequence(live.events), decision_sequence(sim_events)
    services = sorted(set(live_loads) | set(sim_loads))
    total_live, total_sim = sum(live_loads.values()), sum(sim_loads.values())
    return {
        "requests": len(live.responses),
        "served": {
            "live": sum(1 for r in live.responses if r.code is None),
            "sim": sim_summary["served"],
        },
        "cold_starts": {
            "live": total_live,
            "sim": total_sim,
            "by_service": {s: {"live": live_loads[s], "sim": sim_loads[s]} for s in services},
            "agreement": _agreement(total_live, total_sim),
        },
        "refusals": {
            "live": dict(sorted(live_refused.items())),
            "sim": dict(sorted(sim_refused.items())),
            "agreement": _agreement(sum(live_refused.values()), sum(sim_refused.values())),
        },
        "order": {
            "live": live_seq,
            "sim": sim_seq,
            "lcs_ratio": round(lcs_ratio(live_seq, sim_seq), 4),
        },
    }


def _agreement(a: int, b: int) -> float:
    """1 - |a - b| / max(a, b): 1.0 when equal (or both zero)."""
    return 1.0 if max(a, b) == 0 else round(1 - abs(a - b) / max(a, b), 4)


STARTUP_REASONS = frozenset({"pinned", "preload"})


def sim_events_after_start(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The simulator's decisions, less its startup loads of pinned and preloaded
    services: the daemon, started before the run, has done those already."""
    return [
        dict(e)
        for e in events
        if not (e["kind"] == "load" and (e.get("data") or {}).get("reason") in STARTUP_REASONS)
    ]


def sim_tuning(setup: Setup, trace: Sequence[TraceRequest]) -> dict[str, Any]:
    """The simulator's ``yielding: auto`` round at the end of ``trace``, from the untuned
    start, as the daemon's ``POST /api/scheduler/tune`` runs one: the same arrivals (as
    its replay saw them), what it learned, the same choice rule."""
    system = simulate(Vramd, setup, trace)
    traffic, now = system.pump.traffic, system.clock.now
    job = tuner.job_of(
        setup.policy,
        traffic.since(now - tuner.WINDOW_S),
        system.scheduler.learned(),
        traffic.device_totals,
        Tuning(),
    )
    if isinstance(job, str):
        return {"chose": None, "why": job}
    figures = tuner.evaluate(job)
    choice = tuner.choose(figures, Tuning())
    return {
        "chose": choice.tuning.label,
        "why": choice.why,
        "figures": {f.tuning.label: round(f.weighted_slo, 4) for f in figures},
    }


async def daemon_tuning(admin: httpx.AsyncClient) -> dict[str, Any]:
    """The daemon's round, run now (``POST /api/scheduler/tune``)."""
    resp = await admin.post("/api/scheduler/tune", timeout=ROUND_TIMEOUT_S)
    resp.raise_for_status()
    view = resp.json()["yielding"]
    label = view["current"] + ("+top-never" if view["top_never"] else "")
    return {
        "chose": label,
        "why": view["why"],
        "figures": {f["candidate"]: f["weighted_slo"] for f in view["figures"]},
    }


# --------------------------------------------------------------------- the command


def live_setup(setup: Setup) -> tuple[Setup, dict[str, DemoTiming]]:
    runtimes = demo_runtimes(setup.policy)
    services = {
        name: replace(info, bench=runtimes[name][0]) for name, info in setup.services.items()
    }
    timing = {name: runtimes[name][1] for name in runtimes}
    return replace(setup, services=services), timing


def run_live_cli(args: argparse.Namespace, setup: Setup, trace: Sequence[TraceRequest]) -> int:
    if args.bench_data is None:
        setup, timing = live_setup(setup)
    else:
        timing = {name: t for name, (_, t) in demo_runtimes(setup.policy).items()}
    short = compress(trace, speed=args.speed, wall_s=args.live_duration, setup=setup, timing=timing)
    api_headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    admin_key = args.admin_key or args.api_key
    admin_headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}

    async def go() -> tuple[LiveRun, dict[str, Any] | None]:
        timeout = httpx.Timeout(600.0, connect=10.0)
        # Idle connections are dropped before the server's keep-alive timeout (uvicorn: 5 s), so
        # a request never goes out on a connection the server is closing.
        limits = httpx.Limits(
            max_connections=512, max_keepalive_connections=64, keepalive_expiry=2.0
        )
        async with (
            httpx.AsyncClient(
                base_url=args.url, headers=api_headers, timeout=timeout, limits=limits
            ) as client,
            httpx.AsyncClient(base_url=args.url, headers=admin_headers, timeout=30.0) as admin,
        ):
            run = await drive(client, admin, short, setup)
            return run, (await daemon_tuning(admin) if args.tune else None)

    print(f"driving {args.url} with {len(short)} requests over {args.live_duration:g} s ...")
    live, tuned = asyncio.run(go())
    sim = run_system(Vramd, setup, short)
    report = compare(live, sim_events_after_start(sim.events), sim.summary)
    if tuned is not None:
        simulated = sim_tuning(setup, short)
        report["tuning"] = {
            "live": tuned,
            "sim": simulated,
            "same_choice": tuned["chose"] == simulated["chose"],
        }
        print(f"yielding: auto chose {tuned['chose']} live, {simulated['chose']} simulated")
    report["recorded"] = {
        "daemon_events": [e for e in live.events if e.get("kind") in ("load", "evict", "reject")],
        "responses": dict(Counter(f"{r.status} {r.code or ''}".strip() for r in live.responses)),
        "cold_requests": {
            "live": sum(1 for r in live.responses if r.cold),
            "sim": sim.summary["cold_requests"],
        },
    }
    print(json.dumps({k: v for k, v in report.items() if k not in ("order", "recorded")}, indent=2))
    print(f"order of loads and evictions: LCS ratio {report['order']['lcs_ratio']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
