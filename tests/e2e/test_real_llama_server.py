"""vramd in front of llama.cpp's own ``llama-server``: every client API, for real.

``llama-server`` answers OpenAI's chat and Responses APIs and Anthropic's Messages API
itself, and its own ``/slots`` and ``/props``. One ``vramd serve`` runs it on a tiny
generated GGUF (tests/support/gguf_model.py) and the official ``openai``, ``anthropic``
and ``ollama`` clients talk to vramd as apps do: through vramd's endpoint, the Responses
and Messages routes relayed to the runtime, runtime-native routes through
``/upstream/{service}/...``, and Ollama's API through vramd's Ollama listener.

The weights are random, so the assertions are about the shape of the answers, never
their text.

``make test-real`` builds ``llama-server`` from the llama.cpp sources vendored in the
llama-cpp-python sdist into $VRAMD_REAL_RUNTIMES (make real-runtimes) and runs this
module; ``VRAMD_LLAMA_SERVER`` names another binary. Without one it is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from support.daemon import Daemon, policy_yaml, running_daemon
from support.ports import free_port

from service.real_runtimes.catalog import catalog_dir

pytestmark = [pytest.mark.real, pytest.mark.timeout(600)]

BINARY = Path(
    os.environ.get("VRAMD_LLAMA_SERVER", catalog_dir() / "build/llama-server/bin/llama-server")
)
if not BINARY.is_file():
    pytest.skip(
        f"no llama-server at {BINARY} (make real-runtimes builds it)", allow_module_level=True
    )
pytest.importorskip("gguf", reason="gguf is missing (make test-real installs it)")

from support.gguf_model import TinyLlama, write_tiny_llama  # noqa: E402

MODEL = "tiny-llama"
KEY = "test-key-123456"


@pytest.fixture(scope="module")
def ollama_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, ollama_port: int) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("real-llama-server")
    model = write_tiny_llama(workdir / "tiny-llama.gguf")
    command = [
        str(BINARY),
        "--model",
        str(model),
        "--alias",
        "${MODEL}",
        "--host",
        "127.0.0.1",
        "--port",
        "${PORT}",
        "--ctx-size",
        str(TinyLlama().n_ctx),
        "--parallel",
        "2",
        "--threads",
        "2",
    ]
    services = {
        "chat": {
            "kind": "chat",
            "models": [MODEL],
            "command": command,
            "memory": {"estimate": "300MiB"},
            "startup_timeout": "120s",
            "stop_timeout": "10s",
        }
    }
    extra = f"""
    server:
      api_keys: [{KEY}]
      ollama: {{port: {ollama_port}}}
    """
    policy = policy_yaml(services, budget="1GiB", sample_interval="0.5s", extra=extra)
    with running_daemon(policy, workdir) as running:
        yield running


def test_chat_completions_and_the_responses_api_reach_llama_server(daemon: Daemon) -> None:
    with openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key=KEY, timeout=180, max_retries=0
    ) as client:
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage is not None and chat.usage.prompt_tokens > 0

        response = client.responses.create(model=MODEL, input="Hello", max_output_tokens=4)
        assert response.object == "response"
        assert response.status in ("completed", "incomplete")
        assert isinstance(response.output_text, str)

        events = list(
            client.responses.create(
                model=MODEL, input="Tell me a story", max_output_tokens=4, stream=True
            )
        )
        kinds = [event.type for event in events]
        assert kinds[0] == "response.created"
        assert kinds[-1] in ("response.completed", "response.incomplete")


def test_anthropic_messages_stream_and_token_count_reach_llama_server(daemon: Daemon) -> None:
    with anthropic.Anthropic(
        base_url=daemon.url, api_key=KEY, timeout=180, max_retries=0
    ) as client:
        message = client.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
        )
        assert message.type == "message" and message.role == "assistant"
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.usage.input_tokens > 0

        # Greedy, this model's first token is one byte of a multi-byte character, so
        # llama-server opens its stream without message_start: vramd puts one in
        # (docs/runtimes.md, llama.cpp), or the SDK could not build the message.
        with client.messages.stream(
            model=MODEL,
            max_tokens=4,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "A story"}],
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert isinstance(text, str)
        assert final.id.startswith("msg_") and final.model == MODEL
        assert final.usage.output_tokens <= 4

        count = client.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Hello there"}]
        )
        assert count.input_tokens > 0


def test_runtime_native_slots_and_props_pass_through_upstream(daemon: Daemon) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    slots = daemon.get("/upstream/chat/slots", headers=auth, timeout=120)
    assert slots.status_code == 200, slots.text
    assert [slot["id"] for slot in slots.json()] == [0, 1]
    assert slots.headers["x-vramd-service"] == "chat"
    props = daemon.get("/upstream/chat/props", headers=auth, timeout=60)
    assert props.status_code == 200
    assert props.json()["total_slots"] == 2
    tokens = daemon.post(
        "/upstream/chat/tokenize", json={"content": "hello world"}, headers=auth, timeout=60
    )
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    assert daemon.get("/upstream/chat/slots", timeout=10).status_code == 401


def test_the_ollama_client_chats_with_llama_server_through_vramd(
    daemon: Daemon, ollama_port: int
) -> None:
    client = ollama.Client(
        host=f"http://127.0.0.1:{ollama_port}",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=180,
    )
    answer = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        options={"num_predict": 4, "num_ctx": 8192},
    )
    assert answer.done is True
    assert answer.message.role == "assistant"
    assert (answer.prompt_eval_count or 0) > 0
    parts = list(
        client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "A story"}],
            options={"num_predict": 4},
            stream=True,
        )
    )
    assert parts[-1].done is True
    assert all(not part.done for part in parts[:-1])
    names = [model.model for model in client.list().models]
    assert MODEL in names
    client.close()
    assert httpx.get(f"http://127.0.0.1:{ollama_port}/api/version").status_code == 401


def test_usage_counts_the_tokens_llama_server_reports(daemon: Daemon) -> None:
    """Usage per client (docs/operations.md): the tokens are the runtime's own figures,
    from whole answers and from a stream's last event (``include_usage``)."""

    def counted() -> dict[str, int]:
        rows = daemon.get("/api/usage", params={"client": "default"}).json()["usage"]
        row = next((r for r in rows if r["service"] == "chat"), {})
        return {k: row.get(k, 0) for k in ("requests", "errors", "tokens_in", "tokens_out")}

    before = counted()
    reported = {"tokens_in": 0, "tokens_out": 0}
    with openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key=KEY, timeout=180, max_retries=0
    ) as client:
        for prompt in ("Hello", "Tell me a story about a cat and a dog"):
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=5
            )
            assert chat.usage is not None
            reported["tokens_in"] += chat.usage.prompt_tokens
            reported["tokens_out"] += chat.usage.completion_tokens
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Count to three"}],
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None, "llama-server sends usage in the stream's last event"
        reported["tokens_in"] += usage.prompt_tokens
        reported["tokens_out"] += usage.completion_tokens
    after = counted()
    assert after["requests"] - before["requests"] == 3
    assert after["errors"] == before["errors"]
    assert after["tokens_in"] - before["tokens_in"] == reported["tokens_in"] > 0
    assert after["tokens_out"] - before["tokens_out"] == reported["tokens_out"] > 0
