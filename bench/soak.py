"""Soak: a real vramd under mixed traffic and injected faults for minutes; what gives way.

    python -m bench.soak [--duration 600] [--clients 8] [--kill-every 15] [--apply-every 60]
                         [--seed 1] [--json bench/out/soak.json] [--keep DIR]

The fault tests (docs/reliability.md) each provoke one fault and check one outcome. A
soak runs them all at once, for long enough that what leaks, piles up or gets lost
shows: it starts ``vramd serve`` (``bench.processes``) on a generated host-backend policy
whose budget holds about three of its five demo-runtime services, so loads and
evictions never stop, and sends it traffic from ``--clients`` asyncio clients (one
``httpx.AsyncClient`` each) for ``--duration`` seconds: a seeded mix of chat completions
(plain and streamed), embeddings and image generations through ``/v1``. Meanwhile
``bench.soak_faults`` kills runtimes (some mid-stream), freezes them with SIGSTOP,
applies the policy again and locks the database.

What it counts, from the clients' side and from the daemon's:

- every answer by route and status, and the error codes inside the error bodies;
- **hung clients**: a request unanswered ``queue.timeout`` + 60 s after it was sent
  (the client then gives up on it); **transport errors** (httpx exceptions, by class);
- **malformed error bodies**: a non-2xx answer that is not OpenAI's
  ``{"error": {"message": str, "type": str, ...}}``;
- **cut streams**: a streamed 200 that ended without ``data: [DONE]`` and without an
  error event;
- 502s, and 502s per runtime killed;
- the daemon's RSS and open file descriptors (by kind, and its TCP connections) every
  10 s and once more after the traffic, idle; their slope against the requests
  completed after warm-up (the first 60 s or 20 % of samples, whichever is
  longer), in MiB (fds) per 10,000 requests: allocator warm-up fades as a run grows
  longer, a leak does not;
- events produced against events stored: every ``EventLog.record`` logs one
  ``vramd.events`` line, and the writer numbers the rows as they are produced, so the
  log's lines, the ids seen on ``/api/events/stream`` and the rows of the ``events``
  table read after the daemon exits must agree;
- runtime restarts by cause (the ``state`` events' transitions into ``starting``,
  ``backoff`` and ``failed``) and each service's state just before SIGTERM;
- after SIGTERM: how long the daemon took to exit, and the processes left (any whose
  command line or working directory names the run's folder, or a runtime pid seen
  during the run that is still alive); they are killed once counted.

It asserts nothing: it prints the figures and writes them as JSON. Faults are seeded,
timing is not: two runs with the same seed inject the same kinds on the same schedule,
not at the same requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from bench.processes import Vramd, running_vramd
from bench.report import write_outputs
from bench.soak_faults import Faults, Schedule, clock
from service.policy import load_policy

MIB = 1024 * 1024
QUEUE_TIMEOUT_S = 30.0
DEADLINE_S = QUEUE_TIMEOUT_S + 60.0  # a request unanswered this long is a hung client
THINK_S = 0.3  # a client waits up to this long between two requests
SAMPLE_EVERY_S = 10.0
WARM_UP_S = 60.0
SHUTDOWN_WAIT_S = 60.0
SETTLE_S = 6.0  # idle seconds before the last sample
EXAMPLES = 50  # anomalies kept in the JSON per kind

# name -> (kind, model, residency, priority, --memory MiB, --load-seconds)
SERVICES: dict[str, tuple[str, str, str, int, int, float]] = {
    "chat": ("chat", "soak-chat", "warm", 300, 96, 0.5),
    "chat-small": ("chat", "soak-chat-small", "on-demand", 100, 64, 0.3),
    "chat-low": ("chat", "soak-chat-low", "on-demand", 50, 64, 0.5),
    "embed": ("embedding", "soak-embed", "on-demand", 200, 48, 0.3),
    "image": ("diffusion", "soak-image", "on-demand", 100, 128, 1.0),
}
MODEL_SERVICE = {spec[1]: name for name, spec in SERVICES.items()}
ROUTES = {
    "chat": "/v1/chat/completions",
    "chat (stream)": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
    "images": "/v1/images/generations",
}
MIX = {"chat": 0.35, "chat (stream)": 0.30, "embeddings": 0.20, "images": 0.15}
CHAT_MIX = {"soak-chat": 0.5, "soak-chat-small": 0.3, "soak-chat-low": 0.2}


# ---------------------------------------------------------------------------- policy


def soak_policy(workdir: Path, low_priority: int = 50) -> str:
    """The policy: five demo runtimes (about 560 MiB expected) on a 352 MiB budget.

    Each runtime holds ``--memory`` plus its interpreter (about 20 MiB), runs in
    ``workdir`` (so a survivor is found by its working directory) and streams 16 events
    20 ms apart, so a stream is in flight long enough to be cut. ``request_timeout``
    (40 s) is shorter than the default, so a queued request's wait plus the runtime's
    answer fit within the client's deadline. ``low_priority`` is ``chat-low``'s
    priority: the one thing the re-applied policy changes.
    """
    services = {}
    for name, (kind, model, residency, priority, memory, load_s) in SERVICES.items():
        spec: dict[str, Any] = {
            "kind": kind,
            "models": [model],
            "command": [
                "${PYTHON}",
                *("-m", "service.demo_runtime", "--port", "${PORT}", "--model", "${MODEL}"),
                *("--memory", f"{memory}MiB", "--load-seconds", str(load_s)),
                *("--latency-ms", "20", "--chunks", "16", "--chunk-delay-ms", "20"),
            ],
            "cwd": str(workdir),
            "memory": {"estimate": f"{memory + 32}MiB"},
            "residency": residency,
            "priority": low_priority if name == "chat-low" else priority,
        }
        if residency == "warm":
            spec["preload"] = True
        services[name] = spec
    server = {"request_timeout": "40s", "stream_idle_timeout": "20s"}
    defaults = {
        "startup_timeout": "30s",
        "stop_timeout": "5s",
        "idle_ttl": "60s",
        "protect": "5s",
        "max_concurrency": 4,
        "queue": {"max": 64, "timeout": f"{QUEUE_TIMEOUT_S:g}s"},
    }
    lines = ["version: 1", f"server: {json.dumps(server)}", "device:", "  backend: host"]
    lines += ["  budget: 384MiB", "  headroom: 32MiB", "  sample_interval: 1s"]
    lines += [f"defaults: {json.dumps(defaults)}", "services:"]
    lines += [f"  {name}: {json.dumps(spec)}" for name, spec in services.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- clients


@dataclass(frozen=True)
class Call:
    route: str
    model: str
    body: dict[str, Any]

    @property
    def path(self) -> str:
        return ROUTES[self.route]

    @property
    def service(self) -> str:
        return MODEL_SERVICE[self.model]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def pick_call(rng: random.Random) -> Call:
    route = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    words = f"soak {rng.randrange(10**6)}"
    if route.startswith("chat"):
        model = rng.choices(list(CHAT_MIX), weights=list(CHAT_MIX.values()))[0]
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": words}]}
        if route == "chat (stream)":
            body["stream"] = True
        return Call(route, model, body)
    if route == "embeddings":
        return Call(route, "soak-embed", {"model": "soak-embed", "input": words})
    return Call(route, "soak-image", {"model": "soak-image", "prompt": words, "n": 1})


@dataclass
class Outcome:
    """What one request got: its status (or the exception), and for a stream its end."""

    label: str | None = None
    status: int | None = None
    events: int = 0
    done: bool = False
    error_event: bool = False
    transport: str | None = None


@dataclass
class Tally:
    """Everything the clients saw; ``streams`` is shared with the fault injector."""

    started: float
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)
    error_codes: Counter[str] = field(default_factory=Counter)
    status_by_service: Counter[tuple[str, str]] = field(default_factory=Counter)
    transport: Counter[str] = field(default_factory=Counter)
    stream_error_codes: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    anomaly_counts: Counter[str] = field(default_factory=Counter)
    streams: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    in_flight: int = 0

    def anomaly(self, kind: str, call: Call, outcome: Outcome, sent: float, detail: str) -> None:
        self.anomaly_counts[kind] += 1
        examples = self.anomalies.setdefault(kind, [])
        if len(examples) < EXAMPLES:
            examples.append(
                {
                    "t": round(sent - self.started, 2),
                    "clock": clock(),
                    "route": call.route,
                    "model": call.model,
                    "status": outcome.status,
                    "seconds": round(time.monotonic() - sent, 2),
                    "detail": detail[:400],
                }
            )


def error_shape_problem(body: bytes) -> str | None:
    """Why ``body`` is not an OpenAI error (``None`` when it is one)."""
    try:
        value = json.loads(body)
    except ValueError:
        return f"not JSON: {body[:200]!r}"
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict):
        return f"no error object: {body[:200]!r}"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return f"error without a string message and type: {body[:200]!r}"
    return None


def error_code(body: bytes) -> str:
    with contextlib.suppress(ValueError, LookupError, TypeError, AttributeError):
        return str(json.loads(body)["error"].get("code"))
    return "?"


async def client(
    url: str, rng: random.Random, tally: Tally, stop_at: float, deadline_s: float
) -> None:
    timeout = httpx.Timeout(10.0, read=deadline_s + 10)
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        while time.monotonic() < stop_at:
            await send(http, pick_call(rng), tally, deadline_s)
            await asyncio.sleep(rng.uniform(0, THINK_S))


async def send(http: httpx.AsyncClient, call: Call, tally: Tally, deadline_s: float) -> None:
    sent = time.monotonic()
    outcome = Outcome()
    hung = False
    tally.in_flight += 1
    try:
        async with asyncio.timeout(deadline_s):
            if call.stream:
                await streamed(http, call, tally, outcome, sent)
            else:
                await plain(http, call, tally, outcome, sent)
    except TimeoutError:
        hung = True
        where = "before any answer" if outcome.status is None else f"after {outcome.events} events"
        tally.anomaly("hung", call, outcome, sent, f"no end after {deadline_s:g}s, {where}")
    except httpx.HTTPError as exc:
        outcome.transport = type(exc).__name__
        tally.transport[outcome.transport] += 1
        tally.anomaly("transport", call, outcome, sent, f"{outcome.transport}: {exc}")
    except Exception as exc:  # anything else is counted too: one odd answer ends no client
        outcome.transport = type(exc).__name__
        tally.anomaly("client-exception", call, outcome, sent, f"{outcome.transport}: {exc}")
    finally:
        tally.in_flight -= 1
        tally.completed += 1
        label = outcome.label or outcome.transport or "hung"
        tally.statuses[(call.route, label)] += 1
        tally.status_by_service[(call.service, label)] += 1
        tally.seconds.setdefault(call.route, []).append(time.monotonic() - sent)
    ended = outcome.done or outcome.error_event or hung
    if call.stream and outcome.status == 200 and not ended:
        cause = outcome.transport or "the stream ended"
        tally.anomaly("cut-stream", call, outcome, sent, f"{cause} after {outcome.events} events")


def answered(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.label = str(response.status_code)


def check_error(call: Call, tally: Tally, outcome: Outcome, sent: float, body: bytes) -> None:
    tally.error_codes[f"{outcome.status} {error_code(body)}"] += 1
    if problem := error_shape_problem(body):
        tally.anomaly("malformed-error", call, outcome, sent, problem)


async def plain(
    http: httpx.AsyncClient, call: Call, tally: Tally, outcome: Outcome, sent: float
) -> None:
    response = await http.post(call.path, json=call.body)
    answered(outcome, response)
    if response.is_success:
        outcome.done = True
        try:
            json.loads(response.content)
        except ValueError:
            detail = f"2xx body is not JSON: {response.content[:200]!r}"
            tally.anomaly("malformed-success", call, outcome, sent, detail)
    else:
        check_error(call, tally, outcome, sent, response.content)


async def streamed(
    http: httpx.AsyncClient, call: Call, tally: Tally, outcome: Outcome, sent: float
) -> None:
    async with http.stream("POST", call.path, json=call.body) as response:
        answered(outcome, response)
        if response.status_code != 200:
            check_error(call, tally, outcome, sent, await response.aread())
            return
        tally.streams[call.service] += 1
        try:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    read_event(line[5:].strip(), call, tally, outcome, sent)
        finally:
            tally.streams[call.service] -= 1


def read_event(data: str, call: Call, tally: Tally, outcome: Outcome, sent: float) -> None:
    outcome.events += 1
    if data == "[DONE]":
        outcome.done = True
        return
    try:
        event = json.loads(data)
    except ValueError:
        tally.anomaly("malformed-event", call, outcome, sent, f"event not JSON: {data[:200]!r}")
        return
    if isinstance(event, dict) and "error" in event:
        outcome.error_event = True
        tally.stream_error_codes[error_code(data.encode())] += 1
        if problem := error_shape_problem(data.encode()):
            tally.anomaly("malformed-error", call, outcome, sent, f"error event: {problem}")


# ---------------------------------------------------------------------------- watching


@dataclass
class Watch:
    """What the soak saw of the daemon (listening on ``port``) while it ran."""

    port: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    streamed_ids: set[int] = field(default_factory=set)
    stream_breaks: Counter[str] = field(default_factory=Counter)


async def sample(
    http: httpx.AsyncClient, daemon: psutil.Process, tally: Tally, faults: Faults, watch: Watch
) -> None:
    """One sample: the daemon's RSS and fds, requests done and running, service states."""
    try:
        rss, fds = daemon.memory_info().rss, daemon.num_fds()
    except psutil.Error:
        return  # the daemon is gone: shut_down reports how it ended
    row: dict[str, Any] = {
        "t": round(time.monotonic() - tally.started, 1),
        "ts": round(time.time(), 2),
        "requests_completed": tally.completed,
        "client_in_flight": tally.in_flight,
        "rss_mib": round(rss / MIB, 2),
        "fds": fds,
        "fd_kinds": fd_kinds(daemon.pid),
        "tcp": tcp_peers(daemon, watch.port),
    }
    try:
        services = await faults.services(http)
    except httpx.HTTPError as exc:
        row["services_error"] = type(exc).__name__
    else:
        row["daemon_in_flight"] = sum(s["in_flight"] for s in services)
        row["daemon_queued"] = sum(s["queued"] for s in services)
        row["states"] = {s["name"]: s["state"] for s in services}
    watch.samples.append(row)


