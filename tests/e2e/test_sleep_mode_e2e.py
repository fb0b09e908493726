"""vLLM-style sleep mode on a live daemon: evictions sleep, requests wake, no reloads.

The demo runtime's ``--sleep-mode`` answers vLLM's dev-mode routes (``/sleep``,
``/wake_up``, ``/is_sleeping``) and really gives its memory back while asleep.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon

from service.errors import PolicyError
from service.policy import load_policy

MiB = 2**20


def sleeper(model: str, *extra: str) -> dict[str, object]:
    return {
        "kind": "chat",
        "models": [model],
        "adapter": "vllm",
        "sleep": True,
        "command": demo_command("120MiB", "--sleep-mode", *extra),
        "memory": {"estimate": "150MiB"},
        "stop_timeout": "2s",
    }


def ask(daemon: Daemon, model: str) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )


def test_eviction_sleeps_and_a_request_wakes(tmp_path: Path) -> None:
    policy = policy_yaml(
        {"a": sleeper("m-a"), "b": sleeper("m-b")}, budget="250MiB", sample_interval="0.1s"
    )
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        assert ask(daemon, "m-a").status_code == 200
        a_pid = daemon.service("a")["pid"]
        assert ask(daemon, "m-b").status_code == 200  # 150 + 150 > 234: "a" must make room
        a = daemon.service("a")
        assert a["state"] == "sleeping" and a["pid"] == a_pid  # asleep, not stopped
        daemon.wait_for(lambda: daemon.service("a")["footprint_bytes"] < 60 * MiB)
        assert [e for e in daemon.events(kind="sleep") if e["service"] == "a"]

        b_pid = daemon.service("b")["pid"]
        woken = ask(daemon, "m-a")  # wakes "a" (and puts "b" to sleep for room)
        assert woken.status_code == 200
        assert woken.headers["x-vramd-cold-start"] == "1"
        assert daemon.service("a")["pid"] == a_pid  # the same process: woken, not reloaded
        assert daemon.service("a")["state"] == "ready"
        assert daemon.service("b")["state"] == "sleeping" and daemon.service("b")["pid"] == b_pid
        assert [e for e in daemon.events(kind="wake") if e["service"] == "a"]
        loads = [e for e in daemon.events(kind="load") if e["service"] == "a"]
        assert len(loads) == 1  # one spawn in all: the wake was no load

        # An operator unload of a sleeper stops its process for good.
        assert daemon.post("/api/services/b/unload").json()["state"] == "stopped"
        assert daemon.service("b")["pid"] is None


def test_a_sleep_that_frees_nothing_is_undone_and_the_runtime_stopped(tmp_path: Path) -> None:
    # vLLM's CPU build answers /sleep with success and keeps every byte.
    policy = policy_yaml(
        {"a": sleeper("m-a", "--sleep-keeps-memory"), "b": sleeper("m-b")},
        budget="250MiB",
        sample_interval="0.1s",
    )
    settle = {"VRAMD_SETTLE_TIMEOUT": "2"}
    with running_daemon(policy, tmp_path, in_thread=True, env=settle) as daemon:
        for _ in range(2):  # the second eviction of "a" stops it without trying a sleep
            assert ask(daemon, "m-a").status_code == 200
            assert ask(daemon, "m-b").status_code == 200  # "a" must make room
            assert daemon.service("a")["state"] == "stopped"
            assert daemon.service("a")["pid"] is None
        failed = [e for e in daemon.events(kind="sleep-failed") if e["service"] == "a"]
        assert len(failed) == 1
        assert "did not drop" in failed[0]["message"]
        assert not [e for e in daemon.events(kind="sleep") if e["service"] == "a"]


def test_sleep_needs_a_runtime_with_a_sleep_mode() -> None:
    text = """\
version: 1
services:
  chat:
    kind: chat
    models: [m]
    command: [llama-server, --port, "${PORT}"]
    memory: {estimate: 1GiB}
    sleep: true
"""
    with pytest.raises(PolicyError) as info:
        load_policy(text)
    assert info.value.issues[0].path == "services.chat.sleep"
    assert "adapter: vllm" in info.value.issues[0].message
