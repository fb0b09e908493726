"""The demo runtime's llama.cpp slots: prompt caches, timings, and slot save/restore/erase.

Real processes, as vramd will drive them: a follow-up conversation re-uses its slot's
cached prefix, a slot saved before a restart and restored after it does too, and
``--slot-restore`` makes a restore fail in the ways a real llama-server can.
"""

from __future__ import annotations

import json
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.demo import DEMO_CMD, REPO_ROOT, DemoProcess, running_demo
from support.ports import free_port
from support.waiting import wait_until_blocking

STATE_BYTES = 4096  # --state-bytes-per-token's default
REPLY = "demo reply 1 2 3"
# Two first questions long enough that neither shares a tenth of its prompt with the
# other (only the <|user|> marker): llama.cpp's similarity rule puts them in two slots.
ALPHA = "alpha " + " ".join(f"a{i}" for i in range(11))  # 12 words: 13 tokens with the role
BETA = "beta " + " ".join(f"b{i}" for i in range(14))  # 15 words: 16 tokens
# One client for the module: httpx.post() builds a client, and an SSL context, per call.
http = httpx.Client(timeout=5)


@pytest.fixture(scope="module", autouse=True)
def _close_client() -> Iterator[None]:
    yield
    http.close()


def conversation(first: str, *more: str) -> list[dict[str, str]]:
    """The user's questions, each but the last followed by the demo's reply."""
    messages = [{"role": "user", "content": first}]
    for question in more:
        messages += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": question}]
    return messages


def tokens(messages: list[dict[str, str]]) -> int:
    """Prompt tokens as the demo counts them: a role marker and the words of each message."""
    return sum(1 + len(m["content"].split()) for m in messages)


