"""Memory truth on a live daemon: creep, plateau, OOM, caps, windows, learned peaks.

Demo runtimes are scripted to leak, plateau, answer out-of-memory and outgrow their cap;
every verdict must be right, and a plateau must never be flagged. Creep's warm-up is
shortened through the daemon's settings (the contract's 60 s would make slow tests).
Creep, the cap and an out-of-memory load run on both backends (``backend``): the host's
memory, and simulated GPUs (``service.simgpu``) where the runtime holds and leaks device
memory instead. The multi-GPU scenarios are in ``test_gpu_e2e``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import (
    FAST_CREEP,
    Daemon,
    demo_command,
    policy_yaml,
    running_daemon,
    start_daemon,
    stop_daemon,
)
from support.simgpu import SimulatedGpus, simulated_gpus

MiB = 2**20


def chat(held: str, *extra: str, **keys: object) -> dict[str, object]:
    """A pinned chat service whose demo runtime holds ``held`` (keys override)."""
    spec: dict[str, object] = {
        "kind": "chat",
        "models": ["m"],
        "command": demo_command(held, *extra),
        "memory": {"estimate": "100MiB"},
        "residency": "pinned",
        "stop_timeout": "2s",
    }
    spec.update(keys)
    return spec


@dataclass
class Backend:
    """Where a scenario's runtime holds and leaks its memory: the host, or a simulated GPU."""

    name: str
    gpus: SimulatedGpus | None = None
    env: dict[str, str] = field(default_factory=dict)

    def chat(
        self, held: str, *extra: str, leak: str | None = None, **keys: object
    ) -> dict[str, object]:
        """``chat(held, ...)`` holding (and leaking ``leak`` per request) host or device memory."""
        if self.gpus is None:
            return chat(held, *extra, *(["--leak-per-request", leak] if leak else []), **keys)
        leaks = ["--gpu-leak-per-request", leak] if leak else []
        return chat("10MiB", *extra, "--gpu-memory", held, *leaks, **keys)

    def policy(self, services: dict[str, dict[str, Any]], **keys: Any) -> str:
        if self.gpus is None:
            return policy_yaml(services, **keys)
        return self.gpus.policy(services, **keys)


@pytest.fixture(params=["host", "nvml"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "host":
        return Backend("host")
    gpus = simulated_gpus(tmp_path, "4GiB", release_lag=0.2)
    return Backend("nvml", gpus, gpus.env)


def ask(daemon: Daemon, model: str = "m") -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )


def serve(daemon: Daemon, count: int, model: str = "m") -> None:
    for _ in range(count):
        assert ask(daemon, model).status_code == 200


def test_leak_is_flagged_and_a_flagged_window_restarts_it(tmp_path: Path, backend: Backend) -> None:
    policy = backend.policy(
        {"chat": backend.chat("30MiB", leak="4MiB")},
        budget="900MiB",
        sample_interval="0.1s",
        extra="""\
maintenance:
  windows:
    - {name: nightly, cron: "0 4 * * *", duration: 2s, restart: flagged}
""",
    )
    (tmp_path / "policy.yaml").write_text(policy)
    daemon = start_daemon(tmp_path, env=FAST_CREEP | backend.env)
    try:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 0)
        baseline = daemon.service("chat")["footprint_bytes"]
        pid = daemon.service("chat")["pid"]
        for _ in range(80):
            assert ask(daemon).status_code == 200
            if "creeping" in daemon.service("chat")["flags"]:
                break
        daemon.wait_for(lambda: "creeping" in daemon.service("chat")["flags"], timeout=10)
        flag = [e for e in daemon.events(kind="flag") if e["data"]["flag"] == "creeping"]
        assert flag and "per request" in flag[0]["message"]
        assert daemon.service("chat")["footprint_bytes"] > baseline + 40 * MiB

        assert daemon.post("/api/maintenance/nightly/run").status_code == 200
        daemon.wait_for(
            lambda: (s := daemon.service("chat"))["state"] == "ready" and s["pid"] != pid
        )
        daemon.wait_for(lambda: daemon.service("chat")["footprint_bytes"] > 0)
        chat_now = daemon.service("chat")
        assert chat_now["flags"] == []
        assert chat_now["footprint_bytes"] < baseline + 20 * MiB
        assert daemon.events(kind="flag-cleared")
    finally:
        stop_daemon(daemon)


