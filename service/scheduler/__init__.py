"""The pure scheduling core: events flow in, a plan flows out (see ``core``).

Nothing in this package does I/O, awaits, logs or reads a clock: every call is given the
time. The orchestrator feeds it real events and carries out the actions; the bench
simulator drives the same class on a virtual clock.
"""

from service.domain import DeviceReading
from service.scheduler.actions import (
    INSUFFICIENT_CAPACITY,
    MODEL_NOT_FOUND,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    RUNTIME_FAILED,
    WINDOW_CLOSED,
    Action,
    Grant,
    Note,
    Reject,
    Start,
    Stop,
)
from service.scheduler.core import Scheduler
from service.scheduler.events import (
    Event,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    LearnedChanged,
    LoadRequested,
    MakeRoom,
    MemorySampled,
    PolicyChanged,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    RestartRequested,
    Tick,
    UnloadRequested,
    WindowChanged,
)
from service.scheduler.explain import Explanation
from service.scheduler.ledger import LedgerView
from service.scheduler.rules import (
    DeviceRule,
    Learned,
    ServiceRule,
    expected_peak,
    rules_from_policy,
)
from service.scheduler.state import ServiceView

__all__ = [
    "INSUFFICIENT_CAPACITY",
    "MODEL_NOT_FOUND",
    "QUEUE_FULL",
    "QUEUE_TIMEOUT",
    "RUNTIME_FAILED",
    "WINDOW_CLOSED",
    "Action",
    "DeviceReading",
    "DeviceRule",
    "Event",
    "Explanation",
    "Grant",
    "InstanceBackoff",
    "InstanceFailed",
    "InstanceReady",
    "InstanceStopped",
    "Learned",
    "LearnedChanged",
    "LedgerView",
    "LoadRequested",
    "MakeRoom",
    "MemorySampled",
    "Note",
    "PolicyChanged",
    "Reject",
    "RequestArrived",
    "RequestCancelled",
    "RequestFinished",
    "RestartRequested",
    "Scheduler",
    "ServiceRule",
    "ServiceView",
    "Start",
    "Stop",
    "Tick",
    "UnloadRequested",
    "WindowChanged",
    "expected_peak",
    "rules_from_policy",
]
