"""Applying policies to a live daemon: diff, versions, rollback, SIGHUP, no partial change."""

from __future__ import annotations

import signal
from pathlib import Path

from support.daemon import (
    Daemon,
    demo_command,
    policy_yaml,
    running_daemon,
    start_daemon,
    stop_daemon,
)

CHAT = {
    "kind": "chat",
    "models": ["m-chat"],
    "command": demo_command("40MiB"),
    "memory": {"estimate": "80MiB"},
    "residency": "pinned",
    "priority": 300,
    "stop_timeout": "2s",
}
EMBED = {
    "kind": "embedding",
    "models": ["m-embed"],
    "command": demo_command("30MiB"),
    "memory": {"estimate": "70MiB"},
    "residency": "pinned",
    "priority": 200,
    "stop_timeout": "2s",
}


def ready(daemon: Daemon, name: str) -> bool:
    return bool(daemon.service(name)["state"] == "ready")


def apply(daemon: Daemon, text: str, **params: str) -> dict[str, object]:
    response = daemon.post("/api/policy", content=text, params=params)
    assert response.status_code == 200, response.text
    data: dict[str, object] = response.json()
    return data


def test_priority_change_applies_in_place_and_rolls_back(tmp_path: Path) -> None:
    original = policy_yaml({"chat": CHAT})
    with running_daemon(original, tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: ready(daemon, "chat"))
        pid = daemon.service("chat")["pid"]
        v1 = daemon.get("/api/policy").json()["version"]

        changed = policy_yaml({"chat": dict(CHAT, priority=350)})
        preview = apply(daemon, changed, dry_run="true")
        assert preview["version"] is None
        assert "    priority: 300 -> 350" in preview["lines"]  # type: ignore[operator]
        assert daemon.get("/api/policy").json()["version"] == v1  # a dry run changes nothing

        result = apply(daemon, changed)
        assert result["version"] == v1 + 1 and result["changed"] is True
        chat = daemon.service("chat")
        assert chat["priority"] == 350 and chat["pid"] == pid  # no restart for a priority

        again = apply(daemon, changed)
        assert again["version"] == v1 + 1 and again["changed"] is False

        history = daemon.get("/api/policy/history").json()["versions"]
        assert [v["version"] for v in history][:2] == [v1 + 1, v1]
        assert history[0]["active"] and not history[1]["active"]

        rolled = daemon.post(f"/api/policy/rollback/{v1}").json()
        assert rolled["version"] == v1 + 2
        assert daemon.get("/api/policy").json()["text"] == original
        assert daemon.service("chat")["priority"] == 300
        assert daemon.service("chat")["pid"] == pid
        assert daemon.post("/api/policy/rollback/999").status_code == 404


def test_invalid_policy_is_rejected_whole(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: ready(daemon, "chat"))
        before = daemon.get("/api/policy").json()
        bad = policy_yaml(
            {"chat": dict(CHAT, priority=5000), "embed": dict(EMBED, memory={"estimate": "x"})}
        )
        response = daemon.post("/api/policy", content=bad)
        assert response.status_code == 422
        errors = response.json()["errors"]
        paths = {e["path"] for e in errors}
        assert {"services.chat.priority", "services.embed.memory.estimate"} <= paths
        assert all(isinstance(e["line"], int) and e["message"] for e in errors)
        assert daemon.get("/api/policy").json() == before
        assert [s["name"] for s in daemon.get("/api/services").json()] == ["chat"]


def test_added_removed_and_changed_services(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: ready(daemon, "chat"))
        old_pid = daemon.service("chat")["pid"]
        # Add a pinned service and change chat's command: embed starts, chat restarts.
        new_chat = dict(CHAT, command=demo_command("41MiB"))
        result = apply(daemon, policy_yaml({"chat": new_chat, "embed": EMBED}))
        assert "+ service embed" in result["lines"]  # type: ignore[operator]
        assert "~ service chat (restarts, drained)" in result["lines"]  # type: ignore[operator]
        daemon.wait_for(lambda: ready(daemon, "embed"))
        daemon.wait_for(lambda: ready(daemon, "chat") and daemon.service("chat")["pid"] != old_pid)
        # Remove chat: it drains, stops and leaves the list.
        apply(daemon, policy_yaml({"embed": EMBED}))
        daemon.wait_for(
            lambda: [s["name"] for s in daemon.get("/api/services").json()] == ["embed"]
        )
        assert daemon.get("/api/services/chat").status_code == 404


def test_sighup_rereads_the_policy_file(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path) as daemon:
        daemon.wait_for(lambda: ready(daemon, "chat"))
        v1 = daemon.get("/api/policy").json()["version"]
        daemon.config.write_text(policy_yaml({"chat": dict(CHAT, priority=310)}))
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: daemon.get("/api/policy").json()["version"] == v1 + 1)
        assert daemon.service("chat")["priority"] == 310
        # An invalid file on SIGHUP changes nothing and says why.
        daemon.config.write_text("version: 1\nservices: [oops]\n")
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for(lambda: bool(daemon.events(kind="policy-error")))
        assert daemon.get("/api/policy").json()["version"] == v1 + 1
        assert daemon.proc.poll() is None


def test_keys_cannot_be_removed_while_listening_beyond_loopback(tmp_path: Path) -> None:
    keys = "server:\n  api_keys: [sk-inference-1]\n  admin_keys: [sk-admin-123]\n"
    (tmp_path / "policy.yaml").write_text(policy_yaml({"chat": CHAT}, extra=keys))
    daemon = start_daemon(tmp_path, host="0.0.0.0")
    try:
        admin = {"Authorization": "Bearer sk-admin-123"}
        response = daemon.post("/api/policy", content=policy_yaml({"chat": CHAT}), headers=admin)
        assert response.status_code == 422
        assert "must both stay set" in response.json()["errors"][0]["message"]
        assert daemon.get("/api/services").status_code == 401  # still guarded
    finally:
        stop_daemon(daemon)


def test_a_window_named_like_an_api_window_is_a_422_not_a_500(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path, in_thread=True) as daemon:
        made = daemon.post(
            "/api/maintenance",
            json={"name": "fix", "start": "2031-01-01T00:00:00Z", "duration": "1m"},
        )
        assert made.status_code == 201
        clash = policy_yaml(
            {"chat": CHAT},
            extra='maintenance:\n  windows:\n    - {name: fix, cron: "0 4 * * *", duration: 1h}\n',
        )
        response = daemon.post("/api/policy", content=clash)
        assert response.status_code == 422
        assert response.json()["errors"][0]["path"] == "maintenance.windows[0].name"
