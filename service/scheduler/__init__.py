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
    Resolve,
    Start,
    Stop,
    StopSleeper,
)
from service.scheduler.core import Scheduler
from service.scheduler.events import (
    Event,
    InstanceAsleep,
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
    ShutdownRequested,
    Tick,
    UnloadRequested,
    WindowChanged,
)
from service.scheduler.explain import Explanation
from service.scheduler.ledger import LedgerView
from service.scheduler.pump import Effects, Pump
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
    "Effects",
    "Event",
    "Explanation",
    "Grant",
    "InstanceAsleep",
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
    "Pump",
    "Reject",
    "RequestArrived",
    "RequestCancelled",
    "RequestFinished",
    "Resolve",
    "RestartRequested",
    "Scheduler",
    "ServiceRule",
    "ServiceView",
    "ShutdownRequested",
    "Start",
    "Stop",
    "StopSleeper",
    "Tick",
    "UnloadRequested",
    "WindowChanged",
    "expected_peak",
    "rules_from_policy",
]
