"""Who a request is from, what it may use, and what it used (docs/policy.md, "Clients and
keys"; docs/operations.md, "Usage per client"): the pure parts, without a daemon."""

from __future__ import annotations

import io
import struct
import warnings
import wave
from pathlib import Path

import pytest

from service.api.auth import ANONYMOUS, AuthConfig, Caller, scope_for
from service.api.metrics import client_families
from service.cli.render import admission_lines
from service.contract import Explanation
from service.errors import ModelNotAllowed
from service.live.usage import AnswerUsage, UsageBook
from service.policy import diff_policies, load_policy
from service.policy.clients import Scope, key_digest, key_warnings, unmatched_patterns
from service.proxy.usage import answer_usage, tokens_in, wav_seconds
from service.store import open_store, queries

GRAFANA, ALICE = key_digest("sk-grafana-0000"), key_digest("sk-alice-0000000")
POLICY = f"""
version: 1
server:
  api_keys: [sk-default-0000000]
  admin_keys:
    - sk-root-00000000
    - {{name: grafana, key_sha256: {GRAFANA}, scopes: [read]}}
    - {{key: sk-plain-admin-0000, scopes: [read, operate]}}
  clients:
    alice: {{key_sha256: {ALICE}, models: ["chat-*", sdxl]}}
    bob: {{key: sk-bob-000000000, max_concurrency: 2, share: 3}}
services:
  chat-small:
    kind: chat
    models: [chat-small]
    command: [llama-server]
    memory: {{estimate: 1GiB}}
"""


@pytest.fixture
def auth() -> AuthConfig:
    return AuthConfig.from_server(load_policy(POLICY).server)


def test_a_key_names_its_client_and_the_models_it_may_use(auth: AuthConfig) -> None:
    alice = auth.caller("Bearer sk-alice-0000000")
    assert alice is not None and alice.name == "alice" and alice.keyed
    assert alice.may_use("chat-7b") and alice.may_use("sdxl") and not alice.may_use("sdxl-2")
    with pytest.raises(ModelNotAllowed, match="client 'alice' may not use model 'emb'"):
        alice.check("emb")
    with pytest.raises(ModelNotAllowed, match="none of its models emb, emb-2"):
        alice.check_service("embed", ["emb", "emb-2"])
    default = auth.caller("Bearer sk-default-0000000")
    assert default is not None and default.name == "default" and default.may_use("anything")
    assert auth.caller("Bearer sk-bob-000000000").name == "bob"  # type: ignore[union-attr]
    assert auth.caller("Bearer sk-nobody-00000") is None
    assert auth.caller(None) is None
    assert auth.client_names == ("default", "alice", "bob")


def test_a_keyed_caller_cannot_rename_itself(auth: AuthConfig) -> None:
    alice = auth.caller("Bearer sk-alice-0000000")
    assert alice is not None and alice.named("mallory", "eve") is alice


def test_without_keys_a_caller_is_named_by_itself_for_fairness_only() -> None:
    open_ = AuthConfig().caller(None)
    assert open_ is not None and open_.name == ANONYMOUS and open_.may_use("anything")
    assert open_.named(None, "user-7").name == "user-7"
    assert open_.named("header", "user-7").name == "header"  # the header first
    assert open_.named("bad name!", 42, "x" * 65).name == ANONYMOUS  # not a client name
    assert not open_.named("user-7").keyed


def test_admin_keys_carry_their_scopes(auth: AuthConfig) -> None:
    assert auth.admin_scopes("Bearer sk-root-00000000") == (frozenset(Scope), "admin_keys[0]")
    assert auth.admin_scopes("Bearer sk-grafana-0000") == (frozenset({Scope.READ}), "grafana")
    scopes, _ = auth.admin_scopes("Bearer sk-plain-admin-0000") or (None, None)
    assert scopes == {Scope.READ, Scope.OPERATE}
    assert auth.admin_scopes("Bearer sk-alice-0000000") is None  # a client key is not admin
    assert AuthConfig().admin_scopes(None) == (frozenset(Scope), "open")


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/api/services", Scope.READ),
        ("GET", "/api/usage", Scope.READ),
        ("GET", "/api/policy", Scope.READ),
        ("POST", "/api/services/chat/load", Scope.OPERATE),
        ("POST", "/api/maintenance/nightly/run", Scope.OPERATE),
        ("DELETE", "/api/maintenance/once", Scope.OPERATE),
        ("POST", "/api/policy", Scope.APPLY),
        ("POST", "/api/policy/rollback/3", Scope.APPLY),
    ],
)
def test_each_admin_route_needs_one_scope(method: str, path: str, scope: Scope) -> None:
    assert scope_for(method, path) is scope


def test_check_warns_of_plain_keys_and_patterns_that_match_nothing() -> None:
    server = load_policy(POLICY).server
    warnings = key_warnings(server.clients, server.admin_keys)
    assert [w.split(":")[0] for w in warnings] == ["server.clients.bob", "server.admin_keys[2]"]
    assert "key_sha256" in warnings[0]
    assert unmatched_patterns(server.clients, ["chat-small"]) == [
        "server.clients.alice.models: 'sdxl' matches no model of this policy"
    ]


def test_a_caller_repr_holds_no_key(auth: AuthConfig) -> None:
    assert "sk-" not in repr(auth) and "sk-" not in repr(Caller("x"))


# --- what an answer says it used --------------------------------------------------------


