"""The pure scheduling core: events flow in, a plan flows out (see ``core``).

Nothing in this package does I/O, awaits, logs or reads a clock: every call is given the
time. The orchestrator feeds it real events and carries out the actions; the bench
simulator drives the same class on a virtual clock.

core.py       Scheduler: handle(event, now) records the event, runs a pass, returns actions
events.py     the events that flow in: RequestArrived, InstanceReady, MemorySampled, Tick ...
actions.py    the actions that flow out: Start, Stop, StopSleeper, Grant, Reject, Note, Resolve
pump.py       Pump and the Effects protocol: events in one at a time, each action carried out
traffic.py    Traffic: the recent arrivals and their service times, for `yielding: auto`
planner.py    run_pass: the scheduling pass after every event (drains, restarts, grants, loads)
book.py       Book: the one owner of decision state; each move appends its action
state.py      ServiceState, Plan: one service's logical instance, queue, waiting load
fairness.py   FairQueue, Waiter, ClientRule: whose waiting request goes next, who may join
rules.py      ServiceRule, DeviceRule, Learned, raised_peak, rules_from_policy: the
              policy narrowed to values
ledger.py     Ledger, budget_of, available_of: how many bytes each device can still hand out
admission.py  decide: place a load, plan evictions for it, make it wait, or refuse it
eviction.py   Resident, choose_victims: the cheapest set of victims that covers a deficit
yielding.py   may_evict, holder_yield: who may evict whom now, and when a holder yields
habits.py     Habits: a service's idle gaps, request rate and service time, from its traffic
operators.py  answer_operators: the outcome of an operator's load, unload or restart
explain.py    explain, Explanation: what loading a service now would do, changing nothing
reasons.py    the words of waits and refusals an operator or a client sees
"""

from service.domain import DeviceReading
from service.scheduler.actions import (
    Action,
    Answer,
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
    TICK_S,
    Event,
    InstanceAdopted,
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
    TuningChanged,
    UnloadRequested,
    WindowChanged,
)
from service.scheduler.explain import Explanation
from service.scheduler.fairness import ANONYMOUS, ClientRule
from service.scheduler.ledger import LedgerView
from service.scheduler.pump import Effects, Pump
from service.scheduler.rules import (
    DeviceRule,
    Learned,
    ServiceRule,
    clients_from_policy,
    expected_peak,
    raised_peak,
    rules_from_policy,
)
from service.scheduler.state import ServiceView
from service.scheduler.traffic import Arrival, Traffic
from service.scheduler.yielding import FIXED, Tuning

__all__ = [
    "ANONYMOUS",
    "FIXED",
    "TICK_S",
    "Action",
    "Answer",
    "Arrival",
    "ClientRule",
    "DeviceReading",
    "DeviceRule",
    "Effects",
    "Event",
    "Explanation",
    "Grant",
    "InstanceAdopted",
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
    "Traffic",
    "Tuning",
    "TuningChanged",
    "UnloadRequested",
    "WindowChanged",
    "clients_from_policy",
    "expected_peak",
    "raised_peak",
    "rules_from_policy",
]
