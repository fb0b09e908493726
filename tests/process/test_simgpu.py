"""The unchanged NvmlProbe reading simulated GPUs (service.simgpu) that real processes fill.

Demo runtimes started with ``--gpu-memory`` and ``python -m service.simgpu hold`` are
real subprocesses; the probe is the one ``create_probe("nvml")`` builds when
``VRAMD_SIMULATED_GPUS`` is set. What NVML semantics vramd depends on must hold here too:
per-process attribution, the driver's reserve apart, memory of others as foreign, a
dead process listed until the driver lets go, errors as degraded readings, and CUDA's
fastest-first numbering unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from support.daemon import REPO_ROOT
from support.demo import DemoProcess, running_demo
from support.simgpu import SimulatedGpus, simulated_gpus
from support.waiting import wait_until_blocking

from service.adapters import find_oom, guess_adapter
from service.devices import NvmlProbe, create_probe
from service.errors import ProbeError
from service.simgpu import StateFile, new_state, visible_devices
from service.simgpu.state import ENV, Allocation

MiB, GiB = 2**20, 2**30
CONTEXT = 16 * MiB
DEMO = [sys.executable, "-m", "service.demo_runtime"]


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedGpus:
    """Two GPUs, cuda:0 being NVML's 1 unless CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    sim = simulated_gpus(
        tmp_path, "24GiB", "16GiB", reserved="512MiB", release_lag=1.0, fastest_first=[1, 0]
    )
    monkeypatch.setenv(ENV, str(sim.path))
    return sim


@pytest.fixture
def probe(gpus: SimulatedGpus) -> Iterator[NvmlProbe]:
    built = create_probe("nvml")
    assert isinstance(built, NvmlProbe)
    with closing(built):
        yield built


