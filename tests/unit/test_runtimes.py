"""Launch arguments: placeholders filled in for one start of a service."""

from __future__ import annotations

import httpx
import pytest
from support.fake_clock import FakeClock
from support.fake_launcher import FakeLauncher

from service.live.runtimes import RuntimeTable, fit_target_for
from service.policy import Service, load_policy
from service.supervisor.launch import fit_target_mib, launch_args

GiB = 1024**3


def service_with_cap(cap: str) -> Service:
    policy = load_policy(
        "version: 1\nservices:\n  v:\n    kind: chat\n    models: [m]\n"
        '    command: [vllm, --gpu-memory-utilization, "${CAP_FRACTION}", --port, "${PORT}"]\n'
        f"    memory: {{estimate: 1GiB, cap: {cap}}}\n"
    )
    return policy.services["v"]


@pytest.mark.parametrize(
    ("cap", "total"),
    [("7GiB", 24 * GiB), ("17.5GiB", 24 * GiB), ("1GiB", 3 * GiB), ("79GiB", 80 * GiB)],
)
def test_cap_fraction_is_never_rounded_above_the_cap(cap: str, total: int) -> None:
    service = service_with_cap(cap)
    args = launch_args("v", service, port=1, devices=(0,), runtime_totals=(total,))
    fraction = float(args.argv[2])
    assert service.memory.cap is not None
    assert fraction * total <= service.memory.cap
    assert service.memory.cap - fraction * total < total / 1000  # and no lower than needed


def service_with_env(env: str = "{}", span: int = 1) -> Service:
    policy = load_policy(
        "version: 1\nservices:\n  v:\n    kind: chat\n    models: [m]\n"
        '    command: [llama-server, --port, "${PORT}", --device-list, "${GPU}"]\n'
        f"    env: {env}\n    span: {span}\n"
        "    memory: {estimate: 1GiB, cap: 8GiB}\n"
    )
    return policy.services["v"]


NVML_PLACEMENT = {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_placement_env_lists_every_device_of_a_span_in_pci_order() -> None:
    args = launch_args(
        "v", service_with_env(span=2), port=1, devices=(0, 2), placement=NVML_PLACEMENT
    )
    assert args.env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert args.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert args.argv[-1] == "0,2"  # ${GPU}: the devices chosen


@pytest.mark.parametrize(
    "own", ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
)
def test_a_service_choosing_its_own_devices_is_not_filtered_twice(own: str) -> None:
    service = service_with_env(f'{{{own}: "1"}}')
    amd = {"ROCR_VISIBLE_DEVICES": "GPU-abc"}
    for placement in (NVML_PLACEMENT, amd):
        env = launch_args("v", service, port=1, devices=(0,), placement=placement).env
        visible = {
            k
            for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
            if k in env
        }
        assert visible == {own}
        assert env[own] == "1"
    # The ordering is not a filter: CUDA numbers the operator's "1" as nvidia-smi does.
    assert (
        launch_args("v", service, port=1, devices=(0,), placement=NVML_PLACEMENT).env[
            "CUDA_DEVICE_ORDER"
        ]
        == "PCI_BUS_ID"
    )


@pytest.mark.parametrize(
    ("cap", "shares", "totals"),
    [(16 * GiB, (0.5, 0.5), (24 * GiB, 24 * GiB)), (16 * GiB, (0.75, 0.25), (24 * GiB, 12 * GiB))],
)
def test_cap_fraction_of_a_span_keeps_every_device_under_its_share(
    cap: int, shares: tuple[float, ...], totals: tuple[int, ...]
) -> None:
    from service.supervisor.launch import cap_fraction

    fraction = float(cap_fraction(cap, shares, totals))
    for share, total in zip(shares, totals, strict=True):
        assert fraction * total <= cap * share


def test_cap_fraction_never_rounds_up_where_a_float_floor_would() -> None:
    """0.29 of 100 is 28.999... in binary; floor(x * 1000) / 1000 gives 0.290 > x."""
    from service.supervisor.launch import cap_fraction

    total = 100 * 2**20
    cap = 29 * 2**20 - 1  # just under 0.29 of the total
    fraction = cap_fraction(cap, (1.0,), (total,))
    assert fraction == "0.2899"
    assert float(fraction) * total <= cap


MiB = 1024**2


def table(policy_text: str) -> RuntimeTable:
    policy = load_policy(policy_text)
    return RuntimeTable(
        dict(policy.services),
        launcher=FakeLauncher(),
        clock=FakeClock(),
        http=httpx.AsyncClient(),
    )


TWO_LLAMAS = """\
version: 1
services:
  big:
    kind: chat
    models: [big]
    command: [llama-server, --port, "${PORT}"]
    span: 2
    memory: {estimate: 10GiB, cap: 12GiB, split: [0.75, 0.25]}
  small:
    kind: chat
    models: [small]
    command: [llama-server, --port, "${PORT}"]
    memory: {estimate: 2GiB}
"""


def test_fit_target_leaves_free_what_the_cap_and_other_starting_loads_do_not_take() -> None:
    runtimes = table(TWO_LLAMAS)
    big, small = runtimes["big"], runtimes["small"]
    free = {0: 20 * GiB, 1: 20 * GiB}
    # Nothing else starting: free less the service's share of its cap on each device.
    assert fit_target_for(big, (0, 1), free, [big]) == (
        (20 * GiB - 9 * GiB) // MiB,
        (20 * GiB - 3 * GiB) // MiB,
    )
    # small starts on device 1 and already holds 0.5 GiB of its 2 GiB estimate.
    small.placement.devices, small.measured.device_bytes = (1,), {1: GiB // 2}
    assert fit_target_for(big, (0, 1), free, [big, small]) == (
        (20 * GiB - 9 * GiB) // MiB,
        (20 * GiB - int(1.5 * GiB) - 3 * GiB) // MiB,
    )
    assert fit_target_for(big, (0, 1), {0: free[0]}, [small]) == ()  # not sampled yet
    assert fit_target_mib([GiB], [0], [2 * GiB]) == (0,)  # never below zero


def test_fit_target_reaches_the_environment_unless_the_service_sets_it() -> None:
    service = service_with_env()
    args = launch_args("v", service, port=1, devices=(0,), fit_target_mib=(4096,))
    assert args.env["LLAMA_ARG_FIT_TARGET"] == "4096"
    own = service_with_env('{LLAMA_ARG_FIT_TARGET: "512"}')
    args = launch_args("v", own, port=1, devices=(0,), fit_target_mib=(4096,))
    assert args.env["LLAMA_ARG_FIT_TARGET"] == "512"
