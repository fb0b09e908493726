"""Maintenance windows on a live daemon: manual runs, one-off windows, restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
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
    "stop_timeout": "2s",
}
WINDOWS = """\
maintenance:
  windows:
    - name: nightly
      cron: "30 3 * * *"
      duration: 1s
      restart: [chat]
"""


def ready(daemon: Daemon) -> bool:
    return bool(daemon.service("chat")["state"] == "ready")


def test_manual_run_restarts_the_named_service_and_closes(tmp_path: Path) -> None:
    with running_daemon(
        policy_yaml({"chat": CHAT}, extra=WINDOWS), tmp_path, in_thread=True
    ) as daemon:
        daemon.wait_for(lambda: ready(daemon))
        pid = daemon.service("chat")["pid"]
        listed = daemon.get("/api/maintenance").json()["windows"]
        assert listed[0]["name"] == "nightly" and listed[0]["open"] is False
        assert listed[0]["next_start"] is not None
        run = daemon.post("/api/maintenance/nightly/run")
        assert run.status_code == 200 and run.json()["open"] is True
        daemon.wait_for(lambda: ready(daemon) and daemon.service("chat")["pid"] != pid)
        daemon.wait_for(lambda: not daemon.get("/api/maintenance").json()["windows"][0]["open"])
        kinds = [e["kind"] for e in daemon.events()]
        assert "window-open" in kinds and "window-close" in kinds
        stops = [
            e
            for e in daemon.events(kind="state")
            if "maintenance window nightly" in e["data"]["reason"]
        ]
        assert stops, "the restart says which window caused it"
        assert daemon.post("/api/maintenance/nope/run").status_code == 404


def test_one_off_window_is_stored_and_survives_restart(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: ready(daemon))
        response = daemon.post(
            "/api/maintenance",
            json={
                "name": "fix-chat",
                "start": "2031-01-01T03:00:00Z",
                "duration": "10m",
                "restart": ["chat"],
            },
        )
        assert response.status_code == 201, response.text
        assert response.json()["origin"] == "api"
        bad = daemon.post(
            "/api/maintenance", json={"name": "x", "duration": "1m", "restart": ["nope"]}
        )
        assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
        duplicate = daemon.post("/api/maintenance", json={"name": "fix-chat", "duration": "1m"})
        assert duplicate.status_code == 400
    second = start_daemon(tmp_path)
    try:
        names = [w["name"] for w in second.get("/api/maintenance").json()["windows"]]
        assert names == ["fix-chat"]
        assert second.delete("/api/maintenance/fix-chat").status_code == 204
        assert second.get("/api/maintenance").json()["windows"] == []
        assert second.delete("/api/maintenance/fix-chat").status_code == 404
    finally:
        stop_daemon(second)


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_one_off_window_now_restarts_at_once(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": CHAT}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: ready(daemon))
        pid = daemon.service("chat")["pid"]
        response = daemon.post(
            "/api/maintenance", json={"name": "now", "duration": "2s", "restart": ["chat"]}
        )
        assert response.status_code == 201, response.text
        daemon.wait_for(lambda: ready(daemon) and daemon.service("chat")["pid"] != pid)
        # At once: the window opened (and asked for chat's restart) within a second of
        # being added, by the daemon's own clock, not at some later check.
        [added] = daemon.events(kind="window-added")
        [opened] = daemon.events(kind="window-open")
        assert opened["data"]["restart"] == ["chat"]
        assert 0 <= opened["ts"] - added["ts"] < 1.0, (added, opened)
