"""``vramd serve`` for real: a daemon subprocess supervising demo runtime subprocesses.

These are the "done when" checks of the foundation and supervision issues: the pinned
service starts and is measured, a killed runtime comes back with ``restarts`` counted
(however often it is killed), a start that keeps failing ends in ``failed`` with the
flag, ``kill -9`` of the daemon leaves nothing behind after the next start, SIGTERM
stops every runtime, and the policy is stored as a version that the same file does not
duplicate.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import psutil
from support.daemon import (
    Daemon,
    demo_command,
    policy_yaml,
    running_daemon,
    start_daemon,
    stop_daemon,
)

from service.cli.render import service_notes
from service.contract import ServiceStatus

PINNED = {
    "kind": "chat",
    "models": ["m-chat"],
    "command": demo_command("100MiB"),
    "memory": {"estimate": "140MiB", "cap": "300MiB"},
    "residency": "pinned",
    "priority": 300,
    "stop_timeout": "2s",
    "restart": {"max_retries": 3, "backoff": "0.1s", "max_backoff": "0.5s"},
}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_pinned_service_starts_and_is_measured(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": PINNED}), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 100 * 2**20)
        chat = daemon.service("chat")
        pss = sum(
            p.memory_full_info().pss
            for p in [psutil.Process(chat["pid"]), *psutil.Process(chat["pid"]).children(True)]
        )
        assert abs(chat["footprint_bytes"] - pss) / pss < 0.10
        assert chat["cap_bytes"] == 300 * 2**20
        assert chat["expected_peak_bytes"] >= 140 * 2**20
        status = daemon.get("/api/status").json()
        assert status["backend"] == "host"
        device = status["devices"][0]
        assert device["budget_bytes"] == 600 * 2**20 - 16 * 2**20
        assert device["charges"]["chat"] >= 140 * 2**20
        logs = daemon.get("/api/services/chat/logs", params={"tail": 50}).json()["lines"]
        assert any("ready" in line["text"].lower() or "GET" in line["text"] for line in logs)
        health = daemon.get("/healthz")
        assert health.status_code == 200 and health.json()["backend"] == "host"


def test_killed_runtime_comes_back_with_restarts_counted(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": PINNED}), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        first = daemon.service("chat")
        os.killpg(first["pid"], signal.SIGKILL)
        daemon.wait_for(
            lambda: (s := daemon.service("chat"))["state"] == "ready" and s["pid"] != first["pid"]
        )
        again = daemon.service("chat")
        assert again["restarts"] == first["restarts"] + 1
        kinds = [(e["kind"], e["data"].get("to")) for e in daemon.events(service="chat")]
        assert ("state", "backoff") in kinds


def caught_in_backoff(daemon: Daemon, name: str) -> dict[str, Any]:
    """The service's view taken during its backoff (which may last under a second)."""
    seen: list[dict[str, Any]] = []

    def backing_off() -> bool:
        seen.append(daemon.service(name))
        return bool(seen[-1]["state"] == "backoff")

    daemon.wait_for(backing_off)
    return seen[-1]