def fd_kinds(pid: int) -> dict[str, int]:
    """The process's open file descriptors by what they are: socket, pipe, file, other."""
    kinds: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kind = target.split(":", 1)[0] if ":[" in target else "other"
                kinds["file" if target.startswith("/") else kind] += 1
    return dict(sorted(kinds.items()))


def tcp_peers(daemon: psutil.Process, port: int) -> dict[str, int]:
    """The daemon's TCP connections: from clients (to ``port``) and to runtimes, by state."""
    peers: Counter[str] = Counter()
    with contextlib.suppress(psutil.Error):
        for conn in daemon.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                continue
            side = "client" if conn.laddr and conn.laddr.port == port else "runtime"
            peers[f"{side} {conn.status}"] += 1
    return dict(sorted(peers.items()))


async def sample_every(
    http: httpx.AsyncClient, daemon: psutil.Process, tally: Tally, faults: Faults, watch: Watch
) -> None:
    while True:
        await sample(http, daemon, tally, faults, watch)
        await asyncio.sleep(SAMPLE_EVERY_S)


async def remember_runtimes(daemon: psutil.Process, faults: Faults) -> None:
    """Every process the daemon starts, as it starts (for the leftover count)."""
    while True:
        with contextlib.suppress(psutil.Error):
            for child in daemon.children(recursive=True):
                faults.remember(child.pid)
        await asyncio.sleep(0.5)


