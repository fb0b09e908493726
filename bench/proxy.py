"""What the proxy adds to a request: direct to a runtime vs through vramd's /v1 router.

    python -m bench.proxy [--n 2000] [--m 50] [--json OUT]
    python -m bench.proxy --target http://127.0.0.1:8400 --model NAME [--runtime URL]

By default it starts a demo runtime (``--latency-ms 0 --chunk-delay-ms 0``) and, in a
second process, a uvicorn server running the /v1 router in front of it with a static
lease provider (``python -m bench.proxy serve ...``): the same code path as a request to
``vramd serve`` after the orchestrator has granted a lease. With ``--target`` it measures
an already-running vramd instead, and compares with ``--runtime`` when given.

It sends N small non-streaming chat requests and M streaming ones, alternating direct and
proxied so that drift in the machine's load hits both alike, each over one keep-alive
client, one at a time. It prints p50 / p99 latency, the milliseconds the proxy adds, and
the time to the first streamed chunk. Not a test: the figures depend on the machine.

The clients ask for immediate ACKs (``TCP_QUICKACK``, Linux), as the proxy does towards
runtimes: the demo runtime, like any ``http.server``, sends headers and body separately
without ``TCP_NODELAY``, and a client that delays its ACK waits ~40 ms for every body.
Without this the direct figures would measure that stall, not the runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx

CHAT_PATH = "/v1/chat/completions"
WARMUP = 50


# --- the proxy process --------------------------------------------------------------------


class StaticLeases:
    """A LeaseProvider with one always-ready runtime behind every model name."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client: httpx.AsyncClient | None = None

    def resolve(self, model: str, route: str) -> str:
        return "bench"

    async def acquire(
        self, service: str, *, request_id: str, request_info: dict[str, Any] | None = None
    ) -> Any:
        from service.proxy import Lease

        assert self.client is not None
        return Lease(request_id, service, self.upstream, self.client)

    def release(self, lease: Any, *, outcome: str, error: str | None = None) -> None:
        pass

    def models(self) -> list[dict[str, Any]]:
        return [{"id": "bench", "service": "bench", "kind": "chat", "state": "ready"}]


def serve(upstream: str, port: int) -> None:
    """Run the /v1 router in front of ``upstream`` until SIGTERM."""
    import uvicorn
    from fastapi import FastAPI

    from service.api import openai
    from service.api.auth import AuthConfig, install_auth
    from service.api.errors import install_error_handlers
    from service.proxy import ProxyConfig

    leases = StaticLeases(upstream)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as client:
            leases.client = client
            yield

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app)
    install_auth(app, AuthConfig())
    app.state.proxy = ProxyConfig()
    app.state.daemon = SimpleNamespace(orchestrator=leases)
    app.include_router(openai.router)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- helpers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def spawn(argv: list[str], ready_url: str, timeout: float = 20.0) -> Iterator[None]:
    """Run ``argv`` in its own process group until the block ends; wait for ``ready_url``."""
    proc = subprocess.Popen(
        argv,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # the demo runtime logs a line per request
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv} exited with {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ready_url} not ready after {timeout}s")
            time.sleep(0.05)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Side:
    """Timings (seconds) of one side: direct or proxied."""

    url: str
    client: httpx.Client
    chat: list[float] = field(default_factory=list)
    first_chunk: list[float] = field(default_factory=list)
    stream_total: list[float] = field(default_factory=list)

    def request(self, payload: dict[str, Any], *, record: bool = True) -> None:
        started = time.perf_counter()
        with self.client.stream("POST", self.url + CHAT_PATH, json=payload) as response:
            quick_ack(response)
            response.read()
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        if record:
            self.chat.append(elapsed)

    def stream(self, payload: dict[str, Any], *, record: bool = True) -> None:
        started = time.perf_counter()
        first = None
        with self.client.stream("POST", self.url + CHAT_PATH, json=payload) as response:
            response.raise_for_status()
            quick_ack(response)
            for _ in response.iter_raw():
                if first is None:
                    first = time.perf_counter() - started
                quick_ack(response)
        total = time.perf_counter() - started
        if record and first is not None:
            self.first_chunk.append(first)
            self.stream_total.append(total)

    def figures(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, samples in (
            ("chat", self.chat),
            ("first_chunk", self.first_chunk),
            ("stream_total", self.stream_total),
        ):
            if samples:
                out[f"{name}_p50_ms"] = percentile(samples, 50) * 1000
                out[f"{name}_p99_ms"] = percentile(samples, 99) * 1000
                out[f"{name}_mean_ms"] = statistics.fmean(samples) * 1000
        return out


def quick_ack(response: httpx.Response) -> None:
    option = getattr(socket, "TCP_QUICKACK", None)
    stream = response.extensions.get("network_stream")
    if option is not None and stream is not None:
        stream.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, option, 1)


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


