"""State across swaps, end to end: a real daemon, demo runtimes taught llama.cpp's slot
API (docs/policy.md, "State across swaps").

Two services under a budget that fits one: asking one evicts the other, so every test
drives real evictions. ``chat`` keeps its slots (``state``); the demo runtime caches each
slot's prompt, saves and restores it as llama-server does, and reports ``timings``
(``cache_n``: prompt tokens taken from the cache), or misbehaves on cue
(``--slot-restore noop|error|hang``).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon

pytestmark = pytest.mark.timeout(120)

SYSTEM = " ".join(f"rule{i}" for i in range(60))  # a long shared system prompt


def chat_spec(*extra: str, **keys: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "chat",
        "models": ["chat"],
        "adapter": "llama.cpp",
        "command": demo_command(
            "150MiB", "--parallel", "2", "--slot-save-path", "${STATE_DIR}", *extra
        ),
        "memory": {"estimate": "200MiB"},
        "state": {"disk": "64MiB"},
        "protect": "0s",
        "stop_timeout": "5s",
    }
    spec.update(keys)
    return spec


OTHER = {
    "kind": "chat",
    "models": ["other"],
    "command": demo_command("150MiB"),
    "memory": {"estimate": "200MiB"},
    "protect": "0s",
    "stop_timeout": "5s",
}


WINDOW = """\
maintenance:
  windows:
    - name: nightly
      cron: "30 3 * * *"
      duration: 1s
      restart: [chat]
