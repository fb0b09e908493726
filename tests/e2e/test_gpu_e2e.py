"""``vramd serve`` on ``device.backend: nvml`` over simulated GPUs (``service.simgpu``).

The daemon reads NVML through the unchanged probe; its demo runtimes hold "device
memory" with ``--gpu-memory`` on the GPUs their ``CUDA_VISIBLE_DEVICES`` names, numbered
fastest first unless the daemon also sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. So these are
the multi-GPU checks that a host-backend daemon cannot make: placement on the GPU with
room (and the runtime really there), a foreign process counted as foreign, eviction on a
full GPU whose replacement waits for the driver's release lag, host-memory creep beside
flat GPU memory, and an out-of-memory load with enough free memory in total
(fragmentation). Over-cap and device creep run on both backends in
``test_memory_truth_e2e``. Placement tests leave one GPU with room, so they hold whatever
rule picks among GPUs that fit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from support.daemon import FAST_CREEP, REPO_ROOT, Daemon, demo_command, running_daemon
from support.simgpu import simulated_gpus

MiB, GiB = 2**20, 2**30
CONTEXT = 16 * MiB  # what each simulated CUDA context costs (simulated_gpus' default)


def service(gpu_memory: str, *extra: str, **keys: Any) -> dict[str, Any]:
    """A chat service whose runtime holds ``gpu_memory`` on its GPU (keys override)."""
    spec: dict[str, Any] = {
        "kind": "chat",
        "models": ["m"],
        "command": demo_command("10MiB", *extra, gpu_memory=gpu_memory),
        "memory": {"estimate": gpu_memory},
        "residency": "on-demand",
        "stop_timeout": "2s",
    }
    spec.update(keys)
    return spec


def ask(daemon: Daemon, model: str) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )


def landed(daemon: Daemon, name: str) -> list[dict[str, int]]:
    """The runtime's own account of where its memory is (GET /debug/gpu, via /upstream)."""
    response = daemon.get(f"/upstream/{name}/debug/gpu", timeout=10)
    response.raise_for_status()
    devices: list[dict[str, int]] = response.json()["devices"]
    return devices


def metric(text: str, name: str, **labels: str) -> float:
    wanted = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{wanted} not in /metrics")


def test_placement_lands_on_the_gpu_with_room_and_others_memory_is_foreign(
    tmp_path: Path,
) -> None:
    # CUDA's own order is 1, 0: a runtime given CUDA_VISIBLE_DEVICES=1 without
    # CUDA_DEVICE_ORDER=PCI_BUS_ID would allocate on NVML's 0.
    gpus = simulated_gpus(tmp_path, "24GiB", "24GiB", reserved="512MiB", fastest_first=[1, 0])
    chat = service("8GiB", residency="pinned", memory={"estimate": "9GiB"})
    with (
        gpus.hold(0, "20GiB"),
        running_daemon(
            gpus.policy({"chat": chat}), tmp_path, env=gpus.env, in_thread=True
        ) as daemon,
    ):
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        assert daemon.service("chat")["device"] == 1  # GPU 0 has 3.5GiB left
        assert landed(daemon, "chat") == [{"ordinal": 0, "index": 1, "bytes": 8 * GiB}]
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] == 8 * GiB + CONTEXT)

        status = daemon.get("/api/status").json()
        assert status["backend"] == "nvml" and status["degraded"] is None
        first, second = status["devices"]
        assert first["total_bytes"] == second["total_bytes"] == 24 * GiB - 512 * MiB
        assert (first["foreign_bytes"], first["managed_bytes"]) == (20 * GiB + CONTEXT, 0)
        assert (second["foreign_bytes"], second["managed_bytes"]) == (0, 8 * GiB + CONTEXT)
        assert first["budget_bytes"] < 4 * GiB  # the foreign use is out of the budget

        text = daemon.get("/metrics").text
        assert metric(text, "vramd_device_foreign_bytes", device="0") == 20 * GiB + CONTEXT
        assert metric(text, "vramd_device_used_bytes", device="1") == 8 * GiB + CONTEXT
        assert metric(text, "vramd_service_footprint_bytes", service="chat") == 8 * GiB + CONTEXT
        assert 'vramd_info{backend="nvml"' in text


