"""What every simulated system shares: the services, the device, the trace's vocabulary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.domain import Residency, ServiceKind
from service.policy import Policy
from service.replay.benchdata import RuntimeBench, resolve_bench
from service.scheduler import DeviceRule, ServiceRule, rules_from_policy
from service.units import GIB

DEFAULT_SLACK = 1 * GIB


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """One service as the baselines see it: the policy's figures and the bench truth."""

    name: str
    kind: ServiceKind
    priority: int
    residency: Residency
    estimate: int
    max_concurrency: int
    bench: RuntimeBench


@dataclass(frozen=True, slots=True)
class Setup:
    policy: Policy
    rules: Mapping[str, ServiceRule]
    device_rule: DeviceRule
    services: Mapping[str, ServiceInfo]
    models: Mapping[str, str]  # model name -> service
    device_total: int
    plan_bytes: int
    devices: int = 1

    def service_of(self, model: str) -> str | None:
        return self.models.get(model)


def build_setup(
    policy: Policy,
    bench_raw: Mapping[str, Mapping[str, object]] | None = None,
    *,
    device_total: int | None = None,
    devices: int | None = None,
    runtimes: Mapping[str, RuntimeBench] | None = None,
) -> Setup:
    """``runtimes`` (the tuner's learned figures) replaces the bench data where given.

    ``Setup`` is built once from a policy and bench data and handed to every system, so they
    all see the same services, the same device and the same memory to plan with:

    - ``device_total``: the simulated device's real size. By default the policy's
      ``device.budget`` plus its ``headroom`` plus ``DEFAULT_SLACK`` (what a real card has
      beyond what the operator hands out), so a runtime that outgrows its estimate has a
      little room before it fails, as on a real card.
    - ``plan_bytes``: what vramd hands out on that device (``min(budget, total) - headroom``,
      docs/operations.md, "How vramd decides"). The baselines plan against the same figure, so
      every system is compared on the same memory.
    - ``devices``: how many such devices the box has (``device_total`` and ``plan_bytes``
      are per device). By default one, or one per index up to the highest in the policy's
      ``device.gpus`` when it lists them (``gpus: [0, 1]``: a box of two).
    """
    rules, device_rule = rules_from_policy(policy)
    bench = dict(runtimes) if runtimes is not None else resolve_bench(policy, bench_raw)
    budget = policy.device.budget
    if device_total is None:
        if budget is None:
            raise ValueError("the policy sets no device.budget: give the device size")
        device_total = budget + policy.device.headroom + DEFAULT_SLACK
    ceiling = device_total if budget is None else min(budget, device_total)
    plan_bytes = max(0, ceiling - policy.device.headroom)
    services = {
        name: ServiceInfo(
            name=name,
            kind=svc.kind,
            priority=svc.priority,
            residency=svc.residency,
            estimate=svc.expected_peak_floor,
            max_concurrency=svc.max_concurrency,
            bench=bench[name],
        )
        for name, svc in policy.services.items()
    }
    models = {model: name for name, svc in policy.services.items() for model in svc.models}
    if devices is None:
        gpus = policy.device.gpus
        devices = 1 if gpus == "all" or not gpus else max(gpus) + 1
    return Setup(policy, rules, device_rule, services, models, device_total, plan_bytes, devices)