def chat(url: str, messages: list[dict[str, str]], timeout: float = 5) -> dict[str, Any]:
    response = http.post(f"{url}/v1/chat/completions", json={"messages": messages}, timeout=timeout)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def timing(url: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    stats = chat(url, messages)["timings"]
    return stats["cache_n"], stats["prompt_n"]


def action(
    url: str, slot: int | str, name: str, filename: str | None = None, timeout: float = 5
) -> httpx.Response:
    body = None if filename is None else {"filename": filename}
    return http.post(f"{url}/slots/{slot}?action={name}", json=body, timeout=timeout)


def slots(url: str) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = http.get(f"{url}/slots").json()
    return answer


def slot_holding(url: str, count: int) -> int:
    """The id of the idle slot that caches a prompt of ``count`` tokens."""
    return next(s["id"] for s in slots(url) if s.get("n_prompt_tokens") == count)


def erase_all(url: str) -> None:
    for slot in slots(url):
        assert action(url, slot["id"], "erase").status_code == 200


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slot-states")


@pytest.fixture(scope="module")
def demo(save_dir: Path) -> Iterator[DemoProcess]:
    """One well-behaved runtime with two slots, shared by the tests that allow it."""
    args = ("--parallel", "2", "--slot-save-path", str(save_dir), "--chunk-delay-ms", "1")
    with running_demo(*args) as proc:
        yield proc


# --- prompt caches and timings ------------------------------------------------------------


def test_a_follow_up_reuses_the_conversation_it_extends(demo: DemoProcess) -> None:
    erase_all(demo.url)
    first = conversation("hello there")
    answer = chat(demo.url, first)
    assert answer["usage"]["prompt_tokens"] == tokens(first) == 3
    assert answer["choices"][0]["message"]["content"] == REPLY
    stats = answer["timings"]
    assert (stats["cache_n"], stats["prompt_n"], stats["predicted_n"]) == (0, 3, 5)
    assert set(stats) == {
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    }
    follow_up = conversation("hello there", "and what else")
    assert timing(demo.url, follow_up) == (3, tokens(follow_up) - 3)
    # The same prompt again: all cached, but llama.cpp evaluates one token for its logits.
    assert timing(demo.url, follow_up) == (tokens(follow_up) - 1, 1)


def test_idle_slots_report_their_cached_prompt(demo: DemoProcess) -> None:
    erase_all(demo.url)
    assert all("n_prompt_tokens" not in slot for slot in slots(demo.url))
    chat(demo.url, conversation(ALPHA))
    chat(demo.url, conversation(BETA))  # too unlike ALPHA's prompt: the other slot
    held = sorted((s["is_processing"], s.get("n_prompt_tokens")) for s in slots(demo.url))
    assert held == [(False, 13), (False, 16)]


def test_streams_carry_timings_in_their_last_chunk(demo: DemoProcess) -> None:
    erase_all(demo.url)
    chat(demo.url, conversation("stream me"))
    messages = conversation("stream me", "more")
    body = {"messages": messages, "stream": True}
    with http.stream("POST", f"{demo.url}/v1/chat/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    assert [("timings" in event) for event in events] == [False] * 5 + [True]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    stats = events[-1]["timings"]
    assert (stats["cache_n"], stats["prompt_n"]) == (3, tokens(messages) - 3)


def test_completions_carry_timings(demo: DemoProcess) -> None:
    erase_all(demo.url)
    first = http.post(f"{demo.url}/v1/completions", json={"prompt": "one two three"}).json()
    assert first["choices"][0]["text"] == REPLY
    assert (first["timings"]["cache_n"], first["timings"]["prompt_n"]) == (0, 3)
    body = {"prompt": "one two three four", "stream": True}
    with http.stream("POST", f"{demo.url}/v1/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    last = json.loads(lines[-2])
    assert (last["timings"]["cache_n"], last["timings"]["prompt_n"]) == (3, 1)


# --- slot actions -------------------------------------------------------------------------


def test_a_saved_file_holds_the_tokens_and_grows_with_them(
    demo: DemoProcess, save_dir: Path
) -> None:
    erase_all(demo.url)
    chat(demo.url, conversation(ALPHA))
    chat(demo.url, conversation(BETA))
    alpha, beta = slot_holding(demo.url, 13), slot_holding(demo.url, 16)
    small = action(demo.url, alpha, "save", "small.bin")
    large = action(demo.url, beta, "save", "large.bin")
    assert small.status_code == large.status_code == 200
    saved = small.json()
    assert set(saved) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
    assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (alpha, "small.bin", 13)
    assert set(saved["timings"]) == {"save_ms"}
    assert large.json()["n_saved"] == 16
    for answer, name in ((saved, "small.bin"), (large.json(), "large.bin")):
        size = (save_dir / name).stat().st_size
        assert size == answer["n_written"] == answer["n_saved"] * STATE_BYTES
    data = (save_dir / "small.bin").read_bytes()
    assert data[:8] == b"DEMOSLOT" and struct.unpack_from("<I", data, 12) == (13,)
    assert data.count(0) > 12 * STATE_BYTES  # real padding bytes, not a short file


def test_erase_clears_the_cache(demo: DemoProcess) -> None:
    erase_all(demo.url)
    chat(demo.url, conversation("erase me"))
    cached = slot_holding(demo.url, 3)
    erased = action(demo.url, cached, "erase")
    assert erased.json() == {"id_slot": cached, "n_erased": 3}
    follow_up = conversation("erase me", "again")
    assert timing(demo.url, follow_up) == (0, tokens(follow_up))


@pytest.mark.parametrize(
    ("slot", "name", "body", "message"),
    [
        (0, "save", {"filename": "../escape.bin"}, "Invalid filename"),
        (0, "save", {"filename": "sub/dir.bin"}, "Invalid filename"),
        (0, "save", {"filename": ""}, "Invalid filename"),
        (0, "restore", {"filename": ".."}, "Invalid filename"),
        (7, "save", {"filename": "fine.bin"}, "Invalid slot ID"),
        ("x", "erase", None, "Invalid slot ID"),
        (0, "rename", {"filename": "fine.bin"}, "Invalid action"),
    ],
)
def test_bad_requests_answer_400_and_write_nothing(
    demo: DemoProcess, save_dir: Path, slot: int | str, name: str, body: Any, message: str
) -> None:
    before = sorted(save_dir.iterdir())
    response = http.post(f"{demo.url}/slots/{slot}?action={name}", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": 400, "message": message, "type": "invalid_request_error"}
    }
    assert sorted(save_dir.iterdir()) == before
    assert not (save_dir.parent / "escape.bin").exists()


def test_restoring_a_missing_or_corrupt_file_fails_and_clears_the_slot(
    demo: DemoProcess, save_dir: Path
) -> None:
    erase_all(demo.url)
    chat(demo.url, conversation("keep me"))
    cached = slot_holding(demo.url, 3)
    (save_dir / "corrupt.bin").write_bytes(b"not a state file")
    for name in ("missing.bin", "corrupt.bin"):
        response = action(demo.url, cached, "restore", name)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("Unable to restore slot: ")
        assert "n_prompt_tokens" not in slots(demo.url)[cached]  # cleared, as llama.cpp does
        chat(demo.url, conversation("keep me"))  # the same slot again, by similarity


def test_saved_slots_survive_a_restart_when_restored(tmp_path: Path) -> None:
    args = ("--parallel", "2", "--slot-save-path", str(tmp_path), "--chunk-delay-ms", "1")
    with running_demo(*args) as before:
        chat(before.url, conversation(ALPHA))  # slot 0
        chat(before.url, conversation(BETA))  # slot 1
        assert action(before.url, 0, "save", "alpha.bin").json()["n_saved"] == 13
        assert action(before.url, 1, "save", "beta.bin").json()["n_saved"] == 16
    assert before.proc.returncode is not None  # that runtime is gone
    alpha_next, beta_next = conversation(ALPHA, "next"), conversation(BETA, "next")
    with running_demo(*args) as after:
        assert timing(after.url, alpha_next) == (0, tokens(alpha_next))  # nothing cached
        erase_all(after.url)
        # Each slot restores on its own, from either file.
        restored = action(after.url, 0, "restore", "beta.bin").json()
        assert set(restored) == {"id_slot", "filename", "n_restored", "n_read", "timings"}
        assert (restored["id_slot"], restored["n_restored"]) == (0, 16)
        assert restored["n_read"] == (tmp_path / "beta.bin").stat().st_size
        assert set(restored["timings"]) == {"restore_ms"}
        assert action(after.url, 1, "restore", "alpha.bin").json()["n_restored"] == 13
        held = [(s["is_processing"], s["n_prompt_tokens"]) for s in slots(after.url)]
        assert held == [(False, 16), (False, 13)]
        assert timing(after.url, alpha_next) == (13, tokens(alpha_next) - 13)
        assert timing(after.url, beta_next) == (16, tokens(beta_next) - 16)


# --- misbehaviour on cue ------------------------------------------------------------------


def test_noop_restore_reports_success_but_restores_nothing(tmp_path: Path) -> None:
    with running_demo("--slot-save-path", str(tmp_path), "--slot-restore", "noop") as demo:
        chat(demo.url, conversation(ALPHA))
        assert action(demo.url, 0, "save", "alpha.bin").status_code == 200
        action(demo.url, 0, "erase")
        restored = action(demo.url, 0, "restore", "alpha.bin")
        assert restored.status_code == 200
        assert restored.json()["n_restored"] == 13
        assert restored.json()["n_read"] == 13 * STATE_BYTES
        follow_up = conversation(ALPHA, "next")
        assert timing(demo.url, follow_up) == (0, tokens(follow_up))


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoProcess]:
    """One slot, 10 ms per prompt token, and restores that fail with a 500."""
    save = tmp_path_factory.mktemp("slow-states")
    args = ("--slot-save-path", str(save), "--slot-restore", "error")
    with running_demo(*args, "--prompt-ms-per-token", "10", "--chunk-delay-ms", "1") as proc:
        yield proc


def test_error_restore_answers_500(slow: DemoProcess) -> None:
    response = action(slow.url, 0, "restore", "any.bin")
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["code"], error["type"]) == (500, "server_error")
    assert error["message"].startswith("Unable to restore slot")


def test_prompt_time_is_per_uncached_token(slow: DemoProcess) -> None:
    erase_all(slow.url)
    question = " ".join(f"q{i}" for i in range(15))  # 16 tokens
    first = chat(slow.url, conversation(question))["timings"]
    assert first["prompt_n"] == 16 and first["prompt_ms"] >= 16 * 10
    assert first["prompt_per_token_ms"] == pytest.approx(first["prompt_ms"] / 16)
    again = chat(slow.url, conversation(question, "more"))["timings"]
    assert (again["cache_n"], again["prompt_n"]) == (16, 8)  # the reply and the question
    assert 8 * 10 <= again["prompt_ms"] < first["prompt_ms"]


def test_an_action_on_a_busy_slot_waits_until_it_is_idle(slow: DemoProcess) -> None:
    erase_all(slow.url)
    messages = conversation(" ".join(f"w{i}" for i in range(19)))  # 20 tokens: 200 ms
    answers: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: answers.append(chat(slow.url, messages)))
    worker.start()
    try:
        seen: list[dict[str, Any]] = []
        wait_until_blocking(
            lambda: bool(seen.append(slots(slow.url)[0]) or seen[-1]["is_processing"])
        )
        # Busy: n_prompt_tokens is what the request holds, its prompt and its reply.
        assert seen[-1]["n_prompt_tokens"] == 20 + 5
        saved = action(slow.url, 0, "save", "busy.bin")
        assert saved.json()["n_saved"] == 20  # saved after the request left its prompt
    finally:
        worker.join(timeout=5)
    assert answers and answers[0]["timings"]["prompt_n"] == 20


def test_hung_restore_never_answers_while_the_rest_does(tmp_path: Path) -> None:
    with running_demo("--slot-save-path", str(tmp_path), "--slot-restore", "hang") as demo:
        with pytest.raises(httpx.ReadTimeout):
            action(demo.url, 0, "restore", "any.bin", timeout=0.5)
        assert demo.health_status() == 200
        assert chat(demo.url, conversation("still here"))["timings"]["prompt_n"] == 3
        assert action(demo.url, 0, "save", "other.bin").status_code == 200


def test_slot_actions_need_a_slot_save_path() -> None:
    with running_demo() as demo:
        response = action(demo.url, 0, "save", "x.bin")
        assert response.status_code == 501
        assert response.json() == {
            "error": {
                "code": 501,
                "message": "This server does not support slots action. "
                "Start it with `--slot-save-path`",
                "type": "not_supported_error",
            }
        }
    done = subprocess.run(
        [*DEMO_CMD, "--port", str(free_port()), "--slot-save-path", "/nonexistent/dir"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 2 and "not a directory" in done.stderr
