"""Fair queues on a running ``vramd serve``: does one client's flood hold the others back?

    python -m bench.fairness [--service-ms 250] [--flood 200] [--seeds 1,2,3] [--json OUT]

Clients are keyed (``server.clients``), as users set them up. On the demo runtime, with
``max_concurrency: 2`` and a runtime that takes ``--service-ms`` per request:

- client A sends ``--flood`` requests at once to the service ``img``, and sends each
  refused one again after its ``Retry-After`` (as the OpenAI SDKs do);
- client B sends one request to ``img`` every 2 s (the first at a seeded offset) for as
  long as A's flood lasts;
- client C does the same to another service, ``chat``.

Each scenario runs under ``fairness: fifo`` (the order before clients) and ``fair``, with
two queue bounds: ``queue.max: 256`` (the whole flood waits) and ``32`` (most of it is
refused and retried). Reported per run: B's and C's wait (the time to their answer, 429
retries included, less the service time of the same request on an idle service) at p50
and p99, B's refusals, A's throughput (requests answered per second while its flood
lasts) and the service's (A's and B's together: whether it stayed busy). The target
(issue 38): under ``fair``, B's p99 wait within 2 service times.

Then the daemon's CPU per request (psutil, the daemon process alone) for a burst of
``--cpu-requests`` requests at a runtime that answers at once, sent as 50 configured
clients against the same burst with no keys at all.

Not a test: the figures depend on the machine. Percentiles are ``bench.stats``'s
(linear between ranks).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import random
import sys
import time
from typing import Any

import httpx
import psutil
from rich.console import Console

from bench.processes import demo_command, policy_text, running_vramd
from bench.report import markdown_table, rich_table, write_outputs
from bench.stats import percentile

KEYS = {name: f"sk-bench-{name}-0123456789" for name in ("a", "b", "c")}
PERIOD_S = 2.0  # B and C send one request this often
# uvicorn closes a connection idle for 5 s; a client that reuses one at that moment reads
# a reset. Idle connections are dropped here first (the race is the client's, not vramd's).
KEEPALIVE_S = 2.0
COLUMNS = (
    "fairness",
    "queue.max",
    "seed",
    "B wait p50 s",
    "B wait p99 s",
    "B 429s",
    "C wait p50 s",
    "C wait p99 s",
    "A req/s",
    "img req/s",
    "A 429s",
)
CPU_COLUMNS = ("clients", "requests", "daemon CPU s", "CPU ms / request", "req/s")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy(
    fairness: str,
    queue_max: int,
    service_ms: int,
    *,
    concurrency: int = 2,
    keys: dict[str, str] = KEYS,
) -> str:
    def service(model: str) -> dict[str, Any]:
        return {
            "kind": "chat",
            "models": [model],
            "command": demo_command("--memory", "16MiB", "--latency-ms", str(service_ms)),
            "memory": {"estimate": "64MiB"},
            "residency": "pinned",
            "max_concurrency": concurrency,
            "queue": {"max": queue_max, "timeout": "10m"},
        }

    text = policy_text(
        {"img": service("img-model"), "chat": service("chat-model")},
        budget="1GiB",
        defaults={"fairness": fairness},
    )
    if not keys:
        return text
    clients = "".join(f"    {name}: {{key_sha256: {sha(key)}}}\n" for name, key in keys.items())
    return text + f"server:\n  clients:\n{clients}"


async def ask(
    client: httpx.AsyncClient, key: str, model: str, refusals: list[int]
) -> tuple[float, float]:
    """One request, sent again after each 429's Retry-After: (sent, answered) times."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    sent = time.monotonic()
    while True:
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        if answer.status_code != 429:
            answer.raise_for_status()
            return sent, time.monotonic()
        refusals[0] += 1
        await asyncio.sleep(float(answer.headers.get("retry-after", "1")))


async def idle_service_s(client: httpx.AsyncClient) -> float:
    """A request's time on an idle service: the wait is measured above it."""
    times = []
    for _ in range(5):
        sent, done = await ask(client, KEYS["b"], "img-model", [0])
        times.append(done - sent)
    return percentile(times, 50)


async def scenario(url: str, flood: int, seed: int) -> dict[str, Any]:
    limits = httpx.Limits(
        max_connections=flood + 16,
        max_keepalive_connections=flood + 16,
        keepalive_expiry=KEEPALIVE_S,
    )
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        service_s = await idle_service_s(client)
        a_refusals, b_refusals, c_refusals = [0], [0], [0]
        flood_done = asyncio.Event()

        async def steady(key: str, model: str, refusals: list[int]) -> list[tuple[float, float]]:
            await asyncio.sleep(random.Random(seed).uniform(0.2, PERIOD_S))
            pending: list[asyncio.Task[tuple[float, float]]] = []
            while not flood_done.is_set():
                pending.append(asyncio.create_task(ask(client, key, model, refusals)))
                await asyncio.sleep(PERIOD_S)
            return list(await asyncio.gather(*pending))

        started = time.monotonic()
        flood_tasks = [ask(client, KEYS["a"], "img-model", a_refusals) for _ in range(flood)]
        b = asyncio.create_task(steady(KEYS["b"], "img-model", b_refusals))
        c = asyncio.create_task(steady(KEYS["c"], "chat-model", c_refusals))
        answered = await asyncio.gather(*flood_tasks)
        flood_end = max(done for _, done in answered)
        flood_s = flood_end - started
        flood_done.set()
        b_asked, c_asked = await b, await c
    return {
        "service_s": service_s,
        "b_waits": [max(0.0, done - sent - service_s) for sent, done in b_asked],
        "c_waits": [max(0.0, done - sent - service_s) for sent, done in c_asked],
        # The service's throughput while the flood lasted: A's and B's answers in that time.
        "img_per_s": (flood + sum(done <= flood_end for _, done in b_asked)) / flood_s,
        "b_refusals": b_refusals[0],
        "a_refusals": a_refusals[0],
        "a_per_s": flood / flood_s,
        "flood_s": flood_s,
    }


