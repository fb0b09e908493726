"""The admin API's answers as types: what the kernel builds, the API sends and documents
in ``/openapi.json``, and the CLI and the dashboard read (docs/api.md).

status.py     Status, ServiceStatus and their parts: ``GET /api/status``, ``/api/services``
records.py    what the store keeps, as the API answers it: events, incidents, policy
              versions, memory samples, usage, log lines
operations.py maintenance windows, the scheduler's tuning, an admission's explanation, a
              policy apply
"""

from service.contract.operations import (
    ApplyAnswer,
    Explanation,
    SchedulerAnswer,
    TuningFigures,
    Victim,
    Window,
    WindowList,
    YieldingView,
)
from service.contract.records import (
    ActivePolicy,
    EventRecord,
    Events,
    Incident,
    Incidents,
    IncidentSummary,
    LogLine,
    Logs,
    MemoryAnswer,
    MemorySample,
    ModelEntry,
    ModelList,
    PolicyHistory,
    PolicyVersion,
    UsageAnswer,
    UsageRow,
)
from service.contract.status import (
    Backoff,
    DeviceStatus,
    SavedState,
    ServiceMemory,
    ServiceStatus,
    Status,
    StatusAnswer,
    WaitHolder,
)

__all__ = [
    "ActivePolicy",
    "ApplyAnswer",
    "Backoff",
    "DeviceStatus",
    "EventRecord",
    "Events",
    "Explanation",
    "Incident",
    "IncidentSummary",
    "Incidents",
    "LogLine",
    "Logs",
    "MemoryAnswer",
    "MemorySample",
    "ModelEntry",
    "ModelList",
    "PolicyHistory",
    "PolicyVersion",
    "SavedState",
    "SchedulerAnswer",
    "ServiceMemory",
    "ServiceStatus",
    "Status",
    "StatusAnswer",
    "TuningFigures",
    "UsageAnswer",
    "UsageRow",
    "Victim",
    "WaitHolder",
    "Window",
    "WindowList",
    "YieldingView",
]
