"""State across swaps on the real llama-server (docs/policy.md, "State across swaps").

A conversation evicted by another service and asked again must re-process no more
prompt tokens than a warm follow-up would, plus 10 % of the prompt; the same flow on a
service without ``state`` re-processes nearly all of it. A drained restart keeps the
state; a model file touched in place restores nothing and says so; ``state.disk`` drops
what does not fit; ``LLAMA_ARG_FIT_TARGET`` reaches the runtime.

``make test-real`` builds llama-server; without it (or without ``gguf``) this is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, policy_yaml, running_daemon

from service.real_runtimes.catalog import catalog_dir

pytestmark = [pytest.mark.real, pytest.mark.timeout(300)]

BINARY = Path(
    os.environ.get("VRAMD_LLAMA_SERVER", catalog_dir() / "build/llama-server/bin/llama-server")
)
if not BINARY.is_file():
    pytest.skip(
        f"no llama-server at {BINARY} (make real-runtimes builds it)", allow_module_level=True
    )
pytest.importorskip("gguf", reason="gguf is missing (make test-real installs it)")

from support.gguf_model import write_tiny_llama  # noqa: E402


def server(model: Path, *extra: str) -> list[str]:
    return [
        str(BINARY), "--model", str(model), "--alias", "${MODEL}", "--host", "127.0.0.1",
        "--port", "${PORT}", "--ctx-size", "1024", "--parallel", "1", "--threads", "2",
        *extra,
    ]  # fmt: skip


def services(model: Path, disk: str = "64MiB") -> dict[str, dict[str, Any]]:
    base = {
        "kind": "chat",
        "memory": {"estimate": "300MiB"},
        "protect": "0s",
        "startup_timeout": "60s",
        "stop_timeout": "10s",
    }
    return {
        "chat": {
            **base,
            "models": ["chat"],
            "command": server(model, "--slot-save-path", "${STATE_DIR}"),
            "state": {"disk": disk},
        },
        "plain": {**base, "models": ["plain"], "command": server(model)},
    }


WINDOW = """\
maintenance:
  windows:
    - name: nightly
      cron: "30 3 * * *"
      duration: 1s
      restart: [chat]
"""


def policy(model: Path, disk: str = "64MiB") -> str:
    return policy_yaml(services(model, disk), budget="450MiB", sample_interval="0.5s", extra=WINDOW)


def ask(daemon: Daemon, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    response = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 2, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def talk(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"You know {topic}."},
        {"role": "user", "content": f"Tell me about {topic}."},
    ]


def then(messages: list[dict[str, str]], answer: dict[str, Any]) -> list[dict[str, str]]:
    said = answer["choices"][0]["message"]["content"]
    return [
        *messages,
        {"role": "assistant", "content": said},
        {"role": "user", "content": "Go on."},
    ]


def processed(answer: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens processed, prompt tokens in all)."""
    timings = answer["timings"]
    return timings["prompt_n"], timings["prompt_n"] + timings["cache_n"]


def swap_to(daemon: Daemon, model: str, away: str) -> None:
    ask(daemon, model, [{"role": "user", "content": "hello"}])
    daemon.wait_for(lambda: daemon.service(away)["state"] == "stopped", timeout=60)


def events(daemon: Daemon, kind: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events(service="chat", limit=500) if e["kind"] == kind]


def test_a_swapped_out_conversation_resumes_from_its_restored_cache(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with running_daemon(policy(model), tmp_path, in_thread=True) as daemon:
        # Warm: the follow-up of a conversation the runtime still holds.
        warm = talk("rivers")
        warm_processed, _ = processed(ask(daemon, "chat", then(warm, ask(daemon, "chat", warm))))

        # Swapped out and back: the same shape of follow-up, after an eviction.
        kept = talk("mountains")
        first = ask(daemon, "chat", kept)
        swap_to(daemon, "plain", away="chat")
        assert events(daemon, "state-save")[-1]["data"]["tokens"] > 0
        restored_processed, total = processed(ask(daemon, "chat", then(kept, first)))
        assert restored_processed <= warm_processed + 0.1 * total
        assert events(daemon, "state-restore")[-1]["data"]["tokens"] > 0
        daemon.wait_for(lambda: events(daemon, "state-verified") != [])
        assert daemon.service("chat")["saved_state"]["tokens_not_reprocessed"] > 0

        # Without state, the same flow re-processes (nearly) everything.
        lost = talk("forests")
        plain_first = ask(daemon, "plain", lost)
        swap_to(daemon, "chat", away="plain")
        plain_processed, plain_total = processed(ask(daemon, "plain", then(lost, plain_first)))
        assert plain_processed >= 0.9 * plain_total

        # The runtime is told how much to leave free on its device.
        pid = daemon.service("plain")["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        assert any(entry.startswith("LLAMA_ARG_FIT_TARGET=") for entry in environ)


def test_drained_and_window_restarts_keep_the_state_and_a_changed_model_drops_it(
    tmp_path: Path,
) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with running_daemon(policy(model), tmp_path, in_thread=True) as daemon:
        kept = talk("lakes")
        first = ask(daemon, "chat", kept)
        assert daemon.post("/api/services/chat/restart").status_code == 200
        daemon.wait_for(lambda: len(events(daemon, "state-restore")) == 1, timeout=60)
        again = ask(daemon, "chat", then(kept, first))
        (restore,) = events(daemon, "state-restore")
        assert again["timings"]["cache_n"] >= 0.9 * restore["data"]["tokens"]

        # A maintenance window's restart keeps it as well.
        assert daemon.post("/api/maintenance/nightly/run").status_code == 200
        daemon.wait_for(lambda: len(events(daemon, "state-restore")) == 2, timeout=60)
        once_more = ask(daemon, "chat", then(kept, first))
        assert once_more["timings"]["cache_n"] >= 0.9 * restore["data"]["tokens"]

        # Same path, new mtime: a different model as far as saved state is concerned.
        stat = model.stat()
        os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
        swap_to(daemon, "plain", away="chat")
        after = ask(daemon, "chat", then(kept, first))
        (dropped,) = events(daemon, "state-dropped")
        assert "tiny.gguf changed" in dropped["message"]
        done, total = processed(after)
        assert done >= 0.9 * total


def test_the_disk_budget_drops_what_does_not_fit(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with running_daemon(policy(model, disk="4KiB"), tmp_path, in_thread=True) as daemon:
        ask(daemon, "chat", talk("deserts"))
        swap_to(daemon, "plain", away="chat")
        (save,) = events(daemon, "state-save")
        assert save["data"]["dropped"] == ["slot-0.bin"]
        assert daemon.service("chat")["saved_state"]["saved_bytes"] == 0
        assert not list((tmp_path / "state" / "chat").glob("slot-*"))
