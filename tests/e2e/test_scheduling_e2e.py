"""Admission (contract version 3, docs/policy.md) on a live daemon with real demo runtimes.

Waiting instead of refusing, ``protect`` as a cost that yields before a waiter's
deadline, ``protect: never``, the demo policy serving every model in any order, drained
restarts under steady traffic (a cap, a window, an operator), one request bound for
cold and warm services, and the explanation of what a load would do ("yields by ...") --
each against real processes holding real memory on the host backend; the waiting,
protection and demo scenarios on a simulated GPU too.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.daemon import REPO_ROOT, VRAMD, Daemon, demo_command, policy_yaml, running_daemon
from support.simgpu import SimulatedGpus, simulated_gpus

MiB = 2**20


def service(held: str, *extra: str, **keys: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "kind": "chat",
        "models": ["m"],
        "command": demo_command(held, *extra),
        "memory": {"estimate": "100MiB"},
        "stop_timeout": "5s",
    }
    spec.update(keys)
    return spec


def ask(daemon: Daemon, model: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        timeout=timeout,
    )


def in_background(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    thread.start()
    return thread, box


# Two 250 MiB services under a 484 MiB budget: only one fits at a time.
def two_services(hi: dict[str, object], lo: dict[str, object]) -> str:
    return policy_yaml({"hi": hi, "lo": lo}, budget="500MiB")


@dataclass
class Box:
    """Where the two services hold their memory: host RAM under a 500 MiB budget, or a
    simulated 500 MiB GPU (``backend: nvml``), the same arithmetic either way."""

    gpus: SimulatedGpus | None = None

    @property
    def env(self) -> dict[str, str]:
        return self.gpus.env if self.gpus else {}

    def on_device(self, spec: dict[str, object]) -> dict[str, object]:
        """``spec`` with its runtime's 230 MiB held where this box measures."""
        if self.gpus is None:
            return spec
        command = [a if a != "230MiB" else "10MiB" for a in spec["command"]]  # type: ignore[attr-defined]
        return {**spec, "command": [*command, "--gpu-memory", "230MiB"]}

    def two_services(self, hi: dict[str, object], lo: dict[str, object]) -> str:
        services = {"hi": self.on_device(hi), "lo": self.on_device(lo)}
        if self.gpus is None:
            return policy_yaml(services, budget="500MiB")
        return self.gpus.policy(services)


@pytest.fixture(params=["host", "nvml"])
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Box:
    if request.param == "host":
        return Box()
    return Box(simulated_gpus(tmp_path, "500MiB", release_lag=0.2))


HI = service(
    "230MiB",
    models=["hi"],
    memory={"estimate": "300MiB"},
    residency="warm",
    preload=True,
    priority=300,
    protect="3s",
)
LO = service(
    "230MiB",
    models=["lo"],
    memory={"estimate": "300MiB"},
    priority=100,
    queue={"max": 4, "timeout": "60s"},
)


