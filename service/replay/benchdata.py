"""Bench data: how each simulated runtime really behaves, which the policy only estimates.

A YAML mapping of service name to ``{load_s, true_peak, unload_s, wake_s}``::

    chat: {load_s: 10, true_peak: 10GiB, unload_s: 1}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from service.policy import Policy
from service.units import parse_duration, parse_size

DEFAULT_LOAD_S = 5.0
DEFAULT_UNLOAD_S = 1.0
_KEYS = frozenset({"load_s", "true_peak", "unload_s", "wake_s"})
WAKE_SHARE = 0.1  # of the load time, when bench data gives no wake_s


@dataclass(frozen=True, slots=True)
class RuntimeBench:
    load_s: float
    true_peak: int
    unload_s: float = DEFAULT_UNLOAD_S
    wake_s: float | None = None

    @property
    def wake_time(self) -> float:
        return self.wake_s if self.wake_s is not None else self.load_s * WAKE_SHARE


def parse_bench_data(text: str) -> dict[str, dict[str, Any]]:
    """The raw mapping, checked for shape (values are parsed against the policy).

    ``wake_s`` is how long a service with ``sleep: true`` takes to wake (default a tenth of
    its load time); going to sleep takes its ``unload_s``.

    ``true_peak`` is the memory the runtime really reaches once loaded; it may exceed the
    policy's ``memory.estimate`` (as a real KV cache does). A service missing from the file
    (or every service, without a file) loads in ``DEFAULT_LOAD_S`` and peaks at its estimate.
    """
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("bench data must be a mapping of service name to {load_s, true_peak}")
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise ValueError(f"bench data for {name!r} must be a mapping")
        unknown = set(entry) - _KEYS
        if unknown:
            raise ValueError(f"bench data for {name!r}: unknown keys {sorted(unknown)}")
    return data


def resolve_bench(
    policy: Policy, raw: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, RuntimeBench]:
    """One ``RuntimeBench`` per policy service: from ``raw`` where given, else defaults."""
    raw = raw or {}
    unknown = sorted(set(raw) - set(policy.services))
    if unknown:
        raise ValueError(f"bench data names services not in the policy: {unknown}")
    out: dict[str, RuntimeBench] = {}
    for name, service in policy.services.items():
        entry = raw.get(name, {})
        out[name] = RuntimeBench(
            load_s=parse_duration(entry.get("load_s", DEFAULT_LOAD_S)),
            true_peak=parse_size(entry.get("true_peak", service.memory.estimate)),
            unload_s=parse_duration(entry.get("unload_s", DEFAULT_UNLOAD_S)),
            wake_s=parse_duration(entry["wake_s"]) if "wake_s" in entry else None,
        )
    return out
