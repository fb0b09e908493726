"""The tuner's replays in a background process: ``python -m service.replay.worker``.

Reads one pickled ``tuner.Job`` on stdin (from the daemon that started it, nothing
else), lowers its own CPU priority, replays the job under every candidate and writes
the figures and its CPU time as one JSON object on stdout. It holds no state: it exits
after one job, and if the daemon is gone by then the write fails and it exits anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import sys
from dataclasses import asdict

from service.domain import Yielding
from service.replay.tuner import Figures, Job, evaluate
from service.scheduler import Tuning

NICE = 19


def figures_from_json(items: list[dict[str, object]]) -> list[Figures]:
    """The figures as the worker wrote them (its ``tuning`` as ``{yielding, top_never}``)."""
    out = []
    for item in items:
        tuning = item["tuning"]
        assert isinstance(tuning, dict)
        fields = {k: v for k, v in item.items() if k != "tuning"}
        setting = Tuning(Yielding(tuning["yielding"]), bool(tuning["top_never"]))
        out.append(Figures(tuning=setting, **fields))  # type: ignore[arg-type]
    return out


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    with contextlib.suppress(OSError):  # already as low as allowed
        os.nice(NICE)
    job = pickle.load(sys.stdin.buffer)
    if not isinstance(job, Job):
        print(f"expected a tuner job, got {type(job).__name__}", file=sys.stderr)
        return 2
    figures = evaluate(job)
    answer = {"figures": [asdict(f) for f in figures], "cpu_s": cpu_seconds()}
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
