"""Every real runtime in ``runtimes.json`` under a running ``vramd serve`` (docs/runtimes.md).

Per kind (chat, embedding and rerank on llama.cpp, speech-to-text on whisper.cpp,
diffusion on stable-diffusion.cpp, chat on vLLM's CPU build, text-to-speech on piper),
one daemon runs the runtime's own command from ``runtimes.json`` beside a
higher-priority stand-in that needs the whole budget, and a copy of the runtime set up
to run out of memory. Through that daemon: a cold load and a request with the official
``openai`` client, the ``ollama`` client where Ollama's API has the kind's route, the
footprint against the OS's own figure, an eviction by the higher priority and a reload,
a SIGKILL under a request, the out-of-memory line classified by the runtime's adapter,
an unload while vLLM loads, and a SIGTERM that leaves no process behind.

``make real-runtimes`` installs the runtimes; without its ``runtimes.json`` this module
is skipped with that reason. The weights are random: answers are checked for shape only.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import ollama
import openai
import psutil
import pytest
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon, stop_daemon
from support.ports import free_port

from service.adapters import adapter_named, find_oom
from service.real_runtimes.catalog import (
    SERVICE_KINDS,
    CatalogError,
    RuntimeEntry,
    load_catalog,
)

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

try:
    CATALOG = load_catalog()
except CatalogError as exc:
    pytest.skip(str(exc), allow_module_level=True)

MODEL = "real-model"
BUDGET = "8GiB"
# The stand-in needs the whole budget, so loading it evicts whatever is resident.
HOG_ESTIMATE = "7900MiB"
# PSS moves between the daemon's sample and ours (allocator pools, lazy pages).
FOOTPRINT_TOLERANCE = 0.05


# --- one request per kind, through vramd, with the official client ---------------------


def _chat(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    answer = raw.parse()
    assert answer.choices[0].message.role == "assistant"
    return raw


def _embedding(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    raw = client.embeddings.with_raw_response.create(model=model, input=["hello", "world"])
    answer = raw.parse()
    assert len(answer.data) == 2 and len(answer.data[0].embedding) > 0
    return raw


def _rerank(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    # The openai client has no rerank call; its generic post goes through the same
    # transport, headers and error handling.
    documents = ["a cat sat", "stocks fell", "the cat slept"]
    raw = client.post(
        "/rerank",
        body={"model": model, "query": "cat", "documents": documents},
        cast_to=httpx.Response,
    )
    results = raw.json()["results"]
    assert sorted(result["index"] for result in results) == [0, 1, 2]
    return raw


def _speech_to_text(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    from service.real_runtimes.whisper_model import wav_bytes

    raw = client.audio.transcriptions.with_raw_response.create(
        model=model, file=("hello.wav", io.BytesIO(wav_bytes(seconds=1.0)), "audio/wav")
    )
    assert isinstance(raw.parse().text, str)
    return raw


def _diffusion(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    assert entry.image_size is not None
    raw = client.images.with_raw_response.generate(
        model=model, prompt="a red square", size=entry.image_size, n=1,  # type: ignore[arg-type]
        response_format="b64_json",
    )  # fmt: skip
    image = raw.parse().data[0].b64_json
    assert image is not None and base64.b64decode(image)[:8] == b"\x89PNG\r\n\x1a\n"
    return raw


def _text_to_speech(client: openai.OpenAI, entry: RuntimeEntry, model: str) -> Any:
    raw = client.audio.speech.with_raw_response.create(
        model=model, voice="alloy", input="Hello there.", response_format="wav"
    )
    assert raw.http_response.content[:4] == b"RIFF"
    assert raw.http_response.headers["content-type"] == "audio/wav"
    return raw


CALLS: dict[str, Callable[[openai.OpenAI, RuntimeEntry, str], Any]] = {
    "chat": _chat,
    "vllm": _chat,
    "embedding": _embedding,
    "rerank": _rerank,
    "speech-to-text": _speech_to_text,
    "diffusion": _diffusion,
    "text-to-speech": _text_to_speech,
}


@dataclass(frozen=True)
class Setup:
    """What the policy gives one kind: its estimate, its start-up time, and the command
    of its copy that runs out of memory (docs/runtimes.md says how each is forced)."""

    estimate: str
    startup: str
    oom: Callable[[RuntimeEntry], list[str]]


def _under_limit(limit: str, *extra: str) -> Callable[[RuntimeEntry], list[str]]:
    """The runtime under ``prlimit --as=limit``, with ``extra`` arguments that make it
    allocate more than that at start: its allocation fails as on a full device."""
    return lambda entry: ["prlimit", f"--as={limit}", "--", *entry.command, *extra]


GIB = str(2**30)
# llama.cpp: an 8M-token context's KV cache (4 GiB) under a 1 GiB address space.
LLAMA_OOM = _under_limit(GIB, "--ctx-size", "8388608")
# whisper.cpp: its compute buffers under a 200 MiB address space.
WHISPER_OOM = _under_limit(str(200 * 2**20))
# vLLM: a 4M-token context whose KV cache (4 GiB) cannot fit the 1 GiB it is given.
VLLM_OOM: Callable[[RuntimeEntry], list[str]] = lambda entry: [  # noqa: E731
    "env", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", *entry.command, "--max-model-len", "4194304",
]  # fmt: skip
SETUPS: dict[str, Setup] = {
    "chat": Setup("400MiB", "120s", LLAMA_OOM),
    "embedding": Setup("400MiB", "120s", LLAMA_OOM),
    "rerank": Setup("400MiB", "120s", LLAMA_OOM),
    "speech-to-text": Setup("400MiB", "120s", WHISPER_OOM),
    # sd.cpp: its UNet's weights (486 MB) under a 600 MB address space.
    "diffusion": Setup("1GiB", "120s", _under_limit(str(600 * 10**6))),
    "vllm": Setup("3GiB", "300s", VLLM_OOM),
    # piper under a 240 MiB address space: it fails importing (MemoryError), creating its
    # onnxruntime session or loading its voice (std::bad_alloc), by a few MiB either way.
    "text-to-speech": Setup("300MiB", "120s", _under_limit(str(240 * 2**20))),
}


def policy(kind: str, entry: RuntimeEntry, ollama_port: int) -> str:
    setup = SETUPS[kind]
    base = {
        "kind": SERVICE_KINDS[kind].value,
        "adapter": entry.adapter,
        "env": entry.env,
        "startup_timeout": setup.startup,
        "stop_timeout": "20s",
        "residency": "on-demand",
        "protect": "never",
        **({"metrics": entry.metrics} if entry.metrics else {}),
    }
    services = {
        "rt": {
            **base,
            "models": [MODEL],
            "command": list(entry.command),
            "memory": {"estimate": setup.estimate},
            "priority": 100,
        },
        "oom": {
            **base,
            "models": ["oom-model"],
            "command": setup.oom(entry),
            "memory": {"estimate": setup.estimate},
            "priority": 50,
            "restart": {"max_retries": 0},
        },
        "hog": {
            "kind": "chat",
            "models": ["hog"],
            "command": demo_command("20MiB"),
            "memory": {"estimate": HOG_ESTIMATE},
            "residency": "on-demand",
            "priority": 900,
        },
    }
    extra = f"server:\n  ollama: {{port: {ollama_port}}}\n"
    return policy_yaml(services, budget=BUDGET, sample_interval="0.5s", extra=extra)


@pytest.fixture(scope="module", params=sorted(set(CATALOG) & set(SETUPS)))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def ollama_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def daemon(
    kind: str, ollama_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp(f"real-{kind}")
    with running_daemon(policy(kind, CATALOG[kind], ollama_port), workdir) as running:
        yield running


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key="unused", timeout=600, max_retries=0
    ) as client:
        yield client


def call(kind: str, client: openai.OpenAI, model: str = MODEL) -> Any:
    return CALLS[kind](client, CATALOG[kind], model)


def tree_pss(pid: int) -> int:
    """What the OS says the process tree holds (proportional set size)."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


