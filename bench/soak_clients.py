"""The soak's traffic (``bench.soak``): its services and mix, the clients that send a seeded
mix of calls through ``/v1``, and what they and the watchers saw: statuses, error codes,
malformed error bodies, cut streams, hung requests, the daemon's samples."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.soak_faults import Faults, clock

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


# ---------------------------------------------------------------------------- what the soak saw


@dataclass
class Watch:
    """What the soak saw of the daemon (listening on ``port``) while it ran."""

    port: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    streamed_ids: set[int] = field(default_factory=set)
    stream_breaks: Counter[str] = field(default_factory=Counter)


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
