"""Route tables (the ``routes:`` key over kinds and adapter defaults) and error dialects.

Pure functions and the policy loader: which client routes a service serves, where its
runtime answers each, what a bad ``routes:`` entry says, and how one error is worded
for OpenAI, Responses, Anthropic and Ollama clients.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from service.domain import ServiceKind
from service.errors import ErrorCode, InsufficientCapacity, PolicyError, QueueFull
from service.policy import diff_policies, load_policy
from service.policy.routes import CLIENT_ROUTES, ROUTES_BY_KIND, check_route_map, route_table
from service.proxy.dialects import ANTHROPIC, OLLAMA, OPENAI, RESPONSES, Problem, dialect_for


def policy_with(service: str) -> str:
    return textwrap.dedent(
        """\
        version: 1
        services:
          svc:
            models: [m]
            memory: {estimate: 1GiB}
        """
    ) + textwrap.indent(textwrap.dedent(service), "    ")


def test_a_kind_serves_its_routes_at_the_same_path() -> None:
    table = route_table(ServiceKind.CHAT, "llama.cpp", {})
    assert table == {route: route for route in ROUTES_BY_KIND[ServiceKind.CHAT]}
    assert {"/v1/responses", "/v1/messages", "/v1/messages/count_tokens"} <= set(table)


def test_tei_reranks_at_its_native_path_by_default() -> None:
    assert route_table(ServiceKind.RERANK, "tei", {}) == {"/v1/rerank": "/rerank"}


def test_whisper_cpp_transcribes_at_inference_by_default() -> None:
    table = route_table(ServiceKind.SPEECH, "whisper.cpp", {})
    assert table["/v1/audio/transcriptions"] == "/inference"
    assert table["/v1/audio/speech"] == "/v1/audio/speech"


def test_whisper_cpps_default_follows_its_inference_path_flag() -> None:
    # whisper-server --inference-path /v1/audio/transcriptions answers at OpenAI's path.
    for argv in (
        ["whisper-server", "--inference-path", "/v1/audio/transcriptions"],
        ["whisper-server", "--inference-path=/v1/audio/transcriptions"],
    ):
        table = route_table(ServiceKind.SPEECH, "whisper.cpp", {}, argv)
        assert table["/v1/audio/transcriptions"] == "/v1/audio/transcriptions"
    elsewhere = route_table(ServiceKind.SPEECH, "whisper.cpp", {}, ["whisper-server", "-m", "x"])
    assert elsewhere["/v1/audio/transcriptions"] == "/inference"


def test_an_adapter_default_never_adds_a_route_the_kind_does_not_serve() -> None:
    # TEI serving embeddings does not rerank just because TEI can.
    assert route_table(ServiceKind.EMBEDDING, "tei", {}) == {"/v1/embeddings": "/v1/embeddings"}


def test_a_route_map_adds_moves_and_removes_routes() -> None:
    table = route_table(
        ServiceKind.CHAT,
        "llama.cpp",
        {"/v1/embeddings": "/v1/embeddings", "/v1/completions": None, "/v1/responses": "/r"},
    )
    assert table["/v1/embeddings"] == "/v1/embeddings"
    assert "/v1/completions" not in table
    assert table["/v1/responses"] == "/r"


def test_a_policy_entry_overrides_the_adapter_default() -> None:
    assert route_table(ServiceKind.RERANK, "tei", {"/v1/rerank": "/v1/rerank"}) == {
        "/v1/rerank": "/v1/rerank"
    }


def test_route_map_keys_accept_the_rerank_aliases() -> None:
    assert check_route_map({"/rerank": "/x", "/v1/audio/speech": "/tts"}) == {
        "/v1/rerank": "/x",
        "/v1/audio/speech": "/tts",
    }
    with pytest.raises(ValueError, match="both map /v1/rerank"):
        check_route_map({"/rerank": "/x", "/v1/reranking": "/y"})


def test_every_client_route_is_served_by_exactly_one_kind() -> None:
    kinds = [kind for kind, routes in ROUTES_BY_KIND.items() for _ in routes]
    assert len(CLIENT_ROUTES) == len(set(CLIENT_ROUTES)) == len(kinds)


def test_piper_only_speaks_and_gets_openais_body_in_its_own_shape_at_its_path() -> None:
    from service.kernel.routing import native_routes

    piper = """\
        kind: speech
        command: [/opt/piper/bin/python, -m, piper.http_server, --model, v.onnx]
        """
    policy = load_policy(policy_with(piper))
    assert policy.services["svc"].route_table() == {"/v1/audio/speech": "/synthesize"}
    native = native_routes(policy)["svc"]["/v1/audio/speech"]
    assert native.request({"model": "m", "input": "Hi"}) == {"text": "Hi"}
    assert native.answer_type == "audio/wav"  # piper's Flask says text/html
    # Moved by the policy (an OpenAI-speaking front of its own): the body goes as it came.
    moved = load_policy(policy_with(piper + "routes: {/v1/audio/speech: /v1/audio/speech}\n"))
    assert native_routes(moved)["svc"] == {}


def test_the_policy_resolves_a_services_route_table_from_its_command() -> None:
    policy = load_policy(
        policy_with(
            """\
            kind: rerank
            command: [text-embeddings-router, --port, "${PORT}"]
            """
        )
    )
    assert policy.services["svc"].route_table() == {"/v1/rerank": "/rerank"}


def test_an_unknown_client_route_is_a_policy_error_naming_key_and_line() -> None:
    text = policy_with(
        """\
        kind: chat
        command: [llama-server]
        routes:
          /v1/slots: /slots
        """
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(text)
    (issue,) = caught.value.issues
    assert issue.path == "services.svc.routes"
    assert issue.line == 9  # the offending entry
    assert "'/v1/slots' is not a route vramd serves" in issue.message
    assert "/upstream/{service}/{path}" in issue.message


def test_a_runtime_path_without_a_slash_is_a_policy_error() -> None:
    text = policy_with(
        """\
        kind: rerank
        command: [text-embeddings-router]
        routes: {/v1/rerank: rerank}
        """
    )
    with pytest.raises(PolicyError, match="must be a runtime path starting with '/'"):
        load_policy(text)


def test_changing_a_route_map_takes_effect_without_a_restart() -> None:
    before = load_policy(policy_with("kind: rerank\ncommand: [tei]\n"))
    after = load_policy(
        policy_with("kind: rerank\ncommand: [tei]\nroutes: {/v1/rerank: /rerank}\n")
    )
    (change,) = diff_policies(before, after).changed
    assert "routes./v1/rerank" in change.fields
    assert change.restart is False


def test_the_ollama_listener_port_must_differ_from_the_main_port() -> None:
    text = "version: 1\nserver:\n  port: 8400\n  ollama: {port: 8400}\n"
    with pytest.raises(PolicyError) as caught:
        load_policy(text)
    assert caught.value.issues[0].path == "server.ollama.port"
    assert load_policy("version: 1\nserver: {ollama: {}}\n").server.ollama.port == 11434  # type: ignore[union-attr]


def test_set_params_must_name_the_services_own_models_and_never_the_model() -> None:
    text = policy_with(
        """\
        kind: chat
        command: [llama-server]
        set_params:
          m: {temperature: 0.1, model: other}
          elsewhere: {top_p: 0.5}
        """
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(text)
    issues = {issue.path: issue.message for issue in caught.value.issues}
    assert issues == {
        "services.svc.set_params.elsewhere": (
            "'elsewhere' is not one of this service's models ['m']"
        ),
        "services.svc.set_params.m.model": "the model name cannot be set here; use upstream_model",
    }
    fixed = text.replace(", model: other", "").replace("elsewhere: {top_p: 0.5}", "")
    assert load_policy(fixed).services["svc"].set_params == {"m": {"temperature": 0.1}}


# --- dialects ----------------------------------------------------------------------------


def test_dialects_are_chosen_by_the_clients_route() -> None:
    assert dialect_for("/v1/messages") is ANTHROPIC
    assert dialect_for("/v1/messages/count_tokens") is ANTHROPIC
    assert dialect_for("/v1/responses") is RESPONSES
    assert dialect_for("/v1/chat/completions") is OPENAI
    assert dialect_for("/api/services") is OPENAI


def test_one_rejection_in_each_clients_shape_with_the_same_status() -> None:
    full = QueueFull("queue full", retry_after=2.5)
    for dialect, body in (
        (
            OPENAI,
            {"error": {"message": "queue full", "type": "rate_limit_error", "code": "queue_full"}},
        ),
        (
            ANTHROPIC,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "queue full"}},
        ),
        (OLLAMA, {"error": "queue full"}),
    ):
        reply = dialect.reply(full)
        assert reply.status_code == 429
        assert reply.headers["retry-after"] == "3"
        assert json.loads(reply.body) == body


def test_anthropic_error_types_follow_the_status() -> None:
    types = {
        status: ANTHROPIC.body(Problem(ErrorCode.ERROR, "m", http_status=status))["error"]["type"]
        for status in (400, 401, 404, 413, 429, 500, 502, 503, 504)
    }
    assert types == {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        502: "api_error",
        503: "overloaded_error",
        504: "timeout_error",
    }


def test_a_failed_stream_ends_with_each_apis_error_event() -> None:
    failure = InsufficientCapacity("no room")
    anthropic_event = ANTHROPIC.stream_error(failure).decode()
    assert anthropic_event.startswith("event: error\ndata: ")
    assert json.loads(anthropic_event.split("data: ", 1)[1])["error"]["type"] == "overloaded_error"
    responses_event = RESPONSES.stream_error(failure).decode()
    data = json.loads(responses_event.split("data: ", 1)[1])
    assert responses_event.startswith("event: error\n")
    assert (data["type"], data["code"], data["error"]["code"]) == (
        "error",
        "insufficient_capacity",
        "insufficient_capacity",
    )
    assert OPENAI.stream_error(failure).startswith(b'data: {"error"')
    assert json.loads(OLLAMA.stream_error(failure)) == {"error": "no room"}


def test_a_request_piper_cannot_speak_is_a_400_naming_the_service_and_the_field() -> None:
    from service.adapters import PIPER
    from service.errors import InvalidRequest
    from service.proxy.body import reshaped

    speech = PIPER.native_routes["/v1/audio/speech"]
    body, with_model = reshaped(b'{"model":"m","input":"Hi","speed":2}', speech, "tts")
    assert json.loads(body) == {"text": "Hi", "length_scale": 0.5}
    assert with_model("other") == body  # piper's body names no model to rewrite
    with pytest.raises(InvalidRequest) as refused:
        reshaped(b'{"model":"m","input":"Hi","response_format":"mp3"}', speech, "tts")
    assert refused.value.status == 400
    assert "service 'tts': response_format 'mp3'" in refused.value.message
