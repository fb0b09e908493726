"""``span: 2`` end to end: a real daemon on ``backend: nvml`` over two simulated GPUs.

The simulated box numbers its GPUs differently for CUDA ("fastest first": CUDA's 0 is
NVML's 1) than NVML does, as a box with two different cards does. The demo runtime
allocates as a CUDA program would, by ``CUDA_VISIBLE_DEVICES`` read in CUDA's numbering
unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. So the runtime's memory landing on the devices
vramd admitted it to, with the right share on each, proves the placement environment;
``/api/services``, ``vramd ps`` and ``/metrics`` show it per device; a single-device
load evicts the spanning instance for its share on one device, and starts only once the
simulated driver has released that memory (the release lag).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import REPO_ROOT, Daemon, running_daemon

MiB = 1024**2
DEMO = '["${PYTHON}", "-m", "service.demo_runtime", "--port", "${PORT}", "--model", "${MODEL}"'


def policy() -> str:
    return f"""\
version: 1
device:
  backend: nvml
  headroom: 64MiB
  sample_interval: 0.2s
services:
  big:
    kind: chat
    models: [big-model]
    command: {DEMO}, "--memory", "20MiB", "--gpu-memory", "1500MiB", "--gpu-split", "0.6,0.4"]
    span: 2
    memory: {{estimate: 1500MiB, cap: 1800MiB, split: [0.6, 0.4]}}
  small:
    kind: chat
    models: [small-model]
    command: {DEMO}, "--memory", "20MiB", "--gpu-memory", "1400MiB"]
    gpus: [1]
    memory: {{estimate: 1400MiB}}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("span")
    state = workdir / "gpus.json"
    subprocess.run(
        [
            *(sys.executable, "-m", "service.simgpu", "init", "--state", str(state)),
            *("--gpu", "2GiB", "--gpu", "2GiB", "--reserved", "64MiB", "--release-lag", "0.5"),
            *("--fastest-first", "1,0"),
        ],
        check=True,
        cwd=REPO_ROOT,
    )
    env = {"VRAMD_SIMULATED_GPUS": str(state)}
    with running_daemon(policy(), workdir, env=env, in_thread=True) as d:
        d.wait_for(lambda: len(d.get("/api/status").json()["devices"]) == 2)
        yield d


def chat(daemon: Daemon, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = daemon.post("/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def measured(daemon: Daemon, name: str) -> dict[str, int]:
    return {k: int(v) for k, v in daemon.service(name)["device_bytes"].items()}


def test_a_span_2_service_loads_on_both_gpus_with_its_split(daemon: Daemon) -> None:
    chat(daemon, "big-model")
    svc = daemon.service("big")
    assert (svc["devices"], svc["span"]) == ([0, 1], 2)
    # Charged its share of the estimate on each, or what it measures there if more.
    assert svc["charge_by_device"]["0"] >= 900 * MiB
    assert svc["charge_by_device"]["1"] >= 600 * MiB
    daemon.wait_for(lambda: len(measured(daemon, "big")) == 2)
    on = measured(daemon, "big")
    # Where the runtime says it allocated: NVML's 0 holds the 60 % share. Without
    # CUDA_DEVICE_ORDER=PCI_BUS_ID its first device would have been NVML's 1.
    seen = daemon.get("/upstream/big/debug/gpu").json()
    assert seen["cuda_visible_devices"] == "0,1"
    assert seen["cuda_device_order"] == "PCI_BUS_ID"
    by_index = {d["index"]: d["bytes"] for d in seen["devices"]}
    assert by_index[0] == pytest.approx(900 * MiB, rel=0.05)
    assert by_index[1] == pytest.approx(600 * MiB, rel=0.05)
    # ... and vramd measured the same, per device (a CUDA context rides on each).
    assert on["0"] == pytest.approx(900 * MiB, rel=0.05)
    assert on["1"] == pytest.approx(600 * MiB, rel=0.05)
    footprint = daemon.service("big")["footprint_bytes"]
    assert footprint == pytest.approx(sum(on.values()), rel=0.05)
    status = daemon.get("/api/status").json()
    charges = {d["index"]: d["charges"] for d in status["devices"]}
    assert charges[0]["big"] >= 900 * MiB and charges[1]["big"] >= 600 * MiB


def test_ps_and_metrics_show_the_span_per_device(daemon: Daemon) -> None:
    chat(daemon, "big-model")
    ps = subprocess.run(
        [sys.executable, "-m", "service.cli", "ps", "--url", daemon.url],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert ps.returncode == 0, ps.stderr
    lines = ps.stdout.splitlines()
    row = lines.index(next(line for line in lines if line.startswith("big ")))
    assert lines[row].split()[2] == "0:" and lines[row + 1].split()[0] == "1:"
    series = {
        (sample.name, sample.labels.get("service"), sample.labels.get("device")): sample.value
        for family in text_string_to_metric_families(daemon.get("/metrics").text)
        for sample in family.samples
    }
    for device, share in (("0", 900), ("1", 600)):
        used = series[("vramd_service_device_footprint_bytes", "big", device)]
        assert used == pytest.approx(share * MiB, rel=0.05)
        assert series[("vramd_service_device_charge_bytes", "big", device)] >= share * MiB
    listed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "service.cli", "ps", "--json", "--url", daemon.url],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=60,
        ).stdout
    )
    big = next(s for s in listed["services"] if s["name"] == "big")
    assert big["devices"] == [0, 1]


def test_a_load_on_one_gpu_evicts_the_span_and_waits_for_the_driver(daemon: Daemon) -> None:
    chat(daemon, "big-model")
    # GPU 1: 2 GiB - 64 MiB reserve - 64 MiB headroom = 1920 MiB; big holds 600 MiB of
    # it, so small (1400 MiB, GPU 1 only) must evict big.
    chat(daemon, "small-model")
    assert daemon.service("big")["state"] == "stopped"
    small = daemon.service("small")
    assert (small["state"], small["devices"]) == ("ready", [1])
    evictions = [e for e in daemon.events(service="small") if e["kind"] == "evict"]
    assert evictions and "big" in evictions[-1]["data"]["victims"]
    # Started only after the simulated driver gave big's memory back: its load saw no
    # out-of-memory, and no settle gave up.
    assert not [e for e in daemon.events(service="big") if e["kind"] == "settle-timeout"]
    assert small["loads"] == 1 and small["last_error"] is None
