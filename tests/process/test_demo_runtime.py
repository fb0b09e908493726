"""The demo runtime behaves like a real one: real processes, real memory, real clients."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.demo import DEMO_CMD, REPO_ROOT, DemoProcess, running_demo
from support.ports import free_port

from service.demo_runtime import parse_multipart, reply_pieces, tiny_png, tiny_wav

MIB = 1024 * 1024
CHAT = {"model": "demo-chat", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoProcess]:
    """One well-behaved runtime shared by the route tests."""
    with running_demo(
        "--model", "demo-chat", "--model", "demo-embed,demo-tts", "--chunk-delay-ms", "1"
    ) as proc:
        yield proc


@pytest.fixture
def client(demo: DemoProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{demo.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def post_chat(url: str, timeout: float = 5) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=timeout)


def open_request(port: int, body: dict[str, object]) -> socket.socket:
    """Send a chat request on a raw socket and leave it in flight."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


# --- readiness and memory -----------------------------------------------------------------


def test_health_is_503_while_loading_then_200() -> None:
    with running_demo("--load-seconds", "0.5", ready=False) as demo:
        deadline = time.monotonic() + 5
        while (status := demo.health_status()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert status == 503
        assert httpx.get(f"{demo.url}/health").json() == {"status": "loading"}
        demo.wait_ready()
        response = httpx.get(f"{demo.url}/health")
        assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_becomes_ready_quickly() -> None:
    started = time.monotonic()
    with running_demo():
        # Typically ~0.1 s; the bound only catches a heavy import creeping in.
        assert time.monotonic() - started < 5


def test_memory_is_real_and_resident() -> None:
    with running_demo("--memory", "200MiB") as demo:
        assert rss(demo.pid) >= 190 * MIB


def test_workers_hold_memory_and_die_with_the_parent() -> None:
    with running_demo("--workers", "2", "--worker-memory", "50MiB") as demo:
        workers = psutil.Process(demo.pid).children(recursive=True)
        assert len(workers) == 2
        # USS: memory only that worker holds, not pages it shares with its parent.
        assert sum(w.memory_full_info().uss for w in workers) >= 95 * MIB
        demo.proc.kill()
        demo.proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=5)
        assert alive == []


# --- routes through the official client ---------------------------------------------------


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["demo-chat", "demo-embed", "demo-tts"]


def test_chat_completion(client: openai.OpenAI, demo: DemoProcess) -> None:
    reply = client.chat.completions.create(model="demo-chat", messages=CHAT["messages"])  # type: ignore[arg-type]
    assert reply.model == "demo-chat"
    assert reply.choices[0].message.content == "demo reply 1 2 3"
    assert reply.usage is not None and reply.usage.total_tokens > 0
    assert "POST /v1/chat/completions 200" in demo.output()


def test_chat_completion_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="demo-chat",
        messages=CHAT["messages"],
        stream=True,  # type: ignore[arg-type]
    )
    with stream:
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "demo reply 1 2 3"
    assert len(chunks) == 6
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_and_its_stream(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="demo-chat", prompt="say something")
    assert reply.choices[0].text == "demo reply 1 2 3"
    with client.completions.create(model="demo-chat", prompt="x", stream=True) as stream:
        assert "".join(c.choices[0].text for c in stream) == "demo reply 1 2 3"


def test_embeddings_are_deterministic(client: openai.OpenAI) -> None:
    first = client.embeddings.create(model="demo-embed", input=["alpha", "beta"])
    again = client.embeddings.create(model="demo-embed", input="alpha", encoding_format="float")
    assert [len(d.embedding) for d in first.data] == [16, 16]
    assert first.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-6)
    assert first.data[0].embedding != first.data[1].embedding


def test_image_generation_and_edit(client: openai.OpenAI) -> None:
    generated = client.images.generate(model="demo-image", prompt="a cat", n=2)
    assert generated.data is not None and len(generated.data) == 2
    png = base64.b64decode(generated.data[0].b64_json or "")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    edited = client.images.edit(model="demo-image", image=("in.png", png, "image/png"), prompt="x")
    assert edited.data is not None and edited.data[0].b64_json


def test_audio_transcription_and_speech(client: openai.OpenAI) -> None:
    audio = tiny_wav()
    text = client.audio.transcriptions.create(model="demo-stt", file=("a.wav", audio, "audio/wav"))
    assert text.text == f"demo transcript of {len(audio)} bytes"
    speech = client.audio.speech.create(model="demo-tts", voice="alloy", input="hello")
    assert speech.content[:4] == b"RIFF" and speech.content[8:12] == b"WAVE"


def test_audio_translation_multipart(demo: DemoProcess) -> None:
    # The client's translations resource is deprecated, so post the multipart form directly.
    files = {"file": ("a.wav", b"\x00" * 10, "audio/wav")}
    response = httpx.post(f"{demo.url}/v1/audio/translations", data={"model": "m"}, files=files)
    assert response.json() == {"text": "demo transcript of 10 bytes"}


def test_rerank_sorts_by_score(demo: DemoProcess) -> None:
    body = {"model": "demo-rank", "query": "red apple", "documents": ["blue sky", "red apple pie"]}
    response = httpx.post(f"{demo.url}/v1/rerank", json=body)
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1, 0]
    assert results[0]["relevance_score"] > results[1]["relevance_score"]


def test_metrics_parse(demo: DemoProcess) -> None:
    text = httpx.get(f"{demo.url}/metrics").text
    names = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    assert {"llamacpp:kv_cache_usage_ratio", "llamacpp:requests_processing"} <= names
    assert "llamacpp:prompt_tokens_total" in names