"""


def policy(chat: dict[str, Any]) -> str:
    return policy_yaml({"chat": chat, "other": OTHER}, budget="300MiB", extra=WINDOW)


def turn(daemon: Daemon, messages: list[dict[str, str]], model: str = "chat") -> dict[str, Any]:
    response = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": messages},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def conversation(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"{SYSTEM} {topic}"},
        {"role": "user", "content": f"tell me about {topic} " * 10},
    ]


def follow_up(messages: list[dict[str, str]], answer: dict[str, Any]) -> list[dict[str, str]]:
    said = answer["choices"][0]["message"]["content"]
    return [*messages, {"role": "assistant", "content": said}, {"role": "user", "content": "more"}]


def evict_chat(daemon: Daemon) -> None:
    turn(daemon, [{"role": "user", "content": "hi"}], model="other")
    daemon.wait_for(lambda: daemon.service("chat")["state"] == "stopped")


def kinds(daemon: Daemon, kind: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events(service="chat", limit=500) if e["kind"] == kind]


def test_an_evicted_conversation_is_restored_and_continues_from_the_cache(
    tmp_path: Path,
) -> None:
    with running_daemon(policy(chat_spec()), tmp_path, in_thread=True) as daemon:
        first = conversation("tides")
        answer = turn(daemon, first)
        evict_chat(daemon)
        (save,) = kinds(daemon, "state-save")
        assert save["data"]["tokens"] > 0 and save["data"]["bytes"] > 0
        assert "evicted" in save["data"]["reason"] or "room" in save["data"]["reason"]
        state_dir = tmp_path / "state" / "chat"
        assert (state_dir / "slot-0.bin").stat().st_size == save["data"]["bytes"]

        again = turn(daemon, follow_up(first, answer))
        # Only the new turn is processed: the rest came from the restored slot.
        assert again["timings"]["cache_n"] >= save["data"]["tokens"] * 0.9
        assert again["timings"]["prompt_n"] < again["timings"]["cache_n"] * 0.2
        (restore,) = kinds(daemon, "state-restore")
        assert restore["data"]["tokens"] == save["data"]["tokens"]
        daemon.wait_for(lambda: kinds(daemon, "state-verified") != [])
        shown = daemon.service("chat")["saved_state"]
        assert shown["restores"] == 1 and shown["tokens_not_reprocessed"] > 0
        assert shown["saved_bytes"] == save["data"]["bytes"]

        # The swap's steps are timed, a stop's and a start's.
        phases = {e["data"]["phase"]: e["data"]["steps"] for e in kinds(daemon, "swap")}
        assert {"save_ms", "stop_ms", "settle_ms"} <= set(phases["stop"])
        assert {"spawn_ms", "ready_ms", "restore_ms"} <= set(phases["start"])
        assert phases["first-byte"]["first_byte_ms"] > 0

        # A drained restart (the operator's) saves and restores as well.
        assert daemon.post("/api/services/chat/restart").status_code == 200
        daemon.wait_for(lambda: len(kinds(daemon, "state-restore")) == 2)
        third = turn(daemon, follow_up(follow_up(first, answer), again))
        assert third["timings"]["cache_n"] > again["timings"]["cache_n"]

        # So does a maintenance window's restart.
        assert daemon.post("/api/maintenance/nightly/run").status_code == 200
        daemon.wait_for(lambda: len(kinds(daemon, "state-restore")) == 3)
        assert "window" in kinds(daemon, "state-save")[-1]["data"]["reason"]
        fourth = turn(daemon, follow_up(follow_up(follow_up(first, answer), again), third))
        assert fourth["timings"]["cache_n"] > third["timings"]["cache_n"]

        metrics = daemon.get("/metrics").text
        assert 'vramd_state_saved_bytes{service="chat"}' in metrics


def test_the_runtime_is_sized_by_fit_target_unless_the_service_sets_it(tmp_path: Path) -> None:
    own = chat_spec(env={"LLAMA_ARG_FIT_TARGET": "1234"})
    other = {**OTHER, "adapter": "llama.cpp"}
    with running_daemon(
        policy_yaml({"chat": own, "other": other}, budget="300MiB"), tmp_path, in_thread=True
    ) as daemon:
        turn(daemon, [{"role": "user", "content": "hi"}], model="other")
        (load,) = [e for e in daemon.events(service="other", limit=100) if e["kind"] == "load"]
        (fit,) = load["data"]["fit_target_mib"]
        assert fit >= 0
        pid = daemon.service("other")["pid"]
        assert f"LLAMA_ARG_FIT_TARGET={fit}" in environment_of(pid)
        turn(daemon, conversation("own"))
        assert "LLAMA_ARG_FIT_TARGET=1234" in environment_of(daemon.service("chat")["pid"])


def environment_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def test_a_restore_that_did_nothing_is_flagged_and_saving_stops(tmp_path: Path) -> None:
    with running_daemon(
        policy(chat_spec("--slot-restore", "noop")), tmp_path, in_thread=True
    ) as daemon:
        first = conversation("noop")
        answer = turn(daemon, first)
        evict_chat(daemon)
        assert len(kinds(daemon, "state-save")) == 1
        again = turn(daemon, follow_up(first, answer))
        assert again["timings"]["cache_n"] == 0  # the runtime said it restored; it did not
        daemon.wait_for(lambda: "state-ineffective" in daemon.service("chat")["flags"])
        (event,) = kinds(daemon, "state-ineffective")
        assert "re-used 0 tokens" in event["message"]
        assert not list((tmp_path / "state" / "chat").glob("slot-*.bin"))
        evict_chat(daemon)
        assert len(kinds(daemon, "state-save")) == 1  # saving has stopped
        assert daemon.service("chat")["saved_state"]["ineffective"]

        # A changed command (here: a runtime whose restores work) lifts the flag.
        applied = daemon.post("/api/policy", content=policy(chat_spec()).encode())
        assert applied.status_code == 200, applied.text
        turn(daemon, conversation("fixed"))
        assert "state-ineffective" not in daemon.service("chat")["flags"]
        evict_chat(daemon)
        assert len(kinds(daemon, "state-save")) == 2


def test_a_crash_saves_nothing_and_keeps_what_was_saved_before(tmp_path: Path) -> None:
    with running_daemon(policy(chat_spec()), tmp_path, in_thread=True) as daemon:
        first = conversation("crash")
        answer = turn(daemon, first)
        evict_chat(daemon)
        saved = daemon.service("chat")["saved_state"]["saved_bytes"]
        turn(daemon, follow_up(first, answer))
        os.kill(daemon.service("chat")["pid"], signal.SIGKILL)
        daemon.wait_for(lambda: daemon.service("chat")["state"] in ("backoff", "stopped"))
        assert len(kinds(daemon, "state-save")) == 1
        assert daemon.service("chat")["saved_state"]["saved_bytes"] == saved
        assert (tmp_path / "state" / "chat" / "slot-0.bin").exists()


def test_two_slots_are_saved_and_restored(tmp_path: Path) -> None:
    slow = chat_spec("--latency-ms", "400")
    with running_daemon(policy(slow), tmp_path, in_thread=True) as daemon:
        talks = [conversation("alpha"), conversation("beta")]
        answers: list[dict[str, Any]] = [{}, {}]

        def ask(i: int) -> None:
            answers[i] = turn(daemon, talks[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        evict_chat(daemon)
        (save,) = kinds(daemon, "state-save")
        assert sorted(save["data"]["slots"]) == [0, 1]
        for i in range(2):
            again = turn(daemon, follow_up(talks[i], answers[i]))
            assert again["timings"]["cache_n"] > 0
        (restore,) = kinds(daemon, "state-restore")
        assert sorted(restore["data"]["slots"]) == [0, 1]


@pytest.mark.parametrize("mode", ["error", "hang"])
def test_a_failed_restore_never_blocks_the_waiting_requests(tmp_path: Path, mode: str) -> None:
    with running_daemon(
        policy(chat_spec("--slot-restore", mode)), tmp_path, in_thread=True
    ) as daemon:
        first = conversation(mode)
        answer = turn(daemon, first)
        evict_chat(daemon)
        again = turn(daemon, follow_up(first, answer))  # answered, from scratch
        assert again["timings"]["cache_n"] == 0
        (restore,) = kinds(daemon, "state-restore")
        assert restore["data"]["failures"] and restore["data"]["slots"] == []
        assert "state-ineffective" not in daemon.service("chat")["flags"]


def test_an_idle_unload_and_the_daemons_shutdown_save_and_a_new_daemon_restores(
    tmp_path: Path,
) -> None:
    idle = chat_spec(idle_ttl="1s")
    with running_daemon(policy(idle), tmp_path, in_thread=True) as daemon:
        first = conversation("seasons")
        answer = turn(daemon, first)
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "stopped")
        (save,) = kinds(daemon, "state-save")
        assert "idle" in save["data"]["reason"]
        again = turn(daemon, follow_up(first, answer))
        assert again["timings"]["cache_n"] > 0
    # The shutdown saved what the runtime held; the next daemon restores it.
    with running_daemon(policy(idle), tmp_path, in_thread=True) as daemon:
        saves = kinds(daemon, "state-save")
        assert "shutting down" in saves[-1]["data"]["reason"]
        third = turn(daemon, follow_up(follow_up(first, answer), again))
        assert third["timings"]["cache_n"] > again["timings"]["cache_n"]
        assert kinds(daemon, "state-restore")[-1]["data"]["tokens"] == saves[-1]["data"]["tokens"]
