"""Restarts of the daemon that keep the runtimes (docs/operations.md, "Restarts and
upgrades"), through real ``vramd serve`` processes and real demo runtimes: a runtime
outlives a killed daemon and the next one adopts it; one that no longer fits (its command
changed, its pid went to another program, it does not answer) is stopped with the reason;
an adopted runtime is supervised like any; ``--keep-runtimes`` leaves them for the next
daemon; a database from a newer vramd is refused with nothing touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
from support.daemon import Daemon, demo_command, policy_yaml, start_daemon, stop_daemon
from support.faults import alive
from support.ports import free_port

CHAT = {
    "kind": "chat",
    "models": ["m-chat"],
    "command": demo_command("60MiB"),
    "memory": {"estimate": "100MiB", "cap": "300MiB"},
    "residency": "pinned",
    "priority": 300,
    "stop_timeout": "2s",
    "restart": {"max_retries": 3, "backoff": "0.1s", "max_backoff": "0.5s"},
}
EMBED = {
    "kind": "embedding",
    "models": ["m-embed"],
    "command": demo_command("40MiB"),
    "memory": {"estimate": "80MiB"},
    "residency": "on-demand",
    "stop_timeout": "2s",
}


def ask(daemon: Daemon, model: str = "m-chat") -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return daemon.post("/v1/chat/completions", json=body, timeout=30).status_code


def loads_since_adoption(daemon: Daemon) -> list[dict[str, Any]]:
    """Loads recorded from the first adoption on (the database holds the old daemon's)."""
    since = min(e["ts"] for e in daemon.events(kind="adopted", limit=5000))
    return [e for e in daemon.events(kind="load", limit=5000) if e["ts"] >= since]


@contextmanager
def killed_daemon(workdir: Path, services: dict[str, Any]) -> Iterator[dict[str, int]]:
    """A daemon that loaded ``services`` and was killed with SIGKILL: yields each
    service's runtime pid; whatever is still alive at the end is killed."""
    (workdir / "policy.yaml").write_text(policy_yaml(services))
    first = start_daemon(workdir)
    pids: dict[str, int] = {}
    try:
        for name in services:
            if services[name].get("residency") != "pinned":
                model = services[name]["models"][0]
                body = {"model": model, "input": "x"}
                assert first.post("/v1/embeddings", json=body, timeout=30).status_code == 200
            first.wait_for(lambda n=name: first.service(n)["state"] == "ready")
            pids[name] = first.service(name)["pid"]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        first.client.close()
        yield pids
    finally:
        for pid in pids.values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def not_adopted(daemon: Daemon, pid: int) -> dict[str, Any]:
    found = [e for e in daemon.events(kind="not-adopted") if e["data"]["pid"] == pid]
    assert found, daemon.events(limit=50)
    return found[0]


def test_runtimes_outlive_a_killed_daemon_and_the_next_one_adopts_them_without_a_load(
    tmp_path: Path,
) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT, "embed": EMBED}) as pids:
        assert all(alive(pid) for pid in pids.values()), "a runtime died with its daemon"
        second = start_daemon(tmp_path)
        try:
            for name, pid in pids.items():
                second.wait_for(lambda n=name: second.service(n)["state"] == "ready")
                svc = second.service(name)
                assert svc["pid"] == pid and svc["adopted"] is True
            assert loads_since_adoption(second) == [], "the second daemon loaded nothing"
            adopted = {e["data"]["pid"] for e in second.events(kind="adopted")}
            assert adopted == set(pids.values())
            assert ask(second) == 200
            # Its output is followed from the same files: the request's log line is there.
            second.wait_for(
                lambda: any(
                    "/v1/chat/completions" in line["text"]
                    for line in second.get("/api/services/chat/logs").json()["lines"]
                )
            )
            # Measured from the first samples on, as any instance.
            second.wait_for(lambda: second.service("chat")["footprint_bytes"] > 50 * 2**20)
            ps = subprocess.run(
                [sys.executable, "-m", "service.cli", "ps"],
                env={**os.environ, "VRAMD_URL": second.url},
                capture_output=True,
                text=True,
                check=True,
            )
            assert "ready (adopted)" in ps.stdout, ps.stdout
        finally:
            stop_daemon(second)
        assert not alive(pids["chat"]) and not alive(pids["embed"]), "SIGTERM stops adopted ones"


def test_a_runtime_whose_command_changed_while_the_daemon_was_down_is_stopped_not_adopted(
    tmp_path: Path,
) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT}) as pids:
        changed = dict(CHAT, command=[*demo_command("60MiB"), "--chunks", "2"])
        (tmp_path / "policy.yaml").write_text(policy_yaml({"chat": changed}))
        second = start_daemon(tmp_path)
        try:
            assert not alive(pids["chat"]), "stopped before the new daemon serves"
            event = not_adopted(second, pids["chat"])
            assert "command" in event["data"]["why"] and event["data"]["reaped"] is True
            second.wait_for(lambda: second.service("chat")["state"] == "ready")
            assert second.service("chat")["pid"] != pids["chat"]
            assert second.service("chat")["adopted"] is False
        finally:
            stop_daemon(second)