def test_a_full_gpu_evicts_and_the_replacement_waits_for_the_release_lag(
    tmp_path: Path,
) -> None:
    lag = 1.5
    gpus = simulated_gpus(tmp_path, "16GiB", "16GiB", release_lag=lag)
    services = {
        "base": service("10GiB", residency="pinned", models=["base"]),
        "first": service("10GiB", models=["first"]),
        "second": service("10GiB", models=["second"]),
    }
    with running_daemon(gpus.policy(services), tmp_path, env=gpus.env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("base")["state"] == "ready")
        assert ask(daemon, "first").status_code == 200  # the GPU base left free
        full = daemon.service("first")["device"]
        assert full != daemon.service("base")["device"]

        assert ask(daemon, "second").status_code == 200  # neither GPU has room: evict
        assert [e["data"]["victims"] for e in daemon.events(kind="evict")] == [["first"]]
        assert daemon.service("second")["device"] == full
        assert landed(daemon, "second") == [{"ordinal": 0, "index": full, "bytes": 10 * GiB}]

        stopped = [
            e["ts"]
            for e in daemon.events(kind="state", service="first")
            if e["data"]["to"] == "stopped"
        ]
        started = [e["ts"] for e in daemon.events(kind="load", service="second")]
        # Started before the driver let go, it would have failed with out-of-memory.
        assert len(stopped) == len(started) == 1
        assert started[0] - stopped[0] >= lag - 0.3
        assert daemon.service("second")["restarts"] == 0
        assert not daemon.get("/api/incidents").json()["incidents"]


def test_host_memory_creep_is_flagged_while_gpu_memory_stays_flat(tmp_path: Path) -> None:
    gpus = simulated_gpus(tmp_path, "24GiB")
    chat = service("2GiB", "--leak-per-request", "4MiB", residency="pinned")
    policy = gpus.policy({"chat": chat}, sample_interval="0.1s")
    with running_daemon(policy, tmp_path, env=gpus.env | FAST_CREEP, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 0)
        host_before = daemon.service("chat")["host_bytes"]
        for _ in range(80):
            assert ask(daemon, "m").status_code == 200
            if "creeping" in daemon.service("chat")["flags"]:
                break
        daemon.wait_for(lambda: "creeping" in daemon.service("chat")["flags"], timeout=10)
        flags = [e for e in daemon.events(kind="flag") if e["data"]["flag"] == "creeping"]
        assert [e["data"]["series"] for e in flags] == ["host"]
        assert "host memory" in flags[0]["message"]
        chat_now = daemon.service("chat")
        assert chat_now["footprint_bytes"] == 2 * GiB + CONTEXT  # the device series: flat
        assert chat_now["host_bytes"] > host_before + 30 * MiB


def test_out_of_memory_with_free_memory_is_retried_and_diagnosed_fragmentation(
    tmp_path: Path,
) -> None:
    # While another process holds memory on it, the GPU's largest free block is 4GiB.
    gpus = simulated_gpus(tmp_path, "24GiB", max_block=["4GiB"])
    retry = {"max_retries": 1, "backoff": "0.2s"}
    services = {
        "other": service("6GiB", models=["other"]),
        "big": service("6GiB", models=["big"], restart=retry),
    }
    with running_daemon(gpus.policy(services), tmp_path, env=gpus.env, in_thread=True) as daemon:
        assert ask(daemon, "other").status_code == 200
        # Its load fails, evicts what it may and is tried again: the request is served.
        assert ask(daemon, "big").status_code == 200
        daemon.wait_for(lambda: bool(daemon.events(kind="verdict")))
        assert [e["data"]["victims"] for e in daemon.events(kind="evict")] == [["other"]]
        assert landed(daemon, "big") == [{"ordinal": 0, "index": 0, "bytes": 6 * GiB}]

        incidents = daemon.get("/api/incidents").json()["incidents"]
        assert [(i["kind"], i["verdict"]) for i in incidents] == [("load", "fragmentation")]
        detail = daemon.get(f"/api/incidents/{incidents[0]['id']}").json()["data"]
        assert "cudaMalloc failed: out of memory" in detail["oom_text"]
        device = detail["devices"][0]
        assert device["free_bytes"] > 6 * GiB  # enough in total when it failed
        assert "other" in detail["instances"]


def test_gpucheck_passes_on_the_simulation(tmp_path: Path) -> None:
    gpus = simulated_gpus(tmp_path, "24GiB", "8GiB", reserved="512MiB", release_lag=0.2)
    done = subprocess.run(
        [sys.executable, "-m", "service.gpucheck", "--json", "--gpu", "1"],
        cwd=REPO_ROOT,
        env=os.environ | gpus.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] and report["allocator"] == "simulated"
    assert report["gpu"]["total"] == 8 * GiB - 512 * MiB
    assert {check["verdict"] for check in report["checks"]} == {"PASS"}
    assert "GPUs are simulated" in done.stderr
