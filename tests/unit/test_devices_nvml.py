"""NvmlProbe and create_probe against the scripted fake pynvml (tests/support/fake_pynvml.py).

Instance attribution walks real process trees: the test process is the instance root and
a real child of it is the process the fake GPU reports.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing

import pynvml
import pytest
from support.fake_amdsmi import FakeAmdsmi
from support.fake_pynvml import FakeGpu, FakeNvml, FakeProcess, V2Support

from service.devices import HostProbe, NvmlProbe, create_probe
from service.domain import DeviceSnapshot, InstanceMemory
from service.errors import ProbeError

GiB = 2**30
ME = {"me": os.getpid()}
FOREIGN_PID = os.getppid()  # alive, and never in this process's tree
# auto falls back from NVML to amdsmi: these tests mean a machine with no AMD GPU either.
NO_AMD = FakeAmdsmi([])


@pytest.fixture
def child() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(total=80 * GiB, used=10 * GiB, reserved=GiB, name=b"NVIDIA H100"),
            FakeGpu(total=24 * GiB, used=0, name="NVIDIA RTX 4090"),
        ]
    )


def test_reports_every_gpu_with_the_driver_reserve_kept_out_of_total() -> None:
    with closing(NvmlProbe(two_gpus())) as probe:
        reading = probe.read({})
    assert reading.backend == "nvml"
    assert reading.degraded is None
    assert reading.devices == (
        DeviceSnapshot(
            0, 79 * GiB, 10 * GiB, 69 * GiB, 0, name="NVIDIA H100", visible_total=80 * GiB
        ),
        DeviceSnapshot(1, 24 * GiB, 0, 24 * GiB, 0, name="NVIDIA RTX 4090", visible_total=24 * GiB),
    )
    # A runtime sizing itself by a fraction (vLLM) multiplies the total it sees, reserve in.
    assert reading.devices[0].runtime_total == 80 * GiB


def test_placement_env_names_devices_in_nvml_numbering() -> None:
    with closing(NvmlProbe(two_gpus())) as probe:
        assert probe.placement_env([0, 1]) == {
            "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }


def test_instance_on_two_gpus_is_measured_per_device(child: int) -> None:
    fake = two_gpus()
    fake.gpus[0].compute = [FakeProcess(os.getpid(), 3 * GiB)]
    fake.gpus[1].compute = [FakeProcess(child, 2 * GiB)]
    with closing(NvmlProbe(fake)) as probe:
        memory = probe.read(ME).instances["me"]
    assert memory.per_device == {0: 3 * GiB, 1: 2 * GiB}
    assert memory.device_bytes == 5 * GiB


def test_foreign_process_counts_as_foreign() -> None:
    fake = two_gpus()
    fake.gpus[0].compute = [FakeProcess(FOREIGN_PID, 3 * GiB)]
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read(ME)
    assert reading.devices[0].managed == 0
    assert reading.devices[0].foreign == 10 * GiB
    assert reading.instances["me"].device_bytes == 0
    assert reading.degraded is None


def test_instance_child_on_second_gpu_is_attributed_to_the_instance(child: int) -> None:
    fake = two_gpus()
    fake.gpus[1].used = 5 * GiB
    fake.gpus[1].compute = [FakeProcess(child, 2 * GiB), FakeProcess(FOREIGN_PID, 3 * GiB)]
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read(ME)
    memory = reading.instances["me"]
    assert memory.device_bytes == 2 * GiB
    assert memory.pids[0] == os.getpid()
    assert child in memory.pids
    assert memory.host_bytes > 0  # host memory is sampled beside the GPU figure
    assert (reading.devices[1].managed, reading.devices[1].foreign) == (2 * GiB, 3 * GiB)
    assert reading.devices[0].managed == 0


def test_gpu_selection_reads_only_the_chosen_gpus() -> None:
    with closing(NvmlProbe(two_gpus(), gpus=[1])) as probe:
        reading = probe.read({})
    assert [device.index for device in reading.devices] == [1]


def test_a_pid_in_both_process_lists_is_counted_once(child: int) -> None:
    fake = two_gpus()
    fake.gpus[0].compute = [FakeProcess(child, GiB)]
    fake.gpus[0].graphics = [FakeProcess(child, GiB), FakeProcess(FOREIGN_PID, None)]
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read(ME)
    assert reading.instances["me"].device_bytes == GiB
    assert reading.devices[0].managed == GiB
    assert reading.degraded is None  # unknown use of a foreign process changes nothing


def test_unknown_per_process_memory_makes_attribution_partial(child: int) -> None:
    fake = two_gpus()
    fake.gpus[0].compute = [FakeProcess(child, None)]
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read(ME)
    assert reading.instances["me"].device_bytes == 0
    assert reading.devices[0].managed == 0
    assert reading.degraded is not None
    assert "partial attribution" in reading.degraded
    assert f"pid {child}" in reading.degraded


def test_vanished_processes_are_not_errors() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fake = two_gpus()
    fake.gpus[0].compute = [FakeProcess(gone.pid, GiB)]
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read({"gone": gone.pid})
    assert reading.instances["gone"] == InstanceMemory(device_bytes=0, host_bytes=0, pids=())
    assert reading.devices[0].managed == 0


def test_nvml_error_after_init_serves_last_good_figures_then_recovers(child: int) -> None:
    fake = two_gpus()
    fake.gpus[1].compute = [FakeProcess(child, 2 * GiB)]
    with closing(NvmlProbe(fake)) as probe:
        good = probe.read(ME)
        fake.gpus[0].used = 20 * GiB
        fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVMLError_GpuIsLost)
        lost = probe.read(ME)
        recovered = probe.read(ME)
    assert lost.devices == good.devices
    assert lost.instances["me"].device_bytes == 2 * GiB
    assert lost.degraded is not None
    assert "NVMLError_GpuIsLost" in lost.degraded
    assert "last good" in lost.degraded
    assert recovered.degraded is None
    assert recovered.devices[0].used == 20 * GiB


def test_nvml_error_before_any_good_read_reports_zeros() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_Unknown)
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read(ME)
    assert reading.devices == (
        DeviceSnapshot(0, 0, 0, 0, name="NVIDIA H100"),
        DeviceSnapshot(1, 0, 0, 0, name="NVIDIA RTX 4090"),
    )
    assert reading.degraded is not None
    assert "no good reading yet" in reading.degraded
    assert reading.instances["me"].host_bytes > 0


def test_a_gpu_that_cannot_list_processes_is_partial_not_failed() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetGraphicsRunningProcesses", pynvml.NVMLError_NotSupported)
    with closing(NvmlProbe(fake)) as probe:
        reading = probe.read({})
    assert reading.devices[0].used == 10 * GiB
    assert reading.degraded is not None
    assert "GPU 0 cannot list processes" in reading.degraded


def test_an_older_driver_steps_down_to_the_v2_process_lists(child: int) -> None:
    fake = FakeNvml([FakeGpu(compute=[FakeProcess(child, GiB)])], process_abi="v2")
    with closing(NvmlProbe(fake)) as probe:
        first = probe.read(ME)
        second = probe.read(ME)
    assert first.instances["me"].device_bytes == second.instances["me"].device_bytes == GiB
    assert first.degraded is None
    # Stepped down once, for good.
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2


@pytest.mark.parametrize("memory_v2", ["function-not-found", "absent"])
def test_memory_info_falls_back_to_v1(memory_v2: V2Support) -> None:
    fake = FakeNvml([FakeGpu(total=80 * GiB, used=10 * GiB, reserved=GiB)], memory_v2=memory_v2)
    with closing(NvmlProbe(fake)) as probe:
        first = probe.read({})
        second = probe.read({})
    # v1 folds the reserve into "used"; still a correct, slightly pessimistic reading.
    assert first.devices[0].total == 80 * GiB
    assert first.devices[0].used == 11 * GiB
    assert first.devices[0].free == 69 * GiB
    assert second.devices == first.devices
    assert first.degraded is None
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == (3 if memory_v2 == "function-not-found" else 2)


def test_close_shuts_nvml_down_once() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    probe.close()
    probe.close()
    assert fake.calls["nvmlShutdown"] == 1
    assert fake.initialised == 0
    with pytest.raises(ProbeError, match="closed"):
        probe.read({})


@pytest.mark.parametrize("backend", ["auto", "nvml"])
def test_unknown_gpu_index_is_a_probe_error_naming_it(backend: str) -> None:
    fake = two_gpus()
    with pytest.raises(ProbeError, match=r"GPU index 5.*2 GPU\(s\)"):
        create_probe(backend, gpus=[5], nvml=fake)
    assert fake.initialised == 0  # NVML was shut down again


def test_auto_without_a_gpu_library_is_host(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    with caplog.at_level(logging.INFO, logger="vramd.devices"):
        probe = create_probe("auto", nvml=fake, amdsmi=NO_AMD)
    with closing(probe):
        assert isinstance(probe, HostProbe)
    assert "host" in caplog.text
    assert "NVMLError_LibraryNotFound" in caplog.text
    assert fake.calls["nvmlShutdown"] == 0


def test_auto_with_no_gpu_is_host() -> None:
    fake = FakeNvml([])
    with closing(create_probe("auto", nvml=fake, amdsmi=NO_AMD)) as probe:
        assert isinstance(probe, HostProbe)
    assert fake.initialised == 0


def test_auto_with_gpus_is_nvml(caplog: pytest.LogCaptureFixture) -> None:
    fake = two_gpus()
    with caplog.at_level(logging.INFO, logger="vramd.devices"):
        probe = create_probe("auto", nvml=fake)
    with closing(probe):
        assert isinstance(probe, NvmlProbe)
        assert len(probe.read({}).devices) == 2
    assert "nvml (GPUs 0, 1)" in caplog.text


def test_nvml_backend_without_nvml_is_a_clear_probe_error() -> None:
    fake = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    with pytest.raises(ProbeError, match=r"backend is nvml.*NVML Shared Library Not Found"):
        create_probe("nvml", nvml=fake)


def test_unknown_backend_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="'cuda'"):
        create_probe("cuda")


def _real_nvml_has_a_gpu() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return bool(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_auto_with_the_real_binding_matches_the_machine() -> None:
    with closing(create_probe("auto", amdsmi=NO_AMD)) as probe:
        reading = probe.read(ME)
    assert probe.backend == ("nvml" if _real_nvml_has_a_gpu() else "host")
    assert reading.devices[0].total > 0
    assert reading.instances["me"].host_bytes > 0


@pytest.mark.skipif(_real_nvml_has_a_gpu(), reason="this machine has a GPU")
def test_nvml_backend_with_the_real_binding_and_no_gpu_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="NVMLError"):
        create_probe("nvml")
