"""What vramd adds to a request on a warm runtime, against the runtime direct and a bare relay.

    python -m bench.proxy [--concurrency 1,4,16] [--rounds 5] [--per-round 100]
                          [--sides direct,vramd,relay] [--json OUT] [--markdown OUT]
    python -m bench.proxy --target http://127.0.0.1:8400 --model NAME [--api-key KEY]

By default it starts, as real processes on free loopback ports:

- ``vramd serve`` on a generated policy with one pinned chat service, ``bench``, that
  runs the demo runtime answering without delay (``--latency-ms 0 --chunk-delay-ms 0``,
  ``--chunks`` events per stream, 5 by default);
- the bare relay of ``bench.relay`` (FastAPI, one ``httpx.AsyncClient``, the answer
  streamed through), under uvicorn configured as vramd configures it;

and measures three sides against the *same runtime process*:

- ``direct``: the runtime vramd started, on the port ``GET /api/services/bench`` gives.
  The same process rather than a second identical one, so that a difference between the
  sides is the path, never two runtimes' different warmth or placement; and on two cores
  a second runtime would be one more process competing for them.
- ``vramd``: through the daemon's ``/v1``, the whole path: key check, body and model
  parsing, admission (the orchestrator's lease), the proxy, release.
- ``relay``: through the bare relay, the floor for a Python relay on the same stack.

``--sides`` may add ``router``: vramd's own ``/v1`` router and proxy with a lease provider
that grants at once (``bench.relay --app router``, what this benchmark measured before),
which splits vramd's extra time into the HTTP side and the kernel's; and ``ollama``:
the same daemon's Ollama listener (``server.ollama``), ``POST /api/chat`` with the same
conversation, which adds the translation to and from the OpenAI route and NDJSON.

For each mode (non-streaming chat; streaming chat: time to the first event and to the
end) and each concurrency, each side first gets ``--warmup`` requests that are thrown
away, then ``--rounds`` rounds of ``--per-round`` requests, the sides taking turns within
each round in a rotating order, so that the machine's drift hits all of them alike. The
report gives p50 / p90 / p99 per side, what each adds over ``direct`` at the same
percentile, and requests per second. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from rich.console import Console
from rich.table import Table

from bench.load import Burst, Target, burst
from bench.processes import (
    answers,
    demo_command,
    free_port,
    policy_text,
    running_vramd,
    spawn,
    wait_until,
)
from bench.report import write_outputs
from bench.stats import percentile

CHAT_PATH = "/v1/chat/completions"
SERVICE = "bench"
SIDES = ("direct", "vramd", "relay", "router", "ollama")
PATHS = {"ollama": "/api/chat"}  # every other side: CHAT_PATH
MODES = ("chat", "stream")
T = TypeVar("T")
COLUMNS = ("mode", "conc", "side", "p50", "p90", "p99", "+p50", "+p90", "+p99", "req/s")


def bench_policy(chunks: int = 5, idle_services: int = 0, ollama_port: int | None = None) -> str:
    """One pinned chat service, its limits far above what the benchmark sends at once;
    and ``idle_services`` on-demand ones that nobody asks for (a policy's size is part
    of what a request costs: the scheduler's pass looks at every service)."""
    services: dict[str, dict[str, Any]] = {
        SERVICE: {
            "kind": "chat",
            "models": [SERVICE],
            "command": demo_command("--chunks", str(chunks)),
            "memory": {"estimate": "64MiB"},
            "residency": "pinned",
            "max_concurrency": 64,
            "queue": {"max": 256, "timeout": "60s"},
        }
    }
    for i in range(idle_services):
        services[f"idle-{i:02d}"] = {
            "kind": "chat",
            "models": [f"idle-{i:02d}"],
            "command": demo_command(),
            "memory": {"estimate": "64MiB"},
        }
    text = policy_text(services, budget="4GiB")
    if ollama_port is not None:
        text += f"server:\n  ollama: {{port: {ollama_port}}}\n"
    return text


@contextlib.contextmanager
def reference_server(app: str, upstream: str, logs: Path) -> Iterator[str]:
    """``bench.relay --app APP`` in front of ``upstream``; its log (uvicorn's access log,
    as vramd's) goes to a file in ``logs``, as vramd's does."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.relay", "--app", app]
    argv += ["--upstream", upstream, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    ready = "/health" if app == "relay" else "/v1/models"
    with spawn(argv, log=logs / f"{app}.log") as proc:
        wait_until(answers(url + ready), timeout=30, what=f"bench.relay --app {app}", proc=proc)
        yield url


def runtime_of(target: str, model: str, headers: dict[str, str]) -> str:
    """The base URL of the instance serving ``model`` behind a running vramd."""
    models = httpx.get(target + "/v1/models", headers=headers, timeout=10).json()["data"]
    service = next(m["service"] for m in models if m["id"] == model)
    response = httpx.get(f"{target}/api/services/{service}", headers=headers, timeout=10)
    response.raise_for_status()
    port = response.json()["port"]
    if port is None:
        raise RuntimeError(f"service {service!r} is not running: no port to measure directly")
    return f"http://127.0.0.1:{port}"


# --- measuring ----------------------------------------------------------------------------


def payloads(model: str, side: str) -> dict[str, bytes]:
    messages = [{"role": "user", "content": "hi"}]
    if side == "ollama":
        chat: dict[str, object] = {
            "model": model,
            "messages": messages,
            "options": {"num_predict": 8},
        }
        return {
            "chat": json.dumps({**chat, "stream": False}).encode(),
            "stream": json.dumps({**chat, "stream": True}).encode(),
        }
    chat = {"model": model, "messages": messages, "max_tokens": 8}  # same keys as above
    return {
        "chat": json.dumps(chat).encode(),
        "stream": json.dumps({**chat, "stream": True}).encode(),
    }


async def measure(
    urls: dict[str, str], args: argparse.Namespace, headers: dict[str, str]
) -> dict[tuple[str, int, str], list[Burst]]:
    """Every (mode, concurrency, side): its measured bursts, warm-up left out."""
    targets = {side: Target(url, PATHS.get(side, CHAT_PATH), headers) for side, url in urls.items()}
    bodies = {side: payloads(args.model, side) for side in urls}
    out: dict[tuple[str, int, str], list[Burst]] = {}
    sides = list(targets)
    try:
        for mode in args.modes:
            for conc in args.concurrency:
                for side in sides:
                    target = targets[side]
                    request = target.request(bodies[side][mode])
                    await burst(target, request, count=args.warmup, concurrency=conc)
                for r in range(args.rounds):
                    for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                        target = targets[side]
                        got = await burst(
                            target,
                            target.request(bodies[side][mode]),
                            count=args.per_round,
                            concurrency=conc,
                        )
                        out.setdefault((mode, conc, side), []).append(got)
    finally:
        for target in targets.values():
            await target.close()
    return out


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop where installed: the servers run on it (uvicorn's "auto"), and the
    client's own CPU time is the part of every figure that is nobody's overhead."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def figures(bursts: list[Burst], metric: str) -> dict[str, float]:
    samples = [getattr(t, metric) * 1000 for b in bursts for t in b.timings]
    rates = sorted(b.rate for b in bursts)
    return {
        "p50_ms": percentile(samples, 50),
        "p90_ms": percentile(samples, 90),
        "p99_ms": percentile(samples, 99),
        "mean_ms": sum(samples) / len(samples),
        "n": len(samples),
        "req_per_s": rates[len(rates) // 2],  # the median round's
    }


METRICS = {"chat": (("chat", "total"),), "stream": (("ttfb", "first"), ("stream", "total"))}


def rows(measured: dict[tuple[str, int, str], list[Burst]]) -> list[dict[str, Any]]:
    out = []
    for (mode, conc, side), bursts in measured.items():
        for name, metric in METRICS[mode]:
            row: dict[str, Any] = {"mode": name, "concurrency": conc, "side": side}
            row |= figures(bursts, metric)
            out.append(row)
    direct = {(r["mode"], r["concurrency"]): r for r in out if r["side"] == "direct"}
    for row in out:
        base = direct.get((row["mode"], row["concurrency"]))
        if base is not None and row["side"] != "direct":
            row["added_ms"] = {p: row[f"{p}_ms"] - base[f"{p}_ms"] for p in ("p50", "p90", "p99")}
    order = {name: i for i, name in enumerate(("chat", "ttfb", "stream"))}
    side_order = {name: i for i, name in enumerate(SIDES)}
    out.sort(key=lambda r: (order[r["mode"]], r["concurrency"], side_order[r["side"]]))
    return out


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    cells = []
    for row in report["rows"]:
        added = row.get("added_ms")
        cells.append(
            [
                row["mode"],
                str(row["concurrency"]),
                row["side"],
                *(f"{row[f'{p}_ms']:.2f}" for p in ("p50", "p90", "p99")),
                *(f"{added[p]:+.2f}" if added else "" for p in ("p50", "p90", "p99")),
                f"{row['req_per_s']:.0f}",
            ]
        )
    return cells


def caption(report: dict[str, Any]) -> str:
    setup = report["setup"]
    return (
        f"bench.proxy: ms per request, {setup['samples']} measured per side and cell "
        f"({setup['rounds']} interleaved rounds), on {setup['cpus']} CPUs, "
        f"load {setup['loadavg_before'][0]:.2f} before / {setup['loadavg_after'][0]:.2f} after"
    )


def print_report(report: dict[str, Any]) -> None:
    console = Console() if sys.stdout.isatty() else Console(width=120)
    table = Table(title=caption(report), title_justify="left")
    for i, column in enumerate(COLUMNS):
        table.add_column(column, justify="left" if i < 3 else "right")
    for row in table_rows(report):
        table.add_row(*row)
    console.print(table)
    console.print("(+pNN: what the side adds over direct at that percentile)", markup=False)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"**{caption(report)}**", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "|".join(["---"] * 3 + ["--:"] * (len(COLUMNS) - 3)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    return "\n".join(lines) + "\n"


# --- the run ------------------------------------------------------------------------------


def _list(kind: type, choices: Sequence[str] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(part) for part in text.split(",") if part]
        if choices is not None and (bad := set(values) - set(choices)):
            raise argparse.ArgumentTypeError(f"unknown {sorted(bad)}; choose from {choices}")
        return values

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--concurrency", type=_list(int), default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=100, help="requests per side a round")
    parser.add_argument("--warmup", type=int, default=50, help="requests per side, not counted")
    parser.add_argument("--modes", type=_list(str, MODES), default=list(MODES))
    parser.add_argument(
        "--sides", type=_list(str, SIDES), default=["direct", "vramd", "relay"], help=str(SIDES)
    )
    parser.add_argument(
        "--chunks", type=int, default=5, help="events in a streamed answer (demo --chunks)"
    )
    parser.add_argument(
        "--idle-services", type=int, default=0, help="on-demand services besides 'bench'"
    )
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--markdown", help="write the table to this file")
    parser.add_argument("--target", help="an already-running vramd (default: start one)")
    parser.add_argument("--model", default=SERVICE, help="with --target: the model to ask for")
    parser.add_argument("--api-key", help="with --target: a bearer key for /v1 and /api")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    loadavg_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        ollama_port = free_port() if "ollama" in args.sides else None
        if args.target is None:
            policy = bench_policy(args.chunks, args.idle_services, ollama_port)
            vramd = stack.enter_context(running_vramd(policy))
            vramd.wait_ready([SERVICE])
            target = vramd.url
        else:
            target = args.target.rstrip("/")
        runtime = runtime_of(target, args.model, headers)
        urls = {"direct": runtime, "vramd": target}
        if ollama_port is not None:
            if args.target is not None:
                raise SystemExit("--sides ollama starts its own vramd: leave out --target")
            urls["ollama"] = f"http://127.0.0.1:{ollama_port}"
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-proxy-")))
        for app in ("relay", "router"):
            if app in args.sides:
                urls[app] = stack.enter_context(reference_server(app, runtime, logs))
        urls = {side: urls[side] for side in SIDES if side in args.sides}
        started = time.monotonic()
        measured = run_loop(measure(urls, args, headers))
        elapsed = time.monotonic() - started
    report = {
        "setup": {
            "sides": urls,
            "direct": "the runtime vramd started (GET /api/services/NAME -> port)",
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "samples": args.rounds * args.per_round,
            "warmup": args.warmup,
            "runtime": "service.demo_runtime --latency-ms 0 --chunk-delay-ms 0",
            "stream_events": args.chunks,
            "idle_services": args.idle_services,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
            "measure_s": round(elapsed, 1),
        },
        "rows": rows(measured),
    }
    print_report(report)
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
