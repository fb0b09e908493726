"""vramd itself: the daemon's own decision loop (``service.scheduler.Pump``), not a copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from service.errors import ErrorCode
from service.replay import tuner as tuning
from service.replay.harness import System, World
from service.replay.trace import TraceRequest
from service.scheduler import (
    TICK_S,
    DeviceReading,
    Event,
    Grant,
    InstanceAsleep,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    Learned,
    LearnedChanged,
    MakeRoom,
    MemorySampled,
    Note,
    PolicyChanged,
    Pump,
    Reject,
    RequestArrived,
    RequestFinished,
    Resolve,
    Scheduler,
    Start,
    Stop,
    StopSleeper,
    Tick,
    Tuning,
    TuningChanged,
    raised_peak,
)
from service.supervisor.backoff import RestartPolicy, RestartTracker

OOM_ERROR = "CUDA error: out of memory"


@dataclass(slots=True)
class Proc:
    """The simulated process of one service: what the supervisor would know."""

    phase: str = "gone"  # loading | ready | backoff | stopping | asleep | gone
    gen: int = 0  # bumped whenever a pending callback must be ignored
    peak: int = 0  # highest footprint of this instance
    devices: tuple[int, ...] = (0,)
    ready_since: float = 0.0
    in_flight: set[str] = field(default_factory=set)
    oom_incident: bool = False  # an out-of-memory load whose retry has not concluded


class Vramd(System):
    """The daemon's kernel and this model run the same ``Pump`` over the same ``Scheduler``
    and differ only in their ``Effects``: this class implements that protocol on the
    virtual clock. It turns what happens on the simulated device into the events the real
    daemon feeds, and carries out the actions that come back:

    - time 0: a memory sample (one ``DeviceReading`` per simulated device), then
      ``PolicyChanged`` (as ``Orchestrator.start`` does);
      then a ``Tick`` every 0.2 s and a ``MemorySampled`` every ``device.sample_interval``,
      plus one after every instance change (ready, failed, stopped).
    - ``Start``: the runtime starts loading on ``action.device`` (on every device of
      ``action.spans`` for a service that spans several, its policy's share of its true
      peak on each: ``SimBox.place``). After ``load_s`` it is
      ready (``LearnedChanged`` with its load time, then ``InstanceReady``); if its true peak
      does not fit it fails with out of memory, and the supervisor's own restart rules
      (``RestartTracker``: backoff, then give up) turn that into ``InstanceBackoff`` with
      the backoff's deadline, or ``InstanceFailed``. The retry is the scheduler's
      ``Start(retry=True)``, as in the daemon. As ``service.memory.doctor`` does, the first
      out-of-memory of a retry chain is preceded by ``MakeRoom`` (evict everything
      evictable before the retry); the next one closes that incident without another.
    - ``Stop(drain=True)``: nothing to do here (the scheduler stops granting).
      ``Stop(drain=False)``: the process is terminated; ``InstanceStopped`` after
      ``unload_s``, when its memory is gone (the settle barrier). Requests still in flight
      on it fail (``killed``). A sleepable stop of a ``sleep: true`` service puts it to
      sleep instead (``InstanceAsleep`` after ``unload_s``; the sleeper keeps nothing on
      the simulated device), ``Start(wake=True)`` wakes it in ``wake_s``, and
      ``StopSleeper`` ends it.
    - ``Grant``: the request is served for its ``duration_s``, then ``RequestFinished``.
      ``Reject``: refused with its code. ``Note(evict)``: counted.
    - Learned peaks: a sample whose footprint exceeds the expected peak by more than 1 %
      raises the learned peak (``LearnedChanged``), as ``service.memory.sampling`` does.
    - ``yielding: auto``: the tuner (``tuner.Tuner``) is asked on every tick whether a round
      is due, as the daemon's is; its replays run in place (the daemon runs them in a
      background process) and its choice is fed as ``TuningChanged``. ``fixed_system``
      makes the system that holds one fixed setting for every ``auto`` service instead
      (``vramd:eager``, ...), and never tunes.

    Simplified away: the settle barrier's probe polling (memory is gone exactly at
    ``InstanceStopped``), health polling and startup timeouts, over-cap handling (bench data
    should keep true peaks under ``memory.cap``), crashes of ready runtimes, a sleeper's
    leftover context, maintenance windows and operator loads.
    """

    name = "vramd"
    # The setting every ``auto`` service holds (None: tuned, as the daemon does).
    fixed: ClassVar[Tuning | None] = None

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.scheduler = Scheduler(self.setup.rules, self.setup.device_rule)
        self.pump = Pump(self.scheduler, lambda: self.clock.now)
        self.pump.connect(self)
        policy = self.setup.policy
        self.sleeps = {name for name, svc in policy.services.items() if svc.sleep}
        self.procs = {name: Proc() for name in self.setup.services}
        self.trackers = {
            name: RestartTracker(
                RestartPolicy(
                    max_retries=svc.restart.max_retries,
                    backoff_s=svc.restart.backoff,
                    max_backoff_s=max(svc.restart.max_backoff, svc.restart.backoff),
                )
            )
            for name, svc in policy.services.items()
        }
        self.learned_peak: dict[str, int | None] = dict.fromkeys(self.setup.services)
        self.learned_load: dict[str, float | None] = dict.fromkeys(self.setup.services)
        self.gave_up_oom: set[str] = set()
        self.requests: dict[str, TraceRequest] = {}
        self.sample_interval = policy.device.sample_interval
        self.notes: dict[str, int] = {}
        self.tuner: tuning.Tuner | None = None
        if self.fixed is None and tuning.auto_services(policy):
            self.tuner = tuning.Tuner(started_at=0.0)

    # --------------------------------------------------------------- the clock

    def begin(self) -> None:
        self._sample()
        self._feed(PolicyChanged(self.setup.rules, self.setup.device_rule))
        if self.fixed is not None:
            self._feed(TuningChanged(self.fixed))
        self.clock.after(TICK_S, self._tick)
        self.clock.after(self.sample_interval, self._periodic_sample)

    def _tick(self) -> None:
        if self.world.done:
            return
        self._feed(Tick())
        if self.tuner is not None and self.tuner.due(self.clock.now):
            self._tune(self.tuner)
        self.clock.after(TICK_S, self._tick)

    def _tune(self, tuner: tuning.Tuner) -> None:
        """One round of ``yielding: auto``, in place and charged its modeled CPU time."""
        now, traffic = self.clock.now, self.pump.traffic
        job = tuning.job_of(
            self.setup.policy,
            traffic.since(now - tuning.WINDOW_S),
            self.scheduler.learned(),
            traffic.device_totals,
            tuner.current,
        )
        if isinstance(job, str):
            tuner.skip(now, job)
            return
        tuner.begin(now)
        figures = tuning.evaluate(job)
        choice = tuner.conclude(now, figures, tuning.modeled_cpu_s(job, figures))
        if choice.changed:
            self._feed(TuningChanged(choice.tuning))
        self.rec.event(now, "tuning", None, current=choice.tuning.label, changed=choice.changed)

    def _periodic_sample(self) -> None:
        if self.world.done:
            return
        self._sample()
        self.clock.after(self.sample_interval, self._periodic_sample)

    def arrive(self, req: TraceRequest, service: str) -> None:
        self.requests[req.id] = req
        self._feed(RequestArrived(req.id, service))

    # ---------------------------------------------------------- Effects, simulated

    def _feed(self, event: Event) -> None:
        self.pump.feed(event)

    def start(self, action: Start) -> None:
        proc = self.procs[action.service]
        if proc.phase == "asleep":
            if action.wake:
                self._wake(action.service, action.devices)
                return
            proc.phase = "gone"  # woken elsewhere: the sleeper is stopped, a fresh load
        if not action.retry:
            self.trackers[action.service].reset()
        self._spawn(action.service, action.reason, action.devices)

    def drain(self, action: Stop) -> None:
        pass  # the scheduler stops granting; nothing to do on the device

    def stop(self, action: Stop) -> None:
        proc = self.procs[action.service]
        if action.sleepable and action.service in self.sleeps and proc.phase == "ready":
            self._sleep(action.service)
        else:
            self._terminate(action.service)

    def stop_sleeper(self, action: StopSleeper) -> None:
        proc = self.procs[action.service]
        if proc.phase == "asleep":
            proc.gen += 1
            proc.phase = "gone"
            self.clock.at(self.clock.now, self._feed, InstanceStopped(action.service))

    def grant(self, action: Grant) -> None:
        now = self.clock.now
        proc = self.procs[action.service]
        assert proc.phase == "ready", f"grant on {action.service} in {proc.phase}"
        proc.in_flight.add(action.request_id)
        self.rec.granted(action.request_id, now, ready_since=proc.ready_since)
        duration = self.requests[action.request_id].duration_s
        self.clock.after(duration, self._finish, action.request_id, action.service, proc.gen)

    def reject(self, action: Reject) -> None:
        now = self.clock.now
        if action.code is ErrorCode.RUNTIME_FAILED and action.service in self.gave_up_oom:
            self.rec.failed(action.request_id, "oom", now)
            self.rec.event(now, "reject", action.service, code=action.code)
        else:
            self.rec.refused(action.request_id, action.code, now)

    def note(self, action: Note) -> None:
        self.notes[action.kind] = self.notes.get(action.kind, 0) + 1
        if action.victims:
            self.rec.evicted(list(action.victims), self.clock.now, for_service=action.service)

    def resolve(self, action: Resolve) -> None:
        pass  # no operators in a replay

    # --------------------------------------------------------------- the runtimes

    def _spawn(self, service: str, reason: str, devices: tuple[int, ...]) -> None:
        proc, bench, now = self.procs[service], self.setup.services[service].bench, self.clock.now
        proc.gen += 1
        proc.phase = "loading"
        proc.peak = 0
        proc.devices = devices
        self.rec.load(service, now, reason=reason, devices=list(devices))
        fail_at = self._place(service, bench.load_s)
        if fail_at is None:
            self.clock.after(bench.load_s, self._ready, service, proc.gen)
        else:
            self.clock.at(fail_at, self._out_of_memory, service, proc.gen)

    def _place(self, service: str, ramp_s: float) -> float | None:
        """The runtime starts taking memory on its devices; when it runs out, if it does."""
        proc, true_peak = self.procs[service], self.setup.services[service].bench.true_peak
        shares = self.setup.rules[service].shares
        return self.box.place(service, self.clock.now, true_peak, ramp_s, proc.devices, shares)

    def _ready(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen or proc.phase != "loading":
            return
        proc.phase = "ready"
        proc.ready_since = self.clock.now
        proc.oom_incident = False
        self.rec.ready(service)
        self.trackers[service].on_ready(self.clock.now)
        load_s = self.setup.services[service].bench.load_s
        old = self.learned_load[service]
        self.learned_load[service] = load_s if old is None else 0.7 * old + 0.3 * load_s
        self._feed(LearnedChanged(service, self._learned(service)))
        self._feed(InstanceReady(service))
        self._sample()

    def _out_of_memory(self, service: str, gen: int) -> None:
        proc, now = self.procs[service], self.clock.now
        if proc.gen != gen or proc.phase != "loading":
            return
        self.box.remove(service, now)
        self.rec.oom(service, now)
        decision = self.trackers[service].on_failure(now, was_ready=False)
        first_of_chain = not proc.oom_incident
        proc.oom_incident = first_of_chain and decision.retry
        if decision.retry:
            proc.phase = "backoff"
            if first_of_chain:
                self._feed(MakeRoom(service, "its load failed with out-of-memory"))
            self._feed(InstanceBackoff(service, OOM_ERROR, retry_at=now + decision.delay_s))
        else:
            proc.phase = "gone"
            self.gave_up_oom.add(service)
            self._feed(InstanceFailed(service, f"{OOM_ERROR} (gave up)"))
        self._sample()

    def _sleep(self, service: str) -> None:
        """vLLM's sleep: weights leave the device in ``unload_s``; the process lives."""
        proc, now = self.procs[service], self.clock.now
        proc.gen += 1
        proc.phase = "stopping"
        self.box.freeze(service, now)
        self.clock.after(
            self.setup.services[service].bench.unload_s, self._asleep, service, proc.gen
        )

    def _asleep(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen or proc.phase != "stopping":
            return
        self.box.remove(service, self.clock.now)
        proc.phase = "asleep"
        self._feed(InstanceAsleep(service))
        self._sample()

    def _wake(self, service: str, devices: tuple[int, ...]) -> None:
        proc, bench, now = self.procs[service], self.setup.services[service].bench, self.clock.now
        proc.gen += 1
        proc.phase = "loading"
        proc.peak = 0
        proc.devices = devices
        self.rec.load(service, now, reason="wake", devices=list(devices))
        fail_at = self._place(service, bench.wake_time)
        if fail_at is None:
            self.clock.after(bench.wake_time, self._ready, service, proc.gen)
        else:
            self.clock.at(fail_at, self._out_of_memory, service, proc.gen)

    def _terminate(self, service: str) -> None:
        proc, now = self.procs[service], self.clock.now
        if proc.phase in ("gone", "stopping"):
            return
        was = proc.phase
        proc.gen += 1
        proc.phase = "stopping"
        for rid in sorted(proc.in_flight):
            self.rec.failed(rid, "killed", now)
        proc.in_flight.clear()
        if was == "backoff":  # no process: stopped at once
            self.clock.at(now, self._stopped, service, proc.gen)
            return
        self.box.freeze(service, now)
        self.clock.after(
            self.setup.services[service].bench.unload_s, self._stopped, service, proc.gen
        )

    def _stopped(self, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen or proc.phase != "stopping":
            return
        self.box.remove(service, self.clock.now)
        proc.phase = "gone"
        self._feed(InstanceStopped(service))
        self._sample()

    def _finish(self, rid: str, service: str, gen: int) -> None:
        proc = self.procs[service]
        if proc.gen != gen or rid not in proc.in_flight:
            return
        proc.in_flight.discard(rid)
        self.rec.served(rid, self.clock.now)
        self._feed(RequestFinished(rid))

    # --------------------------------------------------------------- memory truth

    def _learned(self, service: str) -> Learned:
        return Learned(self.learned_peak[service], self.learned_load[service])

    def _sample(self) -> None:
        now, total, box = self.clock.now, self.setup.device_total, self.box
        footprints = box.footprints(now)
        for service, footprint in footprints.items():
            self._learn_peak(service, footprint)
        readings = []
        for index, device in enumerate(box.devices):
            used = device.used(now)
            readings.append(DeviceReading(index, total, used, max(0, total - used), managed=used))
        per_device = {
            service: {d: box.devices[d].footprint(service, now) for d in box.on[service]}
            for service in footprints
            if len(box.on[service]) > 1
        }
        self._feed(MemorySampled(tuple(readings), footprints, per_device))

    def _learn_peak(self, service: str, footprint: int) -> None:
        """As ``memory.sampling.Sampler._learn_peak``: raise the learned peak on a new high."""
        proc = self.procs[service]
        proc.peak = max(proc.peak, footprint)
        rule = self.setup.rules[service]
        expected = self.scheduler.service_view(service).expected_peak
        peak = raised_peak(proc.peak, estimate=rule.estimate, cap=rule.cap, expected=expected)
        if peak is None:
            return
        self.learned_peak[service] = peak
        self._feed(LearnedChanged(service, self._learned(service)))


def fixed_system(setting: Tuning) -> type[Vramd]:
    """The vramd system whose ``auto`` services all hold ``setting`` (never tuned)."""
    return type(
        f"Vramd_{setting.label}", (Vramd,), {"name": f"vramd:{setting.label}", "fixed": setting}
    )
