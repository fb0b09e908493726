"""The official ``openai`` client against a live ``vramd serve`` with demo runtimes.

One daemon (module scope) serves every kind; each test reaches one route or one error
code of the contract (docs/api.md) through a real scenario.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon


def svc(
    kind: str, models: list[str], memory: str = "30MiB", *extra: str, **keys: object
) -> dict[str, object]:
    mib = int(memory.removesuffix("MiB"))
    spec: dict[str, object] = {
        "kind": kind,
        "models": models,
        "command": demo_command(memory, *extra),
        "memory": {"estimate": f"{mib + 40}MiB"},
        "stop_timeout": "2s",
    }
    spec.update(keys)
    return spec


SERVICES = {
    "chat": svc("chat", ["m-chat"], "30MiB", "--chunk-delay-ms", "30", residency="pinned"),
    "embed": svc("embedding", ["m-embed"]),
    "image": svc("diffusion", ["m-image"]),
    "speech": svc("speech", ["m-whisper", "m-tts"]),
    "rerank": svc("rerank", ["m-rerank"]),
    "slow": svc(
        "chat",
        ["m-slow"],
        "20MiB",
        "--latency-ms",
        "1500",
        max_concurrency=1,
        queue={"max": 1, "timeout": "0.5s"},
    ),
    "crashy": svc(
        "chat",
        ["m-crashy"],
        "20MiB",
        "--crash-after",
        "1",
        restart={"max_retries": 5, "backoff": "0.1s", "max_backoff": "0.2s"},
    ),
    "never": svc(
        "chat",
        ["m-never"],
        "20MiB",
        "--never-ready",
        startup_timeout="1s",
        restart={"max_retries": 0, "backoff": "0.1s"},
    ),
    "hang": svc("chat", ["m-hang"], "20MiB", "--hang"),
    "huge": dict(svc("embedding", ["m-huge"]), memory={"estimate": "4GiB"}),
    "batch": svc("embedding", ["m-batch"], residency="window-only"),
}
EXTRA = """\
server:
  request_timeout: 3s
maintenance:
  windows:
    - name: yearly
      cron: "0 0 1 1 *"
      duration: 1h
      allow: [batch]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir: Path = tmp_path_factory.mktemp("openai-e2e")
    with running_daemon(
        policy_yaml(SERVICES, budget="700MiB", extra=EXTRA), workdir, in_thread=True
    ) as d:
        d.wait_for(lambda: d.service("chat")["state"] == "ready")
        yield d


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_list_every_name(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert {"m-chat", "m-embed", "m-whisper", "m-tts", "m-batch"} <= set(models)
    assert models["m-chat"].owned_by == "vramd"
    assert models["m-chat"].model_extra["service"] == "chat"  # type: ignore[index]
    assert models["m-chat"].model_extra["state"] == "ready"  # type: ignore[index]


def test_chat_and_headers(daemon: Daemon, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="m-chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-vramd-service"] == "chat"
    assert raw.headers["x-vramd-cold-start"] == "0"
    assert int(raw.headers["x-vramd-queue-ms"]) >= 0
    completion = raw.parse()
    assert completion.choices[0].message.content


def test_chat_streaming_arrives_in_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m-chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 1


def test_completions(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="m-chat", prompt="once upon")
    assert completion.choices[0].text


def test_embeddings_cold_start(daemon: Daemon, client: openai.OpenAI) -> None:
    daemon.post("/api/services/embed/unload")
    raw = client.embeddings.with_raw_response.create(model="m-embed", input=["a", "b"])
    assert raw.headers["x-vramd-cold-start"] == "1"
    assert len(raw.parse().data) == 2


def test_images(client: openai.OpenAI) -> None:
    result = client.images.generate(model="m-image", prompt="a cat")
    assert result.data and result.data[0].b64_json


def test_transcription_multipart(client: openai.OpenAI) -> None:
    audio = io.BytesIO(b"RIFF" + b"\0" * 2000)
    audio.name = "clip.wav"
    result = client.audio.transcriptions.create(model="m-whisper", file=audio)
    assert "2004" in result.text or result.text


def test_speech_binary(client: openai.OpenAI) -> None:
    response = client.audio.speech.create(model="m-tts", voice="alloy", input="hello")
    assert response.content[:4] == b"RIFF"


def test_rerank(daemon: Daemon) -> None:
    response = httpx.post(
        f"{daemon.url}/v1/rerank",
        json={"model": "m-rerank", "query": "q", "documents": ["a", "b", "c"]},
        timeout=30,
    )
    assert response.status_code == 200
    assert len(response.json()["results"]) == 3


def test_async_client(daemon: Daemon) -> None:
    async def run() -> str | None:
        async with openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key="x") as c:
            out = await c.chat.completions.create(
                model="m-chat", messages=[{"role": "user", "content": "hi"}]
            )
            return out.choices[0].message.content

    assert asyncio.run(run())


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[])
    assert info.value.code == "model_not_found"