async def follow_events(url: str, watch: Watch) -> None:
    """Every event id the daemon streams, reconnecting if the stream breaks."""
    timeout = httpx.Timeout(10.0, read=60.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
        while True:
            try:
                async with http.stream("GET", "/api/events/stream") as response:
                    async for line in response.aiter_lines():
                        if line.startswith("id:"):
                            watch.streamed_ids.add(int(line[3:]))
                watch.stream_breaks["ended"] += 1
            except httpx.HTTPError as exc:
                watch.stream_breaks[type(exc).__name__] += 1
            await asyncio.sleep(1.0)


@dataclass
class Live:
    """What ``soak`` returns: the clients' tally, the faults, the watch, the end state."""

    tally: Tally
    faults: Faults
    watch: Watch
    final_services: list[dict[str, Any]]
    requests_total: dict[str, float]
    healthz: dict[str, Any]
    seconds: float


async def soak(vramd: Vramd, policies: tuple[str, str], args: argparse.Namespace) -> Live:
    started = time.monotonic()
    stop_at = started + args.duration
    tally = Tally(started)
    daemon = psutil.Process(vramd.proc.pid)
    faults = Faults(
        url=vramd.url,
        daemon_pid=daemon.pid,
        db=vramd.workdir / "vramd.db",
        policies=policies,
        streams=tally.streams,
        rng=random.Random(f"{args.seed}-faults"),
        started=started,
    )
    watch = Watch(port=int(vramd.url.rsplit(":", 1)[1]))
    schedule = Schedule(kill=args.kill_every, apply=args.apply_every)
    async with httpx.AsyncClient(base_url=vramd.url, timeout=10) as admin:
        background = [
            asyncio.create_task(sample_every(admin, daemon, tally, faults, watch)),
            asyncio.create_task(remember_runtimes(daemon, faults)),
            asyncio.create_task(follow_events(vramd.url, watch)),
        ]
        try:
            clients = [
                client(
                    vramd.url, random.Random(f"{args.seed}-client-{i}"), tally, stop_at, DEADLINE_S
                )
                for i in range(args.clients)
            ]
            await asyncio.gather(faults.run(schedule, stop_at), *clients)
            seconds = time.monotonic() - started
            await sample(admin, daemon, tally, faults, watch)
            final, requests_total, healthz = await end_state(admin, faults)
            # Once idle keep-alive connections have timed out (uvicorn: 5 s), the baseline.
            await asyncio.sleep(SETTLE_S)
            await sample(admin, daemon, tally, faults, watch)
            watch.samples[-1]["idle"] = True  # left out of the slopes: no requests moved
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    return Live(tally, faults, watch, final, requests_total, healthz, seconds)


async def end_state(
    admin: httpx.AsyncClient, faults: Faults
) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, Any]]:
    """The services, ``vramd_requests_total`` by code and ``/healthz``, as the run ends."""
    try:
        final = await faults.services(admin)
        requests_total = requests_by_code((await admin.get("/metrics")).text)
        healthz: dict[str, Any] = (await admin.get("/healthz")).json()
    except (httpx.HTTPError, ValueError) as exc:
        return [], {}, {"error": f"{type(exc).__name__}: {exc}"}
    return final, requests_total, healthz


