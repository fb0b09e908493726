"""AmdsmiProbe and create_probe against the scripted fake amdsmi (tests/support/fake_amdsmi.py).

Instance attribution walks real process trees: the test process is the instance root and
a real child of it is the process the fake GPU reports.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from typing import Literal

import pynvml
import pytest
from support.fake_amdsmi import (
    DRIVER_NOT_LOADED,
    IO,
    NO_PERM,
    VRAM_DDR5,
    VRAM_HBM3,
    VRAM_LPDDR5,
    VRAM_UNKNOWN,
    AmdSmiInitFlags,
    FakeAmdsmi,
    FakeGpu,
    FakeProcess,
    ProcessApi,
    apu,
)
from support.fake_pynvml import FakeGpu as NvidiaGpu
from support.fake_pynvml import FakeNvml

from service.devices import AmdsmiProbe, AmdsmiUnavailable, HostProbe, NvmlProbe, create_probe
from service.devices.amdsmi import CARVE_OUT_MAX
from service.domain import DeviceSnapshot, InstanceMemory
from service.errors import ProbeError

GiB = 2**30
MiB = 2**20
ME = {"me": os.getpid()}
FOREIGN_PID = os.getppid()  # alive, and never in this process's tree
UUID_0 = "GPU-4b3e5f6e0b5d1c47"
UUID_1 = "GPU-f980f88ef31631a2"
PLENTY = 1024 * GiB  # host memory available: caps no GTT


@pytest.fixture
def child() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def two_cards() -> FakeAmdsmi:
    return FakeAmdsmi(
        [
            FakeGpu(
                vram_total=192 * GiB,
                vram_used=10 * GiB,
                gtt_used=3 * GiB,
                vram_type=VRAM_HBM3,
                market_name="AMD Instinct MI300X",
                hip_uuid=UUID_0,
            ),
            FakeGpu(vram_total=24 * GiB, hip_uuid=UUID_1),
        ]
    )


def probe_of(
    fake: FakeAmdsmi, host_available: int = PLENTY, gpus: list[int] | Literal["all"] = "all"
) -> AmdsmiProbe:
    return AmdsmiProbe(fake, gpus, host_available=lambda: host_available)


def test_a_discrete_card_is_its_vram_and_gtt_is_left_out() -> None:
    with closing(probe_of(two_cards())) as probe:
        reading = probe.read({})
    assert reading.backend == "amdsmi"
    assert reading.degraded is None
    assert reading.devices == (
        DeviceSnapshot(0, 192 * GiB, 10 * GiB, 182 * GiB, 0, name="AMD Instinct MI300X"),
        DeviceSnapshot(1, 24 * GiB, 0, 24 * GiB, 0, name="AMD Radeon RX 7900 XTX"),
    )
    assert reading.devices[0].runtime_total == 192 * GiB


def test_an_apu_counts_its_carve_out_and_gtt_together() -> None:
    fake = FakeAmdsmi([apu(vram_used=400 * MiB, gtt_used=20 * GiB)])
    with closing(probe_of(fake)) as probe:
        device = probe.read({}).devices[0]
    # A budget of the 512 MiB carve-out alone would fit nothing on a 128 GiB machine.
    assert device.total == 512 * MiB + 96 * GiB
    assert device.used == 400 * MiB + 20 * GiB
    assert device.free == 112 * MiB + 76 * GiB
    assert device.name == "AMD Radeon 8060S Graphics"


def test_an_apus_free_gtt_is_capped_by_the_hosts_available_memory() -> None:
    # GTT is ordinary RAM: what CPU programs hold is not there for the GPU either.
    fake = FakeAmdsmi([apu(vram_used=400 * MiB, gtt_used=20 * GiB)])
    with closing(probe_of(fake, host_available=30 * GiB)) as probe:
        device = probe.read({}).devices[0]
    assert device.free == 112 * MiB + 30 * GiB
    assert device.used == 400 * MiB + 20 * GiB


def test_an_apu_footprint_counts_vram_and_gtt(child: int) -> None:
    fake = FakeAmdsmi(
        [
            apu(
                vram_used=300 * MiB,
                gtt_used=9 * GiB,
                processes=[FakeProcess(child, 256 * MiB, 8 * GiB)],
            )
        ]
    )
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    memory = reading.instances["me"]
    assert memory.per_device == {0: 256 * MiB + 8 * GiB}
    assert reading.devices[0].managed == 256 * MiB + 8 * GiB
    assert reading.devices[0].foreign == 44 * MiB + 1 * GiB


def test_a_discrete_footprint_ignores_the_process_gtt(child: int) -> None:
    fake = two_cards()
    fake.gpus[0].processes = [FakeProcess(child, 4 * GiB, 2 * GiB)]
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert reading.instances["me"].device_bytes == 4 * GiB
    assert reading.devices[0].foreign == 6 * GiB


@pytest.mark.parametrize(
    ("gpu", "unified"),
    [
        (apu(vram_total=96 * GiB, gtt_total=16 * GiB), True),  # a large carve-out is still an APU
        (apu(vram_type=VRAM_DDR5, market_name="AMD Radeon 780M"), True),
        (apu(vram_type=VRAM_UNKNOWN), True),  # an older release: the carve-out's shape decides
        (FakeGpu(vram_type=VRAM_UNKNOWN, vram_total=CARVE_OUT_MAX + 1, gtt_total=64 * GiB), False),
        (FakeGpu(vram_type=VRAM_UNKNOWN, vram_total=2 * GiB, gtt_total=GiB), False),
        (FakeGpu(vram_total=4 * GiB, gtt_total=64 * GiB), False),  # GDDR6 is a card, however small
    ],
)
def test_apus_are_told_from_discrete_cards(gpu: FakeGpu, unified: bool) -> None:
    with closing(probe_of(FakeAmdsmi([gpu]))) as probe:
        total = probe.read({}).devices[0].total
    assert total == (gpu.vram_total + gpu.gtt_total if unified else gpu.vram_total)


def test_a_gpu_whose_vram_type_cannot_be_read_is_judged_by_its_shape() -> None:
    fake = FakeAmdsmi([apu(vram_type=VRAM_LPDDR5)])
    fake.fail("amdsmi_get_gpu_vram_info", NO_PERM)
    with closing(probe_of(fake)) as probe:
        assert probe.read({}).devices[0].total == 512 * MiB + 96 * GiB


def test_instance_on_two_gpus_is_measured_per_device(child: int) -> None:
    fake = two_cards()
    fake.gpus[0].processes = [FakeProcess(os.getpid(), 3 * GiB)]
    fake.gpus[1].processes = [FakeProcess(child, 2 * GiB)]
    with closing(probe_of(fake)) as probe:
        memory = probe.read(ME).instances["me"]
    assert memory.per_device == {0: 3 * GiB, 1: 2 * GiB}
    assert memory.device_bytes == 5 * GiB
    assert memory.pids[0] == os.getpid()
    assert child in memory.pids
    assert memory.host_bytes > 0  # host memory is sampled beside the GPU figure


def test_foreign_process_counts_as_foreign(child: int) -> None:
    fake = two_cards()
    fake.gpus[1].vram_used = 5 * GiB
    fake.gpus[1].processes = [FakeProcess(child, 2 * GiB), FakeProcess(FOREIGN_PID, 3 * GiB)]
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert (reading.devices[1].managed, reading.devices[1].foreign) == (2 * GiB, 3 * GiB)
    assert reading.devices[0].managed == 0
    assert reading.devices[0].foreign == 10 * GiB
    assert reading.instances["me"].device_bytes == 2 * GiB
    assert reading.degraded is None


def test_a_process_listed_with_nothing_on_a_gpu_is_not_placed_there(child: int) -> None:
    # Older amdsmi releases list every KFD process under every GPU.
    fake = two_cards()
    fake.gpus[0].processes = [FakeProcess(child, 2 * GiB)]
    fake.gpus[1].processes = [FakeProcess(child, 0)]
    with closing(probe_of(fake)) as probe:
        assert probe.read(ME).instances["me"].per_device == {0: 2 * GiB}


def test_unknown_per_process_memory_makes_attribution_partial(child: int) -> None:
    fake = FakeAmdsmi([apu(processes=[FakeProcess(child, 100 * MiB, None)])])
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert reading.instances["me"].device_bytes == 0
    assert reading.devices[0].managed == 0
    assert reading.degraded is not None
    assert "partial attribution" in reading.degraded
    assert f"pid {child}" in reading.degraded


def test_unknown_memory_of_a_foreign_process_changes_nothing() -> None:
    fake = two_cards()
    fake.gpus[0].processes = [FakeProcess(FOREIGN_PID, None)]
    with closing(probe_of(fake)) as probe:
        assert probe.read(ME).degraded is None


def test_a_gpu_that_refuses_its_process_list_is_partial_not_failed() -> None:
    fake = two_cards()
    fake.fail("amdsmi_get_gpu_process_list", NO_PERM)
    with closing(probe_of(fake)) as probe:
        reading = probe.read({})
    assert reading.devices[0].used == 10 * GiB
    assert reading.degraded is not None
    assert "GPU 0 cannot list processes" in reading.degraded
    assert "AMDSMI_STATUS_NO_PERM" in reading.degraded


@pytest.mark.parametrize("api", ["dicts", "handles"])
def test_both_process_list_shapes_are_read(api: ProcessApi, child: int) -> None:
    fake = two_cards()
    fake.process_api = api
    fake.gpus[0].processes = [FakeProcess(child, 3 * GiB), FakeProcess(FOREIGN_PID, GiB)]
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
        holding = probe.holding([child, FOREIGN_PID, 999_999_999])
    assert reading.instances["me"].device_bytes == 3 * GiB
    assert reading.degraded is None
    assert holding == {child, FOREIGN_PID}
    assert fake.calls["amdsmi_get_gpu_process_info"] == (2 if api == "handles" else 0)


def test_a_handle_whose_process_exited_meanwhile_is_skipped(child: int) -> None:
    fake = FakeAmdsmi([FakeGpu(processes=[FakeProcess(child, GiB)])], process_api="handles")
    fake.fail("amdsmi_get_gpu_process_info", 31)  # NOT_FOUND: gone between the two calls
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert reading.instances["me"].device_bytes == 0
    assert reading.degraded is None


def test_a_handle_whose_info_is_refused_is_partial(child: int) -> None:
    fake = FakeAmdsmi([FakeGpu(processes=[FakeProcess(child, GiB)])], process_api="handles")
    fake.fail("amdsmi_get_gpu_process_info", NO_PERM)
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert reading.degraded is not None
    assert f"pid {child}" in reading.degraded


def test_vanished_processes_are_not_errors() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fake = two_cards()
    fake.gpus[0].processes = [FakeProcess(gone.pid, GiB)]
    with closing(probe_of(fake)) as probe:
        reading = probe.read({"gone": gone.pid})
    assert reading.instances["gone"] == InstanceMemory(device_bytes=0, host_bytes=0, pids=())
    assert reading.devices[0].managed == 0


def test_an_amdsmi_error_after_init_serves_last_good_figures_then_recovers(child: int) -> None:
    fake = two_cards()
    fake.gpus[1].processes = [FakeProcess(child, 2 * GiB)]
    with closing(probe_of(fake)) as probe:
        good = probe.read(ME)
        fake.gpus[0].vram_used = 20 * GiB
        fake.fail("amdsmi_get_gpu_memory_usage", IO)
        lost = probe.read(ME)
        recovered = probe.read(ME)
    assert lost.devices == good.devices
    assert lost.instances["me"].device_bytes == 2 * GiB
    assert lost.degraded is not None
    assert "AmdSmiLibraryException" in lost.degraded
    assert "last good" in lost.degraded
    assert recovered.degraded is None
    assert recovered.devices[0].used == 20 * GiB


def test_a_process_list_that_fails_otherwise_is_a_failed_read() -> None:
    fake = two_cards()
    fake.fail("amdsmi_get_gpu_process_list", IO)
    with closing(probe_of(fake)) as probe:
        reading = probe.read(ME)
    assert reading.devices == (
        DeviceSnapshot(0, 0, 0, 0, name="AMD Instinct MI300X"),
        DeviceSnapshot(1, 0, 0, 0, name="AMD Radeon RX 7900 XTX"),
    )
    assert reading.degraded is not None
    assert "no good reading yet" in reading.degraded
    assert reading.instances["me"].host_bytes > 0


def test_gpu_selection_reads_only_the_chosen_gpus() -> None:
    with closing(probe_of(two_cards(), gpus=[1])) as probe:
        reading = probe.read({})
        assert probe.indexes == (1,)
    assert [device.index for device in reading.devices] == [1]


def test_a_gpu_without_a_market_name_is_named_by_its_index() -> None:
    with closing(probe_of(FakeAmdsmi([FakeGpu(market_name="")]))) as probe:
        assert probe.read({}).devices[0].name == "AMD GPU 0"


def test_holding_lists_what_any_gpu_still_lists(child: int) -> None:
    fake = two_cards()
    fake.gpus[1].processes = [FakeProcess(child, GiB)]
    with closing(probe_of(fake)) as probe:
        assert probe.holding([child, os.getpid()]) == {child}
        fake.gpus[1].processes = []
        assert probe.holding([child]) == set()
        fake.fail("amdsmi_get_gpu_process_list", IO)
        # A barrier must not open on a reading it could not take.
        assert probe.holding([child]) == {child}


def test_placement_env_names_gpus_by_rocm_uuid() -> None:
    with closing(probe_of(two_cards())) as probe:
        assert probe.placement_env([1, 0]) == {"ROCR_VISIBLE_DEVICES": f"{UUID_1},{UUID_0}"}


def test_placement_env_falls_back_to_the_index_without_a_uuid() -> None:
    fake = two_cards()
    fake.gpus[1].hip_uuid = "GPU-XX"  # what ROCm shows for a GPU without a unique id
    with closing(probe_of(fake)) as probe:
        assert probe.placement_env([0, 1]) == {"ROCR_VISIBLE_DEVICES": f"{UUID_0},1"}
    # Before ROCm 6.4 there is no enumeration info at all.
    with closing(probe_of(FakeAmdsmi(two_cards().gpus, enumeration=False))) as probe:
        assert probe.placement_env([0, 1]) == {"ROCR_VISIBLE_DEVICES": "0,1"}


def test_init_failure_is_amdsmi_unavailable() -> None:
    fake = FakeAmdsmi(init_error=DRIVER_NOT_LOADED)
    with pytest.raises(AmdsmiUnavailable, match=r"did not initialise.*DRIVER_NOT_LOADED"):
        AmdsmiProbe(fake)
    assert fake.calls["amdsmi_shut_down"] == 0


def test_the_probe_initialises_for_gpus_and_shuts_down_once() -> None:
    fake = two_cards()
    probe = probe_of(fake)
    assert fake.init_flags == [AmdSmiInitFlags.INIT_AMD_GPUS]
    probe.close()
    probe.close()
    assert fake.calls["amdsmi_shut_down"] == 1
    assert fake.initialised == 0
    with pytest.raises(ProbeError, match="closed"):
        probe.read({})
    with pytest.raises(ProbeError, match="closed"):
        probe.holding([1])


def no_nvidia() -> FakeNvml:
    return FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)


@pytest.mark.parametrize("backend", ["auto", "amdsmi"])
def test_unknown_gpu_index_is_a_probe_error_naming_it(backend: str) -> None:
    fake = two_cards()
    with pytest.raises(ProbeError, match=r"GPU index 5.*amdsmi reports 2 GPU\(s\)"):
        create_probe(backend, gpus=[5], nvml=FakeNvml([]), amdsmi=fake)
    assert fake.initialised == 0  # amdsmi was shut down again


def test_auto_tries_nvml_then_amdsmi(caplog: pytest.LogCaptureFixture) -> None:
    fake = two_cards()
    with caplog.at_level(logging.INFO, logger="vramd.devices"):
        probe = create_probe("auto", nvml=no_nvidia(), amdsmi=fake)
    with closing(probe):
        assert isinstance(probe, AmdsmiProbe)
        assert len(probe.read({}).devices) == 2
    assert "NVMLError_LibraryNotFound" in caplog.text
    assert "amdsmi (GPUs 0, 1)" in caplog.text


def test_auto_prefers_nvml_when_it_answers() -> None:
    amd = two_cards()
    with closing(create_probe("auto", nvml=FakeNvml([NvidiaGpu()]), amdsmi=amd)) as probe:
        assert isinstance(probe, NvmlProbe)
    assert amd.calls["amdsmi_init"] == 0


@pytest.mark.parametrize(
    "amd",
    [FakeAmdsmi(init_error=DRIVER_NOT_LOADED), FakeAmdsmi([])],
    ids=["no-driver", "no-gpu"],
)
def test_auto_without_either_library_is_host(
    amd: FakeAmdsmi, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="vramd.devices"):
        probe = create_probe("auto", nvml=no_nvidia(), amdsmi=amd)
    with closing(probe):
        assert isinstance(probe, HostProbe)
    # Each fallback says why.
    assert "NVMLError_LibraryNotFound" in caplog.text
    assert "device backend: host (auto: amdsmi" in caplog.text
    assert amd.initialised == 0


def test_amdsmi_backend_insists() -> None:
    with pytest.raises(ProbeError, match=r"backend is amdsmi, but .*DRIVER_NOT_LOADED"):
        create_probe("amdsmi", amdsmi=FakeAmdsmi(init_error=DRIVER_NOT_LOADED))
    with pytest.raises(ProbeError, match=r"backend is amdsmi, but .*no GPU"):
        create_probe("amdsmi", amdsmi=FakeAmdsmi([]))


def test_amdsmi_backend_never_touches_nvml() -> None:
    nvidia = FakeNvml([NvidiaGpu()])
    with closing(create_probe("amdsmi", nvml=nvidia, amdsmi=two_cards())) as probe:
        assert isinstance(probe, AmdsmiProbe)
    assert nvidia.calls["nvmlInit"] == 0


@pytest.mark.skipif(importlib.util.find_spec("amdsmi") is not None, reason="amdsmi is installed")
def test_amdsmi_backend_without_the_library_is_a_clear_probe_error() -> None:
    with pytest.raises(ProbeError, match=r"backend is amdsmi, but the amdsmi module .* is missing"):
        create_probe("amdsmi")


def _real_amdsmi_gpus() -> int | None:
    """How many GPUs the installed amdsmi reports; None where it cannot start."""
    try:
        amdsmi = importlib.import_module("amdsmi")
    except (ImportError, OSError):
        return None
    try:
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except amdsmi.AmdSmiException:
        return None
    try:
        return len(amdsmi.amdsmi_get_processor_handles())
    finally:
        amdsmi.amdsmi_shut_down()


@pytest.mark.skipif(importlib.util.find_spec("amdsmi") is None, reason="amdsmi is not installed")
def test_amdsmi_backend_with_the_real_library_matches_the_machine() -> None:
    if not _real_amdsmi_gpus():
        with pytest.raises(ProbeError, match="backend is amdsmi"):
            create_probe("amdsmi")
        return
    with closing(create_probe("amdsmi")) as probe:
        reading = probe.read(ME)
        assert probe.holding([os.getpid()]) <= {os.getpid()}
    assert reading.backend == "amdsmi"
    assert all(device.total > 0 for device in reading.devices)
    assert reading.instances["me"].host_bytes > 0
