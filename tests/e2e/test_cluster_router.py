"""A cluster router reading a running vramd: the ``vllm:*`` protocol, live, and while a
device probe hangs.

The endpoint picker in front of a pool of vramd machines (docs/deployment.md, "Many
machines") parses ``/metrics`` for vLLM's names. Here a real daemon serves three
services whose model names differ from their service names: one resident (a llama.cpp
runtime, as far as its ``/slots`` go, serving a slow request), one loading with requests
queued behind the load, one never asked for. The scrape, parsed with prometheus-client's
parser, must show the queue, the request in service, the runtime's own KV use and the
model names in the right lists. Then, on simulated GPUs, every NVML call is made to hang
and ``/metrics`` must go on answering from what the sampler last saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon
from support.simgpu import simulated_gpus

SERVICES = {
    "chat-svc": {
        "kind": "chat",
        "models": ["chat-a", "chat-b"],
        "adapter": "llama.cpp",
        "command": demo_command("30MiB", "--latency-ms", "6000", "--parallel", "2"),
        "memory": {"estimate": "60MiB"},
        "residency": "pinned",
        "max_concurrency": 2,
        "stop_timeout": "1s",
    },
    "coder-svc": {
        "kind": "chat",
        "models": ["coder"],
        # Loads for longer than the test looks: its requests wait for the load.
        "command": demo_command("30MiB", load_seconds=120),
        "memory": {"estimate": "60MiB"},
        "startup_timeout": "5m",
        "stop_timeout": "1s",
    },
    "embed-svc": {
        "kind": "embedding",
        "models": ["embed-x"],
        "command": demo_command("20MiB"),
        "memory": {"estimate": "40MiB"},
    },
}


def families(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def chat(daemon: Daemon, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "tell me a story"}]}
    # Refused or cut when the daemon stops: only the waiting is of interest.
    with suppress(httpx.HTTPError):
        httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60)


@pytest.fixture
def busy_daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(policy_yaml(SERVICES), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat-svc")["state"] == "ready")
        with ThreadPoolExecutor(3) as pool:
            pool.submit(chat, daemon, "chat-a")
            pool.submit(chat, daemon, "coder")
            pool.submit(chat, daemon, "coder")
            yield daemon
            daemon.thread.stop()  # type: ignore[union-attr]  # ends the waiting requests


def test_a_router_sees_queue_running_kv_and_resident_model_names(busy_daemon: Daemon) -> None:
    daemon = busy_daemon
    scraped: dict[str, list[Any]] = {}
    kv_of_chat: list[float | None] = [None]

    def settled() -> bool:
        scraped.update(families(daemon.get("/metrics").text))
        kv_of_chat[0] = daemon.service("chat-svc")["memory"]["kv_cache_usage_ratio"]
        return (
            scraped["vllm:num_requests_waiting"][0].value == 2
            and scraped["vllm:num_requests_running"][0].value == 1
            # Once the sampler has read the busy slot, both say the same (a router's
            # figure from the budget's share instead would never agree).
            and (kv_of_chat[0] or 0) > 0
            and scraped["vllm:kv_cache_usage_perc"][0].value == pytest.approx(kv_of_chat[0])
        )

    daemon.wait_for(settled, timeout=30)
    order = list(scraped)
    assert order[:3] == [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ]
    assert all(scraped[name][0].labels == {} for name in order[:3])
    # KV use is the resident runtime's own (from its /slots), not the budget's share.
    (kv,) = scraped["vllm:kv_cache_usage_perc"]
    assert 0 < kv.value <= 1
    (info,) = scraped["vllm:lora_requests_info"]
    assert info.labels == {
        "max_lora": "4",
        "running_lora_adapters": "chat-a,chat-b",
        "waiting_lora_adapters": "coder",
    }
    resident = {s.labels["model"]: s.value for s in scraped["vramd_model_resident"]}
    waiting = {s.labels["model"]: s.value for s in scraped["vramd_model_requests_waiting"]}
    assert resident == {"chat-a": 1, "chat-b": 1, "coder": 0, "embed-x": 0}
    assert waiting == {"chat-a": 0, "chat-b": 0, "coder": 2, "embed-x": 0}


def test_metrics_answers_while_every_nvml_call_hangs(tmp_path: Path) -> None:
    gpus = simulated_gpus(tmp_path, "8GiB")
    services = {
        "chat-svc": {
            "kind": "chat",
            "models": ["chat-a"],
            "command": demo_command("20MiB", gpu_memory="1GiB"),
            "memory": {"estimate": "1536MiB"},
            "residency": "pinned",
        }
    }
    with running_daemon(gpus.policy(services), tmp_path, in_thread=True, env=gpus.env) as daemon:
        daemon.wait_for(lambda: daemon.service("chat-svc")["state"] == "ready")
        gpus.hang(seconds=30)

        def sample_age() -> float:
            ages = daemon.get("/healthz").json()["progress_age_s"]
            return float(ages["memory samples"] or 0)

        daemon.wait_for(lambda: sample_age() > 1.0, timeout=10)  # the probe is stuck
        for _ in range(20):
            response = daemon.get("/metrics", timeout=2)
            assert response.status_code == 200
            scraped = families(response.text)
            assert scraped["vllm:lora_requests_info"][0].labels["running_lora_adapters"] == (
                "chat-a"
            )
            assert scraped["vramd_device_total_bytes"][0].value == 8 * 2**30
        assert sample_age() > 1.0  # still stuck: every answer above came during the hang
        gpus.hang(seconds=0)
