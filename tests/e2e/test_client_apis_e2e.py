"""Every client API against a live ``vramd serve``, with the official clients.

One daemon (module scope) with demo runtimes that answer the Responses and Messages APIs
as llama-server does, TEI's and whisper.cpp's native routes (``--native-routes``), and
llama.cpp's own ``/slots`` and ``/props``; ``server.api_keys`` set and the Ollama
listener on. Apps written for OpenAI's Responses API, Anthropic's Messages API and
Ollama's API run unchanged against it (docs/policy.md and docs/api.md).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon
from support.ports import free_port

from service.demo_runtime import tiny_wav

KEY = "client-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPLY = "demo reply 1 2 3"


def svc(kind: str, models: list[str], *extra: str, **keys: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": kind,
        "models": models,
        "command": demo_command("20MiB", *extra),
        "memory": {"estimate": "60MiB"},
        "stop_timeout": "2s",
    }
    spec.update(keys)
    return spec


SERVICES = {
    "chat": svc("chat", ["m-chat"], "--chunk-delay-ms", "5", "--parallel", "2"),
    # TEI and whisper.cpp answer at their native paths only; the adapters' defaults
    # send /v1/rerank to /rerank and /v1/audio/transcriptions to /inference.
    "tei": svc("rerank", ["m-rerank"], "--native-routes", adapter="tei"),
    "whisper": svc("speech", ["m-whisper"], "--native-routes", adapter="whisper.cpp"),
    # A chat runtime that also embeds: a route beyond its kind's, through routes:.
    "both": svc("chat", ["m-both"], routes={"/v1/embeddings": "/v1/embeddings"}),
    # Its chat route answered by the demo's /debug/echo: the test reads what arrived.
    "echo": svc(
        "chat",
        ["m-echo", "m-echo-hot"],
        routes={"/v1/chat/completions": "/debug/echo"},
        set_params={"m-echo-hot": {"temperature": 1.5, "top_k": 7}},
    ),
    "slow": svc("chat", ["m-slow"], "--chunks", "400", "--chunk-delay-ms", "50", max_concurrency=1),
    "crashy": svc(
        "chat",
        ["m-crashy"],
        "--crash-after",
        "1",
        restart={"max_retries": 5, "backoff": "0.1s", "max_backoff": "0.2s"},
    ),
}


@pytest.fixture(scope="module")
def ollama_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, ollama_port: int) -> Iterator[Daemon]:
    extra = f"""
    server:
      api_keys: [{KEY}]
      ollama: {{port: {ollama_port}}}
    """
    policy = policy_yaml(SERVICES, budget="800MiB", extra=extra)
    with running_daemon(policy, tmp_path_factory.mktemp("client-apis")) as running:
        yield running


@pytest.fixture(scope="module")
def oai(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def claude(daemon: Daemon) -> Iterator[anthropic.Anthropic]:
    # ANTHROPIC_API_KEY-style: the key goes out as x-api-key.
    with anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def llama(daemon: Daemon, ollama_port: int) -> Iterator[ollama.Client]:
    client = ollama.Client(host=f"http://127.0.0.1:{ollama_port}", headers=AUTH, timeout=30)
    yield client
    client.close()


# --- OpenAI's Responses API -------------------------------------------------------------


def test_the_responses_api_answers_through_vramd(oai: openai.OpenAI) -> None:
    raw = oai.responses.with_raw_response.create(model="m-chat", input="hello there")
    assert raw.headers["x-vramd-service"] == "chat"
    response = raw.parse()
    assert response.object == "response"
    assert response.output_text == REPLY
    assert response.usage is not None and response.usage.input_tokens == 2


def test_a_streamed_response_arrives_event_by_event(oai: openai.OpenAI) -> None:
    events = list(oai.responses.create(model="m-chat", input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_responses_error_has_openais_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.responses.create(model="no-such-model", input="hi")
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="does not serve /v1/responses"):
        oai.responses.create(model="m-rerank", input="hi")


# --- Anthropic's Messages API -----------------------------------------------------------


def test_anthropic_messages_answer_with_x_api_key(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="m-chat", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    assert message.type == "message"
    assert message.content[0].type == "text" and message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"


def test_anthropic_messages_stream_and_count_tokens(daemon: Daemon) -> None:
    # auth_token: the same key as a bearer token, as gateways configure it.
    with (
        anthropic.Anthropic(base_url=daemon.url, auth_token=KEY, max_retries=0) as client,
        client.messages.stream(
            model="m-chat", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        count = client.messages.count_tokens(
            model="m-chat",
            system="be brief",
            messages=[{"role": "user", "content": "hello there"}],
        )
    assert text == REPLY
    assert final.usage.output_tokens == 5
    assert count.input_tokens == 4


def test_anthropic_errors_have_anthropics_shape(
    daemon: Daemon, claude: anthropic.Anthropic
) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(
            model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "model 'no-such-model' is not served here; see GET /v1/models",
        },
    }
    with pytest.raises(anthropic.BadRequestError) as wrong_kind:
        claude.messages.create(
            model="m-rerank", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert wrong_kind.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with (
        anthropic.Anthropic(base_url=daemon.url, api_key="not-the-key", max_retries=0) as stranger,
        pytest.raises(anthropic.AuthenticationError) as denied,
    ):
        stranger.messages.count_tokens(model="m-chat", messages=[{"role": "user", "content": "x"}])
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_runtime_dying_mid_message_stream_raises_in_the_anthropic_client(
    claude: anthropic.Anthropic,
) -> None:
    with (
        pytest.raises(anthropic.APIStatusError, match="failed mid-stream") as caught,
        claude.messages.stream(
            model="m-crashy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        for _ in stream.text_stream:
            pass
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


# --- route maps and aliases -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking"])
def test_tei_reranks_at_its_native_path_from_every_alias(daemon: Daemon, path: str) -> None:
    body = {"model": "m-rerank", "query": "cats", "texts": ["dogs", "cats", "fish"]}
    answer = daemon.post(path, json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-vramd-service"] == "tei"
    ranked = answer.json()
    assert sorted(item["index"] for item in ranked) == [0, 1, 2]
    assert ranked == sorted(ranked, key=lambda item: -item["score"])


def test_each_services_route_table_is_shown_by_the_api(daemon: Daemon) -> None:
    assert daemon.service("tei")["routes"] == {"/v1/rerank": "/rerank"}
    whisper = daemon.service("whisper")["routes"]
    assert whisper["/v1/audio/transcriptions"] == "/inference"
    assert daemon.service("both")["routes"]["/v1/embeddings"] == "/v1/embeddings"


def test_whisper_cpp_transcribes_at_inference(oai: openai.OpenAI) -> None:
    audio = tiny_wav()
    transcript = oai.audio.transcriptions.create(
        model="m-whisper", file=("clip.wav", audio, "audio/wav")
    )
    assert transcript.text == f"demo transcript of {len(audio)} bytes"


def test_a_route_map_lets_a_chat_runtime_embed(oai: openai.OpenAI) -> None:
    embedded = oai.embeddings.create(model="m-both", input=["a", "b"])
    assert len(embedded.data) == 2
    with pytest.raises(openai.BadRequestError, match="routes: key can add it"):
        oai.embeddings.create(model="m-chat", input="chat models do not embed")


def test_set_params_set_fields_per_model_name_over_the_clients(daemon: Daemon) -> None:
    def arrived(model: str) -> dict[str, Any]:
        body = {"model": model, "temperature": 0.1, "messages": [{"role": "user", "content": "x"}]}
        answer = daemon.post("/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert answer.status_code == 200, answer.text
        echo = answer.json()
        assert echo["path"] == "/debug/echo"  # the route map sent it there
        forwarded: dict[str, Any] = json.loads(echo["body"])
        return forwarded

    assert arrived("m-echo")["temperature"] == 0.1  # no set_params: the client's bytes
    hot = arrived("m-echo-hot")
    assert (hot["model"], hot["temperature"], hot["top_k"]) == ("m-echo-hot", 1.5, 7)
    assert hot["messages"] == [{"role": "user", "content": "x"}]


def test_one_model_is_found_by_name(oai: openai.OpenAI) -> None:
    model = oai.models.retrieve("m-rerank")
    assert (model.id, model.owned_by) == ("m-rerank", "vramd")


# --- /upstream/{service}/{path} ---------------------------------------------------------


def test_upstream_passes_method_path_query_and_body_unchanged(daemon: Daemon) -> None:
    answer = daemon.request(
        "PUT",
        "/upstream/chat/debug/echo?a=1&b=two%2Fthree",
        content=b"raw body \x00 bytes",
        headers={**AUTH, "content-type": "application/octet-stream"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-vramd-service"] == "chat"
    echo = answer.json()
    assert echo["method"] == "PUT"
    assert echo["path"] == "/debug/echo"
    assert echo["query"] == "a=1&b=two%2Fthree"
    assert echo["body"] == "raw body \x00 bytes"
    assert echo["headers"]["content-type"] == "application/octet-stream"


def test_upstream_reaches_llama_cpp_native_routes(daemon: Daemon) -> None:
    slots = daemon.get("/upstream/chat/slots", headers=AUTH, timeout=30)
    assert [slot["id"] for slot in slots.json()] == [0, 1]
    assert daemon.get("/upstream/chat/props", headers=AUTH).json()["total_slots"] == 2
    root = daemon.get("/upstream/chat", headers=AUTH, follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (307, "/upstream/chat/")


def test_upstream_needs_a_key_and_a_known_service(daemon: Daemon) -> None:
    denied = daemon.get("/upstream/chat/slots")
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "unauthorized"
    missing = daemon.get("/upstream/nobody/slots", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "service_not_found"


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_upstream_loads_the_service_and_counts_as_its_use(daemon: Daemon) -> None:
    daemon.post("/api/services/slow/unload", timeout=30)
    daemon.wait_for(lambda: daemon.service("slow")["state"] == "stopped")
    served = daemon.service("slow")["requests_served"]
    answer = daemon.get("/upstream/slow/slots", headers=AUTH, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["x-vramd-cold-start"] == "1"
    after = daemon.service("slow")
    assert after["state"] == "ready"
    assert after["requests_served"] == served + 1
    assert after["idle_for_s"] < 5


def test_upstream_waits_its_turn_behind_max_concurrency(daemon: Daemon) -> None:
    """slow has max_concurrency 1: while a long stream holds the slot, an /upstream
    request queues, and runs when the stream ends."""
    results: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as client:
        body = {"model": "m-slow", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            # The stream has begun: it holds the slot. (The iterator is kept: a dropped
            # one closes the response, which hangs up the stream.)
            events = stream.iter_lines()
            next(events)
            # Its own connection pool: an httpx client is not shared across threads.
            url = f"{daemon.url}/upstream/slow/debug/echo"
            waiter = threading.Thread(
                target=lambda: results.update(echo=httpx.get(url, headers=AUTH, timeout=60))
            )
            waiter.start()
            daemon.wait_for(lambda: daemon.service("slow")["queued"] == 1)
            assert daemon.service("slow")["in_flight"] == 1
        # Leaving the block hangs up the stream: its slot goes to the queued request.
        waiter.join(30)
    assert results["echo"].status_code == 200
    assert int(results["echo"].headers["x-vramd-queue-ms"]) > 0


# --- Ollama's API -----------------------------------------------------------------------


def test_the_ollama_client_chats_and_streams(llama: ollama.Client) -> None:
    answer = llama.chat(model="m-chat", messages=[{"role": "user", "content": "hello"}])
    assert answer.message.content == REPLY
    assert answer.done is True and answer.done_reason == "stop"
    assert answer.eval_count == 5
    parts = list(
        llama.chat(model="m-chat", messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    assert "".join(part.message.content or "" for part in parts) == REPLY
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]


def test_the_ollama_client_generates_and_embeds(llama: ollama.Client) -> None:
    assert llama.generate(model="m-chat", prompt="hello").response == REPLY
    streamed = list(llama.generate(model="m-chat:latest", prompt="hello", stream=True))
    assert "".join(part.response for part in streamed) == REPLY
    embedded = llama.embed(model="m-both", input=["one", "two"])
    assert len(embedded.embeddings) == 2
    assert len(llama.embeddings(model="m-both", prompt="one").embedding) == 16


def test_ollama_lists_shows_and_reports_loaded_models(llama: ollama.Client) -> None:
    names = {model.model for model in llama.list().models}
    assert {"m-chat", "m-both", "m-slow"} <= names
    assert "m-rerank" not in names and "m-whisper" not in names  # not kinds Ollama knows
    llama.chat(model="m-chat", messages=[{"role": "user", "content": "x"}])
    loaded = {model.model: model for model in llama.ps().models}
    assert "m-chat" in loaded and (loaded["m-chat"].size or 0) > 0
    assert llama.show("m-chat").capabilities == ["completion"]


def test_ollama_options_that_would_reload_are_ignored_and_said_so(
    daemon: Daemon, ollama_port: int
) -> None:
    body = {
        "model": "m-chat",
        "stream": False,
        "messages": [{"role": "user", "content": "x"}],
        "options": {"num_ctx": 32768, "num_gpu": 99, "temperature": 0.1},
    }
    url = f"http://127.0.0.1:{ollama_port}/api/chat"
    httpx.post(url, json={**body, "options": {}}, headers=AUTH, timeout=30)  # loaded
    before = daemon.service("chat")
    answer = httpx.post(url, json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["x-vramd-ignored"] == "options.num_ctx, options.num_gpu"
    assert answer.json()["message"]["content"] == REPLY
    after = daemon.service("chat")  # the same process: nothing was reloaded
    assert (after["pid"], after["loads"], after["restarts"]) == (
        before["pid"],
        before["loads"],
        before["restarts"],
    )


def test_ollama_model_management_is_refused_with_501(llama: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        llama.pull("llama3")
    assert caught.value.status_code == 501
    assert "policy file" in caught.value.error
    with pytest.raises(ollama.ResponseError) as deleted:
        llama.delete("m-chat")
    assert deleted.value.status_code == 501


def test_ollama_errors_have_ollamas_shape_and_vramds_statuses(
    daemon: Daemon, ollama_port: int
) -> None:
    base = f"http://127.0.0.1:{ollama_port}"
    missing = httpx.post(f"{base}/api/chat", json={"model": "nope"}, headers=AUTH, timeout=30)
    assert missing.status_code == 404
    assert missing.json() == {"error": "model 'nope' is not served here; see GET /v1/models"}
    denied = httpx.get(f"{base}/api/tags")
    assert denied.status_code == 401 and set(denied.json()) == {"error"}
    assert httpx.get(f"{base}/").text == "Ollama is running"
    unknown = httpx.get(f"{base}/api/nothing-here", headers=AUTH)
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}


def test_an_ollama_load_request_loads_the_model(daemon: Daemon, llama: ollama.Client) -> None:
    daemon.post("/api/services/both/unload", timeout=30)
    daemon.wait_for(lambda: daemon.service("both")["state"] == "stopped")
    answer = llama.generate(model="m-both")  # no prompt: Ollama's "load it" request
    assert answer.done_reason == "load"
    assert daemon.service("both")["state"] == "ready"


def test_policy_can_enable_the_listener_for_a_fresh_daemon_only(tmp_path: Path) -> None:
    """A port in use is one clear line and exit 1 before anything starts."""
    import socket

    from support.daemon import start_daemon, stop_daemon

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        policy = policy_yaml(
            {"chat": svc("chat", ["m"])}, extra=f"server:\n  ollama: {{port: {port}}}\n"
        )
        (tmp_path / "policy.yaml").write_text(policy)
        daemon = start_daemon(tmp_path, ready=False)
        try:
            assert daemon.proc.wait(30) == 1
        finally:
            stop_daemon(daemon)
    assert f"cannot listen for Ollama clients on 127.0.0.1:{port}" in daemon.output()
    assert "set server.ollama.port" in daemon.output()


def test_a_route_map_applied_later_takes_effect_without_a_restart(tmp_path: Path) -> None:
    spec = svc("chat", ["m"], residency="pinned")
    with running_daemon(policy_yaml({"chat": spec}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        pid = daemon.service("chat")["pid"]
        body = {"model": "m", "input": "x"}
        assert daemon.post("/v1/embeddings", json=body).status_code == 400
        routed = {**spec, "routes": {"/v1/embeddings": "/v1/embeddings"}}
        applied = daemon.post(
            "/api/policy",
            content=policy_yaml({"chat": routed}),
            headers={"content-type": "application/yaml"},
        )
        assert applied.status_code == 200, applied.text
        assert daemon.post("/v1/embeddings", json=body).status_code == 200
        assert daemon.service("chat")["pid"] == pid


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["role", "content", "num_ctx", "x", "type"]), inner)
    ),
    max_leaves=6,
)
_OLLAMA_FIELDS = st.sampled_from(
    ["messages", "prompt", "input", "stream", "options", "format", "images", "tools",
     "keep_alive", "think", "raw", "suffix", "system", "truncate"]
)  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"]),
    model=st.sampled_from(["m-chat", "m-both", "m-rerank", "nope", ""]) | st.integers(),
    fields=st.dictionaries(_OLLAMA_FIELDS, _VALUES, max_size=4),
)
def test_bad_ollama_requests_get_ollamas_error_never_a_500(
    daemon: Daemon, ollama_port: int, path: str, model: object, fields: dict[str, Any]
) -> None:
    body = {"model": model, "stream": False, **fields}
    answer = httpx.post(
        f"http://127.0.0.1:{ollama_port}{path}", json=body, headers=AUTH, timeout=30
    )
    assert answer.status_code < 500 or answer.status_code in (502, 503, 504), answer.text
    if answer.status_code >= 400:
        assert set(answer.json()) == {"error"}, answer.text