def run(sides: list[Side], model: str, n: int, m: int) -> None:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    streamed = {**payload, "stream": True}
    for i in range(WARMUP):
        for side in sides:
            side.request(payload, record=False)
            if i < 5:
                side.stream(streamed, record=False)
    for i in range(n):
        for side in sides if i % 2 else reversed(sides):
            side.request(payload)
    for i in range(m):
        for side in sides if i % 2 else reversed(sides):
            side.stream(streamed)


def report(direct: Side | None, proxied: Side, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "n": args.n,
        "m": args.m,
        "target": args.target or "bench.proxy serve (the /v1 router, static leases)",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "proxied": proxied.figures(),
    }
    rows = ["chat_p50_ms", "chat_p99_ms", "first_chunk_p50_ms", "first_chunk_p99_ms"]
    rows += ["stream_total_p50_ms", "stream_total_p99_ms"]
    print(f"{'':22}{'direct':>10}{'proxied':>10}{'added':>10}")
    if direct is not None:
        result["direct"] = direct.figures()
        result["added_ms"] = {
            key: result["proxied"][key] - result["direct"][key]
            for key in rows
            if key in result["proxied"] and key in result["direct"]
        }
    for key in rows:
        d = result.get("direct", {}).get(key)
        p = result["proxied"].get(key)
        a = result.get("added_ms", {}).get(key)
        cells = [f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in (d, p)]
        added = f"{a:+10.2f}" if a is not None else f"{'-':>10}"
        print(f"{key.removesuffix('_ms'):22}{cells[0]}{cells[1]}{added}")
    print(f"(ms; {args.n} chat requests and {args.m} streams per side, sequential, keep-alive)")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serving = argparse.ArgumentParser(prog="python -m bench.proxy serve")
        serving.add_argument("--upstream", required=True)
        serving.add_argument("--port", type=int, required=True)
        ns = serving.parse_args(argv[1:])
        serve(ns.upstream, ns.port)
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=int, default=2000, help="non-streaming requests per side")
    parser.add_argument("--m", type=int, default=50, help="streaming requests per side")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--target", help="an already-running vramd (default: start one)")
    parser.add_argument("--model", default="bench", help="model name to request")
    parser.add_argument("--runtime", help="the runtime to compare with, with --target")
    parser.add_argument("--api-key", help="bearer key for --target")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        runtime, target = args.runtime, args.target
        if target is None:
            runtime_port, proxy_port = free_port(), free_port()
            runtime = f"http://127.0.0.1:{runtime_port}"
            demo = [sys.executable, "-m", "service.demo_runtime", "--port", str(runtime_port)]
            demo += ["--model", args.model, "--latency-ms", "0", "--chunk-delay-ms", "0"]
            stack.enter_context(spawn(demo, f"{runtime}/health"))
            target = f"http://127.0.0.1:{proxy_port}"
            proxy = [sys.executable, "-m", "bench.proxy", "serve", "--upstream", runtime]
            proxy += ["--port", str(proxy_port)]
            stack.enter_context(spawn(proxy, f"{target}/v1/models"))
        headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        proxied = Side(target, stack.enter_context(httpx.Client(headers=headers, timeout=60)))
        direct = None
        if runtime is not None:
            direct = Side(runtime, stack.enter_context(httpx.Client(timeout=60)))
        sides = [proxied] if direct is None else [direct, proxied]
        run(sides, args.model, args.n, args.m)
    result = report(direct, proxied, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