def on(gpus: SimulatedGpus, devices: str, *, pci: bool = True) -> dict[str, str]:
    """The environment of a runtime placed on ``devices``."""
    env = gpus.env | {"CUDA_VISIBLE_DEVICES": devices}
    return env | {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if pci else env


def debug_gpu(demo: DemoProcess) -> dict[str, object]:
    response = httpx.get(f"{demo.url}/debug/gpu", timeout=5)
    response.raise_for_status()
    data: dict[str, object] = response.json()
    return data


def chat(demo: DemoProcess) -> httpx.Response:
    body = {"model": "demo", "messages": [{"role": "user", "content": "x"}]}
    return httpx.post(f"{demo.url}/v1/chat/completions", json=body, timeout=10)


def run_demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A demo runtime expected to exit by itself (it failed to load)."""
    return subprocess.run(
        [*DEMO, "--port", "1", *args],
        cwd=REPO_ROOT,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=30,
    )


# --- the device numbering, without processes ------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, [1, 0, 2]),  # every device, fastest first
        ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0, 1, 2]),
        ({"CUDA_VISIBLE_DEVICES": "0"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0]),
        ({"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [2, 1]),
        ({"CUDA_VISIBLE_DEVICES": "0,7,2"}, [1]),  # an unknown entry hides the rest
        ({"CUDA_VISIBLE_DEVICES": "1,1"}, [0]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_cuda_numbers_devices_fastest_first_unless_told_pci_order(
    environ: dict[str, str], expected: list[int]
) -> None:
    state = new_state([8 * GiB, 24 * GiB, 16 * GiB], fastest_first=[1, 0, 2])
    assert visible_devices(state, environ) == expected


def test_a_uuid_names_its_device() -> None:
    state = new_state([8 * GiB, 24 * GiB])
    uuid = state.devices[1].uuid
    assert visible_devices(state, {"CUDA_VISIBLE_DEVICES": uuid[:12]}) == [1]


def test_a_state_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="not a permutation"):
        new_state([GiB, GiB], fastest_first=[0, 0])
    with pytest.raises(ValueError, match="reserve"):
        new_state([GiB], reserved=GiB)


# --- the probe over real processes -----------------------------------------------------------


def test_each_runtime_is_attributed_and_the_reserve_stays_apart(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    with (
        running_demo("--gpu-memory", "2GiB", env=on(gpus, "1")) as small,
        running_demo("--gpu-memory", "5GiB", "--gpu-split", "0.6,0.4", env=on(gpus, "0,1")) as big,
    ):
        reading = probe.read({"small": small.pid, "big": big.pid})
    assert reading.backend == "nvml" and reading.degraded is None
    first, second = reading.devices
    assert (first.visible_total, first.total) == (24 * GiB, 24 * GiB - 512 * MiB)
    assert second.total == 16 * GiB - 512 * MiB
    three, two = int(5 * GiB * 0.6), 5 * GiB - int(5 * GiB * 0.6)
    assert reading.instances["small"].per_device == {1: 2 * GiB + CONTEXT}
    assert reading.instances["big"].per_device == {0: three + CONTEXT, 1: two + CONTEXT}
    assert first.used == first.managed == three + CONTEXT
    assert second.used == second.managed == 2 * GiB + two + 2 * CONTEXT
    assert first.free == first.total - first.used
    assert first.foreign == second.foreign == 0
    assert first.name == "Simulated GPU 0 (24 GiB)"


def test_the_simulation_is_named_when_chosen(
    gpus: SimulatedGpus, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "vramd.devices"), closing(create_probe("auto")) as probe:
        assert probe.backend == "nvml"
    assert f"GPUs are simulated: NVML answers from {gpus.path}" in caplog.text


def test_a_process_vramd_did_not_start_is_foreign(gpus: SimulatedGpus, probe: NvmlProbe) -> None:
    with (
        running_demo("--gpu-memory", "1GiB", env=on(gpus, "0")) as ours,
        gpus.hold(0, "3GiB") as stranger,
        gpus.hold(0, "1GiB", kind="graphics") as desktop,
    ):
        reading = probe.read({"ours": ours.pid})
        listed = probe.holding([ours.pid, stranger, desktop])
    device = reading.devices[0]
    assert device.managed == 1 * GiB + CONTEXT
    assert device.foreign == 4 * GiB + 2 * CONTEXT
    assert listed == {ours.pid, stranger, desktop}  # the graphics list counts too


def test_a_dead_process_stays_listed_for_the_release_lag(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    with running_demo("--gpu-memory", "3GiB", env=on(gpus, "0")) as demo:
        pid = demo.pid
        assert probe.holding([pid]) == {pid}
        os.killpg(pid, signal.SIGKILL)
        demo.proc.wait()
        killed = time.monotonic()
        # Gone from its tree at once, still held on the device: foreign until released.
        reading = probe.read({"demo": pid})
        assert reading.instances["demo"].device_bytes == 0
        assert reading.devices[0].foreign == 3 * GiB + CONTEXT
        wait_until_blocking(
            lambda: not probe.holding([pid]), timeout=5, interval=0.02, what="the release"
        )
        released_after = time.monotonic() - killed
    assert released_after >= 0.9  # the lag is 1s from when the simulation saw it gone
    assert probe.read({}).devices[0].used == 0


def test_a_reused_pid_is_not_the_dead_process(tmp_path: Path) -> None:
    sim = simulated_gpus(tmp_path, "8GiB")
    with sim.file.update() as state:
        # This very pid, but started at another time: a process that has exited since.
        state.allocations.append(Allocation(1, os.getpid(), 1.0, 0, GiB))
    assert sim.state().allocations[0].died_at is not None


def test_scripted_errors_degrade_readings_and_then_recover(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    with running_demo("--gpu-memory", "2GiB", env=on(gpus, "0")) as demo:
        good = probe.read({"demo": demo.pid})
        gpus.fail("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST")
        stale = probe.read({"demo": demo.pid})
        assert stale.degraded is not None
        assert "NVMLError_GpuIsLost: GPU is lost" in stale.degraded
        assert stale.devices == good.devices  # the last good figures
        assert stale.instances["demo"].device_bytes == 2 * GiB + CONTEXT
        assert probe.read({"demo": demo.pid}).degraded is None  # one call only

        # One call per GPU: both lists of compute processes are refused once.
        gpus.fail("nvmlDeviceGetComputeRunningProcesses", "NVML_ERROR_NO_PERMISSION", calls=2)
        partial = probe.read({"demo": demo.pid})
        assert partial.degraded is not None
        assert "partial attribution" in partial.degraded
        assert "GPU 0 cannot list processes (NVMLError_NoPermission" in partial.degraded
        assert partial.devices[0].foreign == 2 * GiB + CONTEXT  # counted, not guessed
        assert probe.holding([demo.pid]) == {demo.pid}


def test_nvml_that_will_not_start_is_unavailable(
    gpus: SimulatedGpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus.fail("nvmlInit", "NVMLError_DriverNotLoaded")
    with pytest.raises(ProbeError, match="NVMLError_DriverNotLoaded"):
        create_probe("nvml")
    monkeypatch.setenv(ENV, str(gpus.path.with_name("missing.json")))
    with closing(create_probe("auto")) as probe:
        assert probe.backend == "host"


def test_cuda_numbering_decides_where_a_runtime_lands(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    """Placed on NVML's 0: only with CUDA_DEVICE_ORDER=PCI_BUS_ID does it land there."""
    with (
        running_demo("--gpu-memory", "1GiB", env=on(gpus, "0", pci=False)) as unordered,
        running_demo("--gpu-memory", "2GiB", env=gpus.env | probe.placement_env([0])) as placed,
    ):
        reading = probe.read({"unordered": unordered.pid, "placed": placed.pid})
        assert debug_gpu(unordered)["devices"] == [{"ordinal": 0, "index": 1, "bytes": GiB}]
        assert debug_gpu(placed)["devices"] == [{"ordinal": 0, "index": 0, "bytes": 2 * GiB}]
    assert reading.instances["unordered"].per_device == {1: GiB + CONTEXT}
    assert reading.instances["placed"].per_device == {0: 2 * GiB + CONTEXT}


def test_no_cuda_visible_devices_means_the_first_cuda_device(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    with running_demo("--gpu-memory", "1GiB", env=gpus.env) as demo:
        assert debug_gpu(demo)["devices"] == [{"ordinal": 0, "index": 1, "bytes": GiB}]


# --- out of memory ---------------------------------------------------------------------------


def test_weights_that_do_not_fit_fail_the_load_as_cuda_says(gpus: SimulatedGpus) -> None:
    failed = run_demo("--gpu-memory", "30GiB", env=on(gpus, "0"))
    assert failed.returncode == 1
    assert "CUDA error: out of memory" in failed.stderr
    assert find_oom(guess_adapter(DEMO), failed.stderr) is not None
    assert gpus.state().allocations == []  # all or nothing, as the load failed


def test_the_largest_free_block_fails_a_load_with_memory_free(tmp_path: Path) -> None:
    gpus = simulated_gpus(tmp_path, "24GiB", max_block=["4GiB"])
    env = on(gpus, "0")
    with gpus.hold(0, "1GiB") as holder:
        failed = run_demo("--gpu-memory", "6GiB", env=env)
        assert gpus.state().free(0) > 20 * GiB
    gpus.wait_released(holder)
    assert failed.returncode == 1
    assert "cudaMalloc failed: out of memory" in failed.stderr
    # Alone on the device its free memory is one block again.
    with running_demo("--gpu-memory", "6GiB", env=env) as demo:
        assert debug_gpu(demo)["bytes"] == 6 * GiB


def test_device_growth_answers_out_of_memory_at_request_time(tmp_path: Path) -> None:
    gpus = simulated_gpus(tmp_path, "10GiB")
    args = ("--gpu-memory", "2GiB", "--gpu-leak-per-request", "4GiB")
    with running_demo(*args, env=on(gpus, "0")) as demo:
        assert chat(demo).status_code == 200
        failed = chat(demo)
        assert failed.status_code == 500
        assert "CUDA out of memory. Tried to allocate 4.00 GiB" in failed.json()["error"]["message"]
        assert debug_gpu(demo)["bytes"] == 6 * GiB
        assert chat(demo).status_code == 500  # it stays full
    assert "torch.OutOfMemoryError: CUDA out of memory" in demo.output()


def test_sleep_gives_the_weights_back_and_waking_takes_them(
    gpus: SimulatedGpus, probe: NvmlProbe
) -> None:
    with running_demo("--sleep-mode", "--gpu-memory", "4GiB", env=on(gpus, "0")) as demo:
        assert httpx.post(f"{demo.url}/sleep?level=1", timeout=5).status_code == 200
        asleep = probe.read({"demo": demo.pid}).instances["demo"].device_bytes
        assert httpx.post(f"{demo.url}/wake_up", timeout=5).status_code == 200
        awake = probe.read({"demo": demo.pid}).instances["demo"].device_bytes
    assert (asleep, awake) == (CONTEXT, 4 * GiB + CONTEXT)


def test_gpu_flags_need_simulated_gpus(tmp_path: Path) -> None:
    failed = run_demo("--gpu-memory", "1GiB", env={ENV: ""})
    assert failed.returncode == 1
    assert "no CUDA-capable device" in failed.stderr
    gpus = simulated_gpus(tmp_path, "8GiB")
    hidden = run_demo("--gpu-memory", "1GiB", env=on(gpus, ""))
    assert hidden.returncode == 1 and "no CUDA-capable device" in hidden.stderr
    split = run_demo("--gpu-memory", "1GiB", "--gpu-split", "1,1", env=on(gpus, "0"))
    assert split.returncode == 1 and "invalid device ordinal" in split.stderr


def test_without_gpu_flags_there_is_no_gpu_route() -> None:
    with running_demo() as demo:
        assert httpx.get(f"{demo.url}/debug/gpu", timeout=5).status_code == 404


# --- the state file --------------------------------------------------------------------------

WRITER = """
import sys
from service.simgpu import CudaProcess, StateFile
process = CudaProcess(StateFile(sys.argv[1]), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
ids = []
for round in range(40):
    ids += process.allocate({round % 2: 1024 * 1024})
    if round % 4 == 3:
        process.free([ids.pop(0)])
print("done", flush=True)
sys.stdin.read()
"""


def test_concurrent_writers_lose_no_update_and_readers_never_see_a_torn_file(
    tmp_path: Path,
) -> None:
    gpus = simulated_gpus(tmp_path, "24GiB", "24GiB")
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(gpus.path)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    reads, done = 0, set[int]()
    deadline = time.monotonic() + 60
    try:
        while len(done) < len(writers):
            assert time.monotonic() < deadline, "the writers did not finish"
            gpus.file.read()  # raises on a torn or half-written file
            reads += 1
            done |= {w.pid for w in writers if w.pid not in done and _said_done(w)}
        state = gpus.state()
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
            for stream in (writer.stdin, writer.stdout):
                if stream is not None:
                    stream.close()
    assert reads > 0
    # Each writer: 40 allocations, 10 freed, and a context on each of the two GPUs.
    assert len(state.allocations) == 4 * (40 - 10 + 2)
    assert len({a.id for a in state.allocations}) == len(state.allocations)
    assert state.used(0) + state.used(1) == 4 * (30 * MiB + 2 * 16 * MiB)


def _said_done(writer: subprocess.Popen[str]) -> bool:
    assert writer.stdout is not None
    ready, _, _ = select.select([writer.stdout], [], [], 0)
    if ready:
        line = writer.stdout.readline()
        assert line.startswith("done"), f"writer failed (exit {writer.poll()}): {line!r}"
        return True
    return False


def test_the_command_line_makes_shows_and_scripts_a_state(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"

    def simgpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.simgpu", *args],
            cwd=REPO_ROOT,
            env=os.environ | {ENV: str(path)},
            capture_output=True,
            text=True,
            timeout=30,
        )

    made = simgpu(
        "init", "--state", str(path), "--gpu", "24GiB", "--gpu", "8GiB",
        "--reserved", "512MiB", "--release-lag", "2", "--fastest-first", "1,0",
        "--max-block", "4GiB,none",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"export {ENV}=" in made.stdout
    assert simgpu("fail", "--function", "nvmlDeviceGetCount", "--error", "UNKNOWN").returncode == 0
    assert simgpu("fail", "--function", "x", "--error", "NOT_AN_ERROR").returncode == 2
    shown = json.loads(simgpu("show", "--json").stdout)
    assert [d["total"] for d in shown["devices"]] == [24 * GiB, 8 * GiB]
    assert [d["max_block"] for d in shown["devices"]] == [4 * GiB, None]
    assert shown["fastest_first"] == [1, 0] and shown["release_lag"] == 2.0
    assert shown["errors"] == {"nvmlDeviceGetCount": {"error": "UNKNOWN", "calls": 1}}
    text = simgpu("show").stdout
    assert "GPU 1 Simulated GPU 1 (8 GiB)" in text and "largest block 4GiB" in text
    bad = simgpu("init", "--state", str(path), "--gpu", "8GiB", "--fastest-first", "1")
    assert bad.returncode == 2 and "permutation" in bad.stderr
    too_big = simgpu("hold", "--device", "1", "--bytes", "9GiB")
    assert too_big.returncode == 1 and "CUDA out of memory" in too_big.stderr
    assert StateFile(path).read().allocations == []
