"""The supervisor: one runtime instance = one child process group (docs/architecture.md).

Modules::

    logs.py         LogRing: the bounded ring of a runtime's output lines
    environment.py  runtime_environment: the minimal environment a runtime inherits
    launch.py       launch_args: one start's command, environment and health URL, placed
    process.py      ProcessLauncher / RuntimeProcess: spawn in a new session, signal the group
    output.py       OutputFiles / OutputFollower: a runtime's output files, followed into its ring
    backoff.py      RestartPolicy / RestartTracker: restart delays and give-up, pure
    instance.py     Instance: the lifecycle state of one runtime, its restarts, its API
    run.py          ProcessRun: one process from spawn to reaped (health wait, stop, kill)
    settle.py       wait_settled: the memory-settle barrier before a replacement starts
    reaper.py       reap_orphans: kill what a previous daemon left running, at startup
"""

from service.supervisor.backoff import RestartDecision, RestartPolicy, RestartTracker
from service.supervisor.environment import runtime_environment
from service.supervisor.instance import Instance, StartFailed
from service.supervisor.logs import LineSplitter, LogLine, LogRing
from service.supervisor.output import OutputFiles, OutputFollower
from service.supervisor.process import (
    EXIT_UNKNOWN,
    AdoptedProcess,
    ChildProcess,
    ProcessLauncher,
    RuntimeProcess,
    SpawnError,
    SubprocessLauncher,
    describe_exit,
)
from service.supervisor.reaper import (
    OrphanRecord,
    ReapOutcome,
    ReapResult,
    not_the_same_process,
    reap_orphans,
)
from service.supervisor.run import LaunchSpec, ProcessRun, RunEnd, RunResult
from service.supervisor.settle import wait_settled

__all__ = [
    "EXIT_UNKNOWN",
    "AdoptedProcess",
    "ChildProcess",
    "Instance",
    "LaunchSpec",
    "LineSplitter",
    "LogLine",
    "LogRing",
    "OrphanRecord",
    "OutputFiles",
    "OutputFollower",
    "ProcessLauncher",
    "ProcessRun",
    "ReapOutcome",
    "ReapResult",
    "RestartDecision",
    "RestartPolicy",
    "RestartTracker",
    "RunEnd",
    "RunResult",
    "RuntimeProcess",
    "SpawnError",
    "StartFailed",
    "SubprocessLauncher",
    "describe_exit",
    "not_the_same_process",
    "reap_orphans",
    "runtime_environment",
    "wait_settled",
]
