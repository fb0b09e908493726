"""Security defaults (docs/operations.md) on a live daemon, and the key check itself.

Loopback unless both key sets are set; the two key sets open different doors; keys are
compared in constant time and never written to a log line or an event; a runtime's
command line never meets a shell; a runtime inherits none of the daemon's secrets.
The in-process auth tests (``tests/unit/test_proxy.py``) cover each route's 401; these cover
what only a real daemon shows: sockets, log files, process environments.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import policy_yaml, running_daemon, start_daemon, stop_daemon
from support.faults import demo_service, listening, no_leftovers, serve_until_exit

from service.api.auth import AuthConfig
from service.supervisor.environment import INHERITED

API_KEY = "sk-inference-7c1d2a9f0b3e4d5a"
ADMIN_KEY = "sk-admin-5e8f7a6b4c3d2e1f"
WRONG_KEY = "sk-wrong-0a1b2c3d4e5f6a7b"
NEW_API_KEY = "sk-rotated-9f8e7d6c5b4a3f2e"
KEYS = f"server:\n  api_keys: [{API_KEY}]\n  admin_keys: [{ADMIN_KEY}]\n"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    with no_leftovers(tmp_path):
        yield tmp_path


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- where it listens ---------------------------------------------------------------------


def test_listens_on_loopback_by_default(workdir: Path) -> None:
    services = {"chat": demo_service(workdir, ["m-chat"])}
    with running_daemon(policy_yaml(services), workdir) as daemon:
        sockets = listening(daemon.proc.pid)
        assert sockets, "the daemon listens somewhere"
        assert {s.laddr.ip for s in sockets} == {"127.0.0.1"}


@pytest.mark.parametrize(
    ("host", "keys"),
    [
        ("0.0.0.0", ""),
        ("::", ""),
        ("0.0.0.0", f"server:\n  api_keys: [{API_KEY}]\n"),
        ("0.0.0.0", f"server:\n  admin_keys: [{ADMIN_KEY}]\n"),
    ],
    ids=["no-keys", "ipv6-any", "api-keys-only", "admin-keys-only"],
)
def test_refuses_to_listen_elsewhere_without_both_key_sets(
    workdir: Path, host: str, keys: str
) -> None:
    (workdir / "policy.yaml").write_text(policy_yaml({}, extra=keys))
    code, output = serve_until_exit(workdir, db=workdir / "vramd.db", env={"VRAMD_HOST": host})
    assert code == 1
    assert f"refusing to listen on {host}" in output
    assert "server.admin_keys must both be set" in output
    assert "Traceback" not in output
    assert not (workdir / "vramd.db").exists(), "refused before touching anything"


def test_listens_elsewhere_with_both_key_sets_and_keeps_them(workdir: Path) -> None:
    (workdir / "policy.yaml").write_text(policy_yaml({}, extra=KEYS))
    daemon = start_daemon(workdir, env={"VRAMD_HOST": "0.0.0.0"})
    try:
        assert {s.laddr.ip for s in listening(daemon.proc.pid)} == {"0.0.0.0"}
        assert daemon.get("/api/status").status_code == 401
        assert daemon.get("/api/status", headers=bearer(ADMIN_KEY)).status_code == 200
        # A policy that drops the keys would open the API to the network: refused whole.
        applied = daemon.post("/api/policy", content=policy_yaml({}), headers=bearer(ADMIN_KEY))
        assert applied.status_code == 422, applied.text
        assert daemon.get("/api/status").status_code == 401
    finally:
        stop_daemon(daemon)


# --- the keys -------------------------------------------------------------------------------


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured key is compared, always, as equal-length digests.

    Timing a comparison is too noisy to test on a shared two-core machine; what makes it
    constant-time is checkable instead: ``hmac.compare_digest`` on fixed-length values,
    and no early exit when one key matches.
    """
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = ("sk-first-key-00000000", API_KEY, "sk-last-key-111111111111111111111")
    config = AuthConfig(api_keys=keys, admin_keys=(ADMIN_KEY,))
    presented = [keys[0], keys[2], "x", WRONG_KEY, "y" * 4096, ADMIN_KEY]
    for token in presented:
        calls.clear()
        allowed = config.api_allows(f"Bearer {token}")
        assert allowed is (token in keys)
        assert len(calls) == len(keys), f"{len(calls)} comparisons for {token[:8]}..."
        assert {(len(a), len(b)) for a, b in calls} == {(32, 32)}
    calls.clear()
    assert not config.admin_allows(f"Bearer {API_KEY}")  # the sets are separate
    assert len(calls) == 1
    assert API_KEY not in repr(config) and ADMIN_KEY not in repr(config)


