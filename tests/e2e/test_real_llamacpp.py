"""vramd against a real llama.cpp: llama-cpp-python's server on a tiny generated GGUF.

One ``vramd serve`` runs two services from the same model file, chat and embeddings
(``--embedding true``), under a host-memory budget that holds only one of them. The
official ``openai`` client then alternates between them, so every request is a cold
start that evicts the other service and waits for its memory to settle: the whole path
of docs/policy.md and docs/api.md with a real runtime's startup, health route (``/v1/models``,
llama-cpp-python has no ``/health``), streaming format and shutdown.

The weights are random (tests/support/gguf_model.py), so the assertions are about the
shape of the answers, never their text.

Needs ``llama-cpp-python[server]`` and ``gguf`` (requirements-real.txt): ``make test-real``
installs them (building llama.cpp from source takes minutes the first time; pip caches
the wheel) and runs this module. Without them it is skipped.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support.daemon import Daemon, policy_yaml, running_daemon

pytestmark = [pytest.mark.real, pytest.mark.timeout(600)]

NOT_INSTALLED = "llama-cpp-python[server] is not installed (make test-real installs it)"
pytest.importorskip("llama_cpp", reason=NOT_INSTALLED)
for _module in ("sse_starlette", "starlette_context", "gguf"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is missing: {NOT_INSTALLED}", allow_module_level=True)

from support.gguf_model import TinyLlama, write_tiny_llama  # noqa: E402

MiB = 2**20
CHAT, EMBED = "tiny-chat", "tiny-embed"
# Each server holds about 50 MiB of host memory (PSS: Python, uvicorn, llama.cpp and the
# model). Counting each at 400 MiB against a 600 MiB budget lets exactly one in at a time
# whatever they measure, as long as a server stays under the 584 MiB left after headroom.
ESTIMATE, BUDGET = "400MiB", "600MiB"


def llama_server(model: Path, *extra: str) -> list[str]:
    return [
        "${PYTHON}",
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        "${MODEL}",
        "--host",
        "127.0.0.1",
        "--port",
        "${PORT}",
        "--n_ctx",
        str(TinyLlama().n_ctx),
        "--n_threads",
        "2",
        *extra,
    ]


def service(kind: str, name: str, command: list[str]) -> dict[str, Any]:
    return {
        "kind": kind,
        "models": [name],
        "command": command,
        "memory": {"estimate": ESTIMATE},
        "residency": "on-demand",
        "startup_timeout": "120s",
        "stop_timeout": "10s",
    }


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("real-llamacpp")
    model = write_tiny_llama(workdir / "tiny-llama.gguf")
    services = {
        "chat": service("chat", CHAT, llama_server(model)),
        "embed": service("embedding", EMBED, llama_server(model, "--embedding", "true")),
    }
    policy = policy_yaml(services, budget=BUDGET, headroom="16MiB", sample_interval="0.5s")
    with running_daemon(policy, workdir) as running:
        yield running


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key="unused", timeout=180, max_retries=0
    ) as c:
        yield c


def states(daemon: Daemon) -> dict[str, str]:
    return {name: daemon.service(name)["state"] for name in ("chat", "embed")}


def evictions(daemon: Daemon) -> list[list[str]]:
    return [event["data"]["victims"] for event in daemon.events(kind="evict")]


def assert_chat_completion(completion: Any) -> None:
    assert completion.object == "chat.completion"
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens > 0
    assert 0 <= completion.usage.completion_tokens <= 8


def assert_embeddings(response: Any, count: int) -> None:
    assert response.object == "list"
    assert [item.index for item in response.data] == list(range(count))
    for item in response.data:
        assert item.object == "embedding"
        assert len(item.embedding) == TinyLlama().n_embd
        assert all(isinstance(x, float) for x in item.embedding)
        assert any(x != 0.0 for x in item.embedding)


def test_models_are_listed_before_anything_is_loaded(daemon: Daemon, client: openai.OpenAI) -> None:
    names = {model.id for model in client.models.list()}
    assert {CHAT, EMBED} <= names
    assert states(daemon) == {"chat": "stopped", "embed": "stopped"}


def test_chat_and_embeddings_evict_and_reload_each_other(
    daemon: Daemon, client: openai.OpenAI
) -> None:
    started = time.monotonic()

    # 1. Chat, not streamed: a cold start of the chat server.
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert raw.headers["x-vramd-service"] == "chat"
    assert raw.headers["x-vramd-cold-start"] == "1"
    assert_chat_completion(raw.parse())
    assert states(daemon) == {"chat": "ready", "embed": "stopped"}
    daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 20 * MiB, timeout=10)
    measured = daemon.service("chat")["footprint_bytes"]

    # 2. Embeddings: the chat server must go first (the budget holds one).
    raw_embed = client.embeddings.with_raw_response.create(
        model=EMBED, input=["hello world", "vramd"]
    )
    assert raw_embed.headers["x-vramd-service"] == "embed"
    assert raw_embed.headers["x-vramd-cold-start"] == "1"
    assert_embeddings(raw_embed.parse(), 2)
    assert states(daemon) == {"chat": "stopped", "embed": "ready"}
    assert evictions(daemon) == [["chat"]]

    # 3. Chat again, streamed: the embeddings server goes, the chat server comes back.
    chunks = list(
        client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=8,
            stream=True,
        )
    )
    assert chunks, "the stream carried chunks"
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    assert all(reason is None for reason in finishes[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)
    assert states(daemon) == {"chat": "ready", "embed": "stopped"}
    assert evictions(daemon) == [["chat"], ["embed"]]

    # 4. Embeddings again, a single string this time.
    single = client.embeddings.create(model=EMBED, input="one input")
    assert_embeddings(single, 1)
    assert states(daemon) == {"chat": "stopped", "embed": "ready"}
    assert evictions(daemon) == [["chat"], ["embed"], ["chat"]]

    chat, embed = daemon.service("chat"), daemon.service("embed")
    assert (chat["loads"], embed["loads"]) == (2, 2)
    assert (chat["evictions"], embed["evictions"]) == (2, 1)
    assert chat["requests_served"] == 2 and embed["requests_served"] == 2
    assert chat["restarts"] == 0 and embed["restarts"] == 0, "no crash on the way"
    elapsed = time.monotonic() - started
    print(f"\nfour cold starts took {elapsed:.1f}s; a chat server held {measured / MiB:.0f} MiB")


def test_a_wrong_route_for_the_kind_is_refused_without_a_load(
    daemon: Daemon, client: openai.OpenAI
) -> None:
    before = daemon.service("chat")["loads"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=CHAT, input="chat models do not embed")
    assert caught.value.status_code == 400
    assert daemon.service("chat")["loads"] == before