def test_errors_are_openai_shaped(demo: DemoProcess) -> None:
    missing = httpx.get(f"{demo.url}/v1/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    bad = httpx.post(f"{demo.url}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]) == {"message", "type", "code"}
    invalid = httpx.post(f"{demo.url}/v1/chat/completions", json={"messages": "hi"})
    assert invalid.status_code == 400


def test_keep_alive_content_length_and_chunked_bodies(demo: DemoProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", demo.port, timeout=5)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b'{"status": "ok"}'
        first_socket = conn.sock
        body = iter([json.dumps(CHAT).encode()])
        conn.request("POST", "/v1/chat/completions", body=body, encode_chunked=True)
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())["object"]) == (200, "chat.completion")
        assert conn.sock is first_socket  # the connection was reused
        conn.putrequest("POST", "/v1/chat/completions")
        conn.endheaders()  # neither Content-Length nor chunked
        assert conn.getresponse().status == 411
    finally:
        conn.close()


# --- misbehaviour on cue ------------------------------------------------------------------


def test_ignore_sigterm_needs_sigkill() -> None:
    with running_demo("--ignore-sigterm") as demo:
        demo.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            demo.proc.wait(timeout=0.5)
        assert demo.health_status() == 200
        demo.proc.kill()
        assert demo.proc.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_sigterm_exits_zero_promptly_with_a_stream_in_flight() -> None:
    with running_demo("--chunks", "1000", "--chunk-delay-ms", "50") as demo:
        sock = open_request(demo.port, {**CHAT, "stream": True})
        try:
            received = b""
            while b"data: " not in received:
                received += sock.recv(4096)
            started = time.monotonic()
            demo.proc.send_signal(signal.SIGTERM)
            assert demo.proc.wait(timeout=5) == 0
            assert time.monotonic() - started < 2
        finally:
            sock.close()


def test_crash_after_second_request() -> None:
    with running_demo("--crash-after", "2") as demo:
        assert post_chat(demo.url).status_code == 200
        with pytest.raises(httpx.TransportError):
            post_chat(demo.url)
        assert demo.proc.wait(timeout=5) == 3
        assert "crashing" in demo.output()


def test_crash_mid_stream() -> None:
    with running_demo("--crash-after", "1") as demo:
        events = []
        with (
            pytest.raises(httpx.TransportError),
            httpx.stream(
                "POST", f"{demo.url}/v1/chat/completions", json={**CHAT, "stream": True}
            ) as r,
        ):
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))
        assert len(events) == 2 and "data: [DONE]" not in events
        assert demo.proc.wait(timeout=5) == 3


def test_never_ready_stays_503() -> None:
    with running_demo("--never-ready", ready=False) as demo:
        deadline = time.monotonic() + 5
        while demo.health_status() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        statuses = set()
        for _ in range(5):
            statuses.add(demo.health_status())
            time.sleep(0.05)
        assert statuses == {503}


def test_fail_start_reports_cuda_oom() -> None:
    done = subprocess.run(
        [*DEMO_CMD, "--port", str(free_port()), "--fail-start"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 1
    assert "CUDA error: out of memory" in done.stderr
    assert "cudaMalloc failed: out of memory" in done.stderr


def test_leak_per_request_grows_rss() -> None:
    with running_demo("--leak-per-request", "20MiB") as demo:
        before = rss(demo.pid)
        for _ in range(2):
            assert post_chat(demo.url).status_code == 200
        assert 38 * MIB <= rss(demo.pid) - before < 60 * MIB


def test_leak_limit_plateaus() -> None:
    with running_demo("--leak-per-request", "20MiB", "--leak-limit", "30MiB") as demo:
        before = rss(demo.pid)
        for _ in range(2):
            post_chat(demo.url)
        plateau = rss(demo.pid)
        for _ in range(2):
            post_chat(demo.url)
        assert 28 * MIB <= plateau - before < 40 * MIB
        assert abs(rss(demo.pid) - plateau) < 5 * MIB


def test_oom_after_second_request() -> None:
    with running_demo("--oom-after", "2") as demo:
        assert post_chat(demo.url).status_code == 200
        for _ in range(2):
            response = post_chat(demo.url)
            assert response.status_code == 500
            assert (
                "CUDA out of memory. Tried to allocate 20.00 MiB"
                in response.json()["error"]["message"]
            )
        assert "CUDA out of memory" in demo.output()


def test_hang_answers_health_but_not_inference() -> None:
    with running_demo("--hang") as demo:
        with pytest.raises(httpx.ReadTimeout):
            post_chat(demo.url, timeout=0.5)
        assert demo.health_status() == 200
        metrics = httpx.get(f"{demo.url}/metrics").text
        assert "llamacpp:requests_processing 1" in metrics


# --- pure helpers -------------------------------------------------------------------------


def test_multipart_keeps_binary_files_exact() -> None:
    payload = b"\x00\r\n--x\r\n\xff"
    body = (
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n" + payload + b"\r\n--B--\r\n"
    )
    assert parse_multipart(body, "multipart/form-data; boundary=B") == {
        "model": "whisper",
        "file": payload,
    }


def test_reply_pieces_and_png() -> None:
    assert "".join(reply_pieces(5)) == "demo reply 1 2 3"
    assert reply_pieces(1) == ["demo"]
    assert len(reply_pieces(8)) == 8
    assert tiny_png()[12:16] == b"IHDR"
