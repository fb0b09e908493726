"""``yielding: auto`` in the daemon: the tuner's rounds, off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import sys
from collections.abc import Callable

from service.clock import Clock
from service.contract import TuningFigures, YieldingView
from service.domain import EventKind, Yielding
from service.live.events import EventLog
from service.policy import Policy
from service.replay.tuner import WINDOW_S, Figures, Job, Tuner, auto_services, job_of
from service.replay.worker import figures_from_json
from service.scheduler import Pump, TuningChanged

CHECK_S = 5.0
# A round that takes longer than this is killed and counted as failed.
ROUND_TIMEOUT_S = 600.0


class AutoTuning:
    """Every ``CHECK_S`` it asks the tuner (``service.replay.tuner.Tuner``) whether a round is
    due. A round takes the pump's recent traffic, what the scheduler has learned and the
    devices' sizes, hands them to ``python -m service.replay.worker`` (a child process at
    the lowest CPU priority, one at a time, killed at shutdown) and waits for its figures
    without blocking anything. A changed choice is fed to the scheduler
    (``TuningChanged``) and written as a ``tuning`` event with the figures compared.
    """

    def __init__(
        self, *, pump: Pump, events: EventLog, clock: Clock, policy: Callable[[], Policy]
    ) -> None:
        self._pump = pump
        self._events = events
        self._clock = clock
        self._policy = policy
        self.tuner = Tuner(started_at=clock.monotonic())
        self._proc: asyncio.subprocess.Process | None = None
        self._round = asyncio.Lock()

    async def run(self) -> None:
        """The loop the orchestrator starts: a round whenever one is due."""
        while True:
            await self._clock.sleep(CHECK_S)
            if self.tuner.due(self._clock.monotonic()):
                await self.tune()

    async def tune(self) -> YieldingView:
        """One round now (``POST /api/scheduler/tune`` too); returns the view after it."""
        async with self._round:
            now, traffic = self._clock.monotonic(), self._pump.traffic
            job = job_of(
                self._policy(),
                traffic.since(now - WINDOW_S),
                self._pump.scheduler.learned(),
                traffic.device_totals,
                self.tuner.current,
            )
            if isinstance(job, str):
                self.tuner.skip(now, job)
                return self.view()
            self.tuner.begin(now)
            try:
                figures, cpu_s = await self._replay(job)
            except (OSError, ValueError, KeyError, TypeError, TimeoutError) as exc:
                self.tuner.fail(self._clock.monotonic(), str(exc) or type(exc).__name__)
                self._events.record(EventKind.TUNING, f"yielding: auto: {self.tuner.why}")
                return self.view()
            choice = self.tuner.conclude(self._clock.monotonic(), figures, cpu_s)
            if choice.changed:
                self._pump.feed(TuningChanged(choice.tuning))
                self._events.record(
                    EventKind.TUNING,
                    f"yielding: auto now stands for {choice.tuning.label}: {self.tuner.why}",
                    data={
                        "current": choice.tuning.yielding.value,
                        "top_never": choice.tuning.top_never,
                        "figures": [_figures_data(f).model_dump() for f in figures],
                        "cpu_s": round(cpu_s, 3),
                    },
                )
            return self.view()

    async def _replay(self, job: Job) -> tuple[list[Figures], float]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.replay.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._proc = proc
        try:
            payload = await asyncio.to_thread(pickle.dumps, job)  # an hour: tens of ms
            out, err = await asyncio.wait_for(proc.communicate(payload), timeout=ROUND_TIMEOUT_S)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            self._proc = None
        if proc.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise ValueError(f"the replay worker exited with {proc.returncode}: {last[0]}")
        answer = json.loads(out)
        return figures_from_json(answer["figures"]), float(answer["cpu_s"])

    async def close(self) -> None:
        """Kill a round in progress: nothing we started outlives the daemon."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    def view(self) -> YieldingView:
        """``GET /api/scheduler``'s ``yielding`` (docs/api.md, "Scheduler")."""
        policy, tuner = self._policy(), self.tuner
        setting = policy.defaults.yielding
        tuned = bool(auto_services(policy))
        fixed = f"no service has yielding: auto (defaults.yielding: {setting.value})"
        return YieldingView(
            setting=setting.value,
            current=tuner.current.yielding.value if setting is Yielding.AUTO else setting.value,
            top_never=tuner.current.top_never and setting is Yielding.AUTO,
            since=self._wall(tuner.since),
            why=tuner.why if tuned else fixed,
            services={
                name: tuner.current.label if svc.yielding is Yielding.AUTO else svc.yielding.value
                for name, svc in sorted(policy.services.items())
            },
            figures=[_figures_data(f) for f in tuner.figures],
            rounds=tuner.rounds,
            cpu_s=round(tuner.cpu_s, 3),
            next_round=self._wall(tuner.next_at) if tuned and not tuner.running else None,
        )

    def _wall(self, monotonic: float) -> float:
        """A time on the monotonic clock as wall-clock seconds since the epoch."""
        return round(monotonic + self._clock.now() - self._clock.monotonic(), 3)


def _figures_data(f: Figures) -> TuningFigures:
    return TuningFigures(
        candidate=f.tuning.label,
        weighted_slo=round(f.weighted_slo, 4),
        served=f.served,
        requests=f.requests,
        loads=f.loads,
        failed_oom=f.failed_oom,
    )
