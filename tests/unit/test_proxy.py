"""The /v1 router and the proxy, in-process: ASGI app in front, httpx.MockTransport behind.

``FakeLeases`` implements ``LeaseProvider`` and records every acquire and release; the
``harness`` fixture checks after every test that each acquired lease was released exactly
once, whatever path the request took.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI

from service.api import openai
from service.api.auth import AuthConfig, install_auth, require_admin_key
from service.api.errors import install_error_handlers
from service.demo_runtime import parse_multipart
from service.domain import ServiceKind
from service.errors import (
    InvalidRequest,
    ModelNotFound,
    QueueFull,
    RequestRejected,
    ServiceNotFound,
)
from service.live.leases import Lease, Routed, ServedModel
from service.policy.routes import ROUTES_BY_KIND
from service.proxy import forward
from service.proxy.body import form_field
from service.proxy.forward import UpstreamBroken, events_end
from service.proxy.request import ProxyConfig

CHAT = "/v1/chat/completions"
TRANSCRIBE = "/v1/audio/transcriptions"
API_KEY = "sk-app-key-0123456789"
ADMIN_KEY = "sk-admin-key-9876543210"

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


@dataclass(frozen=True)
class Svc:
    kind: ServiceKind
    models: tuple[str, ...]
    upstream_model: str | None = None


SERVICES = {
    "chat": Svc(ServiceKind.CHAT, ("chat-a",)),
    "renamed": Svc(ServiceKind.CHAT, ("nice-name",), upstream_model="org/real-model.gguf"),
    "embed": Svc(ServiceKind.EMBEDDING, ("embed-a",)),
    "speech": Svc(ServiceKind.SPEECH, ("whisper",), upstream_model="whisper-large-v3"),
}


@dataclass
class Release:
    request_id: str
    outcome: str
    error: str | None
    usage: Any = None


@dataclass
class FakeLeases:
    """A LeaseProvider whose leases reach a MockTransport; it records what the proxy does."""

    handler: Handler
    reject: RequestRejected | None = None
    hold: asyncio.Event | None = None  # when set, acquire waits for it
    acquired: list[str] = field(default_factory=list)
    released: list[Release] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    def resolve(self, model: str, route: str) -> Routed:
        for name, svc in SERVICES.items():
            if model in svc.models:
                if route not in ROUTES_BY_KIND[svc.kind]:
                    raise InvalidRequest(f"model {model!r} ({svc.kind}) does not serve {route}")
                return Routed(name, route)
        raise ModelNotFound(f"model {model!r} not found")

    def service_named(self, name: str) -> str:
        if name not in SERVICES:
            raise ServiceNotFound(f"no service named {name!r}")
        return name

    async def acquire(
        self,
        service: str,
        *,
        request_id: str,
        request_info: dict[str, Any] | None = None,
        client: str = "anonymous",
    ) -> Lease:
        if self.reject is not None:
            raise self.reject
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.withdrawn.append(request_id)
                raise
        self.acquired.append(request_id)
        return Lease(
            request_id=request_id,
            service=service,
            base_url="http://runtime.test",
            client=self.client,
            upstream_model=SERVICES[service].upstream_model,
            queue_ms=12.4,
            cold_start=True,
        )

    def release(
        self,
        lease: Lease,
        *,
        outcome: str,
        error: str | None = None,
        status: int | None = None,
        usage: Any = None,
    ) -> None:
        self.released.append(Release(lease.request_id, outcome, error, usage))

    def models(self) -> list[ServedModel]:
        return [
            ServedModel(model, name, str(svc.kind), "ready")
            for name, svc in SERVICES.items()
            for model in svc.models
        ]

    @property
    def outcome(self) -> Release:
        (release,) = self.released
        return release


class Harness:
    """The app under test, its fake provider, and what the fake runtime was sent."""

    def __init__(self) -> None:
        self.reply: Handler = _ok
        self.seen: list[httpx.Request] = []
        self.leases = FakeLeases(self._handle)
        self.app = make_app(self.leases)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://vramd.test"
        )

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        self.seen.append(request)
        return await self.reply(request)

    def configure(self, *, auth: AuthConfig | None = None, **proxy: Any) -> None:
        if auth is not None:
            self.app.state.auth = auth
        if proxy:
            self.app.state.proxy = ProxyConfig(**proxy)

    async def post(self, path: str = CHAT, **kwargs: Any) -> httpx.Response:
        return await self.client.post(path, **kwargs)


def make_app(leases: FakeLeases) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    install_auth(app, AuthConfig())
    app.state.proxy = ProxyConfig()
    app.state.daemon = SimpleNamespace(orchestrator=leases)
    app.include_router(openai.router)
    admin = APIRouter(prefix="/api", dependencies=[Depends(require_admin_key)])

    @admin.get("/status")
    async def status() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(admin)
    return app


async def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"id": "x", "object": "chat.completion"})


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    async with h.client, h.leases.client:
        yield h
    counts = Counter(release.request_id for release in h.leases.released)
    # A request asked for again (its first lease's runtime refused the connection) holds
    # one lease at a time: as many releases as acquires, for every request.
    assert counts == Counter(h.leases.acquired), "every lease is released exactly once"


def chat(model: object = "chat-a", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


async def stream_of(*chunks: bytes, then: BaseException | None = None) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
    if then is not None:
        raise then


# --- forwarding -----------------------------------------------------------------------------


async def test_forwards_the_clients_bytes_untouched_and_marks_the_response(
    harness: Harness,
) -> None:
    body = b'{ "messages" : [ ],  "model":"chat-a", "temperature": 1.0e0, "x": "\\u00e9" }'
    response = await harness.post(
        f"{CHAT}?trace=1",
        content=body,
        headers={
            "content-type": "application/json",
            "accept": "application/json",
            "authorization": "Bearer client-secret-key",
            "cookie": "session=1",
        },
    )
    assert response.status_code == 200
    assert response.json() == {"id": "x", "object": "chat.completion"}
    assert response.headers["x-vramd-service"] == "chat"
    assert response.headers["x-vramd-queue-ms"] == "12"
    assert response.headers["x-vramd-cold-start"] == "1"
    (sent,) = harness.seen
    assert str(sent.url) == "http://runtime.test/v1/chat/completions?trace=1"
    assert sent.content == body
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["accept"] == "application/json"
    assert sent.headers["accept-encoding"] == "identity"
    assert "authorization" not in sent.headers
    assert "cookie" not in sent.headers
    assert sent.headers["host"] == "runtime.test"
    assert harness.leases.outcome.outcome == "ok"


async def test_rewrites_the_model_when_the_service_names_an_upstream_model(
    harness: Harness,
) -> None:
    response = await harness.post(json=chat("nice-name", temperature=0.5, note="café"))
    assert response.status_code == 200
    assert response.headers["x-vramd-service"] == "renamed"
    sent = json.loads(harness.seen[0].content)
    assert sent == chat("org/real-model.gguf", temperature=0.5, note="café")
    # A lone surrogate survives the re-encoding.
    body = b'{"model": "nice-name", "messages": [], "x": "\\ud800"}'
    response = await harness.post(content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert json.loads(harness.seen[1].content) == {
        "model": "org/real-model.gguf",
        "messages": [],
        "x": "\ud800",
    }


async def test_passes_upstream_errors_through_and_reports_them(harness: Harness) -> None:
    oom = b'{"error": {"message": "CUDA out of memory. Tried to allocate 20 MiB", "code": 500}}'

    async def fail(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, content=oom, headers={"content-type": "application/json"})

    harness.reply = fail
    response = await harness.post(json=chat())
    assert response.status_code == 500
    assert response.content == oom
    assert response.headers["x-vramd-service"] == "chat"
    release = harness.leases.outcome
    assert release.outcome == "upstream_error"
    assert release.error is not None and "CUDA out of memory" in release.error


async def test_relays_binary_bodies_exactly(harness: Harness) -> None:
    audio = bytes(range(256)) * 40

    async def speak(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=audio, headers={"content-type": "audio/wav"})

    harness.reply = speak
    response = await harness.post(
        "/v1/audio/speech", json={"model": "whisper", "input": "hi", "voice": "a"}
    )
    assert response.status_code == 200
    assert response.content == audio
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["content-length"] == str(len(audio))


async def test_relays_a_chunked_body_chunk_by_chunk(harness: Harness) -> None:
    async def chunked(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stream_of(b"RIFF", b"1234", b"5678"))

    harness.reply = chunked
    response = await harness.post(json=chat())
    assert response.content == b"RIFF12345678"
    assert harness.leases.outcome.outcome == "ok"


async def test_drops_hop_by_hop_response_headers(harness: Harness) -> None:
    async def chatty(request: httpx.Request) -> httpx.Response:
        headers = {
            "connection": "keep-alive, x-hop",
            "keep-alive": "timeout=5",
            "x-hop": "1",
            "x-runtime": "llama.cpp",
            "server": "runtime/1",
        }
        return httpx.Response(200, json={}, headers=headers)

    harness.reply = chatty
    response = await harness.post(json=chat())
    assert response.headers["x-runtime"] == "llama.cpp"
    for name in ("keep-alive", "x-hop", "server"):
        assert name not in response.headers


# --- streaming ------------------------------------------------------------------------------

EVENTS = ({"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": "b"}}]})


async def test_relays_an_event_stream(harness: Harness) -> None:
    async def stream(request: httpx.Request) -> httpx.Response:
        chunks = [*sse(*EVENTS), b"data: [DONE]\n\n"]
        return httpx.Response(
            200, content=stream_of(*chunks), headers={"content-type": "text/event-stream"}
        )

    harness.reply = stream
    response = await harness.post(json=chat(stream=True))
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-vramd-service"] == "chat"
    assert response.content == b"".join([*sse(*EVENTS), b"data: [DONE]\n\n"])
    assert harness.leases.outcome.outcome == "ok"


async def test_a_compressed_event_stream_reaches_the_client_decoded(harness: Harness) -> None:
    plain = b"".join([*sse(*EVENTS), b"data: [DONE]\n\n"])
    packed = gzip.compress(plain)

    async def stream(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
        return httpx.Response(200, content=stream_of(packed[:20], packed[20:]), headers=headers)

    harness.reply = stream
    response = await harness.post(json=chat(stream=True))
    assert "content-encoding" not in response.headers  # dropped, so the body is decoded
    assert response.content == plain


def events_in(body: bytes) -> list[Any]:
    return [
        line.removeprefix(b"data: ").decode()
        if line == b"data: [DONE]"
        else json.loads(line.removeprefix(b"data: "))
        for line in body.split(b"\n\n")
        if line
    ]


async def test_a_runtime_dying_mid_stream_ends_the_stream_with_an_error_event(
    harness: Harness,
) -> None:
    async def dies(request: httpx.Request) -> httpx.Response:
        # Half an event arrives before the connection drops: the client must not see it.
        chunks = stream_of(
            *sse(*EVENTS),
            b'data: {"choices": [{"del',
            then=httpx.RemoteProtocolError("incomplete chunked read"),
        )
        return httpx.Response(200, content=chunks, headers={"content-type": "text/event-stream"})

    harness.reply = dies
    response = await harness.post(json=chat(stream=True))
    assert response.status_code == 200
    *relayed, last = events_in(response.content)
    assert relayed == list(EVENTS)
    assert last["error"]["code"] == "runtime_failed"
    assert last["error"]["type"] == "server_error"
    assert "incomplete chunked read" in last["error"]["message"]
    assert harness.leases.outcome.outcome == "runtime_failed"


async def test_a_stalled_stream_ends_with_a_timeout_event(harness: Harness) -> None:
    async def stalls(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield sse(EVENTS[0])[0]
            await asyncio.Event().wait()
            yield b""  # pragma: no cover

        return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})

    harness.reply = stalls
    harness.configure(read_timeout=0.05)
    response = await harness.post(json=chat(stream=True))
    first, last = events_in(response.content)
    assert first == EVENTS[0]
    assert last["error"]["code"] == "runtime_timeout"
    assert harness.leases.outcome.outcome == "runtime_timeout"


async def test_a_slow_stream_is_not_cut_while_each_event_comes_in_time(
    harness: Harness,
) -> None:
    # read_timeout bounds the silence between events, not the whole stream: six events
    # 0.05 s apart take longer than the limit, and none of them waits for as long.
    async def trickles(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            for chunk in sse(*EVENTS * 3):
                await asyncio.sleep(0.05)
                yield chunk

        return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})

    harness.reply = trickles
    harness.configure(read_timeout=0.2)
    response = await harness.post(json=chat(stream=True))
    assert events_in(response.content) == [*EVENTS * 3]
    assert harness.leases.outcome.outcome == "ok"


async def test_a_stalled_chunked_body_drops_the_connection(harness: Harness) -> None:
    async def stalls(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"RIFF"
            await asyncio.Event().wait()
            yield b""  # pragma: no cover

        return httpx.Response(200, content=chunks())

    harness.reply = stalls
    harness.configure(read_timeout=0.05)
    with pytest.raises(UpstreamBroken, match=r"sent nothing for 0\.05s mid-body"):
        await harness.post(json=chat())
    assert harness.leases.outcome.outcome == "runtime_timeout"


def test_events_end_finds_the_last_whole_event() -> None:
    assert events_end(b"") == 0
    assert events_end(b"data: 1") == 0
    assert events_end(b"data: 1\n\ndata: 2") == 9
    assert events_end(b"data: 1\r\n\r\ndata: 2\r\n\r\n") == 22
    assert events_end(b"data: 1\r\rdata") == 9


async def test_a_chunked_body_broken_mid_way_drops_the_connection(harness: Harness) -> None:
    async def breaks(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stream_of(b"RIFF", then=httpx.ReadError("reset")))

    harness.reply = breaks
    with pytest.raises(UpstreamBroken):
        await harness.post(json=chat())
    assert harness.leases.outcome.outcome == "runtime_failed"


async def test_a_body_of_known_length_broken_mid_way_is_a_502(harness: Harness) -> None:
    async def breaks(request: httpx.Request) -> httpx.Response:
        body = stream_of(b'{"id": ', then=httpx.RemoteProtocolError("peer closed"))
        return httpx.Response(200, content=body, headers={"content-length": "100"})

    harness.reply = breaks
    response = await harness.post(json=chat())
    assert response.status_code == 502
    assert error_of(response)["code"] == "runtime_failed"
    assert response.headers["x-vramd-service"] == "chat"
    assert harness.leases.outcome.outcome == "runtime_failed"


# --- the runtime cannot answer --------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (httpx.ConnectTimeout("connect timed out"), 502, "runtime_failed"),
        (httpx.RemoteProtocolError("server disconnected"), 502, "runtime_failed"),
        (httpx.ReadTimeout("read timed out"), 504, "runtime_timeout"),
    ],
)
async def test_a_runtime_that_cannot_answer(
    harness: Harness, exc: Exception, status: int, code: str
) -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        raise exc

    harness.reply = broken
    response = await harness.post(json=chat())
    assert response.status_code == status
    assert error_of(response)["code"] == code
    assert response.headers["x-vramd-service"] == "chat"
    assert response.headers["x-vramd-cold-start"] == "1"
    assert harness.leases.outcome.outcome == code


@pytest.fixture
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "NOT_SENT_PAUSES_S", (0.0, 0.0))


async def test_a_refused_connection_is_asked_again_and_served_by_the_next_instance(
    harness: Harness, no_pauses: None
) -> None:
    # The runtime died a moment ago: the request never reached it, so its lease is given
    # back unserved and the request waits for the instance that replaces it.
    calls = 0

    async def dead_then_back(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("All connection attempts failed")
        return await _ok(request)

    harness.reply = dead_then_back
    response = await harness.post(json=chat())
    assert response.status_code == 200
    assert [r.outcome for r in harness.leases.released] == ["not_sent", "ok"]
    assert len(set(harness.leases.acquired)) == 1  # one request, asked for twice


async def test_a_runtime_that_keeps_refusing_connections_is_a_502_after_three_leases(
    harness: Harness, no_pauses: None
) -> None:
    async def refuses(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    harness.reply = refuses
    response = await harness.post(json=chat())
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "runtime_failed"
    assert error["message"] == (
        "the runtime of service 'chat' could not be reached: connection refused"
    )
    outcomes = [r.outcome for r in harness.leases.released]
    assert outcomes == ["not_sent", "not_sent", "runtime_failed"]


async def test_a_request_the_runtime_dropped_is_never_sent_twice(harness: Harness) -> None:
    async def dropped(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("")

    harness.reply = dropped
    response = await harness.post(json=chat())
    assert response.status_code == 502
    assert len(harness.seen) == 1
    assert error_of(response)["message"] == (
        "the runtime of service 'chat' dropped the connection before answering: ReadError"
    )


async def test_a_runtime_that_never_answers_times_out_at_the_first_byte(
    harness: Harness,
) -> None:
    async def hangs(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    harness.reply = hangs
    harness.configure(first_byte_timeout=0.05)
    response = await harness.post(json=chat())
    assert response.status_code == 504
    assert error_of(response)["code"] == "runtime_timeout"
    assert harness.leases.outcome.outcome == "runtime_timeout"


# --- what the router refuses ----------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"messages": []},
        {"model": None},
        {"model": 5},
        {"model": 1.5},
        {"model": True},
        {"model": ["chat-a"]},
        {"model": {"name": "chat-a"}},
        {"model": ""},
    ],
)
async def test_model_must_be_a_non_empty_string(harness: Harness, payload: object) -> None:
    response = await harness.post(json=payload)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert "'model'" in error["message"]
    assert harness.seen == []


@pytest.mark.parametrize("payload", [None, 1, 2.5, "chat-a", True, [], [{"model": "chat-a"}]])
async def test_the_body_must_be_a_json_object(harness: Harness, payload: object) -> None:
    response = await harness.post(json=payload)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"


@pytest.mark.parametrize("body", [b"", b"{", b'{"model": "chat-a",}', b"\xff\xfe{", b"[" * 100_000])
async def test_malformed_json_is_a_400(harness: Harness, body: bytes) -> None:
    response = await harness.post(content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"


async def test_an_unsupported_content_type_is_a_415(harness: Harness) -> None:
    response = await harness.post(data={"model": "chat-a"})  # form-urlencoded
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


async def test_a_body_over_the_limit_is_a_413(harness: Harness) -> None:
    harness.configure(max_json_body=1000, max_upload_body=5000)
    response = await harness.post(json=chat(pad="x" * 2000))
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "request_too_large"
    assert "server.max_json_body" in error["message"]
    # Upload routes have their own, larger limit.
    files = {"file": ("a.wav", b"x" * 2000)}
    response = await harness.post(TRANSCRIBE, data={"model": "whisper"}, files=files)
    assert response.status_code == 200
    files = {"file": ("a.wav", b"x" * 6000)}
    response = await harness.post(TRANSCRIBE, data={"model": "whisper"}, files=files)
    assert response.status_code == 413
    assert "server.max_upload_body" in error_of(response)["message"]
    assert len(harness.seen) == 1


async def test_a_chunked_body_over_the_limit_is_a_413(harness: Harness) -> None:
    harness.configure(max_json_body=1000)

    async def body() -> AsyncIterator[bytes]:
        yield b'{"model": "chat-a", "pad": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    response = await harness.post(content=body(), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"


async def test_an_unknown_model_is_a_404(harness: Harness) -> None:
    response = await harness.post(json=chat("nope"))
    assert response.status_code == 404
    assert error_of(response)["code"] == "model_not_found"


async def test_a_model_of_the_wrong_kind_for_the_route_is_a_400(harness: Harness) -> None:
    response = await harness.post("/v1/embeddings", json={"model": "chat-a", "input": "hi"})
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_request"
    assert harness.seen == []


async def test_a_full_queue_is_a_429_with_retry_after(harness: Harness) -> None:
    harness.leases.reject = QueueFull("queue of service 'chat' is full", retry_after=2.5)
    response = await harness.post(json=chat())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.headers["x-vramd-service"] == "chat"
    assert error_of(response)["code"] == "queue_full"
    assert harness.leases.released == []


# --- multipart ------------------------------------------------------------------------------


async def test_finds_and_rewrites_the_model_form_field(harness: Harness) -> None:
    audio = b"RIFF" + bytes(range(256)) * 8
    response = await harness.post(
        TRANSCRIBE,
        data={"model": "whisper", "language": "en"},
        files={"file": ("clip.wav", audio, "audio/wav")},
    )
    assert response.status_code == 200
    assert response.headers["x-vramd-service"] == "speech"
    (sent,) = harness.seen
    form = parse_multipart(sent.content, sent.headers["content-type"])
    assert form == {"model": "whisper-large-v3", "language": "en", "file": audio}


def multipart(*parts: tuple[str, bytes], filename: str | None = None) -> bytes:
    out = [b"preamble\r\n"]
    for name, value in parts:
        disposition = f'form-data; name="{name}"'
        if name == "file":
            disposition += f'; filename="{filename or "a.wav"}"'
        out.append(b"--BOUND\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n")
        out.append(value + b"\r\n")
    out.append(b"--BOUND--\r\n")
    return b"".join(out)


async def test_the_model_field_may_follow_a_file_that_mentions_it(harness: Harness) -> None:
    tricky = b'--BOUN\r\nname="model"\r\n\r\nwhisper\r\n'  # not a delimiter: no match
    body = multipart(("file", tricky), ("model", b"whisper"))
    headers = {"content-type": 'multipart/form-data; boundary="BOUND"'}
    response = await harness.post(TRANSCRIBE, content=body, headers=headers)
    assert response.status_code == 200
    form = parse_multipart(harness.seen[0].content, headers["content-type"])
    assert form == {"file": tricky, "model": "whisper-large-v3"}


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (multipart(("file", b"x")), "multipart/form-data; boundary=BOUND", "'model'"),
        (multipart(("model", b"")), "multipart/form-data; boundary=BOUND", "'model'"),
        (multipart(("model", b"\xff")), "multipart/form-data; boundary=BOUND", "UTF-8"),
        (multipart(("model", b"whisper")), "multipart/form-data", "boundary"),
        (b"--BOUND\r\nContent-Disposition: form-data", "multipart/form-data; boundary=BOUND", ""),
        (b"no delimiter at all", "multipart/form-data; boundary=BOUND", ""),
    ],
)
async def test_malformed_forms_are_400(
    harness: Harness, body: bytes, content_type: str, message: str
) -> None:
    response = await harness.post(TRANSCRIBE, content=body, headers={"content-type": content_type})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert message in error["message"]


def test_form_field_skips_parts_without_headers_and_other_names() -> None:
    body = b'--B\r\n\r\nanonymous\r\n--B\r\nContent-Disposition: form-data; filename="m"; name="model"\r\n\r\nm1\r\n--B--'  # noqa: E501
    start, end = form_field(body, b"B", b"model") or (0, 0)
    assert body[start:end] == b"m1"
    assert form_field(b"--B\r\n\r\nx\r\n--B--", b"B", b"model") is None


# --- cancellation ---------------------------------------------------------------------------


class Client:
    """A raw ASGI client that hangs up on cue, as a real client closing its socket does."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.gone = asyncio.Event()
        self.messages: list[dict[str, Any]] = []
        self._sent_body = False

    async def receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.gone.set()  # hang up after the first chunk

    async def call(self, app: FastAPI, path: str = CHAT) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"host", b"vramd.test")],
            "client": ("127.0.0.1", 50000),
            "server": ("vramd.test", 80),
        }
        await app(scope, self.receive, self.send)