def test_a_runtime_killed_again_and_again_under_traffic_is_never_given_up(
    tmp_path: Path,
) -> None:
    # An on-demand service (max_retries 2) killed three times while a client keeps asking:
    # each time it comes back, it is flagged crash-looping, never failed, and a request
    # sent while it backs off waits for the next instance instead of a 502.
    chat = dict(
        PINNED,
        residency="on-demand",
        restart={"max_retries": 2, "backoff": "0.5s", "max_backoff": "1s"},
    )
    body = {"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]}
    with running_daemon(policy_yaml({"chat": chat}), tmp_path) as daemon:
        codes = []
        for _ in range(3):
            codes.append(daemon.post("/v1/chat/completions", json=body).status_code)
            pid = daemon.service("chat")["pid"]
            os.killpg(pid, signal.SIGKILL)
            backing_off = caught_in_backoff(daemon, "chat")
            during = daemon.post("/v1/chat/completions", json=body)
            assert during.status_code == 200, during.text
            assert daemon.service("chat")["pid"] not in (None, pid)
        assert codes == [200] * 3
        chat_now = daemon.service("chat")
        assert chat_now["state"] == "ready" and chat_now["restarts"] == 3
        assert "crash-looping" in chat_now["flags"]
        assert backing_off["backoff"]["cause"] == "died"
        assert backing_off["backoff"]["deaths_in_10_min"] == 3
        (note,) = service_notes([ServiceStatus.model_validate(backing_off)])
        assert note.startswith("chat: died after being ready, 3 times in 10 min (killed by")
        assert "; next start " in note
        states = [e["data"].get("to") for e in daemon.events(service="chat", kind="state")]
        assert states.count("backoff") == 3 and "failed" not in states


def test_crash_loop_ends_failed_until_loaded(tmp_path: Path) -> None:
    broken = dict(PINNED, command=demo_command("10MiB", "--fail-start"))
    with running_daemon(policy_yaml({"chat": broken}), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "failed")
        chat = daemon.service("chat")
        assert "crash-looping" in chat["flags"]
        assert "out of memory" in chat["last_error"]
        assert chat["restarts"] == 3
        # An operator's load clears the flag and tries again (and fails the same way).
        asked = max(e["id"] for e in daemon.events(service="chat", limit=5000))
        response = daemon.post("/api/services/chat/load")
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "runtime_failed"
        after = [e for e in daemon.events(service="chat", limit=5000) if e["id"] > asked]
        kinds = [e["kind"] for e in after]
        assert kinds[0] == "operator" and "flag-cleared" in kinds
        tries = [e for e in after if e["kind"] == "state" and e["data"]["to"] == "starting"]
        assert len(tries) == 4, tries  # the new try, and its restarts afresh (max_retries 3)
        again = daemon.service("chat")
        assert again["state"] == "failed" and "crash-looping" in again["flags"]


def test_sigterm_stops_every_runtime(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": PINNED}), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        runtimes = daemon.runtime_pids()
        assert runtimes
        # uvicorn re-raises the signal once its graceful shutdown is done.
        assert stop_daemon(daemon) in (0, -signal.SIGTERM)
        assert "every runtime was stopped" in daemon.output()
        assert not [pid for pid in runtimes if alive(pid)]


def test_load_unload_and_capacity(tmp_path: Path) -> None:
    services = {
        "chat": PINNED,
        "image": {
            "kind": "diffusion",
            "models": ["m-image"],
            "command": demo_command("60MiB"),
            "memory": {"estimate": "100MiB"},
            "residency": "on-demand",
            "stop_timeout": "2s",
        },
        "huge": {
            "kind": "embedding",
            "models": ["m-huge"],
            "command": demo_command("10MiB"),
            "memory": {"estimate": "2GiB"},
        },
    }
    with running_daemon(policy_yaml(services), tmp_path) as daemon:
        loaded = daemon.post("/api/services/image/load")
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["state"] == "ready"
        unloaded = daemon.post("/api/services/image/unload").json()
        assert unloaded["state"] == "stopped"
        refused = daemon.post("/api/services/huge/load")
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "insufficient_capacity"
        assert "chat" in error["message"]  # it names what holds the memory
        missing = daemon.post("/api/services/nope/load")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "service_not_found"


def test_policy_is_stored_once_per_content(tmp_path: Path) -> None:
    text = policy_yaml({"chat": PINNED})
    with running_daemon(text, tmp_path) as daemon:
        first = daemon.get("/api/policy").json()
        assert first["text"] == text and len(first["sha256"]) == 64
    with running_daemon(text, tmp_path) as daemon:
        assert daemon.get("/api/policy").json()["version"] == first["version"]
    changed = text.replace("priority: 300", "priority: 301")
    with running_daemon(changed, tmp_path) as daemon:
        assert daemon.get("/api/policy").json()["version"] == first["version"] + 1
    with sqlite3.connect(tmp_path / "vramd.db") as db:
        rows = db.execute("select priority from services where name = 'chat'").fetchall()
        assert rows == [(301,)]


def test_invalid_policy_at_startup_changes_nothing(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": PINNED}), tmp_path):
        pass
    (tmp_path / "policy.yaml").write_text(
        policy_yaml({"chat": dict(PINNED, memory={"estimate": "6GiB", "cap": "5GiB"})})
    )
    daemon = start_daemon(tmp_path, ready=False)
    try:
        assert daemon.proc.wait(20) == 1
    finally:
        stop_daemon(daemon)
    assert "services.chat.memory.cap (line" in daemon.output()
    assert "must be >= estimate (6GiB)" in daemon.output()
    with sqlite3.connect(tmp_path / "vramd.db") as db:
        assert db.execute("select count(*) from policy_versions").fetchone() == (1,)


def test_daemon_with_no_services_serves(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({}), tmp_path) as daemon:
        assert daemon.get("/healthz").json()["status"] == "ok"
        assert daemon.get("/api/services").json() == []


def test_answered_metrics_scrapes_write_no_access_line_other_requests_do(tmp_path: Path) -> None:
    """A cluster router scrapes /metrics 20 times a second: that must not flood the log."""
    with running_daemon(policy_yaml({}), tmp_path) as daemon:
        for _ in range(5):
            assert daemon.get("/metrics").status_code == 200
        assert daemon.get("/healthz").status_code == 200
        daemon.wait_for(lambda: '"GET /healthz HTTP/1.1" 200' in daemon.output())
        assert "/metrics" not in daemon.output()


def test_a_second_daemon_on_the_same_database_is_refused(tmp_path: Path) -> None:
    with running_daemon(policy_yaml({"chat": PINNED}), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        pid = daemon.service("chat")["pid"]
        second = start_daemon(tmp_path, ready=False)
        try:
            assert second.proc.wait(30) != 0
        finally:
            stop_daemon(second)
        assert "is in use by another vramd" in second.output()
        assert alive(pid), "the first daemon's runtime was not taken for an orphan"
        assert daemon.service("chat")["pid"] == pid