def requests_by_code(metrics: str) -> dict[str, float]:
    """``vramd_requests_total`` summed over services, by ``code``."""
    totals: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("vramd_requests_total{"):
            labels, _, value = line.rpartition(" ")
            code = re.search(r'code="([^"]*)"', labels)
            totals[code.group(1) if code else "?"] += int(float(value))
    return dict(sorted(totals.items()))


# ---------------------------------------------------------------------------- the end


def shut_down(vramd: Vramd, pids_seen: dict[int, float]) -> dict[str, Any]:
    """SIGTERM the daemon, wait for it, then count (and kill) what it left behind."""
    died_before = vramd.proc.poll()
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(vramd.proc.pid, signal.SIGTERM)
    try:
        code: int | None = vramd.proc.wait(timeout=SHUTDOWN_WAIT_S)
    except subprocess.TimeoutExpired:
        code = None
    seconds = time.monotonic() - started
    left = leftovers(vramd.workdir, pids_seen)
    for proc in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc["pid"], signal.SIGKILL)
    return {
        "died_before_sigterm_with": died_before,
        "exit_code": code,
        "seconds": round(seconds, 2),
        "exited": code is not None,
        "runtime_pids_seen": len(pids_seen),
        "processes_left": len(left),
        "left": left,
    }


def leftovers(workdir: Path, pids_seen: dict[int, float]) -> list[dict[str, Any]]:
    """Live processes naming ``workdir`` (command line or cwd), or runtimes seen before."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "create_time", "status"]):
        info = proc.info
        if info["pid"] in mine or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(info["cmdline"] or [])
        named = str(workdir) in command or info["cwd"] == str(workdir)
        born = pids_seen.get(info["pid"])
        seen = born is not None and abs(born - (info["create_time"] or 0)) < 0.05
        if named or seen:
            found.append({"pid": info["pid"], "status": info["status"], "cmdline": command[:300]})
    return found


STATE_MESSAGE = re.compile(r"^\S+: \S+ -> \S+ \((?P<reason>.*)\)$", re.S)


def read_store(db: Path) -> list[dict[str, Any]]:
    """Every row of the ``events`` table, oldest first (read after the daemon exited)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT id, ts, kind, service, message, data FROM events ORDER BY id")
        return [
            {
                "id": i,
                "ts": ts,
                "kind": k,
                "service": s,
                "message": m,
                "data": json.loads(d or "{}"),
            }
            for i, ts, k, s, m, d in rows
        ]
    finally:
        con.close()