def test_wrong_kind_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m-embed", messages=[])
    assert info.value.code == "invalid_request"
    assert "embedding" in info.value.message


def test_capacity_is_503_naming_holders(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.embeddings.create(model="m-huge", input="x")
    assert info.value.status_code == 503
    assert info.value.code == "insufficient_capacity"
    assert "chat" in info.value.message


def test_queue_full_429_and_queue_timeout_503(daemon: Daemon) -> None:
    body = {"model": "m-slow", "messages": [{"role": "user", "content": "x"}]}
    results: list[httpx.Response] = []

    def send() -> None:
        results.append(httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=30))

    httpx.post(f"{daemon.url}/api/services/slow/load", timeout=30)
    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 429, 503], [r.text for r in results]
    full = next(r for r in results if r.status_code == 429)
    assert full.json()["error"]["code"] == "queue_full" and "retry-after" in full.headers
    timed_out = next(r for r in results if r.status_code == 503)
    assert timed_out.json()["error"]["code"] == "queue_timeout"


def test_window_closed_503_with_retry_after(daemon: Daemon) -> None:
    response = httpx.post(
        f"{daemon.url}/v1/embeddings", json={"model": "m-batch", "input": "x"}, timeout=30
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "window_closed"
    assert int(response.headers["retry-after"]) > 60


def test_runtime_that_never_becomes_ready_is_502(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m-never", messages=[])
    assert info.value.status_code == 502
    assert info.value.code == "runtime_failed"


def test_crash_mid_stream_ends_the_stream_with_an_error(daemon: Daemon) -> None:
    body = {"model": "m-crashy", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream(
        "POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=30
    ) as response:
        text = "".join(response.iter_text())
    assert response.status_code == 200
    assert '"code": "runtime_failed"' in text or '"code":"runtime_failed"' in text
    # The crashed runtime is restarted by the supervisor.
    daemon.wait_for(lambda: daemon.service("crashy")["restarts"] >= 1)


def test_hanging_runtime_is_504_and_daemon_stays_responsive(daemon: Daemon) -> None:
    response = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": "m-hang", "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "runtime_timeout"
    assert daemon.get("/healthz").status_code == 200


def test_api_key_required_when_configured(tmp_path: Path) -> None:
    extra = "server:\n  api_keys: [sk-test-inference]\n  admin_keys: [sk-test-admin1]\n"
    with running_daemon(policy_yaml({"chat": SERVICES["chat"]}, extra=extra), tmp_path) as d:
        with openai.OpenAI(base_url=f"{d.url}/v1", api_key="wrong-key", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError) as info:
                c.models.list()
            assert info.value.code == "unauthorized"
        with openai.OpenAI(base_url=f"{d.url}/v1", api_key="sk-test-inference") as c:
            assert c.models.list().data
        assert d.get("/api/services").status_code == 401
        headers = {"Authorization": "Bearer sk-test-admin1"}
        assert d.get("/api/services", headers=headers).status_code == 200
        # The inference key does not open the admin API, and /healthz needs no key.
        wrong = {"Authorization": "Bearer sk-test-inference"}
        assert d.get("/api/services", headers=wrong).status_code == 401
        assert d.get("/healthz").status_code == 200
        assert "sk-test-inference" not in d.output() and "sk-test-admin1" not in d.output()
