"""Clients on a running daemon (docs/policy.md, "Clients and keys"; docs/api.md).

Keys scoped to models are refused on every route family with a 403 that names the client
and the model, and see only their models; admin keys open only their scopes; usage per
client equals what was sent; a key changed by an apply works at once, without a restart;
and a flood from one client does not hold another client's request behind it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli import vramd
from support.daemon import Daemon, policy_yaml, running_daemon
from support.faults import demo_service, no_leftovers
from support.ports import free_port

ALICE_KEY = "sk-alice-0123456789abcdef"
BOB_KEY = "sk-bob-fedcba9876543210"
CAROL_KEY = "sk-carol-00ff00ff00ff00ff"
READ_KEY = "sk-read-1111222233334444"
OPERATE_KEY = "sk-operate-5555666677778888"
ROOT_KEY = "sk-root-9999aaaabbbbcccc"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys(alice: str = ALICE_KEY) -> str:
    return f"""
    server:
      ollama: {{port: {{ollama}}}}
      admin_keys:
        - {ROOT_KEY}
        - {{name: dashboard, key_sha256: {sha(READ_KEY)}, scopes: [read]}}
        - {{name: ops, key_sha256: {sha(OPERATE_KEY)}, scopes: [read, operate]}}
      clients:
        alice: {{key_sha256: {sha(alice)}, models: ["chat-*"]}}
        bob: {{key_sha256: {sha(BOB_KEY)}}}
        carol: {{key: {CAROL_KEY}, models: [emb], max_concurrency: 1}}
    """


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


SERVICES = {
    "chat": {"models": ["chat-small"], "residency": "pinned"},
    # Slow enough that a second request surely meets the first one still held.
    "embed": {"models": ["emb"], "kind": "embedding", "flags": ["--latency-ms", "1500"]},
}


def policy(workdir: Path, ollama: int, alice: str = ALICE_KEY) -> str:
    services = {}
    for name, spec in SERVICES.items():
        rest = {k: v for k, v in spec.items() if k not in ("models", "kind", "flags")}
        flags = spec.get("flags", ())
        kind = spec.get("kind", "chat")
        services[name] = demo_service(workdir, spec["models"], *flags, kind=kind, **rest)
    return policy_yaml(services, extra=keys(alice).replace("{ollama}", str(ollama)))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int]]:
    workdir = tmp_path_factory.mktemp("clients")
    ollama = free_port()
    with (
        no_leftovers(workdir),
        running_daemon(policy(workdir, ollama), workdir) as daemon,  # the Ollama listener too
    ):
        daemon.wait_for(lambda: daemon.get("/healthz").json()["services"]["chat"] == "ready")
        yield daemon, ollama


CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "two words"}]}


def test_a_scoped_key_is_refused_on_every_route_family_naming_client_and_model(
    box: tuple[Daemon, int],
) -> None:
    daemon, ollama = box
    alice = bearer(ALICE_KEY)
    refusals = {
        "openai": daemon.post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers=alice),
        "anthropic": daemon.post(
            "/v1/messages",
            json={"model": "emb", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": ALICE_KEY},
        ),
        "ollama": httpx.post(
            f"http://127.0.0.1:{ollama}/api/embed", json={"model": "emb", "input": "x"},
            headers=alice,
        ),
        "upstream": daemon.get("/upstream/embed/health", headers=alice),
        "model": daemon.get("/v1/models/emb", headers=alice),
    }  # fmt: skip
    for family, answer in refusals.items():
        assert answer.status_code == 403, (family, answer.text)
        text = answer.text
        assert "alice" in text and ("emb" in text or "embed" in text), (family, text)
    assert refusals["openai"].json()["error"]["code"] == "model_not_allowed"
    assert refusals["anthropic"].json()["error"]["type"] == "permission_error"
    assert "alice" in refusals["ollama"].json()["error"]
    # An unknown model is refused the same way: a scoped key learns nothing of the rest.
    unknown = daemon.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=alice)
    assert unknown.status_code == 403
    # What the key may use works.
    assert daemon.post("/v1/chat/completions", json=CHAT, headers=alice).status_code == 200
    # The refused requests reached no runtime: the embedding service never loaded.
    assert service_of(daemon, "embed")["loads"] == 0


def test_model_lists_show_only_what_the_key_may_use(box: tuple[Daemon, int]) -> None:
    daemon, ollama = box
    listed = {
        key: [m["id"] for m in daemon.get("/v1/models", headers=bearer(key)).json()["data"]]
        for key in (ALICE_KEY, BOB_KEY, CAROL_KEY)
    }
    assert listed == {ALICE_KEY: ["chat-small"], BOB_KEY: ["chat-small", "emb"], CAROL_KEY: ["emb"]}
    tags = httpx.get(f"http://127.0.0.1:{ollama}/api/tags", headers=bearer(ALICE_KEY)).json()
    assert [m["name"] for m in tags["models"]] == ["chat-small"]
    assert daemon.get("/v1/models", headers=bearer(ROOT_KEY)).status_code == 401


def test_admin_keys_open_only_their_scopes(box: tuple[Daemon, int]) -> None:
    daemon, _ = box
    read, ops, root = bearer(READ_KEY), bearer(OPERATE_KEY), bearer(ROOT_KEY)
    text = daemon.get("/api/policy", headers=root).json()["text"]
    for path in ("/api/services", "/api/events", "/api/usage", "/api/services/chat/admission"):
        assert daemon.get(path, headers=read).status_code == 200, path
    denied = daemon.post("/api/services/embed/load", headers=read)
    assert denied.status_code == 403
    error = denied.json()["error"]
    assert error["code"] == "insufficient_scope"
    assert "'dashboard'" in error["message"] and "'operate'" in error["message"]
    assert daemon.post("/api/services/embed/unload", headers=ops).status_code == 200
    for key in (read, ops):
        refused = daemon.post("/api/policy", params={"dry_run": "true"}, content=text, headers=key)
        assert refused.status_code == 403 and "'apply'" in refused.text
    assert daemon.post("/api/policy/rollback/1", headers=ops).status_code == 403
    dry = daemon.post("/api/policy", params={"dry_run": "true"}, content=text, headers=root)
    assert dry.status_code == 200, dry.text
    assert daemon.get("/api/services", headers=bearer(ALICE_KEY)).status_code == 401


def test_usage_per_client_equals_what_was_sent(box: tuple[Daemon, int]) -> None:
    daemon, _ = box
    root = bearer(ROOT_KEY)
    before = usage_of(daemon, "bob")
    tokens_in = tokens_out = 0
    for i in range(5):
        body = {**CHAT, "messages": [{"role": "user", "content": "word " * (i + 1)}]}
        answer = daemon.post("/v1/chat/completions", json=body, headers=bearer(BOB_KEY))
        assert answer.status_code == 200, answer.text
        tokens_in += answer.json()["usage"]["prompt_tokens"]
        tokens_out += answer.json()["usage"]["completion_tokens"]
    embedded = daemon.post(
        "/v1/embeddings", json={"model": "emb", "input": "x"}, headers=bearer(BOB_KEY)
    )
    assert embedded.status_code == 200
    refused = daemon.post(
        "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=bearer(BOB_KEY)
    )
    assert refused.status_code == 404  # names no service: counted nowhere per service
    after = usage_of(daemon, "bob")
    chat = after[("bob", "chat")]
    old = before.get(("bob", "chat"), {"requests": 0, "tokens_in": 0, "tokens_out": 0})
    assert chat["requests"] - old["requests"] == 5 and chat["errors"] == 0
    assert chat["tokens_in"] - old["tokens_in"] == tokens_in > 0
    assert chat["tokens_out"] - old["tokens_out"] == tokens_out > 0
    assert chat["runtime_s"] > 0
    assert after[("bob", "embed")]["requests"] == 1
    # /metrics carries the configured clients' series.
    metrics = daemon.get("/metrics").text
    assert (
        f'vramd_client_requests_total{{client="bob",service="chat"}} {chat["requests"]}' in metrics
    )
    # vramd usage prints the same table.
    ran = vramd("usage", "--client", "bob", "--url", daemon.url, VRAMD_ADMIN_KEY=ROOT_KEY)
    assert ran.returncode == 0, ran.stderr
    assert "bob" in ran.stdout and "chat" in ran.stdout and "embed" in ran.stdout
    assert daemon.get("/api/usage", params={"since": "soon"}, headers=root).status_code == 400


def test_a_client_over_its_own_max_concurrency_gets_429_naming_it(box: tuple[Daemon, int]) -> None:
    daemon, _ = box
    carol = bearer(CAROL_KEY)
    answers: list[httpx.Response] = []

    def send() -> None:
        body = {"model": "emb", "input": "x"}
        answers.append(daemon.client.post("/v1/embeddings", json=body, headers=carol))

    first = threading.Thread(target=send)
    first.start()
    daemon.wait_for(lambda: sum(service_of(daemon, "embed")[k] for k in ("in_flight", "queued")))
    send()  # carol's second while her first is held: over her max_concurrency of 1
    first.join()
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 429], codes
    full = next(a for a in answers if a.status_code == 429)
    assert "client carol" in full.json()["error"]["message"]
    assert int(full.headers["retry-after"]) >= 1
    assert usage_of(daemon, "carol")[("carol", "embed")]["errors_by_code"].get("queue_full", 0) >= 1


def service_of(daemon: Daemon, name: str) -> dict[str, Any]:
    answer = daemon.get(f"/api/services/{name}", headers=bearer(ROOT_KEY))
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def usage_of(daemon: Daemon, client: str) -> dict[tuple[str, str], dict[str, Any]]:
    answer = daemon.get("/api/usage", params={"client": client}, headers=bearer(ROOT_KEY))
    assert answer.status_code == 200, answer.text
    return {(row["client"], row["service"]): row for row in answer.json()["usage"]}


def test_a_key_rotated_by_apply_works_at_once_and_the_old_one_stops(tmp_path: Path) -> None:
    ollama = free_port()
    with (
        no_leftovers(tmp_path),
        running_daemon(policy(tmp_path, ollama), tmp_path, in_thread=True) as daemon,
    ):
        daemon.wait_for(lambda: daemon.get("/healthz").json()["services"]["chat"] == "ready")
        assert daemon.post("/v1/chat/completions", json=CHAT, headers=bearer(ALICE_KEY)).is_success
        new_key = "sk-alice-rotated-00000000"
        applied = daemon.post(
            "/api/policy", content=policy(tmp_path, ollama, new_key), headers=bearer(ROOT_KEY)
        )
        assert applied.status_code == 200, applied.text
        old = daemon.post("/v1/chat/completions", json=CHAT, headers=bearer(ALICE_KEY))
        assert old.status_code == 401
        new = daemon.post("/v1/chat/completions", json=CHAT, headers=bearer(new_key))
        assert new.status_code == 200
        assert service_of(daemon, "chat")["loads"] == 1  # no restart of anything


def test_a_flood_from_one_client_does_not_hold_another_clients_request_behind_it(
    tmp_path: Path,
) -> None:
    """Unkeyed on loopback, clients are named by X-Vramd-Client (fairness only)."""
    service = demo_service(
        tmp_path, ["img-model"], "--latency-ms", "50", max_concurrency=1, queue={"max": 64}
    )
    flood = 30
    done: list[str] = []
    with (
        no_leftovers(tmp_path),
        running_daemon(policy_yaml({"img": service}), tmp_path, in_thread=True) as daemon,
        httpx.Client(base_url=daemon.url, timeout=60) as client,
    ):

        def send(name: str) -> None:
            body = {**CHAT, "model": "img-model"}
            answer = client.post(
                "/v1/chat/completions", json=body, headers={"X-Vramd-Client": name}
            )
            assert answer.status_code == 200, answer.text
            done.append(name)

        senders = [threading.Thread(target=send, args=("alice",)) for _ in range(flood)]
        for sender in senders:
            sender.start()
        daemon.wait_for(lambda: daemon.service("img")["queued"] >= flood - 1)
        assert set(daemon.service("img")["queued_by_client"]) == {"alice"}
        send("bob")
        # bob waited for the request in flight and at most one turn of alice's.
        assert done.index("bob") <= 2, done
        for sender in senders:
            sender.join()
        assert done.count("alice") == flood