def run_scenarios(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for queue_max in args.queue_max:
        for fairness in ("fifo", "fair"):
            for seed in args.seeds:
                text = policy(fairness, queue_max, args.service_ms)
                with running_vramd(text) as vramd:
                    vramd.wait_ready(["img", "chat"])
                    figures = asyncio.run(scenario(vramd.url, args.flood, seed))
                b, c = figures["b_waits"], figures["c_waits"]
                service_s = figures["service_s"]
                runs.append(
                    {
                        "fairness": fairness,
                        "queue_max": queue_max,
                        "seed": seed,
                        **figures,
                        "b_p50_s": percentile(b, 50),
                        "b_p99_s": percentile(b, 99),
                        "c_p50_s": percentile(c, 50),
                        "c_p99_s": percentile(c, 99),
                        "b_within_2_service_times": percentile(b, 99) <= 2 * service_s,
                    }
                )
                print(
                    f"{fairness:4} queue.max {queue_max:3} seed {seed}: B p99 "
                    f"{runs[-1]['b_p99_s']:.2f} s, A {figures['a_per_s']:.2f} req/s",
                    file=sys.stderr,
                )
    return runs


async def burst(url: str, keys: list[str | None], requests: int) -> float:
    """``requests`` requests spread over ``keys`` (None: no key), 16 at a time."""
    limits = httpx.Limits(
        max_connections=32, max_keepalive_connections=32, keepalive_expiry=KEEPALIVE_S
    )
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(16)
        body = {"model": "img-model", "messages": [{"role": "user", "content": "hi"}]}

        async def one(i: int) -> None:
            key = keys[i % len(keys)]
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with gate:
                answer = await client.post("/v1/chat/completions", json=body, headers=headers)
                answer.raise_for_status()

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return time.monotonic() - started


def cpu_per_request(requests: int, repeat: int) -> list[dict[str, Any]]:
    """Each setting ``repeat`` times, alternating which goes first (the noise shows)."""
    rows = []
    orders = [(0, 50), (50, 0)]
    for clients in (n for run in range(repeat) for n in orders[run % 2]):
        keys = {f"c{i:02d}": f"sk-bench-client-{i:02d}-abcdef" for i in range(clients)}
        text = policy("fair", 64, 0, concurrency=8, keys=keys)
        with running_vramd(text) as vramd:
            vramd.wait_ready(["img"])
            daemon = psutil.Process(vramd.proc.pid)
            asyncio.run(burst(vramd.url, list(keys.values()) or [None], 200))  # warm up
            before = daemon.cpu_times()
            seconds = asyncio.run(burst(vramd.url, list(keys.values()) or [None], requests))
            after = daemon.cpu_times()
        cpu = (after.user - before.user) + (after.system - before.system)
        rows.append(
            {
                "clients": clients,
                "requests": requests,
                "cpu_s": cpu,
                "cpu_ms_per_request": 1000 * cpu / requests,
                "per_s": requests / seconds,
            }
        )
    return rows


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            run["fairness"],
            str(run["queue_max"]),
            str(run["seed"]),
            f"{run['b_p50_s']:.2f}",
            f"{run['b_p99_s']:.2f}",
            str(run["b_refusals"]),
            f"{run['c_p50_s']:.2f}",
            f"{run['c_p99_s']:.2f}",
            f"{run['a_per_s']:.2f}",
            f"{run['img_per_s']:.2f}",
            str(run["a_refusals"]),
        ]
        for run in report["runs"]
    ]


def cpu_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            "none (no keys)" if row["clients"] == 0 else f"{row['clients']} configured",
            str(row["requests"]),
            f"{row['cpu_s']:.2f}",
            f"{row['cpu_ms_per_request']:.2f}",
            f"{row['per_s']:.0f}",
        ]
        for row in report["cpu"]
    ]


def caption(report: dict[str, Any]) -> str:
    setup = report["setup"]
    return (
        f"bench.fairness: A floods {setup['flood']} requests at img, B and C one every "
        f"{PERIOD_S:g} s (img, chat); service time {setup['service_ms']} ms, max_concurrency 2, "
        f"{setup['cpus']} CPUs"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [f"**{caption(report)}**", "", *markdown_table(COLUMNS, table_rows(report))]
    lines += ["", "**The daemon's CPU per request**", ""]
    lines += markdown_table(CPU_COLUMNS, cpu_rows(report))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--flood", type=int, default=200, help="client A's requests")
    parser.add_argument("--service-ms", type=int, default=250, help="the runtime's time")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument(
        "--queue-max", type=lambda s: [int(x) for x in s.split(",")], default=[256, 32]
    )
    parser.add_argument("--cpu-requests", type=int, default=2000)
    parser.add_argument("--cpu-repeat", type=int, default=3, help="runs of each CPU setting")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args(argv)
    report = {
        "setup": {
            "flood": args.flood,
            "service_ms": args.service_ms,
            "seeds": args.seeds,
            "queue_max": args.queue_max,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "runs": run_scenarios(args),
        "cpu": cpu_per_request(args.cpu_requests, args.cpu_repeat),
    }
    console = Console() if sys.stdout.isatty() else Console(width=140)
    console.print(rich_table(caption(report), COLUMNS, table_rows(report)))
    console.print(rich_table("The daemon's CPU per request", CPU_COLUMNS, cpu_rows(report)))
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