def event_figures(events: list[dict[str, Any]], log: Path, watch: Watch) -> dict[str, Any]:
    """Events produced (log lines, ids streamed) against events stored (rows)."""
    logged = 0
    not_stored: list[str] = []
    with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if " vramd.events: " in line:
                logged += 1
            elif "not stored" in line:
                not_stored.append(line.strip()[:300])
    ids = {e["id"] for e in events}
    top = max(ids, default=0)
    gaps = sorted(set(range(1, top + 1)) - ids)
    lost = sorted(watch.streamed_ids - ids)
    return {
        "logged": logged,
        "streamed": len(watch.streamed_ids),
        "streamed_id_range": [
            min(watch.streamed_ids, default=0),
            max(watch.streamed_ids, default=0),
        ],
        "stream_breaks": dict(watch.stream_breaks),
        "stored": len(events),
        "highest_id_stored": top,
        "id_gaps": len(gaps),
        "id_gaps_first": gaps[:20],
        "streamed_not_stored": len(lost),
        "streamed_not_stored_first": lost[:20],
        "logged_minus_stored": logged - len(events),
        "not_stored_log_lines": not_stored[:20],
        "by_kind": dict(Counter(e["kind"] for e in events).most_common()),
    }


def transitions(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of ``state`` transitions into starting, backoff and failed, by reason."""
    into: dict[str, Counter[str]] = {
        "starting": Counter(),
        "backoff": Counter(),
        "failed": Counter(),
    }
    by_service: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    for event in events:
        to = event["data"].get("to") if event["kind"] == "state" else None
        if to not in into:
            continue
        if to == "failed":
            when = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
            failed.append({"id": event["id"], "clock": when, "message": event["message"][:300]})
        match = STATE_MESSAGE.match(event["message"])
        reason = match.group("reason") if match else event["message"]
        # Pids, ports, attempts and seconds differ from one event to the next.
        reason = re.sub(r"\d+(\.\d+)?", "N", reason)[:160]
        into[to][reason] += 1
        by_service[f"{event['service']} -> {to}"] += 1
    return {
        "into": {to: dict(counts.most_common()) for to, counts in into.items()},
        "by_service": dict(sorted(by_service.items())),
        "failed": failed,
    }


def log_problems(log: Path) -> dict[str, Any]:
    """The daemon log's WARNING and ERROR lines by logger, tracebacks, a few of each."""
    levels: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    tracebacks = 0
    pattern = re.compile(r"^\S+ \S+ (?P<level>WARNING|ERROR|CRITICAL)\s+(?P<logger>\S+): ")
    with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("Traceback"):
                tracebacks += 1
            match = pattern.match(line)
            if match:
                key = f"{match.group('level')} {match.group('logger')}"
                levels[key] += 1
                kept = examples.setdefault(key, [])
                if len(kept) < 5:
                    kept.append(line.strip()[:300])
    return {
        "by_level_logger": dict(levels.most_common()),
        "tracebacks": tracebacks,
        "examples": examples,
    }


# ---------------------------------------------------------------------------- figures


def slope_per_10k(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` against ``xs``, times 10,000 (None: too few points)."""
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return 10_000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def series(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [s[key] for s in samples]
    skip = max(-(-len(samples) * 20 // 100), sum(1 for s in samples if s["t"] < WARM_UP_S))
    warm = [s for s in samples[skip:] if not s.get("idle")]
    xs = [float(s["requests_completed"]) for s in warm]
    slope = slope_per_10k(xs, [float(s[key]) for s in warm])
    return {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "max": max(values, default=None),
        "slope_per_10k_requests": None if slope is None else round(slope, 3),
        "samples_in_slope": len(warm),
    }


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def build_report(
    args: argparse.Namespace,
    live: Live,
    ending: dict[str, Any],
    events: list[dict[str, Any]],
    workdir: Path,
    loadavg_before: tuple[float, float, float],
) -> dict[str, Any]:
    tally, faults = live.tally, live.faults
    statuses: dict[str, dict[str, int]] = {}
    for (route, label), count in sorted(tally.statuses.items()):
        statuses.setdefault(route, {})[label] = count
    kills = faults.injected["kill"] + faults.injected["kill-mid-stream"]
    status_502 = sum(n for (_, label), n in tally.statuses.items() if label == "502")
    log = workdir / "vramd.log"
    return {
        "setup": {
            "duration_s": args.duration,
            "clients": args.clients,
            "kill_every_s": args.kill_every,
            "apply_every_s": args.apply_every,
            "seed": args.seed,
            "queue_timeout_s": QUEUE_TIMEOUT_S,
            "client_deadline_s": DEADLINE_S,
            "services": {
                name: dict(
                    zip(
                        ("kind", "model", "residency", "priority", "memory_mib", "load_s"),
                        spec,
                        strict=True,
                    )
                )
                for name, spec in SERVICES.items()
            },
            "budget": "384MiB - 32MiB headroom",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
            "workdir": str(workdir),
        },
        "requests": {
            "total": tally.completed,
            "seconds": round(live.seconds, 1),
            "per_second": round(tally.completed / live.seconds, 2) if live.seconds else None,
            "by_route_status": statuses,
            "by_service_status": {
                f"{svc} {label}": n for (svc, label), n in sorted(tally.status_by_service.items())
            },
            "error_codes": dict(tally.error_codes.most_common()),
            "stream_error_event_codes": dict(tally.stream_error_codes.most_common()),
            "seconds_by_route": {
                route: {
                    "p50": round(percentile(values, 50), 3),
                    "p99": round(percentile(values, 99), 3),
                    "max": round(max(values), 3),
                }
                for route, values in sorted(tally.seconds.items())
            },
            "daemon_requests_total_by_code": live.requests_total,
        },
        "anomalies": {
            "hung_clients": tally.anomaly_counts["hung"],
            "transport_errors": dict(tally.transport.most_common()),
            "malformed_error_bodies": tally.anomaly_counts["malformed-error"],
            "malformed_success_bodies": tally.anomaly_counts["malformed-success"],
            "malformed_stream_events": tally.anomaly_counts["malformed-event"],
            "client_exceptions": tally.anomaly_counts["client-exception"],
            "streams_cut_without_error_event": tally.anomaly_counts["cut-stream"],
            "examples": tally.anomalies,
        },
        "status_502": {
            "count": status_502,
            "kills": kills,
            "per_kill": round(status_502 / kills, 2) if kills else None,
        },
        "faults": {
            "injected": dict(sorted(faults.injected.items())),
            "skipped": dict(sorted(faults.skipped.items())),
            "log": faults.log,
        },
        "daemon": {
            "rss_mib": series(live.watch.samples, "rss_mib"),
            "fds": series(live.watch.samples, "fds"),
            "samples": live.watch.samples,
            "healthz_at_end": live.healthz,
            "log": log_problems(log),
        },
        "events": event_figures(events, log, live.watch),
        "restarts": transitions(events),
        "final_services": [
            {
                key: svc.get(key)
                for key in (
                    "name",
                    "state",
                    "restarts",
                    "loads",
                    "evictions",
                    "requests_served",
                    "flags",
                    "last_error",
                )
            }
            for svc in live.final_services
        ],
        "shutdown": ending,
    }


# ---------------------------------------------------------------------------- printing


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def summary_rows(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    req, anomalies, daemon = report["requests"], report["anomalies"], report["daemon"]
    yield "requests", f"{req['total']} in {req['seconds']} s ({req['per_second']}/s)"
    yield "faults injected", ", ".join(f"{k} {v}" for k, v in report["faults"]["injected"].items())
    yield "faults skipped", ", ".join(f"{k} {v}" for k, v in report["faults"]["skipped"].items())
    yield "hung clients", str(anomalies["hung_clients"])
    transport = anomalies["transport_errors"]
    yield "transport errors", ", ".join(f"{k} {v}" for k, v in transport.items()) or "0"
    yield "malformed error bodies", str(anomalies["malformed_error_bodies"])
    yield (
        "malformed 2xx bodies / stream events",
        (f"{anomalies['malformed_success_bodies']} / {anomalies['malformed_stream_events']}"),
    )
    yield "streams cut without an error event", str(anomalies["streams_cut_without_error_event"])
    yield "client exceptions (not httpx's)", str(anomalies["client_exceptions"])
    s502 = report["status_502"]
    yield (
        "502s / kills / 502 per kill",
        f"{s502['count']} / {s502['kills']} / {_fmt(s502['per_kill'])}",
    )
    for key, unit in (("rss_mib", "MiB"), ("fds", "fds")):
        fig = daemon[key]
        yield (
            f"daemon {unit}: first / last / max / per 10k req",
            f"{_fmt(fig['first'])} / {_fmt(fig['last'])} / {_fmt(fig['max'])} / "
            f"{_fmt(fig['slope_per_10k_requests'])} ({fig['samples_in_slope']} samples)",
        )
    for at in (0, -1):
        row = daemon["samples"][at] if daemon["samples"] else {}
        kinds = ", ".join(f"{k} {v}" for k, v in row.get("fd_kinds", {}).items())
        tcp = ", ".join(f"{k} {v}" for k, v in row.get("tcp", {}).items())
        yield f"daemon fds and TCP at t={row.get('t')} s", f"{kinds}; {tcp}"
    ev = report["events"]
    yield "events logged / streamed / stored", f"{ev['logged']} / {ev['streamed']} / {ev['stored']}"
    yield "event id gaps / streamed not stored", f"{ev['id_gaps']} / {ev['streamed_not_stored']}"
    failed = [s["name"] for s in report["final_services"] if s["state"] == "failed"]
    yield "services failed at the end", ", ".join(failed) or "none"
    end = report["shutdown"]
    if end["died_before_sigterm_with"] is not None:
        yield "daemon died during the run", f"exit code {end['died_before_sigterm_with']}"
    # uvicorn re-raises the SIGTERM it handled once shut down: -15 is a clean exit.
    yield "SIGTERM -> exit", f"{end['seconds']} s, exit code {_fmt(end['exit_code'])}"
    yield "processes left after SIGTERM", str(end["processes_left"])
    log = daemon["log"]
    yield (
        "daemon log warnings/errors",
        ", ".join(f"{k} {v}" for k, v in log["by_level_logger"].items())
        + f"; tracebacks {log['tracebacks']}",
    )


def print_report(report: dict[str, Any]) -> None:
    console = Console() if sys.stdout.isatty() else Console(width=140)
    setup = report["setup"]
    title = (
        f"bench.soak: {setup['duration_s']:g} s, {setup['clients']} clients, seed {setup['seed']}, "
        f"on {setup['cpus']} CPUs (load {setup['loadavg_after'][0]:.2f} at the end)"
    )
    table = _table(title, ["figure", "value"])
    for name, value in summary_rows(report):
        table.add_row(name, value)
    console.print(table)

    by_route = report["requests"]["by_route_status"]
    labels = sorted(
        {label for counts in by_route.values() for label in counts},
        key=lambda label: (not label.isdigit(), label),
    )
    table = _table("requests by route and status", ["route", *labels])
    for route, counts in by_route.items():
        table.add_row(route, *(str(counts.get(label, "")) for label in labels))
    console.print(table)

    by_service: dict[str, dict[str, int]] = {}
    for key, count in report["requests"]["by_service_status"].items():
        name, label = key.split(" ", 1)
        by_service.setdefault(name, {})[label] = count
    table = _table("requests by service and status", ["service", *labels])
    for name, counts in by_service.items():
        table.add_row(name, *(str(counts.get(label, "")) for label in labels))
    console.print(table)

    table = _table("error bodies (status, code) and stream error events", ["what", "count"])
    for code, count in report["requests"]["error_codes"].items():
        table.add_row(f"answer {code}", str(count))
    for code, count in report["requests"]["stream_error_event_codes"].items():
        table.add_row(f"stream error event {code}", str(count))
    for code, count in report["requests"]["daemon_requests_total_by_code"].items():
        table.add_row(f"daemon vramd_requests_total {code}", str(count))
    console.print(table)

    table = _table("runtime transitions by reason (events table)", ["into", "reason", "count"])
    for to, reasons in report["restarts"]["into"].items():
        for reason, count in reasons.items():
            table.add_row(to, reason, str(count))
    console.print(table)

    for failed in report["restarts"]["failed"]:
        console.print(
            f"into failed: event {failed['id']} at {failed['clock']}: {failed['message']}"
        )

    table = _table(
        "services just before SIGTERM",
        ["service", "state", "restarts", "loads", "evictions", "served", "flags", "last error"],
    )
    for svc in report["final_services"]:
        table.add_row(
            *(
                _fmt(svc[k])
                for k in ("name", "state", "restarts", "loads", "evictions", "requests_served")
            ),
            ", ".join(svc["flags"] or []),
            (svc["last_error"] or "")[:60],
        )
    console.print(table)

    examples = report["anomalies"]["examples"]
    if examples:
        table = _table(
            "anomalies (first 5 of each)",
            ["kind", "t s", "clock", "route", "model", "status", "s", "detail"],
        )
        for kind, rows in examples.items():
            for row in rows[:5]:
                table.add_row(
                    kind,
                    *(
                        _fmt(row[k])
                        for k in ("t", "clock", "route", "model", "status", "seconds", "detail")
                    ),
                )
        console.print(table)


# ---------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict[str, Any]:
    loadavg_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
            for stale in workdir.glob("vramd.*"):  # a former run's database and log
                stale.unlink()
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vramd-soak-")))
        policies = (soak_policy(workdir, 50), soak_policy(workdir, 60))
        for text in policies:
            load_policy(text)  # an invalid policy stops here, with the loader's message
        config = workdir / "policy.yaml"
        config.write_text(policies[0], encoding="utf-8")
        with running_vramd(config, keep=workdir) as vramd:
            vramd.wait_ready(["chat"])
            budget = args.duration + DEADLINE_S + 120
            live = asyncio.run(asyncio.wait_for(soak(vramd, policies, args), budget))
            ending = shut_down(vramd, live.faults.pids_seen)
        events = read_store(workdir / "vramd.db")
        return build_report(args, live, ending, events, workdir, loadavg_before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--apply-every", type=float, default=60.0, help="seconds between applies")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--keep", help="run in this folder and keep its database and log")
    args = parser.parse_args(argv)
    report = run(args)
    print_report(report)
    write_outputs(report, "", json_path=args.json, markdown_path=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