async def test_a_client_hanging_up_mid_stream_closes_the_upstream(harness: Harness) -> None:
    upstream_closed = asyncio.Event()

    async def endless(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield sse(EVENTS[0])[0]
                await asyncio.Event().wait()
            finally:
                upstream_closed.set()
            yield b""  # pragma: no cover

        return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})

    harness.reply = endless
    client = Client(json.dumps(chat(stream=True)).encode())
    await asyncio.wait_for(client.call(harness.app), timeout=5)
    assert upstream_closed.is_set()
    assert harness.leases.outcome.outcome == "client_gone"
    assert client.messages[0]["status"] == 200
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_a_client_hanging_up_in_the_queue_withdraws_the_request(harness: Harness) -> None:
    harness.leases.hold = asyncio.Event()
    client = Client(json.dumps(chat()).encode())
    client.gone.set()
    await asyncio.wait_for(client.call(harness.app), timeout=5)
    assert len(harness.leases.withdrawn) == 1
    assert harness.leases.acquired == []
    assert client.messages == []
    assert harness.seen == []


async def test_a_client_hanging_up_before_the_first_byte_cancels_the_upstream_request(
    harness: Harness,
) -> None:
    cancelled = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    harness.reply = slow
    client = Client(json.dumps(chat()).encode())
    client.gone.set()
    await asyncio.wait_for(client.call(harness.app), timeout=5)
    assert cancelled.is_set()
    assert harness.leases.outcome.outcome == "client_gone"


