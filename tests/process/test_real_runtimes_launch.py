"""``python -m service.real_runtimes exec KIND``: becomes the runtime runtimes.json names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from service.real_runtimes.catalog import RuntimeEntry, write_catalog

# The "runtime" prints its pid, its arguments and one variable of its environment.
PROGRAM = "import os, sys; print(os.getpid(), sys.argv[1:], os.environ.get('RT_VAR'))"


def run_launcher(catalog: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VRAMD_REAL_RUNTIMES": str(catalog)}
    return subprocess.run(
        [sys.executable, "-m", "service.real_runtimes", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_exec_replaces_itself_with_the_kinds_command(tmp_path: Path) -> None:
    entry = RuntimeEntry(
        adapter="openai",
        command=(sys.executable, "-c", PROGRAM, "--port", "${PORT}", "--name", "${MODEL}"),
        env={"RT_VAR": "set"},
        model="none",
        version="test",
        routes=(),
    )
    write_catalog(tmp_path, {"chat": entry})
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.real_runtimes", "exec", "chat", "--port", "8123",
         "--model", "tiny"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "VRAMD_REAL_RUNTIMES": str(tmp_path)},
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    pid, rest = out.split(" ", 1)
    # The same process: what vramd spawned is the runtime it signals and measures.
    assert int(pid) == proc.pid
    assert rest.strip() == "['--port', '8123', '--name', 'tiny'] set"


def test_exec_of_a_kind_not_installed_says_which_are(tmp_path: Path) -> None:
    entry = RuntimeEntry(adapter="openai", command=("x",), model="m", version="v", routes=())
    write_catalog(tmp_path, {"chat": entry})
    done = run_launcher(tmp_path, "exec", "vllm", "--port", "1")
    assert done.returncode == 2
    assert "no 'vllm' in runtimes.json (chat)" in done.stderr


def test_exec_without_a_catalog_says_how_to_make_one(tmp_path: Path) -> None:
    done = run_launcher(tmp_path, "exec", "chat", "--port", "1")
    assert done.returncode == 2 and "make real-runtimes" in done.stderr