def test_tokens_are_read_from_the_last_usage_object() -> None:
    body = (
        b'{"choices":[{"message":{"content":"\\"usage\\" is a word"}}],'
        b'"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'
    )
    assert tokens_in(body) == AnswerUsage(tokens_in=7, tokens_out=3)
    anthropic = b'{"type":"message","usage":{"input_tokens":12,"output_tokens":4}}'
    assert tokens_in(anthropic) == AnswerUsage(tokens_in=12, tokens_out=4)
    events = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert tokens_in(events) == AnswerUsage(tokens_in=5, tokens_out=2)
    assert tokens_in(b'{"data":[{"embedding":[0.1]}]}') is None
    assert tokens_in(b'{"usage": "none"}') is None
    assert tokens_in(b'{"usage": {"prompt_tokens": 3') is None  # cut short


def test_images_are_counted_from_an_image_answer() -> None:
    body = b'{"created":1,"data":[{"b64_json":"AAAA"},{"b64_json":"BBBB"}]}'
    assert answer_usage("images", body, "application/json") == AnswerUsage(images=2)
    assert answer_usage("images", b"not json", "application/json") is None


def wav(seconds: float, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


def test_audio_seconds_come_from_a_wav_or_a_transcription() -> None:
    assert answer_usage("audio", wav(1.5), "audio/wav") == AnswerUsage(audio_s=1.5)
    streamed = bytearray(wav(0.5))
    struct.pack_into("<I", streamed, 40, 0xFFFFFFFF)  # a streaming writer's unknown size
    assert wav_seconds(bytes(streamed)) == 0.5
    verbose = b'{"text":"hi","duration":3.25}'
    assert answer_usage("audio", verbose, "application/json") == AnswerUsage(audio_s=3.25)
    assert answer_usage("audio", b'{"text":"hi"}', "application/json") is None
    assert wav_seconds(b"RIFF\0\0\0\0WAVEjunk") is None


# --- usage, counted and stored ------------------------------------------------------------


def test_usage_is_counted_per_client_and_stored_per_hour(tmp_path: Path) -> None:
    now = [7200.0 + 10]
    book = UsageBook(lambda: now[0])
    book.count("alice", "chat", "ok", runtime_s=1.5, usage=AnswerUsage(10, 4))
    book.count("alice", "chat", "queue_full")
    now[0] = 3 * 3600.0 + 5  # the next hour
    book.count("alice", "chat", "http_500", runtime_s=0.5)
    book.count("walk-in", "chat", "ok")
    assert book.of_clients(["alice"])[("alice", "chat")].requests == 3
    assert ("walk-in", "chat") not in book.of_clients(["alice"])
    pending = book.take()
    assert sorted(pending) == [(7200.0, "alice", "chat"), (10800.0, "alice", "chat"),
                               (10800.0, "walk-in", "chat")]  # fmt: skip
    assert book.take() == {}  # taken once
    store = open_store(tmp_path / "vramd.db")
    try:
        rows = [
            {"hour": h, "client": c, "service": s, **u.row()} for (h, c, s), u in pending.items()
        ]
        with store.session() as session:
            queries.add_usage(session, rows=rows)
            queries.add_usage(session, rows=rows[:1])  # added to, not replaced
        with store.read() as session:
            summed = queries.usage_since(session, since=7200.0 + 1800, client="alice")
    finally:
        store.close()
    assert summed == [
        {
            "client": "alice", "service": "chat", "requests": 5, "errors": 3,
            "errors_by_code": {"http_500": 1, "queue_full": 2}, "tokens_in": 20,
            "tokens_out": 8, "runtime_s": 3.5, "images": 0, "audio_s": 0.0,
        }
    ]  # fmt: skip


def test_metrics_show_each_clients_use() -> None:
    book = UsageBook(lambda: 0.0)
    book.count("alice", "chat", "ok", runtime_s=2.0, usage=AnswerUsage(5, 7))
    book.count("alice", "chat", "queue_full")
    names = {(m.name, tuple(s.labels.values()), s.value) for m in client_families(book.totals)
             for s in m.samples}  # fmt: skip
    assert ("vramd_client_requests", ("alice", "chat"), 2) in names
    assert ("vramd_client_errors", ("alice", "chat", "queue_full"), 1) in names
    assert ("vramd_client_tokens", ("alice", "chat", "out"), 7) in names
    assert ("vramd_client_runtime_seconds", ("alice", "chat"), 2.0) in names


def test_scoped_admin_keys_dump_and_diff_without_serializer_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic warns when a union member is misread
        old, new = load_policy(POLICY), load_policy(POLICY.replace("grafana", "metrics"))
        dumped = new.server.model_dump(mode="json")["admin_keys"]
        diff = diff_policies(old, new)
    assert dumped[0] == "sk-root-00000000" and dumped[1]["name"] == "metrics"
    assert "~ server.admin_keys" in diff.lines()
    assert "sk-" not in " ".join(diff.lines())  # the diff names keys' places, not keys


def explanation(message: str, **fields: object) -> Explanation:
    return Explanation.model_validate(
        {
            "service": "img",
            "verdict": "loaded",
            "message": message,
            "need_bytes": 1,
            "device": 0,
            "devices": [0],
            "available_bytes": {},
            "victims": [],
            "holders": [],
            "behind": None,
            "waiting_by_client": {},
            "in_flight_by_client": {},
            **fields,
        }
    )


def test_explain_prints_who_waits_and_who_is_served_by_client() -> None:
    answer = explanation(
        "img is ready on device 0, charged 1GiB",
        waiting_by_client={"alice": 12, "bob": 1},
        in_flight_by_client={"alice": 2},
    )
    assert list(admission_lines(answer)) == [
        "img is ready on device 0, charged 1GiB",
        "  waiting, by client: alice 12, bob 1",
        "  in flight, by client: alice 2",
    ]
    assert list(admission_lines(explanation("m"))) == ["m"]
