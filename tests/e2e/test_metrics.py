"""``GET /metrics``: the Prometheus exposition of ``service.api.metrics``.

Unit tests build ``Metrics`` on a fake status view (read when a scrape finds the
snapshot of vramd's series stale) and drive the live instruments directly. End-to-end
tests scrape a real ``vramd serve`` running two demo services, one pinned, and send real
requests through ``/v1`` to watch the request counter and histograms move.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support.contract import status_of
from support.daemon import Daemon, demo_command, policy_yaml, running_daemon

from service.api.exposition import family_text
from service.api.metrics import FLAGS, STATES, Metrics, status_families
from service.contract import Status

MiB = 2**20


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample called ``name`` whose labels include ``labels``; None if absent."""
    found = [
        s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


# ----------------------------------------------------------------- unit: Metrics


def fake_status() -> dict[str, Any]:
    service = {
        "name": "chat",
        "state": "ready",
        "footprint_bytes": 400 * MiB,
        "host_bytes": 30 * MiB,
        "expected_peak_bytes": 450 * MiB,
        "learned_peak_bytes": None,
        "estimate_bytes": 450 * MiB,
        "cap_bytes": 600 * MiB,
        "in_flight": 2,
        "queued": 1,
        "flags": ["creeping"],
        "loads": 3,
        "evictions": 1,
        "restarts": 0,
    }
    return {
        "backend": "nvml",
        "devices": [
            {
                "index": 0,
                "name": "H100",
                "total_bytes": 80 * 1024 * MiB,
                "used_bytes": 10 * 1024 * MiB,
                "free_bytes": 70 * 1024 * MiB,
                "foreign_bytes": 1024 * MiB,
                "headroom_bytes": 512 * MiB,
                "budget_bytes": 78 * 1024 * MiB,
                "available_bytes": -5 * MiB,
            }
        ],
        "services": [
            service,
            dict(
                service,
                name="embed",
                state="stopped",
                cap_bytes=None,
                flags=[],
                loads=0,
                waiting_for_memory=True,
            ),
        ],
    }


class FakeStatus:
    """A status view the test can change between scrapes; counts the reads."""

    def __init__(self) -> None:
        self.view = fake_status()
        self.reads = 0

    def __call__(self) -> Status:
        self.reads += 1
        return status_of(copy.deepcopy(self.view))


@pytest.fixture
def status() -> FakeStatus:
    return FakeStatus()


@pytest.fixture
def metrics(status: FakeStatus) -> Metrics:
    return Metrics(status, version="9.9.9", backend="nvml")


def scrape(metrics: Metrics) -> str:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return body.decode()


def test_status_is_read_when_scraped_and_again_once_the_snapshot_is_stale(
    status: FakeStatus,
) -> None:
    now = [0.0]
    metrics = Metrics(status, version="9.9.9", backend="nvml", clock=lambda: now[0])
    assert status.reads == 0  # building the registry reads nothing
    text = scrape(metrics)
    assert status.reads == 1
    assert value(text, "vramd_service_in_flight", service="chat") == 2
    status.view["services"][0]["in_flight"] = 7
    assert value(scrape(metrics), "vramd_service_in_flight", service="chat") == 2
    now[0] += 3.0  # three sample intervals later, nothing having kept the snapshot fresh
    assert value(scrape(metrics), "vramd_service_in_flight", service="chat") == 7
    assert status.reads == 2


def test_info_and_device_gauges(metrics: Metrics) -> None:
    text = scrape(metrics)
    assert value(text, "vramd_info", version="9.9.9", backend="nvml") == 1
    device = {"device": "0"}
    assert value(text, "vramd_device_total_bytes", **device) == 80 * 1024 * MiB
    assert value(text, "vramd_device_used_bytes", **device) == 10 * 1024 * MiB
    assert value(text, "vramd_device_free_bytes", **device) == 70 * 1024 * MiB
    assert value(text, "vramd_device_foreign_bytes", **device) == 1024 * MiB
    assert value(text, "vramd_device_budget_bytes", **device) == 78 * 1024 * MiB
    assert value(text, "vramd_device_headroom_bytes", **device) == 512 * MiB
    assert value(text, "vramd_device_available_bytes", **device) == -5 * MiB


def test_service_gauges_and_absent_values(metrics: Metrics) -> None:
    text = scrape(metrics)
    chat = {"service": "chat"}
    assert value(text, "vramd_service_footprint_bytes", **chat) == 400 * MiB
    assert value(text, "vramd_service_host_bytes", **chat) == 30 * MiB
    assert value(text, "vramd_service_expected_peak_bytes", **chat) == 450 * MiB
    assert value(text, "vramd_service_estimate_bytes", **chat) == 450 * MiB
    assert value(text, "vramd_service_cap_bytes", **chat) == 600 * MiB
    assert value(text, "vramd_service_queued", **chat) == 1
    assert value(text, "vramd_service_waiting_for_memory", **chat) == 0
    assert value(text, "vramd_service_waiting_for_memory", service="embed") == 1
    # Not learned yet, no cap: no sample rather than a misleading zero.
    assert value(text, "vramd_service_learned_peak_bytes", **chat) is None
    assert value(text, "vramd_service_cap_bytes", service="embed") is None


def test_a_spanning_service_has_one_series_per_device(metrics: Metrics, status: FakeStatus) -> None:
    chat = status.view["services"][0]
    chat["device_bytes"] = {"0": 300 * MiB, "1": 100 * MiB}
    chat["charge_by_device"] = {"0": 300 * MiB, "1": 225 * MiB}
    text = scrape(metrics)
    for device, used, charged in (("0", 300, 300), ("1", 100, 225)):
        labels = {"service": "chat", "device": device}
        assert value(text, "vramd_service_device_footprint_bytes", **labels) == used * MiB
        assert value(text, "vramd_service_device_charge_bytes", **labels) == charged * MiB
    assert value(text, "vramd_service_device_footprint_bytes", service="embed") is None


def test_state_set_and_flags(metrics: Metrics) -> None:
    text = scrape(metrics)
    for name, current in (("chat", "ready"), ("embed", "stopped")):
        states = {
            s.labels["state"]: s.value
            for s in samples(text)
            if s.name == "vramd_service_state" and s.labels["service"] == name
        }
        assert set(states) == set(STATES)
        assert [state for state, v in states.items() if v == 1] == [current]
        assert sum(states.values()) == 1
    flags = {
        s.labels["flag"]: s.value
        for s in samples(text)
        if s.name == "vramd_service_flag" and s.labels["service"] == "chat"
    }
    assert flags == {flag: (1 if flag == "creeping" else 0) for flag in FLAGS}


def test_counters_from_the_service_view(metrics: Metrics) -> None:
    families = {f.name: f for f in text_string_to_metric_families(scrape(metrics))}
    for name in ("vramd_service_loads", "vramd_service_evictions", "vramd_service_restarts"):
        assert families[name].type == "counter"
    text = scrape(metrics)
    assert value(text, "vramd_service_loads_total", service="chat") == 3
    assert value(text, "vramd_service_evictions_total", service="chat") == 1
    assert value(text, "vramd_service_loads_total", service="embed") == 0


def test_requests_and_histograms(metrics: Metrics) -> None:
    metrics.request_done("chat", "ok", queue_s=0.002)
    metrics.request_done("chat", "ok", queue_s=3.0)
    metrics.request_done("chat", "queue_full")
    metrics.load_done("chat", 1.5)
    text = scrape(metrics)
    assert value(text, "vramd_requests_total", service="chat", code="ok") == 2
    assert value(text, "vramd_requests_total", service="chat", code="queue_full") == 1
    # Only requests that got a slot have a wait to observe.
    assert value(text, "vramd_queue_wait_seconds_count", service="chat") == 2
    assert value(text, "vramd_queue_wait_seconds_sum", service="chat") == pytest.approx(3.002)
    assert value(text, "vramd_queue_wait_seconds_bucket", service="chat", le="0.005") == 1
    assert value(text, "vramd_load_seconds_count", service="chat") == 1
    assert value(text, "vramd_load_seconds_bucket", service="chat", le="2.0") == 1
    assert value(text, "vramd_load_seconds_bucket", service="chat", le="1.0") == 0


def test_each_metrics_has_its_own_registry(status: FakeStatus) -> None:
    first = Metrics(status, version="1")
    second = Metrics(status, version="1")  # would raise "Duplicated timeseries" if shared
    first.request_done("chat", "ok")
    assert value(scrape(first), "vramd_requests_total", service="chat", code="ok") == 1
    assert value(scrape(second), "vramd_requests_total", service="chat", code="ok") is None
    # Without a backend given, the status view's is used.
    assert value(scrape(second), "vramd_info", version="1", backend="nvml") == 1


# ----------------------------------------------------------- end to end: a daemon


SERVICES = {
    "chat": {
        "kind": "chat",
        "models": ["m-chat"],
        "command": demo_command("40MiB"),
        "memory": {"estimate": "70MiB", "cap": "200MiB"},
        "residency": "pinned",
        "stop_timeout": "2s",
    },
    "embed": {
        "kind": "embedding",
        "models": ["m-embed"],
        "command": demo_command("20MiB"),
        "memory": {"estimate": "50MiB"},
        "stop_timeout": "2s",
    },
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir: Path = tmp_path_factory.mktemp("metrics")
    with running_daemon(policy_yaml(SERVICES), workdir, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 20 * MiB)
        yield daemon


def scrape_daemon(daemon: Daemon) -> str:
    response = daemon.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def test_daemon_exposes_device_and_service_gauges(daemon: Daemon) -> None:
    text = scrape_daemon(daemon)
    assert value(text, "vramd_info", backend="host") == 1
    total = value(text, "vramd_device_total_bytes", device="0")
    used = value(text, "vramd_device_used_bytes", device="0")
    free = value(text, "vramd_device_free_bytes", device="0")
    assert total and used and free
    assert used + free == pytest.approx(total)
    assert value(text, "vramd_device_budget_bytes", device="0") == 600 * MiB - 16 * MiB
    assert value(text, "vramd_device_headroom_bytes", device="0") == 16 * MiB
    assert (value(text, "vramd_device_foreign_bytes", device="0") or 0) >= 0
    assert (value(text, "vramd_service_footprint_bytes", service="chat") or 0) > 20 * MiB
    assert value(text, "vramd_service_footprint_bytes", service="embed") == 0
    assert value(text, "vramd_service_cap_bytes", service="chat") == 200 * MiB
    assert value(text, "vramd_service_cap_bytes", service="embed") is None
    assert (value(text, "vramd_service_loads_total", service="chat") or 0) >= 1


def test_daemon_state_set_has_one_current_state(daemon: Daemon) -> None:
    text = scrape_daemon(daemon)
    api = {s["name"]: s["state"] for s in daemon.get("/api/services").json()}
    for name in ("chat", "embed"):
        current = [
            s.labels["state"]
            for s in samples(text)
            if s.name == "vramd_service_state" and s.labels["service"] == name and s.value == 1
        ]
        assert current == [api[name]]


def test_metrics_needs_no_admin_key(tmp_path: Path) -> None:
    extra = "server:\n  admin_keys: [k-admin-0123]\n"
    with running_daemon(policy_yaml(SERVICES, extra=extra), tmp_path, in_thread=True) as daemon:
        assert daemon.get("/api/status").status_code == 401
        assert "vramd_device_total_bytes" in scrape_daemon(daemon)


def test_requests_are_counted(daemon: Daemon) -> None:
    before = scrape_daemon(daemon)
    chat = {"model": "m-chat", "messages": [{"role": "user", "content": "hi"}]}
    assert daemon.post("/v1/chat/completions", json=chat, timeout=30).status_code == 200
    embed = {"model": "m-embed", "input": "hello"}
    assert daemon.post("/v1/embeddings", json=embed, timeout=30).status_code == 200
    missing = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    assert daemon.post("/v1/chat/completions", json=missing).status_code == 404
    # vramd's own series are renewed once per sample interval (0.2 s here) while scraped.
    after = ""

    def grew(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    def counted() -> bool:
        nonlocal after
        after = scrape_daemon(daemon)
        return grew("vramd_requests_total", code="model_not_found") == 1

    daemon.wait_for(counted, timeout=10)

    assert grew("vramd_requests_total", service="chat", code="ok") == 1
    assert grew("vramd_requests_total", service="embed", code="ok") == 1
    assert grew("vramd_requests_total", code="model_not_found") == 1
    assert grew("vramd_queue_wait_seconds_count", service="chat") == 1
    # embed was loaded for its request: one spawn-to-ready observed, and a cold wait.
    assert grew("vramd_load_seconds_count", service="embed") == 1
    assert grew("vramd_queue_wait_seconds_sum", service="embed") > 0.05
    assert (value(after, "vramd_load_seconds_count", service="chat") or 0) >= 1


def test_vramds_text_reads_back_as_prometheus_clients_own_would(metrics: Metrics) -> None:
    status = fake_status()
    status["services"][1]["name"] = 'odd "name"\\with\nbreaks'
    metrics.request_done("chat", "ok", queue_s=0.3)
    metrics.load_done("chat", 12.0)
    families = [
        *status_families(status_of(status), version="9", backend=None),
        *metrics.registry.collect(),
    ]

    class Families:
        def collect(self) -> list[Metric]:
            return families

    theirs = generate_latest(Families()).decode()  # type: ignore[arg-type]
    ours = "".join(family_text(family) for family in families)

    def read(text: str) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """Every family and sample, ``_created`` left out (vramd does not write it)."""
        return [
            (f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
            for f in text_string_to_metric_families(text)
            if not f.name.endswith("_created")
        ]

    assert read(ours) == read(theirs)
    assert 'service="odd \\"name\\"\\\\with\\nbreaks"' in ours
