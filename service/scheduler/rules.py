"""What the scheduler needs to know about a service and the device, and nothing more.

The policy file carries commands, health paths, environments and much else the scheduler
never decides on. ``rules_from_policy`` narrows a validated ``Policy`` to frozen values, so
the decision core (and the bench simulator, which has no policy file) depends on a small,
stable shape instead of the pydantic schema. ``Learned`` carries what the store measured
about past instances: it changes the arithmetic, never the rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.domain import Residency, Yielding
from service.policy import Policy, Service, protect_seconds
from service.scheduler.fairness import ClientRule


@dataclass(frozen=True, slots=True)
class ServiceRule:
    """One service's scheduling rules.

    ``idle_ttl_s`` is already resolved per residency by the policy loader; 0 means the
    instance never unloads for being idle. ``gpus`` None means any device the daemon uses.
    ``protect_s``: how long an idle instance keeps its memory against lower priorities
    (``math.inf``: never yields to them); None means the residency's default.
    ``shares``: one per device an instance spans (``span: N``), each device's part of
    its need, in device order; ``(1.0,)`` for a single-device service.
    """

    name: str
    residency: Residency
    priority: int
    estimate: int
    cap: int | None
    max_concurrency: int
    queue_max: int
    queue_timeout_s: float
    idle_ttl_s: float
    stop_timeout_s: float
    gpus: tuple[int, ...] | None = None
    preload: bool = False
    protect_s: float | None = None
    shares: tuple[float, ...] = (1.0,)
    # Waiting requests are taken in turn by client (False: in arrival order).
    fair: bool = True
    # How readily its idle protected instance yields early (``auto``: as tuned).
    yielding: Yielding = Yielding.AUTO

    @property
    def span(self) -> int:
        return len(self.shares)

    @property
    def protection_s(self) -> float:
        """``protect_s`` resolved: seconds, ``math.inf`` for never (and for pinned)."""
        return protect_seconds(self.protect_s, self.residency)


@dataclass(frozen=True, slots=True)
class DeviceRule:
    """The device section of the policy: an optional ceiling, headroom, which GPUs."""

    budget_limit: int | None = None
    headroom: int = 0
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Learned:
    """What past instances of a service showed: the highest footprint, the load time."""

    peak_bytes: int | None = None
    load_s: float | None = None


def expected_peak(rule: ServiceRule, learned: Learned | None = None) -> int:
    """``max(estimate, learned peak)``, never above the cap (docs/operations.md, "Estimates,
    caps and learned peaks").

    A learned peak above the cap is clamped because the cap is enforced (``on_cap``): an
    instance is not allowed to stay there, so admission must not plan for it.
    """
    peak = rule.estimate
    if learned is not None and learned.peak_bytes is not None:
        peak = max(peak, learned.peak_bytes)
    if rule.cap is not None:
        peak = min(peak, rule.cap)
    return peak


# A higher footprint becomes the learned peak only when it beats what is expected by more
# than this fraction, so a slowly warming cache does not write a row every second.
LEARN_STEP = 0.01


def raised_peak(observed: int, *, estimate: int, cap: int | None, expected: int) -> int | None:
    """The new learned peak for a service seen at ``observed`` bytes (clamped to its cap),
    or None where that is not more than ``LEARN_STEP`` above ``max(estimate, expected)``.
    The daemon's sampler and the simulator both learn by this rule."""
    peak = observed if cap is None else min(observed, cap)
    return None if peak <= max(estimate, expected) * (1 + LEARN_STEP) else peak


def share_of(total: int, shares: tuple[float, ...], index: int) -> int:
    """Device ``index``'s part of ``total`` bytes (rounded up: never under-charged)."""
    return total if len(shares) == 1 else math.ceil(total * shares[index])


def rule_from_service(name: str, service: Service) -> ServiceRule:
    return ServiceRule(
        name=name,
        residency=service.residency,
        priority=service.priority,
        estimate=service.memory.estimate,
        cap=service.memory.cap,
        max_concurrency=service.max_concurrency,
        queue_max=service.queue.max,
        queue_timeout_s=service.queue.timeout,
        # The loader resolves idle_ttl per residency; None only on a hand-built Service.
        idle_ttl_s=service.idle_ttl or 0.0,
        stop_timeout_s=service.stop_timeout,
        gpus=tuple(service.gpus) if service.gpus is not None else None,
        preload=service.preload,
        protect_s=protect_seconds(service.protect, service.residency),
        shares=service.shares,
        fair=service.fairness == "fair",
        yielding=service.yielding,
    )


def clients_from_policy(policy: Policy) -> dict[str, ClientRule]:
    """Each configured client's share and limit (``server.clients``); ``default``, the
    client of ``server.api_keys``, and unnamed clients weigh 1 with no limit of their own."""
    return {
        name: ClientRule(name, client.share, client.max_concurrency)
        for name, client in policy.server.clients.items()
    }


def rules_from_policy(policy: Policy) -> tuple[dict[str, ServiceRule], DeviceRule]:
    """The scheduler's view of a validated policy: rules by service name, device rule."""
    rules = {name: rule_from_service(name, svc) for name, svc in sorted(policy.services.items())}
    gpus = policy.device.gpus
    device = DeviceRule(
        budget_limit=policy.device.budget,
        headroom=policy.device.headroom,
        gpus=None if gpus == "all" else tuple(gpus),
    )
    return rules, device
