"""The /v1 router end to end: real runtimes, a real server, the official openai client.

Demo runtimes run as subprocesses; the router runs in a real uvicorn server (in a thread)
in front of them, with ``StubLeases``: a LeaseProvider that maps each service to one
runtime through one pooled keep-alive client, as the orchestrator does for an instance.
Misbehaving runtimes (``--crash-after``, ``--hang``) are separate processes, so each
failure is deterministic.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI
from support.demo import DemoProcess, running_demo
from support.ports import free_port

from service.api import openai as openai_routes
from service.api.auth import AuthConfig, install_auth
from service.api.errors import install_error_handlers
from service.demo_runtime import tiny_wav
from service.domain import ServiceKind
from service.errors import InvalidRequest, ModelNotFound, ServiceNotFound
from service.live.leases import Lease, Routed, ServedModel
from service.policy.routes import ROUTES_BY_KIND
from service.proxy.request import ProxyConfig

KEY = "sk-routes-test-key"
MESSAGES = [{"role": "user", "content": "hello there"}]
DEMO_REPLY = "demo reply 1 2 3"  # the demo runtime's five-piece answer


@dataclass(frozen=True)
class StubService:
    kind: ServiceKind
    model: str
    url: str
    upstream_model: str | None = None


@dataclass(frozen=True)
class Released:
    service: str
    outcome: str
    error: str | None


class StubLeases:
    """A LeaseProvider over fixed, always-ready runtimes; it records every release."""

    def __init__(self, services: dict[str, StubService]) -> None:
        self.services = services
        self.released: list[Released] = []  # appended from the server's thread
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def open(self) -> None:
        for svc in self.services.values():
            if svc.url not in self._clients:
                self._clients[svc.url] = httpx.AsyncClient()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    def resolve(self, model: str, route: str) -> Routed:
        for name, svc in self.services.items():
            if svc.model == model:
                if route not in ROUTES_BY_KIND[svc.kind]:
                    raise InvalidRequest(f"{model!r} does not serve {route}")
                return Routed(name, route)
        raise ModelNotFound(f"model {model!r} not found")

    def service_named(self, name: str) -> str:
        if name not in self.services:
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
        svc = self.services[service]
        return Lease(request_id, service, svc.url, self._clients[svc.url], svc.upstream_model)

    def release(
        self,
        lease: Lease,
        *,
        outcome: str,
        error: str | None = None,
        status: int | None = None,
        usage: Any = None,
    ) -> None:
        self.released.append(Released(lease.service, outcome, error))

    def models(self) -> list[ServedModel]:
        return [
            ServedModel(svc.model, name, str(svc.kind), "ready")
            for name, svc in self.services.items()
        ]

    def wait_for_release(self, service: str, *, after: int = 0, timeout: float = 5.0) -> Released:
        """The first release of ``service`` among those after the first ``after``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for released in self.released[after:]:
                if released.service == service:
                    return released
            time.sleep(0.02)
        raise AssertionError(f"no release for {service} within {timeout}s")