def test_a_recorded_pid_that_now_belongs_to_another_program_is_left_alone(
    tmp_path: Path,
) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT}) as pids:
        os.killpg(pids["chat"], signal.SIGKILL)
        stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            with sqlite3.connect(tmp_path / "vramd.db") as db:
                db.execute(
                    "update instances set pid = ?, pgid = ? where pid = ?",
                    (stranger.pid, stranger.pid, pids["chat"]),
                )
            db.close()
            second = start_daemon(tmp_path)
            try:
                event = not_adopted(second, stranger.pid)
                assert "another program" in event["data"]["why"]
                assert event["data"]["reaped"] is False
                assert stranger.poll() is None, "a stranger with a recycled pid is never signalled"
                second.wait_for(lambda: second.service("chat")["state"] == "ready")
            finally:
                stop_daemon(second)
        finally:
            stranger.kill()
            stranger.wait()


def test_a_runtime_that_does_not_answer_its_health_check_is_stopped_not_adopted(
    tmp_path: Path,
) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT}) as pids:
        os.kill(pids["chat"], signal.SIGSTOP)  # alive, the same process, silent
        second = start_daemon(tmp_path)
        try:
            event = not_adopted(second, pids["chat"])
            assert "health" in event["data"]["why"] and event["data"]["reaped"] is True
            assert not alive(pids["chat"])
            second.wait_for(lambda: second.service("chat")["state"] == "ready")
        finally:
            stop_daemon(second)


def test_an_adopted_runtime_that_dies_is_restarted_like_any(tmp_path: Path) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT}) as pids:
        second = start_daemon(tmp_path)
        try:
            second.wait_for(lambda: second.service("chat")["adopted"] is True)
            os.killpg(pids["chat"], signal.SIGKILL)
            second.wait_for(
                lambda: (
                    second.service("chat")["state"] == "ready"
                    and second.service("chat")["pid"] not in (None, pids["chat"])
                )
            )
            states = [e["data"]["to"] for e in second.events(service="chat", kind="state")]
            assert "backoff" in states, states
            assert second.service("chat")["adopted"] is False
            assert ask(second) == 200
        finally:
            stop_daemon(second)


