"""The series a cluster router scores this machine by: the model-server metric protocol."""

from __future__ import annotations

from collections.abc import Iterable

from service.api.exposition import sample_line
from service.domain import InstanceState
from service.kernel.views import NodeLoad, ServiceLoad

RUNNING_STATES = frozenset({InstanceState.READY.value})
LOADING_STATES = frozenset({InstanceState.STARTING.value})


def router_exposition(load: NodeLoad, now: float) -> str:
    """The protocol's series as Prometheus text, ``now`` being the wall-clock time.

    A pool of machines, one vramd on each, is routed by an existing router, never by vramd
    (docs/deployment.md, "Many machines"). The Kubernetes Gateway API inference extension's
    endpoint picker scrapes every endpoint's ``/metrics`` for vLLM's names and scores
    endpoints by queue, KV-cache use and which models (LoRA adapters, to vLLM) are loaded.
    vramd answers under the same names, so the picker's stock scorers route by vramd's load
    and send a request where its model is already resident (docs/api.md, "GET /metrics")::

        vllm:num_requests_waiting      every request queued: for a slot, a load or memory
        vllm:num_requests_running      requests in service
        vllm:kv_cache_usage_perc       0..1: the highest KV use among ready runtimes that
                                       report it, else the share of the budget charged
        vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}
                                       the time of the scrape; running: the model names of
                                       ready services, waiting: of those loading or queued
                                       for a load; max_lora: how many model names it serves
        vramd_model_requests_waiting{model}, vramd_model_resident{model}

    The first three come first and carry no labels, as the picker expects. A service's
    figures are shared by each of its model names (``models: [a, b]``).

    The router asks 20 times a second and reads a slow answer as saturation, so these lines
    are written at each scrape from ``NodeLoad`` (the kernel's counts, the sampler's KV
    figures) with ``service.api.exposition``'s plain formatting.
    """
    services = load.services
    running, waiting = resident_models(services)
    served = sum(len(svc.models) for svc in services)
    lines = [
        *_gauge(
            "vllm:num_requests_waiting",
            "Requests queued on this machine: for a slot, a model load or memory.",
            sum(svc.queued for svc in services),
        ),
        *_gauge(
            "vllm:num_requests_running",
            "Requests being served on this machine.",
            sum(svc.in_flight for svc in services),
        ),
        *_gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache use, 0-1: the highest among ready runtimes that report it, "
            "else the share of the memory budget charged.",
            kv_cache_usage(load),
        ),
        "# HELP vllm:lora_requests_info Models loaded (running) and loading or queued for "
        "a load (waiting); the value is the time of the scrape.",
        "# TYPE vllm:lora_requests_info gauge",
        sample_line(
            "vllm:lora_requests_info",
            {
                "max_lora": str(served),
                "running_lora_adapters": ",".join(running),
                "waiting_lora_adapters": ",".join(waiting),
            },
            now,
        ),
        "# HELP vramd_model_requests_waiting Requests queued for the service of the model.",
        "# TYPE vramd_model_requests_waiting gauge",
        *(
            sample_line("vramd_model_requests_waiting", {"model": model}, svc.queued)
            for svc in services
            for model in svc.models
        ),
        "# HELP vramd_model_resident 1 while the service of the model is loaded and ready.",
        "# TYPE vramd_model_resident gauge",
        *(
            sample_line("vramd_model_resident", {"model": model}, int(svc.state in RUNNING_STATES))
            for svc in services
            for model in svc.models
        ),
    ]
    return "\n".join(lines) + "\n"


def resident_models(services: Iterable[ServiceLoad]) -> tuple[list[str], list[str]]:
    """Model names of ready services, and of services loading or queued for a load."""
    running: list[str] = []
    waiting: list[str] = []
    for svc in services:
        if svc.state in RUNNING_STATES:
            running += svc.models
        elif svc.state in LOADING_STATES or svc.queued or svc.waiting_for_memory:
            waiting += svc.models
    return sorted(running), sorted(waiting)


def kv_cache_usage(load: NodeLoad) -> float:
    """The highest KV use a ready runtime reports; else the budget's charged share."""
    reported = [
        svc.kv_usage
        for svc in load.services
        if svc.state in RUNNING_STATES and svc.kv_usage is not None
    ]
    if reported:
        return max(reported)
    if load.budget_bytes <= 0:
        return 0.0
    return min(1.0, max(0.0, load.charged_bytes / load.budget_bytes))


def _gauge(name: str, help_: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} gauge", sample_line(name, {}, value)]
