"""Which services can starve: the lower priorities under a ``protect: never``."""

from __future__ import annotations

from service.domain import Residency
from service.policy.protect import NEVER
from service.policy.schema import Policy, Service


def outranks(holder: Service, other: Service) -> bool:
    """Whether ``holder`` keeps its memory against ``other`` by the residency table's
    first clause (warm: against equal and lower priorities; on demand: lower ones)."""
    if holder.residency is Residency.WARM:
        return other.priority <= holder.priority
    if holder.residency is Residency.ON_DEMAND:
        return other.priority < holder.priority
    return False


def may_share_a_device(a: Service, b: Service) -> bool:
    """Whether two services can be placed on one device (``gpus`` limits where)."""
    return a.gpus is None or b.gpus is None or bool(set(a.gpus) & set(b.gpus))


def starvation_warnings(policy: Policy) -> list[str]:
    """One line per service with ``protect: never`` that outranks others, naming them.

    ``protect`` is a cost, not a lock (docs/policy.md): an idle instance keeps its memory
    against a lower priority only until that priority's waiting request would otherwise
    time out. ``protect: never`` keeps the strict rule instead: the instance never yields
    its memory to a lower priority while it is loaded, and a lower priority that needs that
    memory waits past its ``queue.timeout`` for as long as the instance stays loaded.
    That is an owner's choice to make knowingly, so ``vramd check`` names the services it
    can starve.
    """
    out: list[str] = []
    for name, holder in sorted(policy.services.items()):
        if holder.protect != NEVER or holder.residency not in (
            Residency.WARM,
            Residency.ON_DEMAND,
        ):
            continue
        below = [
            other_name
            for other_name, other in sorted(policy.services.items())
            if other_name != name
            and other.residency is not Residency.PINNED
            and outranks(holder, other)
            and may_share_a_device(holder, other)
        ]
        if not below:
            continue
        they = "they" if len(below) > 1 else "it"
        their = "their" if len(below) > 1 else "its"
        out.append(
            f"services.{name}.protect is never: {name} ({holder.residency}, priority "
            f"{holder.priority}) never yields its memory to {', '.join(below)} while it "
            f"is loaded, so {they} can starve (wait past {their} queue.timeout) whenever "
            f"{they} {'need' if len(below) > 1 else 'needs'} that memory; a duration lets "
            f"{name} yield before those requests time out"
        )
    return out
