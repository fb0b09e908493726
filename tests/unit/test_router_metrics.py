"""The model-server metric protocol on ``/metrics``, and how fresh each part of it is.

``router_exposition`` is parsed back with prometheus-client's own text parser, as a
router's scraper would read it: the unlabelled ``vllm:*`` gauges first, the model lists
of ``vllm:lora_requests_info`` from the served model names, KV use from the runtimes or
the budget. ``Metrics`` keeps vramd's own series as a snapshot renewed at the sampler's
pace, and writes the router's series at every scrape. llama.cpp's ``/slots`` answer
(its current and older shapes) gives KV use where its metrics no longer do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.contract import status_of

from service.adapters.llamacpp import slots_kv_usage
from service.api.metrics import Metrics
from service.api.router_metrics import router_exposition
from service.contract import Status
from service.kernel.views import NodeLoad, ServiceLoad

GiB = 2**30


def load(*services: ServiceLoad, budget: int = 20 * GiB, charged: int = 5 * GiB) -> NodeLoad:
    return NodeLoad(services, budget_bytes=budget, charged_bytes=charged)


def svc(
    *models: str,
    state: str = "ready",
    in_flight: int = 0,
    queued: int = 0,
    waiting_for_memory: bool = False,
    kv: float | None = None,
) -> ServiceLoad:
    return ServiceLoad(models, state, in_flight, queued, waiting_for_memory, kv)


def parsed(text: str) -> dict[str, list[Any]]:
    """Family name -> its samples, in the order the text has them."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_unlabelled_gauges_come_first_and_sum_the_node() -> None:
    node = load(
        svc("chat-8b", "default", in_flight=3, queued=1),
        svc("coder-7b", state="starting", queued=4),
        svc("flux", state="stopped", queued=2, waiting_for_memory=True),
    )
    families = parsed(router_exposition(node, now=1_700_000_000.0))
    assert list(families)[:3] == [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ]
    for name in list(families)[:3]:
        assert [s.labels for s in families[name]] == [{}]
    assert families["vllm:num_requests_waiting"][0].value == 7
    assert families["vllm:num_requests_running"][0].value == 3


def test_lora_info_lists_resident_models_as_running_and_loading_or_queued_as_waiting() -> None:
    node = load(
        svc("chat-8b", "default"),
        svc("coder-7b", state="starting"),
        svc("flux", state="stopped", queued=1),
        svc("sdxl", state="stopped", waiting_for_memory=True),
        svc("tts", state="stopped"),
        svc("whisper", state="draining"),
    )
    (info,) = parsed(router_exposition(node, now=1_700_000_123.5))["vllm:lora_requests_info"]
    assert info.labels == {
        "max_lora": "7",
        "running_lora_adapters": "chat-8b,default",
        "waiting_lora_adapters": "coder-7b,flux,sdxl",
    }
    assert info.value == 1_700_000_123.5


def test_per_model_series_name_models_not_services() -> None:
    node = load(svc("chat-8b", "default", queued=2), svc("flux", state="stopped", queued=5))
    families = parsed(router_exposition(node, now=0.0))
    waiting = {s.labels["model"]: s.value for s in families["vramd_model_requests_waiting"]}
    resident = {s.labels["model"]: s.value for s in families["vramd_model_resident"]}
    assert waiting == {"chat-8b": 2, "default": 2, "flux": 5}
    assert resident == {"chat-8b": 1, "default": 1, "flux": 0}


@pytest.mark.parametrize(
    ("services", "budget", "charged", "expected"),
    [
        # The highest reported by a ready runtime wins over the budget's share.
        ([svc("a", kv=0.25), svc("b", kv=0.6), svc("c", state="stopped", kv=0.9)], 10, 9, 0.6),
        # Nobody reports: the share of the budget charged.
        ([svc("a"), svc("b", state="starting")], 20 * GiB, 5 * GiB, 0.25),
        # Charged over the budget (a load being made room for) stays within 0..1.
        ([svc("a")], 10, 14, 1.0),
        # No device sampled yet.
        ([svc("a")], 0, 0, 0.0),
    ],
)
def test_kv_cache_usage_is_a_share(
    services: list[ServiceLoad], budget: int, charged: int, expected: float
) -> None:
    node = load(*services, budget=budget, charged=charged)
    (sample,) = parsed(router_exposition(node, now=0.0))["vllm:kv_cache_usage_perc"]
    assert sample.value == pytest.approx(expected)