def make_app(leases: StubLeases, proxy: ProxyConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await leases.open()
        try:
            yield
        finally:
            await leases.close()

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app)
    install_auth(app, AuthConfig(api_keys=(KEY,)))
    app.state.proxy = proxy
    app.state.daemon = SimpleNamespace(orchestrator=leases)
    app.include_router(openai_routes.router)
    return app


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Run ``app`` in a real uvicorn server on a free loopback port for the with-block."""
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Setup:
    url: str
    leases: StubLeases
    long: DemoProcess


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(running_demo("--chunk-delay-ms", "200"))
        # A 60 s stream: the test that hangs up on it must find it still running however
        # slowly a loaded machine lets the client read its first line.
        long = stack.enter_context(running_demo("--chunks", "600", "--chunk-delay-ms", "100"))
        crash = stack.enter_context(running_demo("--crash-after", "1", "--chunk-delay-ms", "1"))
        hang = stack.enter_context(running_demo("--hang"))
        leases = StubLeases(
            {
                "chat": StubService(ServiceKind.CHAT, "chat", main.url, "demo-chat"),
                "embed": StubService(ServiceKind.EMBEDDING, "embed", main.url),
                "image": StubService(ServiceKind.DIFFUSION, "image", main.url),
                "speech": StubService(ServiceKind.SPEECH, "speech", main.url, "demo-speech"),
                "long": StubService(ServiceKind.CHAT, "long", long.url),
                "crash": StubService(ServiceKind.CHAT, "crashy", crash.url),
                "hang": StubService(ServiceKind.CHAT, "hung", hang.url),
            }
        )
        proxy = ProxyConfig(first_byte_timeout=2.0, read_timeout=5.0)
        url = stack.enter_context(serving(make_app(leases, proxy)))
        yield Setup(url=url, leases=leases, long=long)


@pytest.fixture
def client(setup: Setup) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{setup.url}/v1", api_key=KEY, max_retries=0, timeout=20
    ) as client:
        yield client


def test_chat(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES)
    assert raw.headers["x-vramd-service"] == "chat"
    assert raw.headers["x-vramd-queue-ms"] == "0"
    assert raw.headers["x-vramd-cold-start"] == "0"
    completion = raw.parse()
    assert completion.choices[0].message.content == DEMO_REPLY
    assert completion.model == "demo-chat"  # the runtime saw the rewritten name


def test_chat_streams_chunk_by_chunk(client: openai.OpenAI) -> None:
    arrivals: list[tuple[float, str]] = []
    with client.chat.completions.create(model="chat", messages=MESSAGES, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic(), chunk.choices[0].delta.content))
    assert "".join(text for _, text in arrivals) == DEMO_REPLY
    assert len(arrivals) > 1
    # The runtime waits 200 ms between chunks: buffered, they would all arrive at once.
    assert arrivals[-1][0] - arrivals[0][0] > 0.4


def test_completions(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="chat", prompt="once upon a time")
    assert completion.choices[0].text == DEMO_REPLY


def test_embeddings(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="embed", input=["one", "two"])
    assert [len(item.embedding) for item in result.data] == [16, 16]


def test_images(client: openai.OpenAI) -> None:
    result = client.images.generate(model="image", prompt="a red square")
    assert result.data and result.data[0].b64_json
    assert base64.b64decode(result.data[0].b64_json).startswith(b"\x89PNG")


def test_transcription_is_multipart(client: openai.OpenAI) -> None:
    wav = tiny_wav()
    result = client.audio.transcriptions.create(model="speech", file=("clip.wav", wav))
    assert result.text == f"demo transcript of {len(wav)} bytes"


def test_speech_is_binary(client: openai.OpenAI) -> None:
    result = client.audio.speech.create(model="speech", voice="alloy", input="hello")
    assert result.content.startswith(b"RIFF")


def test_models(client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {"chat", "embed", "image", "speech", "long", "crashy", "hung"}
    assert models["chat"].owned_by == "vramd"


def test_upstream_errors_pass_through(setup: Setup) -> None:
    mark = len(setup.leases.released)
    with httpx.Client(base_url=setup.url, headers={"authorization": f"Bearer {KEY}"}) as http:
        response = http.post("/v1/chat/completions", json={"model": "embed"})
        assert response.status_code == 400  # the router: embed does not serve chat
        response = http.post("/v1/embeddings", json={"model": "embed", "input": []})
    assert response.status_code == 400  # the runtime: an empty input
    assert "'input' must be a string or a non-empty list" in response.json()["error"]["message"]
    assert response.headers["x-vramd-service"] == "embed"
    released = setup.leases.wait_for_release("embed", after=mark)
    assert released.outcome == "upstream_error"
    assert released.error is not None and "'input'" in released.error


def test_a_wrong_key_is_refused(setup: Setup) -> None:
    wrong = openai.OpenAI(base_url=f"{setup.url}/v1", api_key="sk-wrong", max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError) as caught:
        wrong.models.list()
    assert caught.value.status_code == 401


async def test_async_client(setup: Setup) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{setup.url}/v1", api_key=KEY, max_retries=0, timeout=20
    ) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert completion.choices[0].message.content == DEMO_REPLY
        pieces = []
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        assert "".join(pieces) == DEMO_REPLY
        embedding = await client.embeddings.create(model="embed", input="one")
        assert len(embedding.data[0].embedding) == 16


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_a_runtime_crashing_mid_stream_ends_the_stream_with_an_error(
    client: openai.OpenAI, setup: Setup
) -> None:
    received = []
    started = time.monotonic()
    stream = client.chat.completions.create(model="crashy", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught, stream:
        for chunk in stream:
            received.append(chunk)
    assert time.monotonic() - started < 10
    assert len(received) == 2  # the demo runtime crashes after two events
    assert caught.value.code == "runtime_failed"
    assert setup.leases.wait_for_release("crash").outcome == "runtime_failed"


def _in_flight(demo: DemoProcess) -> float:
    metrics = httpx.get(f"{demo.url}/metrics", timeout=2).text
    for line in metrics.splitlines():
        if line.startswith("llamacpp:requests_processing "):
            return float(line.split()[1])
    raise AssertionError("no requests_processing metric")


def test_a_client_hanging_up_mid_stream_is_seen_by_the_runtime(setup: Setup) -> None:
    payload = {"model": "long", "messages": MESSAGES, "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    http = httpx.Client(base_url=setup.url, headers=headers, timeout=10)
    with http, http.stream("POST", "/v1/chat/completions", json=payload) as response:
        assert response.status_code == 200
        first = next(response.iter_lines())
        assert first.startswith("data: "), first
        assert _in_flight(setup.long) == 1
        # Leaving the block closes the connection with most of the 60 s stream unsent.
    assert setup.leases.wait_for_release("long").outcome == "client_gone"
    deadline = time.monotonic() + 10  # a chunk every 0.1 s: the next write fails
    while _in_flight(setup.long) != 0:
        assert time.monotonic() < deadline, "the runtime kept generating for nobody"
        time.sleep(0.05)


def test_a_hung_runtime_times_out(client: openai.OpenAI, setup: Setup) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="hung", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.code == "runtime_timeout"
    assert setup.leases.wait_for_release("hang").outcome == "runtime_timeout"


def test_a_prompts_length_counts_the_text_in_messages_and_content_parts() -> None:
    from service.proxy.body import request_shape

    payload = {
        "model": "m",
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        ],
    }
    # "system" + "be brief" + "user" + "text" + "hello": roles count, as they reach the model.
    assert request_shape(payload, 120) == {"body_bytes": 120, "max_tokens": 16, "prompt_chars": 27}
