"""The client commands (``vramd ps``, ``load`` ...) as real processes against a real daemon.

One daemon serves the module (a pinned ``demo`` and an on-demand ``side``); each test
leaves its services and windows as it found them. The admin-key tests start their own.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli import VRAMD, Ran, cli_env
from support.cli import vramd as run_cli
from support.cli import vramd_process as run_cli_process
from support.daemon import REPO_ROOT, Daemon, demo_command, policy_yaml, running_daemon
from support.ports import free_port

from service.cli.admin_api import AdminClient, ApiError, DaemonUnreachable
from service.cli.client import CtrlC
from service.cli.windows import parse_at

ADMIN_KEY = "operator-key-0123"


def services(demo_priority: int = 100) -> dict[str, dict[str, Any]]:
    return {
        "demo": {
            "kind": "chat",
            "models": ["demo-chat"],
            "command": demo_command("40MiB"),
            "memory": {"estimate": "60MiB", "cap": "300MiB"},
            "residency": "pinned",
            "priority": demo_priority,
        },
        "side": {
            "kind": "embedding",
            "models": ["demo-embed"],
            "command": demo_command("30MiB"),
            "memory": {"estimate": "50MiB"},
        },
    }


def vramd(*args: str, url: str | None, **env: str) -> Ran:
    return run_cli(*args, *(["--url", url] if url else []), **env)


def vramd_process(*args: str, url: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli_process(*args, *(["--url", url] if url else []), **env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(
        policy_yaml(services()), tmp_path_factory.mktemp("vramd"), in_thread=True
    ) as daemon:
        daemon.wait_for(lambda: daemon.service("demo")["state"] == "ready")
        yield daemon


def test_client_and_windows_commands_run_as_real_processes(daemon: Daemon) -> None:
    ps = vramd_process("ps", url=daemon.url)
    assert ps.returncode == 0, ps.stderr
    assert any(line.startswith("demo ") for line in ps.stdout.splitlines()), ps.stdout
    windows = vramd_process("windows", "--json", url=daemon.url)
    assert windows.returncode == 0, windows.stderr
    assert isinstance(json.loads(windows.stdout), list)
    unreachable = vramd_process("ps", url=f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 3 and unreachable.stdout == ""


def test_ps_shows_a_table_and_json(daemon: Daemon) -> None:
    result = vramd("ps", url=daemon.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("device 0 (")
    assert "budget 584MiB" in lines[0]
    assert "SERVICE" in result.stdout and "USED / PEAK / CAP" in result.stdout
    demo = next(line for line in lines if line.startswith("demo "))
    assert "ready" in demo and "300MiB" in demo
    side = next(line for line in lines if line.startswith("side "))
    assert "stopped" in side and "~50MiB est" in side

    as_json = vramd("ps", "--json", url=daemon.url)
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    assert {s["name"]: s["state"] for s in status["services"]}["demo"] == "ready"


def test_load_and_unload_print_the_new_state(daemon: Daemon) -> None:
    loaded = vramd("load", "side", url=daemon.url)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("side: ready (pid ")
    assert daemon.service("side")["state"] == "ready"

    unloaded = vramd("unload", "side", url=daemon.url)
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout.strip() == "side: stopped"

    missing = vramd("load", "nope", url=daemon.url)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "vramd: nope: service_not_found: no service named 'nope'"


def test_apply_shows_the_diff_and_the_new_version(daemon: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(services(demo_priority=400)))
    try:
        result = vramd("apply", str(path), url=daemon.url)
        assert result.returncode == 0, result.stderr
        assert "~ service demo" in result.stdout
        assert "priority: 100 -> 400" in result.stdout
        version = daemon.get("/api/policy").json()["version"]
        assert f"applied as policy version {version}" in result.stdout
        assert daemon.service("demo")["priority"] == 400
    finally:  # leave the module's daemon on its first policy text
        daemon.post("/api/policy", content=policy_yaml(services()))


def test_apply_dry_run_changes_nothing(daemon: Daemon, tmp_path: Path) -> None:
    before = daemon.get("/api/policy").json()["version"]
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(services(demo_priority=700)))
    result = vramd("apply", str(path), "--dry-run", url=daemon.url)
    assert result.returncode == 0, result.stderr
    assert "priority: 100 -> 700" in result.stdout
    assert "dry run: nothing was changed" in result.stdout
    assert daemon.get("/api/policy").json()["version"] == before
    assert daemon.service("demo")["priority"] == 100


def test_apply_invalid_policy_prints_every_error_with_its_line(
    daemon: Daemon, tmp_path: Path
) -> None:
    text = policy_yaml(services()).replace(
        "    priority: 100\n", '    priority: 5000\n    colour: "blue"\n'
    )
    priority_line = text.splitlines().index("    priority: 5000") + 1
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    before = daemon.get("/api/policy").json()["version"]

    result = vramd("apply", str(path), url=daemon.url)

    assert result.returncode == 1
    errors = result.stderr.splitlines()
    assert f"{path}: services.demo.priority (line {priority_line}): " in errors[0]
    assert f"{path}: services.demo.colour (line {priority_line + 1}): unknown key" in errors
    assert errors[-1] == f"vramd: {path}: invalid policy (2 errors); nothing was changed"
    assert "Traceback" not in result.stderr
    assert daemon.get("/api/policy").json()["version"] == before


def test_apply_unreadable_file(daemon: Daemon, tmp_path: Path) -> None:
    result = vramd("apply", str(tmp_path / "missing.yaml"), url=daemon.url)
    assert result.returncode == 1
    assert "cannot read policy file" in result.stderr


def test_events_lists_state_changes(daemon: Daemon) -> None:
    result = vramd("events", "--service", "demo", "--kind", "state", url=daemon.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("state" in line and "demo" in line and "-> ready" in line for line in lines)
    assert all(" demo " in line for line in lines)

    last = vramd("events", "--limit", "1", url=daemon.url)
    assert len(last.stdout.splitlines()) == 1


def test_events_follow_prints_new_events_until_ctrl_c(daemon: Daemon) -> None:
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        [*VRAMD, "events", "-f", "--limit", "1", "--url", daemon.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
        env=cli_env(),
    ) as proc:
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        try:
            lines.get(timeout=20)  # the latest event: the follow has started
            start = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
            created = daemon.post(
                "/api/maintenance",
                json={"name": "follow-marker", "start": start, "duration": "1m", "restart": "none"},
            )
            assert created.status_code == 201, created.text
            seen = _wait_for_line(lines, "follow-marker")
            assert "window-added" in seen
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            daemon.delete("/api/maintenance/follow-marker")


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_ctrl_c_in_a_follow_is_a_stop_request_not_an_exception() -> None:
    # A KeyboardInterrupt could land inside the HTTP client and leave its pool locked;
    # inside CtrlC the signal only marks the stop and wakes the wait between polls.
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as ctrl_c:
        assert not ctrl_c.wait(0)
        sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
        started = time.monotonic()
        sender.start()
        assert ctrl_c.wait(30)
        sender.join()
        assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGINT) is before


def _wait_for_line(lines: queue.Queue[str], text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} within {timeout}s")


def test_windows_add_list_and_remove(daemon: Daemon) -> None:
    added = vramd(
        "windows",
        "add",
        "cli-window",
        "--at",
        "+2h",
        "--duration",
        "30m",
        "--restart",
        "demo",
        url=daemon.url,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("window cli-window added: opens ")

    listed = vramd("windows", url=daemon.url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("cli-window"))
    assert " api " in row and " 30m " in row and " demo " in row and row.rstrip().endswith("no")

    as_json = json.loads(vramd("windows", "--json", url=daemon.url).stdout)
    window = next(w for w in as_json if w["name"] == "cli-window")
    assert window["restart"] == ["demo"]
    assert window["start_at"] == pytest.approx(time.time() + 7200, abs=120)

    removed = vramd("windows", "rm", "cli-window", url=daemon.url)
    assert removed.returncode == 0, removed.stderr
    assert "cli-window" not in vramd("windows", url=daemon.url).stdout

    again = vramd("windows", "rm", "cli-window", url=daemon.url)
    assert again.returncode == 1
    assert again.stderr.startswith("vramd: cli-window: ")


def test_windows_add_rejects_a_bad_time(daemon: Daemon) -> None:
    result = vramd(
        "windows",
        "add",
        "x",
        "--at",
        "tomorrowish",
        "--duration",
        "1m",
        "--restart",
        "none",
        url=daemon.url,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("vramd: --at: expected now, +DURATION")


def test_incidents_list_and_detail(daemon: Daemon) -> None:
    listed = vramd("incidents", url=daemon.url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no incidents recorded"
    assert json.loads(vramd("incidents", "--json", url=daemon.url).stdout) == []

    missing = vramd("incidents", "999", url=daemon.url)
    assert missing.returncode == 1
    assert missing.stderr == "vramd: not_found: no incident 999\n"


def test_unreachable_daemon_exits_3_with_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = vramd("ps", url=url)
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr == (
        f"vramd: cannot reach the vramd daemon at {url} (connection refused); "
        "is it running? set --url or VRAMD_URL\n"
    )


def test_url_comes_from_the_environment() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = vramd("load", "chat", url=None, VRAMD_URL=url)
    assert result.returncode == 3
    assert url in result.stderr


def test_admin_key_is_required_when_the_policy_sets_one(tmp_path: Path) -> None:
    policy = policy_yaml(services(), extra=f'server:\n  admin_keys: ["{ADMIN_KEY}"]\n')
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        without = vramd("ps", url=daemon.url)
        assert without.returncode == 1
        assert without.stderr == "vramd: the daemon requires an admin key: set VRAMD_ADMIN_KEY\n"

        wrong = vramd("ps", url=daemon.url, VRAMD_ADMIN_KEY="not-the-key-000")
        assert wrong.returncode == 1
        assert "rejected the admin key" in wrong.stderr

        with_key = vramd("ps", url=daemon.url, VRAMD_ADMIN_KEY=ADMIN_KEY)
        assert with_key.returncode == 0, with_key.stderr
        assert "demo" in with_key.stdout


# ------------------------------------------------------------- in process


NOW = datetime(2025, 3, 10, 14, 30, 15)  # naive: local time, as datetime.now() gives


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", "now"),
        ("+30m", NOW + timedelta(minutes=30)),
        ("15:00", NOW.replace(hour=15, minute=0, second=0)),
        ("09:05", NOW.replace(hour=9, minute=5, second=0) + timedelta(days=1)),
        ("2025-03-11T02:00:00", datetime(2025, 3, 11, 2, 0)),
        ("2025-03-11T02:00:00+00:00", datetime(2025, 3, 11, 2, 0, tzinfo=UTC)),
        ("2025-03-11T02:00:00Z", datetime(2025, 3, 11, 2, 0, tzinfo=UTC)),
    ],
)
def test_parse_at(text: str, expected: str | datetime) -> None:
    if isinstance(expected, datetime):
        expected = expected.astimezone(UTC).isoformat()
    assert parse_at(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["25:00", "tomorrow", "+soon", ""])
def test_parse_at_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_at(text, now=NOW)


def test_client_reads_policy_errors_and_refusals() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/policy":
            return httpx.Response(
                422,
                json={
                    "error": {"message": "invalid policy (1 error)", "code": "invalid_policy"},
                    "errors": [{"path": "version", "line": 1, "col": 10, "message": "bad"}],
                },
            )
        if request.url.path == "/api/status":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(502, text="<html>bad gateway</html>")

    with AdminClient("http://vramd.test", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ApiError) as invalid:
            client.apply_policy("version: 2\n")
        assert invalid.value.status == 422
        assert invalid.value.code == "invalid_policy"
        assert invalid.value.errors == [{"path": "version", "line": 1, "col": 10, "message": "bad"}]
        with pytest.raises(DaemonUnreachable) as unreachable:
            client.status()
        assert unreachable.value.reason == "connection refused"
        with pytest.raises(ApiError) as proxy_error:
            client.load("chat")
        assert (proxy_error.value.status, proxy_error.value.code) == (502, "error")


def test_client_sends_the_admin_key() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"windows": []})

    transport = httpx.MockTransport(handler)
    with AdminClient("http://vramd.test", admin_key="k" * 12, transport=transport) as client:
        assert client.windows() == []
    assert seen == [f"Bearer {'k' * 12}"]
