"""What a cluster router's scraping costs a running vramd: ``/metrics`` latency and CPU.

    python -m bench.scrape [--hz 20] [--rate 20] [--duration 30] [--repeat 1] [--json OUT]

The endpoint picker in front of a pool of vramd machines scrapes each one's ``/metrics``
every 50 ms (20 Hz) and reads a slow answer as a saturated machine (docs/deployment.md,
"Many machines"). This starts ``vramd serve`` (``bench.processes``) on ``bench.idle``'s
twenty-service policy (five runtimes running, fifteen on demand: a large ``/metrics``),
then measures five phases of ``--duration`` seconds each:

- ``traffic``: chat and embedding requests to the five running services at ``--rate``
  per second, open loop, from a separate process; nobody scrapes.
- ``traffic+scrape``: the same traffic, and a scraper on one keep-alive connection (as
  the picker holds one) asking for ``/metrics`` every ``1/--hz`` seconds.
- ``traffic+floor``: the same traffic to vramd, and the same scraper asking the *floor*
  instead: a server that does nothing but answer a body of ``/metrics``' size, on the
  same uvicorn (uvloop, httptools), in its own process. What this machine's loopback,
  scheduler and HTTP stack cost a scrape whatever answers it.
- ``scrape`` and ``floor``: each scraper alone, no traffic.

Figures: each scrape's time from request to the last byte (p50, p99, max), and the
daemon's CPU (user + system of the ``vramd serve`` process) as a share of one core per
phase; what scraping costs is ``traffic+scrape`` minus ``traffic``, and what vramd adds
to a scrape's time is ``/metrics`` over the floor. Not a test: the figures depend on the
machine (on a small VM, waking an idle process every 50 ms costs milliseconds at p99).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psutil
from rich.console import Console

from bench import stats
from bench.idle import cpu_seconds, twenty_services
from bench.processes import answers, free_port, running_vramd, spawn, wait_until
from bench.report import markdown_table, rich_table, write_outputs

RUNNING = ["svc-00", "svc-01", "svc-02", "svc-03", "svc-04"]
COLUMNS = ("phase", "scrapes", "p50 ms", "p99 ms", "max ms", "daemon CPU % of a core", "requests")


def send_traffic(url: str, models: list[tuple[str, str]], rate: float, stop_at: float) -> None:
    """Open-loop requests at ``rate`` per second until ``stop_at`` (in a child process)."""
    done = threading.Semaphore(32)  # at most 32 in flight: the daemon, not this, is measured

    def one(kind: str, model: str, client: httpx.Client) -> None:
        try:
            if kind == "embedding":
                client.post("/v1/embeddings", json={"model": model, "input": "a b c"})
            else:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:
            pass
        finally:
            done.release()

    with httpx.Client(base_url=url, timeout=30) as client:
        due = time.monotonic()
        i = 0
        while due < stop_at:
            time.sleep(max(0.0, due - time.monotonic()))
            done.acquire()
            kind, model = models[i % len(models)]
            threading.Thread(target=one, args=(kind, model, client), daemon=True).start()
            i += 1
            due += 1.0 / rate


def scrape(url: str, hz: float, stop_at: float) -> list[float]:
    """``GET url`` every ``1/hz`` s on one connection; each answer's milliseconds."""
    latencies = []
    with httpx.Client(timeout=10) as client:
        due = time.monotonic()
        while due < stop_at:
            time.sleep(max(0.0, due - time.monotonic()))
            started = time.perf_counter()
            response = client.get(url)
            response.read()
            latencies.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            due += 1.0 / hz
    return latencies


def phase(
    name: str, daemon: psutil.Process, duration: float, *, traffic: Callable[[float], Any] | None,
    scraper: Callable[[float], list[float]] | None,
) -> dict[str, Any]:  # fmt: skip
    stop_at = time.monotonic() + duration
    child = None
    if traffic is not None:
        child = multiprocessing.get_context("spawn").Process(target=traffic, args=(stop_at,))
        child.start()
    cpu, started = cpu_seconds(daemon), time.monotonic()
    latencies = scraper(stop_at) if scraper is not None else []
    time.sleep(max(0.0, stop_at - time.monotonic()))
    cpu, elapsed = cpu_seconds(daemon) - cpu, time.monotonic() - started
    if child is not None:
        child.join(30)
    ordered = sorted(latencies)
    return {
        "phase": name,
        "scrapes": len(ordered),
        "p50_ms": stats.median(ordered),
        "p99_ms": stats.percentile(ordered, 99) if ordered else None,
        "max_ms": ordered[-1] if ordered else None,
        "cpu_pct": 100 * cpu / elapsed,
    }


