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
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.processes import Vramd, running_vramd
from bench.report import write_outputs
from bench.soak_clients import (
    DEADLINE_S,
    QUEUE_TIMEOUT_S,
    SAMPLE_EVERY_S,
    SERVICES,
    SETTLE_S,
    Live,
    Tally,
    Watch,
    client,
)
from bench.soak_faults import Faults, Schedule
from bench.soak_report import build_report, print_report, read_store, shut_down
from service.policy import load_policy
from service.units import MIB

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


# ---------------------------------------------------------------------------- watching


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