def test_keep_runtimes_leaves_them_running_for_the_next_daemon(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(policy_yaml({"chat": CHAT}))
    first = start_daemon(tmp_path, args=["--keep-runtimes"])
    first.wait_for(lambda: first.service("chat")["state"] == "ready")
    pid = first.service("chat")["pid"]
    try:
        first.proc.send_signal(signal.SIGTERM)  # not stop_daemon: it kills the tree
        assert first.proc.wait(20) in (0, -signal.SIGTERM)
        first.client.close()
        assert alive(pid), "--keep-runtimes leaves the ready runtime running"
        assert "left running: chat" in first.output()
        second = start_daemon(tmp_path)
        try:
            second.wait_for(lambda: second.service("chat")["state"] == "ready")
            assert second.service("chat")["pid"] == pid and second.service("chat")["adopted"]
            assert ask(second) == 200
        finally:
            stop_daemon(second)
        assert not alive(pid), "a plain SIGTERM stops it"
    finally:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_a_database_from_a_newer_vramd_is_refused_and_nothing_is_touched(
    tmp_path: Path,
) -> None:
    with killed_daemon(tmp_path, {"chat": CHAT}) as pids:
        with sqlite3.connect(tmp_path / "vramd.db") as db:
            db.execute("update alembic_version set version_num = '9999'")
        db.close()
        refused = start_daemon(tmp_path, ready=False)
        code = refused.proc.wait(30)
        refused.client.close()
        assert code == 1
        assert "newer vramd" in refused.output() and "downgrade" in refused.output()
        assert alive(pids["chat"]), "a refused start touches no runtime"
        with sqlite3.connect(tmp_path / "vramd.db") as db:
            assert db.execute("select version_num from alembic_version").fetchall() == [("9999",)]
            live = db.execute("select count(*) from instances where stopped_at is null").fetchone()
        db.close()
        assert live == (1,), "its rows are as the dead daemon left them"


def test_replace_under_streaming_traffic_fails_no_request_adopts_all_and_loads_nothing(
    tmp_path: Path,
) -> None:
    chunks = ("--chunks", "8", "--chunk-delay-ms", "30")
    streamed = dict(CHAT, command=[*demo_command("60MiB"), *chunks])
    # A model name whose policy sets fields: the body sent on differs from the client's,
    # and a request relayed after the hand-over must carry the client's own.
    streamed["models"] = ["m-chat", "m-chat-hot"]
    streamed["set_params"] = {"m-chat-hot": {"temperature": 1.5}}
    ollama_port = free_port()
    (tmp_path / "policy.yaml").write_text(
        policy_yaml(
            {"chat": streamed, "embed": dict(EMBED, residency="pinned")},
            extra=f"server:\n  ollama:\n    port: {ollama_port}\n",
        )
    )
    old = start_daemon(tmp_path)
    new: Daemon | None = None
    failures: list[str] = []
    done = threading.Event()
    counts = {"ok": 0}

    def client(kind: str) -> None:
        with httpx.Client(base_url=old.url, timeout=30) as http:
            while not done.is_set():
                try:
                    if kind == "ollama":
                        body = {"model": "m-chat-hot", "stream": False,
                                "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                        r = http.post(f"http://127.0.0.1:{ollama_port}/api/chat", json=body)
                        ok = r.status_code == 200 and r.json()["done"] is True
                    elif kind == "embed":
                        body = {"model": "m-embed", "input": "x"}
                        r = http.post("/v1/embeddings", json=body)
                        ok = r.status_code == 200
                    else:
                        body = {"model": "m-chat", "messages": [{"role": "user", "content": "hi"}],
                                "stream": kind == "stream"}  # fmt: skip
                        r = http.post("/v1/chat/completions", json=body)
                        ok = r.status_code == 200 and (kind != "stream" or "[DONE]" in r.text)
                    if not ok:
                        failures.append(f"{kind}: {r.status_code} {r.text[:200]}")
                    else:
                        counts["ok"] += 1
                except httpx.HTTPError as exc:
                    failures.append(f"{kind}: {exc!r}")

    try:
        for name in ("chat", "embed"):
            old.wait_for(lambda n=name: old.service(n)["state"] == "ready")
        pids = {name: old.service(name)["pid"] for name in ("chat", "embed")}
        threads = [
            threading.Thread(target=client, args=(kind,))
            for kind in ("stream", "stream", "stream", "chat", "ollama", "embed", "embed", "embed")
        ]
        for thread in threads:
            thread.start()
        old.wait_for(lambda: counts["ok"] > 20)
        new = start_daemon(tmp_path, port=old.port, args=["--replace"], ready=False)
        assert old.proc.wait(30) == 0, old.output()[-3000:]
        served_before = counts["ok"]
        new.wait_for(lambda: counts["ok"] > served_before + 20)
        done.set()
        for thread in threads:
            thread.join(30)
        assert failures == [], failures[:5]
        for name, pid in pids.items():
            assert new.service(name)["pid"] == pid and new.service(name)["adopted"]
        assert loads_since_adoption(new) == [], "the new daemon loaded nothing"
        assert "took over from pid" in new.output()
    finally:
        done.set()
        if new is not None:
            stop_daemon(new)
        if old.proc.poll() is None:
            stop_daemon(old)
        else:
            old.client.close()
        for pid in psutil.pids():
            with contextlib.suppress(psutil.Error):
                if "service.demo_runtime" in " ".join(psutil.Process(pid).cmdline()) and str(
                    tmp_path
                ) in " ".join(psutil.Process(pid).environ().values()):
                    os.kill(pid, signal.SIGKILL)


def test_sigusr2_starts_a_successor_that_takes_over_and_tells_systemd_it_is_the_main_pid(
    tmp_path: Path,
) -> None:
    """The path ``systemctl reload vramd`` takes: the unit sends SIGUSR2, the daemon starts
    ``vramd serve --replace`` with its own arguments, and the new process announces itself
    on $NOTIFY_SOCKET (a datagram socket of the test's, standing in for systemd's)."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    (tmp_path / "policy.yaml").write_text(policy_yaml({"chat": CHAT}))
    old = start_daemon(tmp_path, env={"NOTIFY_SOCKET": str(tmp_path / "notify")})
    successor: psutil.Process | None = None
    try:
        assert notify.recv(4096) == b"READY=1"
        old.wait_for(lambda: old.service("chat")["state"] == "ready")
        pid = old.service("chat")["pid"]
        old.proc.send_signal(signal.SIGUSR2)
        message = notify.recv(4096).decode()
        fields = dict(line.split("=", 1) for line in message.splitlines())
        assert fields["READY"] == "1"
        successor = psutil.Process(int(fields["MAINPID"]))
        assert "--replace" in successor.cmdline()
        assert old.proc.wait(30) == 0
        old.client.close()
        with httpx.Client(base_url=old.url) as http:
            chat = next(s for s in http.get("/api/services").json() if s["name"] == "chat")
            assert chat["pid"] == pid and chat["adopted"] is True
            body = {"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]}
            assert http.post("/v1/chat/completions", json=body, timeout=30).status_code == 200
    finally:
        notify.close()
        if old.proc.poll() is None:
            stop_daemon(old)
        if successor is not None and successor.is_running():
            successor.terminate()
            successor.wait(30)
        assert not alive(pid), "the successor's SIGTERM stops the runtime it adopted"
