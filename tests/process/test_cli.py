"""The ``vramd`` command's daemon-free commands: check, schema, db upgrade.

Run in this process through typer's ``CliRunner`` (exit code, stdout and stderr apart);
one smoke test per command group runs ``python -m service.cli`` as a real process.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from support.cli import vramd, vramd_process
from support.daemon import REPO_ROOT

INVALID = REPO_ROOT / "tests" / "policies" / "invalid"


def test_check_and_db_upgrade_run_as_real_processes(tmp_path: Path) -> None:
    checked = vramd_process("check", "config/demo.yaml")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("config/demo.yaml: valid policy")
    invalid = vramd_process("check", str(sorted(INVALID.glob("*.yaml"))[0]))
    assert invalid.returncode == 1 and "error" in invalid.stderr
    upgraded = vramd_process("db", "upgrade", "--db", str(tmp_path / "v.db"))
    assert upgraded.returncode == 0, upgraded.stderr
    assert (tmp_path / "v.db").exists()


def test_check_accepts_every_shipped_policy() -> None:
    for path in sorted((REPO_ROOT / "config").glob("*.yaml")):
        result = vramd("check", str(path))
        assert result.returncode == 0, result.stderr
        assert "valid policy" in result.stdout


def test_check_summarises_each_service() -> None:
    result = vramd("check", "config/demo.yaml")
    lines = result.stdout.splitlines()
    assert lines[0] == "config/demo.yaml: valid policy, 4 services"
    assert any(line.startswith("  chat: chat pinned priority 300") for line in lines)
    assert any("window nightly" in line for line in lines)


def test_check_warns_that_protect_never_can_starve_the_lower_priorities(tmp_path: Path) -> None:
    text = (REPO_ROOT / "config" / "demo.yaml").read_text()
    text = text.replace("    protect: 5s ", "    protect: never ", 1)  # the image model's
    policy = tmp_path / "never.yaml"
    policy.write_text(text)
    result = vramd("check", str(policy))
    assert result.returncode == 0, result.stderr  # a choice, not an error
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: services.image.protect is never: image (on-demand, priority 100) never "
        "yields its memory to speech while it is loaded, so it can starve (wait past its "
        "queue.timeout) whenever it needs that memory; a duration lets image yield before "
        "those requests time out"
    ]
    assert not any(
        line.startswith("warning:")
        for line in vramd("check", "config/demo.yaml").stdout.splitlines()
    )


def test_check_lists_clients_and_warns_of_plain_keys_and_patterns_matching_nothing(
    tmp_path: Path,
) -> None:
    text = (REPO_ROOT / "config" / "demo.yaml").read_text()
    server = (
        "server:\n  clients:\n"
        "    kids: {key: sk-kids-laptop-01, models: [demo-chat, 'sdxl-*']}\n"
        f"    batch: {{key_sha256: {'ab' * 32}, max_concurrency: 4, share: 0.5}}\n"
    )
    policy = tmp_path / "clients.yaml"
    policy.write_text(
        text.replace("server:\n", server, 1) if "server:\n" in text else text + server
    )
    result = vramd("check", str(policy))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  client kids: models demo-chat, sdxl-*, share 1" in lines
    assert "  client batch: all models, share 0.5, max_concurrency 4" in lines
    warnings = [line for line in lines if line.startswith("warning:")]
    assert warnings[0].startswith("warning: server.clients.kids: key is written plainly")
    assert warnings[1] == (
        "warning: server.clients.kids.models: 'sdxl-*' matches no model of this policy"
    )


def test_check_prints_every_error_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\n"
        "services:\n"
        "  chat:\n"
        "    kind: chat\n"
        "    models: [a]\n"
        "    command: [x]\n"
        "    memory: {estimate: 6GiB, cap: 5GiB}\n"
        "    priority: 2000\n"
        "    colour: blue\n"
    )
    result = vramd("check", str(bad))
    assert result.returncode == 1
    err = result.stderr
    assert f"{bad}: services.chat.memory.cap (line 7, col 35): must be >= estimate (6GiB)" in err
    assert "services.chat.priority (line 8, col 15)" in err
    assert "services.chat.colour (line 9, col 5): unknown key" in err
    assert "3 errors; nothing was changed" in err


def test_check_on_every_invalid_fixture_fails() -> None:
    paths = sorted(INVALID.glob("*.yaml"))
    assert len(paths) >= 40
    for path in paths:
        result = vramd("check", str(path))
        assert result.returncode == 1, path
        assert f"{path}: " in result.stderr and "nothing was changed" in result.stderr, path
        assert result.stdout == "", path


def test_check_missing_file(tmp_path: Path) -> None:
    result = vramd("check", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "cannot read policy file" in result.stderr


def test_schema_is_json_schema() -> None:
    result = vramd("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "vramd policy"
    assert {"version", "services", "device", "maintenance"} <= set(schema["properties"])


def test_db_upgrade_creates_a_migrated_database(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "v.db"
    result = vramd("db", "upgrade", "--db", str(db))
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("select name from sqlite_master")}
        assert {"policy_versions", "services", "instances", "events"} <= tables
        assert conn.execute("pragma journal_mode").fetchone() == ("wal",)


def test_db_upgrade_on_a_non_database_fails_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    db.write_bytes(b"this is not sqlite" * 100)
    result = vramd("db", "upgrade", "--db", str(db))
    assert result.returncode == 1
    assert str(db) in result.stderr
    assert "Traceback" not in result.stderr