async def test_a_client_hanging_up_mid_upload_ends_quietly(harness: Harness) -> None:
    client = Client(b"")
    client._sent_body = True  # the first receive is already the hang-up
    client.gone.set()
    await asyncio.wait_for(client.call(harness.app), timeout=5)
    assert client.messages[0]["status"] == 400
    assert harness.seen == []


# --- /v1/models -----------------------------------------------------------------------------


async def test_lists_every_model(harness: Harness) -> None:
    response = await harness.client.get("/v1/models")
    assert response.status_code == 200
    listing = response.json()
    assert listing["object"] == "list"
    first = listing["data"][0]
    assert first["id"] == "chat-a"
    assert first["object"] == "model"
    assert first["owned_by"] == "vramd"
    assert isinstance(first["created"], int)
    assert (first["service"], first["kind"], first["state"]) == ("chat", "chat", "ready")
    assert {entry["id"] for entry in listing["data"]} == {
        model for svc in SERVICES.values() for model in svc.models
    }
    response = await harness.client.get("/v1/models/whisper")
    assert response.json()["service"] == "speech"
    response = await harness.client.get("/v1/models/org/x")
    assert error_of(response)["code"] == "model_not_found"
    response = await harness.client.get("/v1/models/nope")
    assert response.status_code == 404
    assert error_of(response)["code"] == "model_not_found"


