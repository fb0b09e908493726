"""The demo runtime's Responses, Messages and runtime-native routes, driven by real clients.

The official ``openai`` and ``anthropic`` clients talk to a real demo runtime process, so
what passes here is what those clients accept from OpenAI, Anthropic or llama.cpp's
server; vramd's end-to-end tests then put vramd between the two.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from support.demo import DemoProcess, running_demo

from service.demo_runtime import tiny_wav

REPLY = "demo reply 1 2 3"
RESPONSE_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 5,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
MESSAGE_EVENTS = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]
HELLO: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoProcess]:
    with running_demo("--model", "demo-chat", "--chunk-delay-ms", "1", "--parallel", "2") as proc:
        yield proc


@pytest.fixture
def oai(demo: DemoProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{demo.url}/v1", api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(demo: DemoProcess) -> Iterator[anthropic.Anthropic]:
    # Anthropic's client adds /v1 itself: its base URL is the server's root.
    with anthropic.Anthropic(base_url=demo.url, api_key="x", max_retries=0) as client:
        yield client


# --- OpenAI Responses ---------------------------------------------------------------------


def test_response_json(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model="demo-chat", input="hi there", instructions="be brief")
    assert response.id.startswith("resp_")
    assert (response.object, response.status, response.model) == (
        "response",
        "completed",
        "demo-chat",
    )
    assert response.output_text == REPLY
    assert response.instructions == "be brief"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 5)
    assert response.usage.total_tokens == 9


def test_response_takes_a_list_of_input_items(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model="demo-chat",
        input=[
            {"role": "developer", "content": "answer in one line"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
    )
    assert response.output_text == REPLY
    assert response.usage is not None and response.usage.input_tokens == 5


def test_response_stream_is_openais_event_sequence(oai: openai.OpenAI) -> None:
    with oai.responses.create(model="demo-chat", input="hi", stream=True) as stream:
        events = list(stream)
    assert [event.type for event in events] == RESPONSE_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(RESPONSE_EVENTS)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY
    created, completed = events[0], events[-1]
    assert created.type == "response.created" and completed.type == "response.completed"
    assert created.response.id == completed.response.id
    assert created.response.status == "in_progress" and created.response.output == []
    assert completed.response.output_text == REPLY


def test_response_stream_helper_accumulates_it(oai: openai.OpenAI) -> None:
    # The client's stream helper checks ids and indexes across events, so it is the strict
    # reader of the sequence.
    with oai.responses.stream(model="demo-chat", input="hi") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == REPLY
    assert final.output_text == REPLY and final.status == "completed"


def test_response_errors_are_openai_shaped(oai: openai.OpenAI, demo: DemoProcess) -> None:
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="demo-chat", input=None)  # type: ignore[arg-type]
    bad = httpx.post(f"{demo.url}/v1/responses", content=b"{not json")
    assert bad.status_code == 400 and set(bad.json()["error"]) == {"message", "type", "code"}


# --- Anthropic Messages -------------------------------------------------------------------


def test_message_json(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="demo-chat",
        max_tokens=100,
        system=[{"type": "text", "text": "be brief"}],
        messages=HELLO,
    )
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", "demo-chat")
    assert [(block.type, getattr(block, "text", None)) for block in message.content] == [
        ("text", REPLY)
    ]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 5)


def test_message_cut_at_max_tokens(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model="demo-chat", max_tokens=2, messages=HELLO)
    assert message.stop_reason == "max_tokens"
    assert [getattr(block, "text", None) for block in message.content] == ["demo reply"]
    assert message.usage.output_tokens == 2


def test_message_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="demo-chat", max_tokens=100, system="be brief", messages=HELLO
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == REPLY
    assert final.stop_reason == "end_turn"
    assert [getattr(block, "text", None) for block in final.content] == [REPLY]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 5)


def test_message_stream_is_anthropics_event_sequence(demo: DemoProcess) -> None:
    body = {"model": "demo-chat", "max_tokens": 100, "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{demo.url}/v1/messages", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert [line.removeprefix("event: ") for line in lines] == [
        *MESSAGE_EVENTS[:2],
        "ping",
        *MESSAGE_EVENTS[2:],
    ]


def test_count_tokens(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model="demo-chat", system="be brief", messages=HELLO)
    assert counted.input_tokens == 4


def test_message_errors_are_anthropic_shaped(
    claude: anthropic.Anthropic, demo: DemoProcess
) -> None:
    # messages.create checks for max_tokens itself, so send the body without it directly.
    body = {"model": "demo-chat", "messages": HELLO}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "'max_tokens' is required and must be a whole number",
        },
    }
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="demo-chat", max_tokens=0, messages=HELLO)
    bad = httpx.post(f"{demo.url}/v1/messages/count_tokens", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(f"{demo.url}/v1/messages/nope", json={})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


# --- llama.cpp's own routes and /debug/echo -----------------------------------------------


def test_slots_and_props(demo: DemoProcess) -> None:
    slots = httpx.get(f"{demo.url}/slots").json()
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in slots] == [
        (0, 2048, False),
        (1, 2048, False),
    ]
    props = httpx.get(f"{demo.url}/props").json()
    assert props["total_slots"] == 2
    assert props["model_path"] == "demo-chat.gguf"
    assert props["default_generation_settings"]["n_ctx"] == 2048


def test_a_slot_is_busy_while_a_stream_runs() -> None:
    with running_demo("--chunks", "200", "--chunk-delay-ms", "10") as demo:
        body = {"max_tokens": 1000, "messages": HELLO, "stream": True}
        with httpx.stream("POST", f"{demo.url}/v1/messages", json=body) as response:
            lines = response.iter_lines()  # held: a dropped iterator closes the stream
            assert next(lines) == "event: message_start"
            busy = [s["is_processing"] for s in httpx.get(f"{demo.url}/slots").json()]
        assert busy == [True]


def test_tokenize_counts_words(demo: DemoProcess) -> None:
    tokens = httpx.post(f"{demo.url}/tokenize", json={"content": "hello big world"}).json()
    again = httpx.post(f"{demo.url}/tokenize", json={"content": "hello"}).json()
    assert len(tokens["tokens"]) == 3 and all(isinstance(t, int) for t in tokens["tokens"])
    assert again["tokens"] == tokens["tokens"][:1]
    pieces = httpx.post(f"{demo.url}/tokenize", json={"content": "a b", "with_pieces": True})
    assert [p["piece"] for p in pieces.json()["tokens"]] == ["a", " b"]
    assert httpx.post(f"{demo.url}/tokenize", json={}).status_code == 400


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_echo_returns_what_it_got(demo: DemoProcess, method: str) -> None:
    body = b"" if method == "GET" else b'{"x": 1}'
    response = httpx.request(
        method,
        f"{demo.url}/debug/echo?a=1&b=two",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.json() == {
        "method": method,
        "path": "/debug/echo",
        "query": "a=1&b=two",
        "body": body.decode(),
        "headers": {"content-type": "application/json"},
    }


def test_native_routes_are_off_by_default(demo: DemoProcess) -> None:
    files = {"file": ("a.wav", b"\x00" * 10, "audio/wav")}
    assert httpx.post(f"{demo.url}/inference", files=files).status_code == 404
    rerank = {"query": "q", "texts": ["a"]}
    assert httpx.post(f"{demo.url}/rerank", json=rerank).status_code == 404


# --- --native-routes ----------------------------------------------------------------------


def test_native_routes_answer_at_tei_and_whisper_paths() -> None:
    with running_demo("--native-routes") as demo:
        body = {"query": "red apple", "texts": ["blue sky", "red apple pie"]}
        ranked = httpx.post(f"{demo.url}/rerank", json=body).json()
        assert [r["index"] for r in ranked] == [1, 0]
        assert ranked[0]["score"] > ranked[1]["score"]

        audio = tiny_wav()
        files = {"file": ("a.wav", audio, "audio/wav")}
        text = f"demo transcript of {len(audio)} bytes"
        assert httpx.post(f"{demo.url}/inference", files=files).json() == {"text": text}
        plain = httpx.post(f"{demo.url}/inference", files=files, data={"response_format": "text"})
        assert plain.text == text
        verbose = httpx.post(
            f"{demo.url}/inference", files=files, data={"response_format": "verbose_json"}
        ).json()
        assert (verbose["text"], verbose["duration"]) == (text, 0.1)

        openai_rerank = {"query": "q", "documents": ["a"]}
        assert httpx.post(f"{demo.url}/v1/rerank", json=openai_rerank).status_code == 404
        transcribe = httpx.post(f"{demo.url}/v1/audio/transcriptions", files=files)
        assert transcribe.status_code == 404
        assert transcribe.json()["error"]["code"] == 404