def test_plateau_after_warm_up_is_not_flagged(tmp_path: Path) -> None:
    policy = policy_yaml(
        {"chat": chat("30MiB", "--leak-per-request", "4MiB", "--leak-limit", "40MiB")},
        budget="900MiB",
        sample_interval="0.1s",
    )
    (tmp_path / "policy.yaml").write_text(policy)
    daemon = start_daemon(tmp_path, env=FAST_CREEP)
    try:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        serve(daemon, 60)
        daemon.wait_for(lambda: daemon.service("chat")["memory"]["weights_bytes"] is not None)
        # Give the detector many more samples of the plateau to look at.
        for _ in range(20):
            serve(daemon, 1)
            httpx.get(f"{daemon.url}/healthz").raise_for_status()
        assert "creeping" not in daemon.service("chat")["flags"]
        assert not [e for e in daemon.events(kind="flag")]
    finally:
        stop_daemon(daemon)


def test_oom_with_free_memory_is_fragmentation_and_leaves_an_incident(tmp_path: Path) -> None:
    with running_daemon(
        policy_yaml({"chat": chat("30MiB", "--oom-after", "3")}, budget="900MiB"),
        tmp_path,
        in_thread=True,
    ) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        serve(daemon, 2)
        failed = ask(daemon)
        assert failed.status_code == 500
        assert "CUDA out of memory" in failed.text  # the runtime's own error passes through
        daemon.wait_for(lambda: "fragmented" in daemon.service("chat")["flags"])
        incidents = daemon.get("/api/incidents").json()["incidents"]
        assert incidents and incidents[0]["kind"] == "request"
        assert incidents[0]["verdict"] == "fragmentation"
        detail = daemon.get(f"/api/incidents/{incidents[0]['id']}").json()["data"]
        assert detail["devices"][0]["total_bytes"] > 0
        assert "chat" in detail["instances"]
        assert detail["largest_recent_request"]["body_bytes"] > 0
        assert any(e["kind"] == "state" for e in detail["history"])
        assert daemon.get("/api/incidents/999").status_code == 404


def test_over_cap_runtime_is_restarted(tmp_path: Path, backend: Backend) -> None:
    spec = backend.chat("30MiB", leak="25MiB")
    spec["memory"] = {"estimate": "60MiB", "cap": "100MiB", "on_cap": "restart"}
    with running_daemon(
        backend.policy({"chat": spec}, budget="900MiB", sample_interval="0.1s"),
        tmp_path,
        env=backend.env,
        in_thread=True,
    ) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        pid = daemon.service("chat")["pid"]
        serve(daemon, 4)
        daemon.wait_for(
            lambda: (s := daemon.service("chat"))["state"] == "ready" and s["pid"] != pid
        )
        flags = [e for e in daemon.events(kind="flag") if e["data"]["flag"] == "over-cap"]
        assert flags and "above its cap" in flags[0]["message"]
        stops = [e for e in daemon.events(kind="state") if "over its cap" in e["data"]["reason"]]
        assert stops


def test_window_only_service_runs_only_inside_its_window(tmp_path: Path) -> None:
    batch = chat("20MiB", residency="window-only", models=["b"], kind="embedding")
    extra = """\
maintenance:
  windows:
    - {name: batch-time, cron: "0 2 * * *", duration: 3s, restart: none, allow: [batch]}
"""
    with running_daemon(
        policy_yaml({"batch": batch}, extra=extra), tmp_path, in_thread=True
    ) as daemon:
        body = {"model": "b", "input": "x"}
        closed = httpx.post(f"{daemon.url}/v1/embeddings", json=body, timeout=30)
        assert closed.status_code == 503 and closed.json()["error"]["code"] == "window_closed"
        daemon.post("/api/maintenance/batch-time/run")
        served = httpx.post(f"{daemon.url}/v1/embeddings", json=body, timeout=30)
        assert served.status_code == 200
        daemon.wait_for(lambda: daemon.service("batch")["state"] == "stopped", timeout=15)
        again = httpx.post(f"{daemon.url}/v1/embeddings", json=body, timeout=30)
        assert again.status_code == 503