def test_a_lower_priority_waits_and_is_served_once_the_higher_ones_protection_lapses(
    tmp_path: Path, box: Box
) -> None:
    with running_daemon(box.two_services(HI, LO), tmp_path, env=box.env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
        assert ask(daemon, "hi").status_code == 200  # hi used now: protected for 3 s
        explained = daemon.get("/api/services/lo/admission").json()
        assert explained["verdict"] == "wait"
        assert explained["holders"][0]["service"] == "hi"
        assert explained["holders"][0]["why"] == "protected"
        assert re.search(r"yields by \d\d:\d\d:\d\d at the latest", explained["message"])
        thread, box = in_background(ask, daemon, "lo")
        daemon.wait_for(lambda: daemon.service("lo")["waiting_for"] is not None)
        waiting = daemon.service("lo")
        assert "hi (warm, priority 300) idle" in waiting["waiting_for"]
        assert re.search(r"yields by \d\d:\d\d:\d\d at the latest", waiting["waiting_for"])
        assert waiting["wait_holders"][0]["service"] == "hi"
        thread.join(60)
        (response,) = box
        assert response.status_code == 200, response.text
        assert response.headers["x-vramd-cold-start"] == "1"
        waits = [
            e
            for e in daemon.events(service="lo", kind="wait")
            if any(h["service"] == "hi" for h in e["data"].get("holders", []))
        ]
        assert waits and waits[0]["data"]["holders"][0]["why"] == "protected"
        assert daemon.service("hi")["state"] == "stopped"  # evicted, not refused


def test_a_request_that_outwaits_its_queue_timeout_names_the_holder(
    tmp_path: Path, box: Box
) -> None:
    hi = {**HI, "protect": "10m"}
    lo = {**LO, "queue": {"max": 4, "timeout": "1s"}}
    with running_daemon(box.two_services(hi, lo), tmp_path, env=box.env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
        response = ask(daemon, "lo")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "queue_timeout"
        assert "hi (warm, priority 300)" in error["message"]
        assert "at the latest" in error["message"]
        assert 0 < int(response.headers["retry-after"]) <= 600
        assert daemon.service("hi")["state"] == "ready"


def test_vramd_explain_and_ps_say_what_a_waiting_service_waits_for(tmp_path: Path) -> None:
    hi = {**HI, "protect": "10m"}
    lo = {**LO, "queue": {"max": 4, "timeout": "3s"}}
    with running_daemon(two_services(hi, lo), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")

        def vramd(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*VRAMD, *args, "--url", daemon.url],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=30,
            )

        explained = vramd("explain", "lo")
        assert explained.returncode == 0, explained.stderr
        assert "lo would wait for" in explained.stdout
        assert "hi (warm, priority 300) idle" in explained.stdout
        assert re.search(r"yields by \d\d:\d\d:\d\d at the latest", explained.stdout)
        assert re.search(r"yielding: auto, now balanced \(since \d\d:\d\d:\d\d\)", explained.stdout)
        assert "  lo yields as balanced" in explained.stdout
        assert "  why: not tuned yet" in explained.stdout
        loaded = vramd("explain", "hi")
        assert loaded.returncode == 0 and "hi is ready on device 0" in loaded.stdout
        thread, box = in_background(ask, daemon, "lo", 30)
        daemon.wait_for(lambda: daemon.service("lo")["waiting_for"] is not None)
        ps = vramd("ps")
        assert ps.returncode == 0, ps.stderr
        row = next(line for line in ps.stdout.splitlines() if line.startswith("lo "))
        assert "waiting" in row
        assert any(
            line.startswith("lo: waits for") and "hi (warm, priority 300)" in line
            for line in ps.stdout.splitlines()
        ), ps.stdout
        thread.join(30)
        assert box[0].status_code == 503  # its 3 s queue.timeout, naming hi
        assert vramd("explain", "nope").returncode == 1


def keep_asking(daemon: Daemon, model: str, every: float) -> tuple[threading.Event, list[int]]:
    """Ask ``model`` every ``every`` seconds in the background until the event is set."""
    stop, codes = threading.Event(), []

    def loop() -> None:
        with httpx.Client(base_url=daemon.url, timeout=60) as http:
            while not stop.is_set():
                r = http.post(
                    "/v1/chat/completions",
                    json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                )
                codes.append(r.status_code)
                stop.wait(every)

    threading.Thread(target=loop, daemon=True).start()
    return stop, codes


def test_a_lower_priority_is_served_in_time_though_the_higher_one_is_used_every_second(
    tmp_path: Path, box: Box
) -> None:
    """The pattern version 2 starved: hi (warm, protect 10m) is asked every second, so its
    protection never lapses. lo's request is still served before its 20 s queue.timeout:
    hi yields at an idle moment before lo's deadline (arrival + 20 s - lo's load time,
    10 s until learned - a margin), and takes its memory back after."""
    hi = {**HI, "protect": "10m"}
    lo = {**LO, "queue": {"max": 4, "timeout": "20s"}}
    with running_daemon(box.two_services(hi, lo), tmp_path, env=box.env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
        stop, codes = keep_asking(daemon, "hi", every=1.0)
        try:
            daemon.wait_for(lambda: len(codes) >= 5)  # hi has shown its habit
            started = time.monotonic()
            response = ask(daemon, "lo")
            waited = time.monotonic() - started
            daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
            asked = len(codes)
            daemon.wait_for(lambda: len(codes) >= asked + 2)
        finally:
            stop.set()
        assert response.status_code == 200, response.text
        assert waited < 20
        evicted = [e for e in daemon.events(service="lo", kind="evict")]
        assert evicted and evicted[0]["data"]["victims"] == ["hi"]
        assert set(codes) == {200}  # hi's requests too, those that waited for its reload


def test_protect_never_keeps_the_strict_rule_and_the_503_says_so(tmp_path: Path) -> None:
    hi = {**HI, "protect": "never"}
    lo = {**LO, "queue": {"max": 4, "timeout": "2s"}}
    with running_daemon(two_services(hi, lo), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
        response = ask(daemon, "lo")
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert "hi (warm, priority 300) protect: never: does not yield to a lower priority" in (
            message
        )
        assert daemon.service("hi")["state"] == "ready"


def demo_policy(box: Box) -> str:
    """``config/demo.yaml`` as shipped, on this box: on simulated GPUs each runtime holds
    its memory on a 1.5 GiB device instead of in host memory."""
    policy: dict[str, Any] = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    if box.gpus is not None:
        policy["device"] = {**policy["device"], "backend": "nvml"}
        del policy["device"]["budget"]
        for spec in policy["services"].values():
            command = spec["command"]
            at = command.index("--memory") + 1
            spec["command"] = [*command[:at], "10MiB", *command[at + 1 :]]
            spec["command"] += ["--gpu-memory", command[at]]
    return yaml.safe_dump(policy, sort_keys=False)


def call(daemon: Daemon, model: str) -> httpx.Response:
    """One request to ``model`` on the route its demo service's kind serves."""
    url = daemon.url + "/v1"
    if model == "demo-whisper":
        files = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
        return httpx.post(
            f"{url}/audio/transcriptions", data={"model": model}, files=files, timeout=90
        )
    route, body = {
        "demo-chat": ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        "demo-embed": ("embeddings", {"input": "hi"}),
        "demo-image": ("images/generations", {"prompt": "a cat"}),
        "demo-tts": ("audio/speech", {"input": "hi", "voice": "alloy"}),
    }[model]
    return httpx.post(f"{url}/{route}", json={"model": model, **body}, timeout=90)


def test_the_demo_policy_answers_every_model_in_any_order_within_its_timeout(
    tmp_path: Path, box: Box
) -> None:
    """The newcomer's walk through ``make run``: an image, then a transcription (which
    needs the image model's memory and sits below it), back and forth, then the rest.
    Every answer is 200, each within its service's queue.timeout."""
    timeouts = {"demo-image": 60, "demo-whisper": 30, "demo-tts": 30, "demo-embed": 60}
    timeouts["demo-chat"] = 60
    if box.gpus is not None:
        box = Box(simulated_gpus(tmp_path, "1536MiB", release_lag=0.2))
    with running_daemon(demo_policy(box), tmp_path, env=box.env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready", timeout=60)
        order = ["demo-image", "demo-whisper", "demo-image", "demo-tts", "demo-embed"]
        for model in [*order, "demo-chat", "demo-whisper"]:
            # Served, not refused: a request not served within its service's queue
            # timeout is answered 503 queue_timeout by the daemon itself.
            response = call(daemon, model)
            assert response.status_code == 200, (model, response.text)


def test_an_over_cap_runtime_under_steady_traffic_is_restarted_without_a_failed_request(
    tmp_path: Path,
) -> None:
    """8 MiB leaked per request, a 200 MiB cap, 4 clients that never stop: the restart
    drains at once instead of waiting for an idle moment that never comes."""
    spec = service(
        "60MiB",
        "--leak-per-request",
        "8MiB",
        "--latency-ms",
        "30",
        models=["m"],
        memory={"estimate": "100MiB", "cap": "200MiB", "on_cap": "restart"},
        residency="pinned",
        max_concurrency=4,
        queue={"max": 16, "timeout": "60s"},
    )
    policy = policy_yaml({"leaky": spec}, budget="1500MiB", sample_interval="0.1s")
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("leaky")["state"] == "ready")
        first_pid = daemon.service("leaky")["pid"]
        statuses: Counter[int] = Counter()
        peaks: list[int] = []
        restarted = threading.Event()
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(base_url=daemon.url, timeout=60) as http:
                while not stop.is_set():
                    r = http.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    )
                    statuses[r.status_code] += 1

        def watch() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not restarted.is_set():
                svc = daemon.service("leaky")
                peaks.append(svc["footprint_bytes"] or 0)
                if svc["state"] == "ready" and svc["pid"] not in (None, first_pid):
                    restarted.set()
                time.sleep(0.05)

        with ThreadPoolExecutor(5) as pool:
            clients = [pool.submit(client) for _ in range(4)]
            watcher = pool.submit(watch)
            watcher.result(90)
            served_before_stop = sum(statuses.values())
            stop.set()
            for c in clients:
                c.result(90)
        assert restarted.is_set(), "the over-cap runtime was not restarted under traffic"
        assert set(statuses) == {200}, statuses  # no request failed
        assert sum(statuses.values()) >= served_before_stop > 20
        # Restarted soon after crossing its cap, not after growing far past it.
        assert max(peaks) < 600 * MiB, max(peaks) / MiB
        flags = [e for e in daemon.events(kind="flag") if e["data"]["flag"] == "over-cap"]
        assert flags
        drains = [
            e
            for e in daemon.events(service="leaky", kind="state")
            if e["data"]["to"] == "draining" and "over its cap" in e["data"]["reason"]
        ]
        assert drains, "the restart drained the instance"


@pytest.mark.parametrize("on_cap", ["stop", "warn"])
def test_on_cap_stop_stops_and_on_cap_warn_only_flags(tmp_path: Path, on_cap: str) -> None:
    spec = service(
        "40MiB",
        "--leak-per-request",
        "30MiB",
        models=["m"],
        memory={"estimate": "60MiB", "cap": "100MiB", "on_cap": on_cap},
        residency="warm",
        preload=True,
    )
    policy = policy_yaml({"leaky": spec}, budget="900MiB", sample_interval="0.1s")
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("leaky")["state"] == "ready")
        pid = daemon.service("leaky")["pid"]
        for _ in range(4):
            assert ask(daemon, "m").status_code == 200
        if on_cap == "stop":
            # Stopped once flagged; on a busy machine that can happen between the asks
            # above (two leaks already pass the cap), and the next ones load a fresh
            # instance, which clears the flag: the events say what happened, whenever.
            daemon.wait_for(lambda: bool(daemon.events(kind="cap-stop")))
            flags = daemon.events(kind="flag")
            assert flags and all(flag["data"]["flag"] == "over-cap" for flag in flags)
            # A warm service comes back for its next request, as a fresh instance.
            assert ask(daemon, "m").status_code == 200
            assert daemon.service("leaky")["loads"] >= 2
        else:
            daemon.wait_for(lambda: "over-cap" in daemon.service("leaky")["flags"])
            for _ in range(5):  # samples go on; nothing restarts it
                assert ask(daemon, "m").status_code == 200
            svc = daemon.service("leaky")
            assert (svc["state"], svc["pid"], svc["loads"]) == ("ready", pid, 1)
            assert not [e for e in daemon.events(kind="cap-stop")]


def test_a_window_restart_of_an_idle_warm_service_leaves_it_loaded(tmp_path: Path) -> None:
    spec = service("30MiB", models=["m"], residency="warm", preload=True)
    windows = """\
maintenance:
  windows:
    - {name: nightly, cron: "30 3 * * *", duration: 2s, restart: [svc]}
"""
    with running_daemon(
        policy_yaml({"svc": spec}, extra=windows), tmp_path, in_thread=True
    ) as daemon:
        daemon.wait_for(lambda: daemon.service("svc")["state"] == "ready")
        pid = daemon.service("svc")["pid"]
        assert daemon.post("/api/maintenance/nightly/run").status_code == 200
        daemon.wait_for(
            lambda: (s := daemon.service("svc"))["state"] == "ready" and s["pid"] not in (None, pid)
        )
        assert daemon.service("svc")["loads"] == 2


def test_an_operator_restart_is_drained_and_the_request_in_flight_finishes(
    tmp_path: Path,
) -> None:
    spec = service("30MiB", "--latency-ms", "1500", models=["m"], residency="warm", preload=True)
    with running_daemon(policy_yaml({"svc": spec}), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("svc")["state"] == "ready")
        pid = daemon.service("svc")["pid"]
        thread, box = in_background(ask, daemon, "m")
        daemon.wait_for(lambda: daemon.service("svc")["in_flight"] == 1)
        restarted = daemon.post("/api/services/svc/restart", timeout=60)
        assert restarted.status_code == 200, restarted.text
        assert restarted.json()["state"] == "ready" and restarted.json()["pid"] != pid
        thread.join(30)
        assert box[0].status_code == 200  # finished on the old instance, not cut


@pytest.mark.parametrize("warm", [False, True])
def test_a_service_accepts_as_many_requests_cold_as_warm(tmp_path: Path, warm: bool) -> None:
    """max_concurrency 1, queue.max 2: six at once give 3 x 200 and 3 x 429."""
    spec = service(
        "20MiB",
        models=["m"],
        command=demo_command("20MiB", "--latency-ms", "400", load_seconds=1.0),
        max_concurrency=1,
        queue={"max": 2, "timeout": "60s"},
    )
    with running_daemon(policy_yaml({"svc": spec}), tmp_path, in_thread=True) as daemon:
        if warm:
            assert ask(daemon, "m").status_code == 200
        with ThreadPoolExecutor(6) as pool:
            codes = sorted(r.status_code for r in pool.map(lambda _: ask(daemon, "m"), range(6)))
        assert codes == [200, 200, 200, 429, 429, 429]


def test_queue_max_zero_still_loads_a_cold_service(tmp_path: Path) -> None:
    spec = service("20MiB", models=["m"], max_concurrency=2, queue={"max": 0, "timeout": "30s"})
    with running_daemon(policy_yaml({"svc": spec}), tmp_path, in_thread=True) as daemon:
        with ThreadPoolExecutor(2) as pool:
            codes = [r.status_code for r in pool.map(lambda _: ask(daemon, "m"), range(2))]
        assert codes == [200, 200]
        assert daemon.service("svc")["loads"] == 1