# --- auth -----------------------------------------------------------------------------------


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_api_keys_guard_v1(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    harness.configure(auth=AuthConfig(api_keys=("sk-other-key-000", API_KEY)))
    for headers in ({}, bearer("sk-wrong-key-111"), {"authorization": API_KEY}, bearer("")):
        response = await harness.post(json=chat(), headers=headers)
        assert response.status_code == 401
        assert error_of(response)["code"] == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")
        response = await harness.client.get("/v1/models", headers=headers)
        assert response.status_code == 401
    assert harness.seen == []
    response = await harness.post(json=chat(), headers=bearer(API_KEY))
    assert response.status_code == 200
    response = await harness.post(json=chat(), headers={"authorization": f"bearer  {API_KEY}"})
    assert response.status_code == 200
    assert "authorization" not in harness.seen[0].headers
    for secret in (API_KEY, "sk-other-key-000", "sk-wrong-key-111"):
        assert secret not in caplog.text
    assert "sk-" not in repr(AuthConfig(api_keys=(API_KEY,)))


async def test_admin_keys_alone_guard_api(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    harness.configure(auth=AuthConfig(api_keys=(API_KEY,), admin_keys=(ADMIN_KEY,)))
    assert (await harness.client.get("/api/status")).status_code == 401
    assert (await harness.client.get("/api/status", headers=bearer(API_KEY))).status_code == 401
    assert (await harness.client.get("/api/status", headers=bearer(ADMIN_KEY))).status_code == 200
    # The keys do not open each other's routes.
    assert (await harness.post(json=chat(), headers=bearer(ADMIN_KEY))).status_code == 401
    # No admin keys: /api is open, /v1 still guarded.
    harness.configure(auth=AuthConfig(api_keys=(API_KEY,)))
    assert (await harness.client.get("/api/status")).status_code == 200
    assert (await harness.post(json=chat())).status_code == 401
    assert API_KEY not in caplog.text and ADMIN_KEY not in caplog.text


async def test_no_keys_means_no_auth(harness: Harness) -> None:
    assert (await harness.post(json=chat())).status_code == 200
    assert (await harness.client.get("/api/status")).status_code == 200


async def test_a_missing_auth_config_fails_closed(harness: Harness) -> None:
    del harness.app.state.auth
    with pytest.raises(RuntimeError, match=r"app\.state\.auth"):
        await harness.post(json=chat())
    assert harness.seen == []


# --- an Anthropic stream without its opening event (llama-server) ----------------------


def test_an_anthropic_stream_without_message_start_gets_one_in_front_once() -> None:
    from service.proxy.message_start import MessageStart, first_event_type

    opener = MessageStart(model="m", request_id="req-0123")
    block = b'event: content_block_start\ndata: {"type":"content_block_start","index":0}\n\n'
    opened = opener.events(block)
    assert first_event_type(opened) == "message_start"
    start = json.loads(opened.split(b"\n")[1].removeprefix(b"data: "))
    assert start["message"]["id"] == "msg_0123" and start["message"]["model"] == "m"
    assert opened.endswith(block)
    later = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert opener.events(later) == later  # only the stream's first events


@pytest.mark.parametrize(
    "first",
    [
        b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n',
        b'data: {"type":"message_start","message":{}}\n\n',
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n',
    ],
)
def test_an_anthropic_stream_that_opens_itself_is_relayed_as_it_came(first: bytes) -> None:
    from service.proxy.message_start import MessageStart

    assert MessageStart(model="m", request_id="req-1").events(first) == first
