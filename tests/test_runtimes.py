"""Launch arguments: placeholders filled in for one start of a service."""

from __future__ import annotations

import pytest

from service.policy import Service, load_policy
from service.runtimes import launch_args

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
