"""``protect``: how long an idle instance keeps its memory against lower priorities.

A value is ``never`` or a duration (docs/policy.md, "``protect`` is a cost, not a lock").
Services that do not say get their residency's default, chosen by the sweep in
docs/benchmarks.md; pinned services are never evicted, so for them protect is always
``never``.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, WithJsonSchema

from service.domain import Residency
from service.units import DURATION_HINT, parse_duration

NEVER: Literal["never"] = "never"
ProtectValue = float | Literal["never"]


def parse_protect(value: object) -> ProtectValue:
    """``never`` or a duration (``protect`` in docs/policy.md)."""
    if isinstance(value, str) and value.strip().lower() == "never":
        return NEVER
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or never") from None


# How long an idle instance keeps its memory against lower priorities, by residency,
# when a service does not say (docs/policy.md; the choice is explained in
# docs/benchmarks.md). Pinned services are never evicted, so they have no entry.
DEFAULT_PROTECT_S: dict[Residency, float] = {
    Residency.WARM: 600.0,
    Residency.ON_DEMAND: 60.0,
    Residency.WINDOW_ONLY: 0.0,
}
Protect = Annotated[
    float | Literal["never"],
    BeforeValidator(parse_protect),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string"},
            ],
            "description": f"{DURATION_HINT}, or never",
        }
    ),
]


def protect_seconds(value: float | str | None, residency: Residency) -> float:
    """``protect`` as seconds: ``math.inf`` for never, the residency default for None."""
    if value == NEVER or residency is Residency.PINNED:
        return math.inf
    if value is None:
        return DEFAULT_PROTECT_S[residency]
    return float(value)