def test_model_names_with_quotes_and_backslashes_survive_the_text_format() -> None:
    odd = 'we"ird\\name\nx'
    families = parsed(router_exposition(load(svc(odd, queued=1)), now=0.0))
    assert families["vramd_model_requests_waiting"][0].labels == {"model": odd}


# ------------------------------------------------------------------ /slots to KV use


def slot(n_ctx: int, processing: bool, **fields: Any) -> dict[str, Any]:
    return {"id": 0, "n_ctx": n_ctx, "is_processing": processing, **fields}


def test_kv_use_from_slots_counts_tokens_of_busy_slots_over_every_context() -> None:
    slots = [
        slot(4096, True, n_prompt_tokens=1024, next_token=[{"n_decoded": 10}]),
        slot(4096, False, n_prompt_tokens=4000),  # an idle slot's cached prompt: not load
    ]
    assert slots_kv_usage(slots) == pytest.approx(1024 / 8192)


def test_kv_use_from_older_slot_answers() -> None:
    assert slots_kv_usage([slot(2048, True, n_past=512)]) == pytest.approx(0.25)
    assert slots_kv_usage([slot(2048, True)]) == 0.0  # busy, but says no count
    assert slots_kv_usage([slot(100, True, n_prompt_tokens=500)]) == 1.0  # clamped


@pytest.mark.parametrize(
    "answer", [[], {"slots": []}, [{"id": 0, "is_processing": True}], [slot(0, True)], "text"]
)
def test_an_answer_that_is_not_a_slot_list_gives_no_kv_figure(answer: Any) -> None:
    assert slots_kv_usage(answer) is None


# --------------------------------------------------------------- Metrics' freshness


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def status_with(in_flight: int) -> dict[str, Any]:
    service = {"name": "chat", "state": "ready", "in_flight": in_flight, "models": ["m"]}
    return {"backend": "host", "devices": [], "services": [service]}


def test_vramd_series_are_a_snapshot_renewed_at_the_sampler_pace() -> None:
    clock, reads, node = Clock(), [], [load(svc("m", in_flight=1))]

    def status() -> Status:
        reads.append(clock.t)
        return status_of(status_with(in_flight=len(reads)))

    metrics = Metrics(status, version="1", node_load=lambda: node[0], refresh_s=1.0, clock=clock)
    first = parsed(metrics.render()[0].decode())
    assert first["vramd_service_in_flight"][0].value == 1
    node[0] = load(svc("m", in_flight=4))
    clock.t += 2.0  # within 2.5 intervals: the snapshot stands, the router's part is new
    second = parsed(metrics.render()[0].decode())
    assert reads == [100.0]
    assert second["vramd_service_in_flight"][0].value == 1
    assert second["vllm:num_requests_running"][0].value == 4
    clock.t += 1.0  # 3 intervals old: this scrape renders vramd's series again
    third = parsed(metrics.render()[0].decode())
    assert reads == [100.0, 103.0]
    assert third["vramd_service_in_flight"][0].value == 2


async def test_the_snapshot_is_kept_fresh_in_the_background_while_scraped() -> None:
    reads: list[int] = []

    def status() -> Status:
        reads.append(1)
        return status_of(status_with(in_flight=len(reads)))

    metrics = Metrics(status, version="1", refresh_s=0.01)
    refresher = asyncio.create_task(metrics.keep_fresh())
    try:
        await asyncio.sleep(0.05)
        assert reads == []  # nobody scraped: nothing rendered
        metrics.render()
        while len(reads) < 3:
            await asyncio.sleep(0.01)
        text = metrics.render()[0].decode()
        assert parsed(text)["vramd_service_in_flight"][0].value >= 2
    finally:
        refresher.cancel()