def measure(*, hz: float, rate: float, duration: float) -> dict[str, Any]:
    with running_vramd(twenty_services()) as vramd:
        vramd.wait_ready(RUNNING)
        kinds = {s["name"]: s["kind"] for s in vramd.services()}
        models = [(kinds[name], f"model-{name[-2:]}") for name in RUNNING]
        daemon = psutil.Process(vramd.proc.pid)
        body = httpx.get(vramd.url + "/metrics").text
        with floor_server(len(body)) as floor_url:
            # Partials of module functions: picklable, so a child process can run them.
            traffic = functools.partial(send_traffic, vramd.url, models, rate)
            scrape_vramd = functools.partial(scrape, vramd.url + "/metrics", hz)
            scrape_floor = functools.partial(scrape, floor_url + "/metrics", hz)
            served_before = _served(vramd.services())
            phases = [
                phase("traffic", daemon, duration, traffic=traffic, scraper=None),
                phase("traffic+scrape", daemon, duration, traffic=traffic, scraper=scrape_vramd),
            ]
            served = _served(vramd.services()) - served_before
            phases += [
                phase("traffic+floor", daemon, duration, traffic=traffic, scraper=scrape_floor),
                phase("scrape", daemon, duration, traffic=None, scraper=scrape_vramd),
                phase("floor", daemon, duration, traffic=None, scraper=scrape_floor),
            ]
    return {
        "phases": phases,
        "requests_served": served,
        "metrics_bytes": len(body),
        "metrics_lines": body.count("\n"),
        "scrape_cpu_pct": phases[1]["cpu_pct"] - phases[0]["cpu_pct"],
    }


FLOOR_APP = """
import sys, uvicorn
BODY = b"x" * int(sys.argv[2])
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False)
"""


@contextlib.contextmanager
def floor_server(size: int) -> Iterator[str]:
    """A server that answers ``size`` bytes to anything, on vramd's HTTP stack."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with spawn([sys.executable, "-c", FLOOR_APP, str(port), str(size)]) as proc:
        wait_until(answers(url + "/metrics"), timeout=30, what="the floor server", proc=proc)
        yield url


def _served(services: list[dict[str, Any]]) -> int:
    return sum(int(svc["requests_served"]) for svc in services)


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for run in report["runs"]:
        for ph in run["phases"]:
            rows.append(
                [
                    ph["phase"],
                    str(ph["scrapes"]),
                    _ms(ph["p50_ms"]),
                    _ms(ph["p99_ms"]),
                    _ms(ph["max_ms"]),
                    f"{ph['cpu_pct']:.1f}",
                    str(run["requests_served"]) if ph["phase"] == "traffic+scrape" else "",
                ]
            )
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def caption(report: dict[str, Any]) -> str:
    setup = report["setup"]
    costs = ", ".join(f"{run['scrape_cpu_pct']:.1f}" for run in report["runs"])
    return (
        f"bench.scrape: /metrics at {setup['hz']:g} Hz, {setup['rate']:g} requests/s, "
        f"{setup['duration_s']:g} s per phase, {setup['cpus']} CPUs; scraping costs "
        f"{costs} % of a core"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [f"**{caption(report)}**", "", *markdown_table(COLUMNS, table_rows(report))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scrape",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--hz", type=float, default=20.0, help="scrapes per second")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per phase")
    parser.add_argument("--repeat", type=int, default=1, help="daemons, one after another")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--markdown", help="write the table to this file")
    args = parser.parse_args(argv)
    runs = [measure(hz=args.hz, rate=args.rate, duration=args.duration) for _ in range(args.repeat)]
    report = {
        "setup": {
            "hz": args.hz,
            "rate": args.rate,
            "duration_s": args.duration,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
        },
        "runs": runs,
    }
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(rich_table(caption(report), COLUMNS, table_rows(report)))
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
