"""The Ollama translation layer (service.ollama): requests to OpenAI, answers back.

Every answer and stream line is validated against the official ``ollama`` client's
pydantic types, so what the listener sends is what Ollama clients parse.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ollama._types import (
    ChatRequest,
    ChatResponse,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    GenerateRequest,
    GenerateResponse,
    Image,
    ListResponse,
    Message,
    Options,
    ProcessResponse,
    ShowResponse,
    Tool,
)

from service.errors import InvalidRequest, RuntimeFailed
from service.ollama import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    EMBEDDINGS_ROUTE,
    MANAGEMENT_MESSAGE,
    MANAGEMENT_ROUTES,
    ChatStream,
    ModelView,
    Timing,
    chat_answer,
    chat_request,
    embed_answer,
    embed_request,
    embeddings_answer,
    embeddings_request,
    error_line,
    generate_answer,
    generate_request,
    idle_answer,
    ps,
    rfc3339,
    show,
    tags,
    version,
)

# A 1x1 PNG and the start of a JPEG, base64 as Ollama clients send images.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
JPEG = "/9j/4AAQSkZJRgABAQAAAQABAAD"
SECOND = 1_000_000_000
T0 = 1_722_000_000 * SECOND  # 2024-07-26T13:20:00Z


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **extra}


class FakeClock:
    """Nanoseconds that advance by ``step`` each time they are read."""

    def __init__(self, start: int, step: int = SECOND // 10) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


# --- requests: /api/chat -------------------------------------------------------------


def test_chat_request_goes_to_chat_completions_with_the_model_name_as_given() -> None:
    t = chat_request(chat(model="llama3.2:latest"))
    assert t.route == CHAT_ROUTE
    assert t.body["model"] == "llama3.2:latest"
    assert t.body["messages"] == [{"role": "user", "content": "hi"}]


def test_chat_request_streams_when_stream_is_absent_as_ollama_does() -> None:
    t = chat_request(chat())
    assert t.stream is True
    assert t.body["stream"] is True
    assert t.body["stream_options"] == {"include_usage": True}


def test_chat_request_with_stream_null_also_streams() -> None:
    assert chat_request(chat(stream=None)).stream is True


def test_chat_request_with_stream_false_asks_for_one_answer() -> None:
    t = chat_request(chat(stream=False))
    assert t.stream is False
    assert t.body["stream"] is False
    assert "stream_options" not in t.body


def test_chat_message_images_become_content_parts_with_data_uris() -> None:
    t = chat_request(
        {
            "model": "llava",
            "messages": [{"role": "user", "content": "what?", "images": [PNG, JPEG]}],
        }
    )
    assert t.body["messages"][0]["content"] == [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
    ]


def test_chat_images_already_data_uris_pass_unchanged() -> None:
    uri = f"data:image/webp;base64,{PNG}"
    t = chat_request({"model": "m", "messages": [{"role": "user", "images": [uri]}]})
    assert t.body["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": uri}}]


def test_chat_assistant_tool_calls_get_json_text_arguments_and_ids() -> None:
    call = {"function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}}}
    t = chat_request(
        {"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": [call]}]}
    )
    (out,) = t.body["messages"][0]["tool_calls"]
    assert out["type"] == "function"
    assert out["id"]
    assert out["function"]["name"] == "weather"
    assert json.loads(out["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_chat_tool_results_are_linked_to_their_calls_by_tool_name() -> None:
    calls = [
        {"function": {"name": "weather", "arguments": {}}},
        {"function": {"name": "time", "arguments": {}}},
    ]
    t = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_name": "time", "content": "noon"},
                {"role": "tool", "tool_name": "weather", "content": "rain"},
            ],
        }
    )
    ids = [c["id"] for c in t.body["messages"][1]["tool_calls"]]
    time_result, weather_result = t.body["messages"][2], t.body["messages"][3]
    assert time_result == {
        "role": "tool",
        "content": "noon",
        "tool_call_id": ids[1],
        "name": "time",
    }
    assert weather_result["tool_call_id"] == ids[0]
    assert weather_result["name"] == "weather"


def test_chat_tool_result_without_a_name_takes_the_oldest_unanswered_call() -> None:
    calls = [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b"}}]
    t = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "assistant", "tool_calls": calls},
                {"role": "tool", "content": "1"},
                {"role": "tool", "content": "2"},
            ],
        }
    )
    ids = [c["id"] for c in t.body["messages"][0]["tool_calls"]]
    assert [m["tool_call_id"] for m in t.body["messages"][1:]] == ids


def test_chat_tools_pass_through_unchanged() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert chat_request(chat(tools=tools)).body["tools"] == tools


def test_format_json_becomes_json_object_response_format() -> None:
    assert chat_request(chat(format="json")).body["response_format"] == {"type": "json_object"}


def test_format_schema_becomes_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    assert chat_request(chat(format=schema)).body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }


def test_empty_format_asks_for_nothing() -> None:
    assert "response_format" not in chat_request(chat(format="")).body


def test_sampling_options_map_to_openai_fields() -> None:
    options = {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 7,
        "stop": ["\n", "user:"],
        "num_predict": 128,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
    }
    body = chat_request(chat(options=options)).body
    assert body["temperature"] == 0.2
    assert body["top_p"] == 0.9
    assert body["top_k"] == 40
    assert body["min_p"] == 0.05
    assert body["seed"] == 7
    assert body["stop"] == ["\n", "user:"]
    assert body["max_tokens"] == 128
    assert body["repeat_penalty"] == body["repetition_penalty"] == 1.1
    assert body["presence_penalty"] == 0.5
    assert body["frequency_penalty"] == 0.25


def test_num_predict_minus_one_means_no_limit() -> None:
    assert "max_tokens" not in chat_request(chat(options={"num_predict": -1})).body


def test_a_single_stop_string_becomes_a_list() -> None:
    assert chat_request(chat(options={"stop": "END"})).body["stop"] == ["END"]


def test_runtime_options_and_keep_alive_are_ignored_and_reported() -> None:
    runtime = {
        "num_ctx": 8192,
        "num_gpu": 99,
        "main_gpu": 0,
        "num_batch": 512,
        "num_thread": 8,
        "low_vram": False,
        "use_mmap": True,
        "use_mlock": False,
        "numa": False,
        "num_keep": 4,
        "f16_kv": True,
        "vocab_only": False,
    }
    t = chat_request(chat(options={**runtime, "temperature": 0.1}, keep_alive="10m"))
    assert set(t.ignored) == {f"options.{name}" for name in runtime} | {"keep_alive"}
    assert t.body["temperature"] == 0.1
    for name in runtime:
        assert name not in t.body
    assert "keep_alive" not in t.body


def test_unknown_options_are_ignored_and_reported() -> None:
    t = chat_request(chat(options={"penalize_newline": True, "made_up": 1}))
    assert t.ignored == ("options.penalize_newline", "options.made_up")
    assert "made_up" not in t.body


def test_nothing_ignored_for_a_plain_request() -> None:
    assert chat_request(chat(options={"temperature": 1})).ignored == ()


def test_think_true_or_false_sets_the_templates_enable_thinking() -> None:
    assert chat_request(chat(think=True)).body["chat_template_kwargs"] == {"enable_thinking": True}
    assert chat_request(chat(think=False)).body["chat_template_kwargs"] == {
        "enable_thinking": False
    }


def test_think_level_sets_reasoning_effort() -> None:
    body = chat_request(chat(think="high")).body
    assert body["reasoning_effort"] == "high"
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


def test_chat_with_no_messages_is_a_load_request() -> None:
    assert chat_request({"model": "m"}).load_only is True
    assert chat_request({"model": "m", "messages": []}).load_only is True
    assert chat_request(chat()).load_only is False


def test_chat_with_no_messages_and_keep_alive_zero_is_an_unload_request() -> None:
    for keep_alive in (0, "0", "0s", "0m"):
        t = chat_request({"model": "m", "messages": [], "keep_alive": keep_alive})
        assert (t.unload_only, t.load_only) == (True, False), keep_alive
    assert chat_request({"model": "m", "keep_alive": "5m"}).unload_only is False


# --- requests: /api/generate ---------------------------------------------------------


def test_generate_is_a_chat_completion_with_system_and_user_messages() -> None:
    t = generate_request({"model": "m", "prompt": "why?", "system": "be brief", "stream": False})
    assert t.route == CHAT_ROUTE
    assert t.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "why?"},
    ]
    assert t.stream is False


def test_generate_images_ride_on_the_user_message() -> None:
    t = generate_request({"model": "m", "prompt": "what?", "images": [PNG]})
    assert t.body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png")


def test_generate_streams_by_default() -> None:
    t = generate_request({"model": "m", "prompt": "why?"})
    assert t.stream is True
    assert t.body["stream_options"] == {"include_usage": True}


def test_raw_generate_is_a_plain_completion_of_the_prompt() -> None:
    t = generate_request({"model": "m", "prompt": "[INST] hi [/INST]", "raw": True})
    assert t.route == COMPLETIONS_ROUTE
    assert t.body["prompt"] == "[INST] hi [/INST]"
    assert "messages" not in t.body


def test_raw_generate_reports_system_and_think_as_ignored() -> None:
    t = generate_request({"model": "m", "prompt": "x", "raw": True, "system": "s", "think": True})
    assert set(t.ignored) == {"system", "think"}
    assert "chat_template_kwargs" not in t.body


def test_generate_with_suffix_is_a_completion_with_openai_suffix() -> None:
    t = generate_request({"model": "m", "prompt": "def f(", "suffix": "    return x"})
    assert t.route == COMPLETIONS_ROUTE
    assert (t.body["prompt"], t.body["suffix"]) == ("def f(", "    return x")


def test_generate_options_and_format_map_as_for_chat() -> None:
    t = generate_request(
        {"model": "m", "prompt": "x", "format": "json", "options": {"num_predict": 5, "num_ctx": 1}}
    )
    assert t.body["response_format"] == {"type": "json_object"}
    assert t.body["max_tokens"] == 5
    assert t.ignored == ("options.num_ctx",)


def test_generate_template_and_context_are_reported_as_ignored() -> None:
    t = generate_request({"model": "m", "prompt": "x", "template": "{{ .Prompt }}", "context": [1]})
    assert t.ignored == ("template", "context")


def test_generate_with_no_prompt_is_a_load_request() -> None:
    assert generate_request({"model": "m"}).load_only is True
    assert generate_request({"model": "m", "prompt": ""}).load_only is True
    assert generate_request({"model": "m", "prompt": "x"}).load_only is False


def test_generate_with_no_prompt_and_keep_alive_zero_is_an_unload_request() -> None:
    t = generate_request({"model": "m", "keep_alive": 0})
    assert (t.unload_only, t.load_only) == (True, False)


# --- requests: embeddings --------------------------------------------------------------


def test_embed_a_string_is_one_input() -> None:
    t = embed_request({"model": "e", "input": "hello"})
    assert t.route == EMBEDDINGS_ROUTE
    assert t.body == {"model": "e", "input": ["hello"], "encoding_format": "float"}
    assert t.stream is False


def test_embed_a_list_and_dimensions_pass_through() -> None:
    t = embed_request({"model": "e", "input": ["a", "b"], "dimensions": 256})
    assert t.body["input"] == ["a", "b"]
    assert t.body["dimensions"] == 256


def test_embed_truncate_keep_alive_and_options_are_reported_as_ignored() -> None:
    t = embed_request(
        {
            "model": "e",
            "input": "a",
            "truncate": False,
            "keep_alive": "1m",
            "options": {"num_ctx": 1},
        }
    )
    assert set(t.ignored) == {"truncate", "keep_alive", "options.num_ctx"}


def test_embed_with_no_input_is_a_load_request() -> None:
    assert embed_request({"model": "e"}).load_only is True
    assert embed_request({"model": "e", "input": []}).load_only is True


def test_legacy_embeddings_prompt_is_the_one_input() -> None:
    t = embeddings_request({"model": "e", "prompt": "llamas"})
    assert t.route == EMBEDDINGS_ROUTE
    assert t.body["input"] == ["llamas"]
    assert t.load_only is False
    assert embeddings_request({"model": "e"}).load_only is True


# --- requests: bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("translate", "body", "field"),
    [
        (chat_request, [], "request body"),
        (chat_request, "text", "request body"),
        (chat_request, {"messages": []}, "model"),
        (chat_request, {"model": 3}, "model"),
        (chat_request, {"model": ""}, "model"),
        (chat_request, {"model": "m", "messages": "hi"}, "messages"),
        (chat_request, {"model": "m", "messages": ["hi"]}, "messages[0]"),
        (chat_request, {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        (chat_request, {"model": "m", "messages": [{"role": "user", "content": 1}]}, "content"),
        (chat_request, {"model": "m", "messages": [{"role": "user", "images": "x"}]}, "images"),
        (chat_request, {"model": "m", "messages": [{"role": "user", "images": [1]}]}, "images[0]"),
        (
            chat_request,
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            chat_request,
            {
                "model": "m",
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": 1}}],
                    }
                ],
            },
            "arguments",
        ),
        (chat_request, chat(tools={"f": 1}), "tools"),
        (chat_request, chat(tools=["f"]), "tools[0]"),
        (chat_request, chat(stream="yes"), "stream"),
        (chat_request, chat(format="xml"), "format"),
        (chat_request, chat(think="max"), "think"),
        (chat_request, chat(options=[1]), "options"),
        (chat_request, chat(options={"temperature": "hot"}), "options.temperature"),
        (chat_request, chat(options={"seed": True}), "options.seed"),
        (chat_request, chat(options={"top_k": 1.5}), "options.top_k"),
        (chat_request, chat(options={"stop": [1]}), "options.stop"),
        (generate_request, {"model": "m", "prompt": 1}, "prompt"),
        (generate_request, {"model": "m", "prompt": "x", "system": ["s"]}, "system"),
        (generate_request, {"model": "m", "prompt": "x", "raw": "yes"}, "raw"),
        (generate_request, {"prompt": "x"}, "model"),
        (embed_request, {"model": "e", "input": 1}, "input"),
        (embed_request, {"model": "e", "input": ["a", 2]}, "input"),
        (embed_request, {"model": "e", "input": "a", "dimensions": 0}, "dimensions"),
        (embed_request, {"model": "e", "input": "a", "truncate": "no"}, "truncate"),
        (embeddings_request, {"model": "e", "prompt": ["a"]}, "prompt"),
        (embeddings_request, {"model": None}, "model"),
    ],
)
def test_bad_input_raises_invalid_request_naming_the_field(
    translate: Any, body: object, field: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        translate(body)
    assert field in caught.value.message
    assert caught.value.status == 400


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "input",
        "options",
        "format",
        "think",
        "stream",
        "tools",
        "images",
        "system",
        "suffix",
        "raw",
        "keep_alive",
        "dimensions",
        "truncate",
    ]
)
MESSAGE = st.dictionaries(
    st.sampled_from(["role", "content", "images", "tool_calls", "tool_name", "tool_call_id"]),
    JSON,
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(FIELDS, JSON, max_size=6)
    | st.fixed_dictionaries({"model": st.just("m"), "messages": st.lists(MESSAGE, max_size=3)})
    | JSON
)
def test_any_json_is_translated_or_refused_with_invalid_request_only(body: object) -> None:
    for translate in (chat_request, generate_request, embed_request, embeddings_request):
        with contextlib.suppress(InvalidRequest):
            translate(body)


# --- requests as the official client sends them ----------------------------------------


def test_a_chat_request_built_by_the_official_client_translates() -> None:
    tool = Tool(
        function=Tool.Function(
            name="weather",
            description="the weather",
            parameters=Tool.Function.Parameters(
                properties={"city": Tool.Function.Parameters.Property(type="string")},
                required=["city"],
            ),
        )
    )
    call = Message.ToolCall(
        function=Message.ToolCall.Function(name="weather", arguments={"city": "Oslo"})
    )
    sent = ChatRequest(
        model="qwen",
        messages=[
            Message(role="user", content="look", images=[Image(value=PNG)]),
            Message(role="assistant", content="", tool_calls=[call]),
            Message(role="tool", content="snow", tool_name="weather"),
        ],
        tools=[tool],
        stream=False,
        format="json",
        options=Options(temperature=0, num_ctx=4096),
        keep_alive="5m",
        think=False,
    ).model_dump(exclude_none=True)
    t = chat_request(sent)
    assert t.stream is False
    assert t.body["tools"][0]["function"]["name"] == "weather"
    user, assistant, result = t.body["messages"]
    assert user["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert result["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert t.body["temperature"] == 0
    assert set(t.ignored) == {"keep_alive", "options.num_ctx"}


def test_generate_and_embed_requests_built_by_the_official_client_translate() -> None:
    gen = GenerateRequest(model="m", prompt="hi", system="s", stream=True).model_dump(
        exclude_none=True
    )
    assert generate_request(gen).body["messages"][0] == {"role": "system", "content": "s"}
    emb = EmbedRequest(model="e", input=["a", "b"], truncate=True).model_dump(exclude_none=True)
    assert embed_request(emb).body["input"] == ["a", "b"]


# --- answers ---------------------------------------------------------------------------


def openai_chat(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 26, "completion_tokens": 12, "total_tokens": 38},
        **extra,
    }


TIMING = Timing(start_ns=T0, end_ns=T0 + 3 * SECOND, load_ns=SECOND, queue_ns=SECOND // 2)


def test_rfc3339_is_utc_with_nanoseconds_and_z() -> None:
    assert rfc3339(T0 + 123) == "2024-07-26T13:20:00.000000123Z"


def test_chat_answer_carries_the_message_counts_and_durations() -> None:
    answer = chat_answer(openai_chat({"role": "assistant", "content": "Hello!"}), "qwen", TIMING)
    parsed = ChatResponse.model_validate(answer)
    assert parsed.model == "qwen"
    assert parsed.created_at == rfc3339(TIMING.end_ns)
    assert parsed.message.role == "assistant"
    assert parsed.message.content == "Hello!"
    assert parsed.done is True
    assert parsed.done_reason == "stop"
    assert parsed.prompt_eval_count == 26
    assert parsed.eval_count == 12
    assert parsed.total_duration == 3 * SECOND
    assert parsed.load_duration == SECOND
    # No better source: the runtime's whole time (total - load - queue) counts as eval.
    assert (parsed.prompt_eval_duration, parsed.eval_duration) == (0, 3 * SECOND // 2)


def test_chat_answer_uses_llama_cpp_timings_for_the_prompt_and_eval_split() -> None:
    openai = openai_chat(
        {"role": "assistant", "content": "x"}, timings={"prompt_ms": 120.5, "predicted_ms": 900.0}
    )
    answer = chat_answer(openai, "m", TIMING)
    assert answer["prompt_eval_duration"] == 120_500_000
    assert answer["eval_duration"] == 900_000_000


def test_chat_answer_turns_tool_call_arguments_back_into_objects() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
    ]
    answer = chat_answer(
        openai_chat({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"),
        "m",
        TIMING,
    )
    parsed = ChatResponse.model_validate(answer)
    assert parsed.done_reason == "stop"
    assert parsed.message.content == ""
    assert parsed.message.tool_calls is not None
    assert [(c.function.name, dict(c.function.arguments)) for c in parsed.message.tool_calls] == [
        ("f", {"a": 1}),
        ("g", {"arguments": "not json"}),
    ]


def test_chat_answer_carries_reasoning_content_as_thinking() -> None:
    message = {"role": "assistant", "content": "4", "reasoning_content": "2+2"}
    parsed = ChatResponse.model_validate(chat_answer(openai_chat(message), "m", TIMING))
    assert parsed.message.thinking == "2+2"


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("stop", "stop"), ("length", "length"), ("tool_calls", "stop"), (None, "stop")],
)
def test_finish_reasons_become_ollama_done_reasons(finish: str | None, reason: str) -> None:
    answer = chat_answer(openai_chat({"role": "assistant", "content": "x"}, finish), "m", TIMING)
    assert answer["done_reason"] == reason


def test_durations_are_never_negative() -> None:
    backwards = Timing(start_ns=T0, end_ns=T0 - SECOND, load_ns=2 * SECOND)
    answer = chat_answer(openai_chat({"role": "assistant", "content": "x"}), "m", backwards)
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert answer[key] >= 0


def test_an_answer_without_choices_is_a_runtime_failure() -> None:
    with pytest.raises(RuntimeFailed):
        chat_answer({"object": "chat.completion"}, "m", TIMING)


def test_generate_answer_from_a_chat_completion() -> None:
    message = {"role": "assistant", "content": "blue", "reasoning_content": "hmm"}
    parsed = GenerateResponse.model_validate(generate_answer(openai_chat(message), "m", TIMING))
    assert (parsed.response, parsed.thinking, parsed.done) == ("blue", "hmm", True)
    assert parsed.eval_count == 12


def test_generate_answer_from_a_plain_completion() -> None:
    openai = {
        "choices": [{"index": 0, "text": "done", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9},
    }
    parsed = GenerateResponse.model_validate(generate_answer(openai, "m", TIMING))
    assert (parsed.response, parsed.done_reason, parsed.prompt_eval_count) == ("done", "length", 3)


@pytest.mark.parametrize(("mode", "kind"), [("chat", ChatResponse), ("generate", GenerateResponse)])
def test_load_and_unload_answers_say_so_in_done_reason(mode: str, kind: Any) -> None:
    for reason in ("load", "unload"):
        parsed = kind.model_validate(idle_answer("m", T0, mode=mode, reason=reason))
        assert (parsed.done, parsed.done_reason) == (True, reason)


def test_embed_answer_orders_vectors_by_index_and_counts_the_prompt() -> None:
    openai = {
        "data": [
            {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]},
            {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
        ],
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }
    parsed = EmbedResponse.model_validate(embed_answer(openai, "e", TIMING))
    assert [list(v) for v in parsed.embeddings] == [[0.1, 0.2], [0.3, 0.4]]
    assert (parsed.model, parsed.prompt_eval_count) == ("e", 8)
    assert parsed.total_duration == 3 * SECOND


def test_legacy_embeddings_answer_is_the_first_vector() -> None:
    openai = {"data": [{"index": 0, "embedding": [0.5, -0.5]}]}
    parsed = EmbeddingsResponse.model_validate(embeddings_answer(openai))
    assert list(parsed.embedding) == [0.5, -0.5]


def test_embeddings_without_data_are_a_runtime_failure() -> None:
    with pytest.raises(RuntimeFailed):
        embed_answer({"object": "list"}, "e", TIMING)
    with pytest.raises(RuntimeFailed):
        embeddings_answer({"data": [{"index": 0, "embedding": "AAAA"}]})


def test_error_line_is_ollamas_error_shape() -> None:
    assert error_line("model not found") == {"error": "model not found"}


# --- streams ---------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE_CHUNK = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


def run_stream(stream: ChatStream, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    lines = [line for c in chunks for line in stream.event(c)]
    return [*lines, stream.finish()]


def test_chat_stream_gives_a_line_per_content_delta_then_a_done_line() -> None:
    clock = FakeClock(T0)
    stream = ChatStream("qwen", "chat", start_ns=T0, clock_ns=clock)
    lines = run_stream(
        stream,
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
            USAGE_CHUNK,
        ],
    )
    parsed = [ChatResponse.model_validate(line) for line in lines]
    assert [p.message.content for p in parsed] == ["Hel", "lo", ""]
    assert [p.done for p in parsed] == [False, False, True]
    final = parsed[-1]
    assert (final.done_reason, final.prompt_eval_count, final.eval_count) == ("stop", 5, 2)
    assert final.total_duration == clock.now - T0
    # Before the first token is the prompt; after it is eval.
    assert final.prompt_eval_duration is not None and final.prompt_eval_duration > 0
    assert final.prompt_eval_duration + (final.eval_duration or 0) == final.total_duration
    assert all(p.created_at and p.created_at.endswith("Z") for p in parsed)


def test_chat_stream_leaves_out_load_and_queue_time_from_the_prompt() -> None:
    clock = FakeClock(T0 + 3 * SECOND, step=SECOND)
    stream = ChatStream("m", start_ns=T0, load_ns=2 * SECOND, queue_ns=SECOND, clock_ns=clock)
    final = run_stream(stream, [chunk({"content": "x"}), chunk({}, "stop")])[-1]
    # First token at T0+4s (one second of prompt after 3s of waiting); done at T0+6s.
    assert final["load_duration"] == 2 * SECOND
    assert final["prompt_eval_duration"] == SECOND
    assert final["eval_duration"] == 2 * SECOND
    assert final["total_duration"] == 6 * SECOND


def test_chat_stream_carries_thinking_deltas() -> None:
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    (line,) = stream.event(chunk({"reasoning_content": "let me see"}))
    assert ChatResponse.model_validate(line).message.thinking == "let me see"


def test_chat_stream_emits_a_tool_call_whole_once_its_fragments_are_complete() -> None:
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    fragments = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"name": "g", "arguments": "{}"}}]}),
    ]
    assert [line for c in fragments for line in stream.event(c)] == []
    (line,) = stream.event(chunk({}, "tool_calls"))
    parsed = ChatResponse.model_validate(line)
    assert parsed.message.tool_calls is not None
    assert [(c.function.name, dict(c.function.arguments)) for c in parsed.message.tool_calls] == [
        ("f", {"city": "Paris"}),
        ("g", {}),
    ]
    final = ChatResponse.model_validate(stream.finish())
    assert (final.done, final.done_reason, final.message.tool_calls) == (True, "stop", None)


def test_chat_stream_that_ends_without_a_finish_reason_puts_pending_calls_in_the_last_line() -> (
    None
):
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    stream.event(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]})
    )
    final = ChatResponse.model_validate(stream.finish())
    assert final.message.tool_calls is not None
    assert final.message.tool_calls[0].function.name == "f"


def test_chat_stream_length_finish_is_done_reason_length() -> None:
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    final = run_stream(stream, [chunk({"content": "a"}), chunk({}, "length")])[-1]
    assert final["done_reason"] == "length"


def test_generate_stream_gives_response_lines() -> None:
    stream = ChatStream("m", "generate", start_ns=T0, clock_ns=FakeClock(T0))
    lines = run_stream(stream, [chunk({"content": "The"}), chunk({"content": " sky"}), USAGE_CHUNK])
    parsed = [GenerateResponse.model_validate(line) for line in lines]
    assert [p.response for p in parsed] == ["The", " sky", ""]
    assert parsed[-1].done is True
    assert parsed[-1].eval_count == 2
    assert "message" not in lines[0]


def test_generate_stream_understands_plain_completion_chunks() -> None:
    stream = ChatStream("m", "generate", start_ns=T0, clock_ns=FakeClock(T0))
    chunks = [
        {
            "object": "text_completion",
            "choices": [{"index": 0, "text": "ab", "finish_reason": None}],
        },
        {
            "object": "text_completion",
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
        },
    ]
    lines = run_stream(stream, chunks)
    parsed = [GenerateResponse.model_validate(line) for line in lines]
    assert [p.response for p in parsed] == ["ab", ""]
    assert parsed[-1].done_reason == "stop"


def test_stream_records_llama_cpp_timings_from_its_last_chunk() -> None:
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    last = {**chunk({}, "stop"), "timings": {"prompt_ms": 10.0, "predicted_ms": 20.0}}
    final = run_stream(stream, [chunk({"content": "x"}), last])[-1]
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (10_000_000, 20_000_000)


def test_an_error_chunk_becomes_an_error_line_and_fails_the_stream() -> None:
    stream = ChatStream("m", start_ns=T0, clock_ns=FakeClock(T0))
    lines = stream.event({"error": {"code": 500, "message": "out of memory", "type": "server"}})
    assert lines == [{"error": "out of memory"}]
    assert stream.failed is True


# --- meta ------------------------------------------------------------------------------

STARTED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
VIEWS = [
    ModelView(
        name="qwen2.5-7b",
        service="chat",
        kind="chat",
        state="ready",
        size_bytes=6 << 30,
        expires_at=STARTED + timedelta(minutes=15),
        family="llama.cpp",
        context_length=8192,
    ),
    ModelView(name="nomic", service="embed", kind="embedding", state="stopped", size_bytes=1 << 30),
    ModelView(
        name="big",
        service="vllm",
        kind="chat",
        state="draining",
        size_bytes=20 << 30,
        vram_bytes=18 << 30,
    ),
]


def test_tags_lists_every_model_name_with_a_stable_digest() -> None:
    answer = tags(VIEWS, modified_at=STARTED)
    parsed = ListResponse.model_validate(answer)
    assert [m.model for m in parsed.models] == ["qwen2.5-7b", "nomic", "big"]
    assert [m["name"] for m in answer["models"]] == ["qwen2.5-7b", "nomic", "big"]
    assert parsed.models[0].modified_at == STARTED
    assert parsed.models[0].size == 6 << 30
    again = tags(VIEWS, modified_at=STARTED)
    assert [m["digest"] for m in again["models"]] == [m["digest"] for m in answer["models"]]
    assert len({m["digest"] for m in answer["models"]}) == 3
    assert all(len(m["digest"]) == 64 for m in answer["models"])


def test_ps_lists_only_loaded_models_with_sizes_and_expiry() -> None:
    answer = ps(VIEWS)
    parsed = ProcessResponse.model_validate(answer)
    assert [m.model for m in parsed.models] == ["qwen2.5-7b", "big"]
    qwen, big = parsed.models
    assert (qwen.size, qwen.size_vram, qwen.context_length) == (6 << 30, 6 << 30, 8192)
    assert qwen.expires_at == STARTED + timedelta(minutes=15)
    assert (big.size, big.size_vram) == (20 << 30, 18 << 30)
    # No idle expiry (a pinned service): a time far ahead, as Ollama shows keep_alive < 0.
    assert big.expires_at is not None and big.expires_at.year > 2100


def test_show_gives_details_and_the_chat_capability() -> None:
    answer = show(VIEWS[0], modified_at=STARTED)
    parsed = ShowResponse.model_validate(answer)
    assert parsed.capabilities == ["completion"]
    assert parsed.details is not None and parsed.details.family == "llama.cpp"
    assert parsed.modelinfo is not None
    assert parsed.modelinfo["llama.cpp.context_length"] == 8192
    assert parsed.modified_at == STARTED
    for text in (parsed.modelfile, parsed.parameters, parsed.template):
        assert text is not None and "vramd" in text


def test_show_gives_the_embedding_capability_for_an_embedding_model() -> None:
    parsed = ShowResponse.model_validate(show(VIEWS[1], modified_at=STARTED))
    assert parsed.capabilities == ["embedding"]


def test_show_capabilities_can_be_overridden() -> None:
    answer = show(VIEWS[0], modified_at=STARTED, capabilities=["completion", "tools"])
    assert answer["capabilities"] == ["completion", "tools"]


def test_version_passes_clients_minimum_version_checks() -> None:
    answer = version()
    numbers = tuple(int(part) for part in answer["version"].split("."))
    assert numbers >= (0, 6, 4)  # VS Code Copilot's floor


def test_model_management_paths_are_answered_with_the_policy_message() -> None:
    paths = {path for _, path in MANAGEMENT_ROUTES}
    assert {"/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete"} <= paths
    assert "/api/blobs/{digest}" in paths
    assert not paths & {"/api/chat", "/api/tags"}
    assert "policy" in MANAGEMENT_MESSAGE and "vramd apply" in MANAGEMENT_MESSAGE