# --- the checks, in the order one daemon goes through them ------------------------------


def test_a_cold_load_serves_the_openai_clients_request(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    assert daemon.service("rt")["state"] == "stopped"
    raw = call(kind, client)
    assert raw.headers["x-vramd-service"] == "rt"
    assert raw.headers["x-vramd-cold-start"] == "1"
    assert daemon.service("rt")["state"] == "ready"
    warm = call(kind, client)
    assert warm.headers["x-vramd-cold-start"] == "0"


def test_the_footprint_is_the_os_figure_within_5_percent(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    call(kind, client)
    pid = daemon.service("rt")["pid"]
    assert pid is not None
    seen: list[tuple[int, int]] = []

    def agrees() -> bool:
        measured = daemon.service("rt")["footprint_bytes"] or 0
        actual = tree_pss(pid)
        seen.append((measured, actual))
        return abs(measured - actual) <= FOOTPRINT_TOLERANCE * actual

    daemon.wait_for(agrees, timeout=30)
    assert seen[-1][1] > 10 * 2**20, f"a real runtime holds more than 10 MiB: {seen[-1]}"


def test_the_ollama_client_reaches_it_where_ollamas_api_has_the_route(
    kind: str, daemon: Daemon, ollama_port: int
) -> None:
    if kind not in ("chat", "vllm", "embedding"):
        pytest.skip(f"Ollama's API has no route for {kind}")
    with ollama.Client(host=f"http://127.0.0.1:{ollama_port}", timeout=600) as client:
        if kind == "embedding":
            vectors = client.embed(model=MODEL, input=["one", "two"]).embeddings
            assert len(vectors) == 2 and len(vectors[0]) > 0
            return
        ask = [{"role": "user", "content": "Hi"}]
        short = {"num_predict": 4}
        answer = client.chat(model=MODEL, messages=ask, options=short)
        assert answer.done is True and answer.message.role == "assistant"
        parts = list(client.chat(model=MODEL, messages=ask, options=short, stream=True))
        assert parts[-1].done is True and not any(part.done for part in parts[:-1])
        generated = client.generate(model=MODEL, prompt="Once", options=short)
        assert generated.done is True


def test_a_higher_priority_evicts_it_and_a_request_loads_it_again(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    call(kind, client)
    before = daemon.service("rt")
    assert before["state"] == "ready"
    assert daemon.post("/api/services/hog/load", timeout=120).status_code in (200, 202)
    daemon.wait_for(lambda: daemon.service("hog")["state"] == "ready", timeout=120)
    after = daemon.service("rt")
    assert after["state"] == "stopped"
    assert after["evictions"] == before["evictions"] + 1
    assert daemon.post("/api/services/hog/unload", timeout=60).status_code in (200, 202)
    daemon.wait_for(lambda: daemon.service("hog")["state"] == "stopped", timeout=60)
    raw = call(kind, client)
    assert raw.headers["x-vramd-cold-start"] == "1"
    assert daemon.service("rt")["loads"] == before["loads"] + 1


def test_sigkill_under_a_request_fails_it_cleanly_and_the_runtime_comes_back(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    call(kind, client)
    pid = daemon.service("rt")["pid"]
    # Stopped, the runtime holds the request that reaches it: it is surely in flight.
    os.kill(pid, signal.SIGSTOP)
    failure: list[BaseException] = []

    def doomed() -> None:
        try:
            call(kind, client)
        except BaseException as exc:  # recorded for the assertion below
            failure.append(exc)

    thread = threading.Thread(target=doomed)
    thread.start()
    try:
        daemon.wait_for(lambda: daemon.service("rt")["in_flight"] == 1, timeout=30)
    finally:
        os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive()
    assert len(failure) == 1, "the request through a killed runtime must fail"
    error = failure[0]
    assert isinstance(error, openai.APIStatusError), repr(error)
    assert error.status_code == 502
    assert error.body is not None and "runtime_failed" in str(error.body)
    call(kind, client)  # a new instance serves the next request
    assert daemon.service("rt")["pid"] not in (None, pid)


def test_the_forced_out_of_memory_is_classified_by_the_adapter(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.APIStatusError):
        call(kind, client, model="oom-model")
    daemon.wait_for(lambda: _oom_incident(daemon) is not None, timeout=60)
    incident = _oom_incident(daemon)
    assert incident is not None and incident["kind"] == "load", incident
    # The adapter's own out-of-memory line, quoted from the runtime's output.
    assert incident["summary"].startswith("load failed with out-of-memory: "), incident
    quoted = incident["summary"].removeprefix("load failed with out-of-memory: ")
    assert find_oom(adapter_named(CATALOG[kind].adapter), quoted) == quoted
    assert quoted in incident["data"]["oom_text"]


def test_an_unload_while_it_loads_leaves_no_process(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    if kind != "vllm":
        pytest.skip(f"{kind} loads in about a second: too short to stop it while loading")
    daemon.post("/api/services/rt/unload", timeout=60)
    daemon.wait_for(lambda: daemon.service("rt")["state"] == "stopped", timeout=60)
    loading = threading.Thread(target=lambda: daemon.post("/api/services/rt/load", timeout=300))
    loading.start()
    daemon.wait_for(lambda: daemon.service("rt")["pid"] is not None, timeout=60)
    pid = daemon.service("rt")["pid"]
    daemon.wait_for(lambda: psutil.Process(pid).children(recursive=True) != [], timeout=120)
    assert daemon.service("rt")["state"] == "starting"
    tree = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    # vLLM can lose a SIGTERM while loading: only the group's SIGKILL ends it.
    assert daemon.post("/api/services/rt/unload", timeout=120).status_code in (200, 202)
    daemon.wait_for(lambda: daemon.service("rt")["state"] == "stopped", timeout=120)
    loading.join(120)
    daemon.wait_for(lambda: _alive(tree) == [], timeout=30)


def test_sigterm_stops_every_runtime_process(
    kind: str, daemon: Daemon, client: openai.OpenAI
) -> None:
    call(kind, client)
    pid = daemon.service("rt")["pid"]
    tree = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    assert stop_daemon(daemon) in (0, -signal.SIGTERM)
    assert _alive(tree) == [], f"left behind: {_alive(tree)}"


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _oom_incident(daemon: Daemon) -> dict[str, Any] | None:
    """The ``oom`` service's incident in full, once it has one."""
    for incident in daemon.get("/api/incidents").json()["incidents"]:
        if incident["service"] == "oom":
            full: dict[str, Any] = daemon.get(f"/api/incidents/{incident['id']}").json()
            return full
    return None
