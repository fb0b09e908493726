"""500 clients at once against one service with 4 slots and a queue of 16.

The contract (docs/policy.md): a service takes ``max_concurrency`` requests at the
runtime and queues ``queue.max`` more; everything beyond answers 429 ``queue_full`` with
Retry-After at once. The runtime here takes 2 s per request, far longer than the burst
takes to arrive (about 1-2 s on two cores), so every request is counted while the first
four still hold their slots: exactly 4 + 16 = 20 are served and 480 are refused, in
every round. No request may get a 5xx from the daemon itself.

Then the daemon must be back where it started: no client connection left open, its file
descriptors back to the baseline (bar the keep-alive pool to the runtime, which the
daemon keeps on purpose), its resident memory flat across rounds once warmed up.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from support.daemon import Daemon, policy_yaml, running_daemon
from support.faults import demo_service, ensure_fd_limit, established, fd_count, no_leftovers

CLIENTS = 500
SLOTS = 4
QUEUE = 16
LATENCY_MS = 2000
ROUNDS = 3
MIB = 2**20
# Resident memory may grow this much after the first round (allocator arenas, caches
# filled once); a leak of even 20 KiB per request would exceed it within two rounds.
RSS_TOLERANCE = 12 * MIB


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    ensure_fd_limit(4 * CLIENTS)
    spec = demo_service(
        tmp_path,
        ["m"],
        "--latency-ms",
        str(LATENCY_MS),
        residency="pinned",
        max_concurrency=SLOTS,
        queue={"max": QUEUE, "timeout": "60s"},
    )
    with no_leftovers(tmp_path), running_daemon(policy_yaml({"chat": spec}), tmp_path) as d:
        d.wait_for(lambda: d.service("chat")["state"] == "ready")
        yield d


async def burst(url: str) -> list[tuple[int | str, float, httpx.Headers | None, bytes]]:
    """Send ``CLIENTS`` requests at once, each on its own connection."""
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        started = time.monotonic()

        async def one() -> tuple[int | str, float, httpx.Headers | None, bytes]:
            try:
                response = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:
                return type(exc).__name__, time.monotonic() - started, None, b""
            return (
                response.status_code,
                time.monotonic() - started,
                response.headers,
                response.content,
            )

        return await asyncio.gather(*(one() for _ in range(CLIENTS)))


def runtime_port(daemon: Daemon) -> int:
    port: int = daemon.service("chat")["port"]
    return port


def client_connections(daemon: Daemon) -> list[object]:
    """The daemon's established connections other than its pool to the runtime."""
    port = runtime_port(daemon)
    return [c for c in established(daemon.proc.pid) if c.raddr and c.raddr.port != port]


def pool_connections(daemon: Daemon) -> int:
    port = runtime_port(daemon)
    return sum(1 for c in established(daemon.proc.pid) if c.raddr and c.raddr.port == port)


def settled(daemon: Daemon) -> tuple[int, int]:
    """Once the round is over: (file descriptors not held by the runtime pool, RSS)."""
    chat = daemon.service("chat")
    assert (chat["in_flight"], chat["queued"]) == (0, 0)
    # The test's own admin client keeps one connection; nothing else may stay open.
    daemon.wait_for(lambda: len(client_connections(daemon)) <= 1, timeout=10)
    fds = fd_count(daemon.proc.pid) - pool_connections(daemon)
    return fds, psutil.Process(daemon.proc.pid).memory_info().rss


def test_a_burst_of_500_gets_exactly_the_contracts_counts_and_leaks_nothing(
    daemon: Daemon,
) -> None:
    # Warm the pool and the code paths once, so the baseline is a daemon that has served.
    assert httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    ).is_success
    baseline_fds, _ = settled(daemon)
    served_before = daemon.service("chat")["requests_served"]
    rss_after: list[int] = []
    for round_no in range(1, ROUNDS + 1):
        results = asyncio.run(burst(daemon.url))
        counts = Counter(status for status, _, _, _ in results)
        last_refusal = max((t for s, t, _, _ in results if s == 429), default=0.0)
        first_success = min((t for s, t, _, _ in results if s == 200), default=0.0)
        timing = f"last 429 at {last_refusal:.2f}s, first 200 at {first_success:.2f}s"
        assert counts == {200: SLOTS + QUEUE, 429: CLIENTS - SLOTS - QUEUE}, (
            f"round {round_no}: {dict(counts)} ({timing})"
        )
        for status, _, headers, content in results:
            if status == 429:
                assert headers is not None and int(headers["retry-after"]) >= 1
                assert b'"code":"queue_full"' in content
        fds, rss = settled(daemon)
        assert fds == baseline_fds, f"round {round_no}: {fds} fds, {baseline_fds} before"
        rss_after.append(rss)
    served = daemon.service("chat")["requests_served"] - served_before
    assert served == ROUNDS * (SLOTS + QUEUE)
    growth = max(rss_after) - rss_after[0]
    assert growth <= RSS_TOLERANCE, f"RSS after each round (MiB): {[r // MIB for r in rss_after]}"
    assert daemon.get("/healthz").status_code == 200
