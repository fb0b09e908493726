"""WindowList, the scheduler's tuning, an admission's explanation, a policy apply."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from service.contract.status import WaitHolder
from service.policy.diff import PolicyDiff


class Window(BaseModel):
    """A maintenance window, from the policy or an operator (``GET /api/maintenance``)."""

    name: str
    origin: str  # policy | api
    cron: str | None
    start_at: float | None
    duration_s: float
    timezone: str | None
    restart: str | list[str]
    allow: list[str]
    next_start: float | None
    open: bool
    closes_at: float | None


class WindowList(BaseModel):
    windows: list[Window]


class TuningFigures(BaseModel):
    """One candidate's figures in a tuning round."""

    candidate: str
    weighted_slo: float
    served: int
    requests: int
    loads: int
    failed_oom: int


class YieldingView(BaseModel):
    """What ``yielding: auto`` stands for now, since when and why."""

    setting: str
    current: str
    top_never: bool
    since: float
    why: str
    services: dict[str, str]
    figures: list[TuningFigures]
    rounds: int
    cpu_s: float
    next_round: float | None


class SchedulerAnswer(BaseModel):
    yielding: YieldingView


class Victim(BaseModel):
    """A service an admission would evict (or is already stopping) for the load."""

    service: str
    residency: str
    priority: int
    busy: bool
    bytes: int
    already_stopping: bool


class Explanation(BaseModel):
    """What loading a service now would do (``GET /api/services/{name}/admission``); a
    verdict may add figures of its own (``opens_in_s`` ...)."""

    model_config = ConfigDict(extra="allow")

    service: str
    verdict: str
    message: str
    need_bytes: int
    device: int | None
    devices: list[int]
    available_bytes: dict[str, int]
    victims: list[Victim]
    holders: list[WaitHolder]
    behind: str | None
    waiting_by_client: dict[str, int]
    in_flight_by_client: dict[str, int]


class ApplyAnswer(BaseModel):
    """``POST /api/policy``: what changed (``diff``: docs/api.md), in lines and as data."""

    dry_run: bool
    diff: PolicyDiff
    lines: list[str]
    version: int | None
    changed: bool