def test_no_key_or_authorization_header_reaches_a_log_or_an_event(workdir: Path) -> None:
    services = {
        "chat": demo_service(workdir, ["m-chat"], residency="pinned"),
        "embed": demo_service(workdir, ["m-embed"], kind="embedding"),
    }
    env = {"VRAMD_LOG_LEVEL": "debug"}
    with running_daemon(policy_yaml(services, extra=KEYS), workdir, env=env) as daemon:
        daemon.wait_for(lambda: daemon.get("/healthz").json()["services"]["chat"] == "ready")
        v1 = f"{daemon.url}/v1"
        chat = {"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]}
        # Each key opens its own door only.
        assert httpx.post(f"{v1}/chat/completions", json=chat, headers=bearer(API_KEY)).is_success
        for headers in (bearer(ADMIN_KEY), bearer(WRONG_KEY), {"Authorization": WRONG_KEY}):
            refused = httpx.post(f"{v1}/chat/completions", json=chat, headers=headers)
            assert refused.status_code == 401
        streamed = httpx.post(
            f"{v1}/chat/completions", json={**chat, "stream": True}, headers=bearer(API_KEY)
        )
        assert streamed.is_success
        cold = httpx.post(
            f"{v1}/embeddings", json={"model": "m-embed", "input": "x"}, headers=bearer(API_KEY)
        )
        assert cold.is_success and cold.headers["x-vramd-cold-start"] == "1"
        for key in (API_KEY, WRONG_KEY):
            assert daemon.get("/api/services", headers=bearer(key)).status_code == 401
        assert daemon.get("/healthz", headers=bearer(WRONG_KEY)).status_code == 200
        # Keys rotated through the API: the change is an event, the keys are not in it.
        rotated = policy_yaml(services, extra=KEYS.replace(API_KEY, NEW_API_KEY))
        applied = daemon.post("/api/policy", content=rotated, headers=bearer(ADMIN_KEY))
        assert applied.status_code == 200 and applied.json()["changed"], applied.text
        old = httpx.post(f"{v1}/chat/completions", json=chat, headers=bearer(API_KEY))
        assert old.status_code == 401
        admin = bearer(ADMIN_KEY)
        events = daemon.get("/api/events", params={"limit": 5000}, headers=admin).json()
        runtime_logs = [
            daemon.get(f"/api/services/{name}/logs", params={"tail": 10000}, headers=admin).json()
            for name in services
        ]
        log_text = daemon.output()
        with sqlite3.connect(daemon.db) as db:
            event_rows = db.execute("select kind, message, data from events").fetchall()
        db.close()

    assert "policy version" in json.dumps(events), "the rotation is recorded"
    places = {
        "daemon log": log_text,
        "events API": json.dumps(events),
        "events table": json.dumps(event_rows),
        "runtime logs": json.dumps(runtime_logs),
    }
    for place, text in places.items():
        for secret in (API_KEY, ADMIN_KEY, WRONG_KEY, NEW_API_KEY):
            assert secret not in text, f"{secret[:6]}... found in the {place}"
        assert "authorization:" not in text.lower(), f"an Authorization header in the {place}"
        assert "bearer sk-" not in text.lower(), f"a bearer token in the {place}"


# --- what a runtime gets ------------------------------------------------------------------

ARGV_PROBE = """
import json, os, sys
out, port = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    json.dump({"argv": sys.argv[1:], "env": os.environ.get("PROBE_ENV")}, f)
from service.demo_runtime import main
sys.exit(main(["--port", port, "--model", "m"]))
"""


def test_the_runtime_command_never_passes_through_a_shell(workdir: Path) -> None:
    markers = [workdir / f"pwned-{n}" for n in range(7)]
    hostile = [
        f"; touch {markers[0]}",
        f"$(touch {markers[1]})",
        f"`touch {markers[2]}`",
        f"| touch {markers[3]}",
        f"&& touch {markers[4]}",
        f"> {markers[5]}",
        f"{workdir}/*",
        "$HOME ~ 'single' \"double\" \\back",
        "two  spaces\tand a tab\nand a newline",
        "",
    ]
    out = workdir / "argv.json"
    spec = demo_service(workdir, ["m"], residency="pinned")
    spec["command"] = ["${PYTHON}", "-c", ARGV_PROBE, str(out), "${PORT}", *hostile]
    spec["env"] = {"PROBE_ENV": f"$(touch {markers[6]}); ${{SERVICE}}"}
    with running_daemon(policy_yaml({"probe": spec}), workdir) as daemon:
        daemon.wait_for(lambda: daemon.service("probe")["state"] == "ready")
        seen = json.loads(out.read_text())
        port = str(daemon.service("probe")["port"])
    assert seen["argv"] == [str(out), port, *hostile], "every argument arrives as written"
    assert seen["env"] == f"$(touch {markers[6]}); probe", "placeholders only, no expansion"
    assert not [m.name for m in markers if m.exists()]


def test_a_runtime_inherits_none_of_the_daemons_secrets(workdir: Path) -> None:
    secrets = {
        "VRAMD_ADMIN_KEY": ADMIN_KEY,
        "VRAMD_LOG_LEVEL": "info",
        "OPENAI_API_KEY": "sk-daemon-env-openai-000000",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-111111111111",
        "HF_TOKEN": "hf_secret_2222222222222",
    }
    services = {"chat": demo_service(workdir, ["m-chat"], residency="pinned", env={"MINE": "1"})}
    with running_daemon(policy_yaml(services, extra=KEYS), workdir, env=secrets) as daemon:
        daemon.wait_for(lambda: daemon.get("/healthz").json()["services"]["chat"] == "ready")
        [pid] = daemon.runtime_pids()
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    names = {entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry}
    assert "PATH" in names and "MINE" in names
    assert names <= set(INHERITED) | {"MINE"}, names - set(INHERITED)
    for value in [*secrets.values(), API_KEY]:
        if value != "info":
            assert value.encode() not in raw