def test_learned_peak_survives_restart_and_changes_admission(tmp_path: Path) -> None:
    services = {
        # Estimated at 40MiB, really ~170MiB: only the learned peak tells the truth.
        "liar": chat(
            "150MiB", residency="on-demand", models=["liar"], memory={"estimate": "40MiB"}
        ),
        "other": chat(
            "60MiB", residency="on-demand", models=["other"], memory={"estimate": "100MiB"}
        ),
    }
    policy = policy_yaml(services, budget="250MiB", sample_interval="0.1s")
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        serve(daemon, 1, model="other")
        serve(daemon, 1, model="liar")  # admitted at its 40MiB estimate beside "other"
        assert not daemon.events(kind="evict")
        daemon.wait_for(lambda: (daemon.service("liar")["learned_peak_bytes"] or 0) > 140 * MiB)
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        liar = daemon.service("liar")
        assert liar["learned_peak_bytes"] > 140 * MiB
        assert liar["expected_peak_bytes"] == liar["learned_peak_bytes"]
        serve(daemon, 1, model="other")
        serve(daemon, 1, model="liar")  # 170 + 100 > 234: now it must evict "other" first
        evictions = daemon.events(kind="evict")
        assert evictions and evictions[-1]["data"]["victims"] == ["other"]


def test_out_of_memory_load_is_retried_then_called_capacity(
    tmp_path: Path, backend: Backend
) -> None:
    keys: dict[str, object] = {
        "residency": "on-demand",
        "restart": {"max_retries": 1, "backoff": "0.2s"},
    }
    if backend.gpus is None:
        spec = backend.chat("20MiB", "--fail-start", **keys)
    else:
        spec = backend.chat("8GiB", **keys)  # twice the GPU, estimated at 100MiB
    with running_daemon(
        backend.policy({"chat": spec}), tmp_path, env=backend.env, in_thread=True
    ) as daemon:
        response = ask(daemon)
        assert response.status_code == 502
        daemon.wait_for(lambda: bool(daemon.events(kind="verdict")))
        # The retry: one more start, after making room (everything evictable evicted),
        # and only its failure gives the verdict.
        starts = [
            e["id"]
            for e in daemon.events(service="chat", kind="state")
            if e["data"]["to"] == "starting"
        ]
        [make_room] = [e["id"] for e in daemon.events(kind="make-room")]
        [verdict] = daemon.events(kind="verdict")
        assert len(starts) == 2 and starts[0] < make_room < starts[1] < verdict["id"], starts
        assert "failed again with everything evictable gone" in verdict["message"]
        incidents = daemon.get("/api/incidents").json()["incidents"]
        assert len(incidents) == 1  # the retry's failure is the same incident's verdict
        assert incidents[0]["kind"] == "load" and incidents[0]["verdict"] == "capacity"
        detail = daemon.get(f"/api/incidents/{incidents[0]['id']}").json()["data"]
        assert "out of memory" in detail["oom_text"]


def test_memory_endpoint_serves_samples(tmp_path: Path) -> None:
    with running_daemon(
        policy_yaml({"chat": chat("30MiB")}, sample_interval="0.1s"), tmp_path, in_thread=True
    ) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        daemon.wait_for(lambda: len(daemon.get("/api/services/chat/memory").json()["samples"]) > 3)
        memory = daemon.get("/api/services/chat/memory").json()
        assert memory["estimate_bytes"] == 100 * MiB
        assert memory["samples"][-1]["device_bytes"] > 25 * MiB
        assert daemon.get("/api/services/nope/memory").status_code == 404
