"""``yielding: auto``: the fixed setting that serves this box's own recent traffic best."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.domain import Residency, Yielding
from service.policy import Policy
from service.replay.benchdata import DEFAULT_UNLOAD_S, RuntimeBench
from service.replay.harness import run_system
from service.replay.setup import Setup, build_setup
from service.replay.trace import TraceRequest
from service.scheduler import Learned, Tuning
from service.scheduler.habits import DEFAULT_SERVICE_S
from service.scheduler.rules import expected_peak, rules_from_policy
from service.scheduler.traffic import KEEP_S, Arrival
from service.scheduler.yielding import DEFAULT_LOAD_S, FIXED

WINDOW_S = KEEP_S
SERVED_TOLERANCE = 0.02
HYSTERESIS = 0.01  # of weighted SLO (a fraction): what a challenger must win by
FIRST_AFTER_S = 600.0
MIN_INTERVAL_S = 900.0
MIN_REQUESTS = 30  # fewer in the window: nothing to learn from, no round
CPU_SHARE = 0.02
REPLAY_CPU_S_PER_REQUEST = 0.002  # the simulator's stand-in for the measured CPU time


@dataclass(frozen=True, slots=True)
class Figures:
    """One candidate's replay of the window."""

    tuning: Tuning
    requests: int
    served: int  # within their queue.timeout
    weighted_slo: float
    slo: float
    failed_oom: int
    loads: int

    def text(self) -> str:
        return (
            f"{self.tuning.label} {self.weighted_slo:.3f} weighted SLO, "
            f"{self.served} served in time, {self.loads} loads"
        )


@dataclass(frozen=True, slots=True)
class Job:
    """What one round replays: the policy, the window's arrivals and the learned facts."""

    policy: Policy
    arrivals: tuple[Arrival, ...]
    learned: Mapping[str, Learned]
    device_totals: tuple[int, ...]
    current: Tuning


@dataclass(frozen=True, slots=True)
class Choice:
    tuning: Tuning
    changed: bool
    why: str
    # The current setting no longer qualifies (it serves too few, or ran out of memory):
    # replaced at once, with no second round to confirm.
    urgent: bool = False


def auto_services(policy: Policy) -> list[str]:
    return sorted(n for n, s in policy.services.items() if s.yielding is Yielding.AUTO)


def replay_setup(job: Job) -> Setup:
    """The simulated box: the policy's services as the daemon has learned them."""
    rules, _ = rules_from_policy(job.policy)
    runtimes = {
        name: RuntimeBench(
            load_s=(job.learned.get(name) or Learned()).load_s or DEFAULT_LOAD_S,
            true_peak=expected_peak(rule, job.learned.get(name)),
            unload_s=DEFAULT_UNLOAD_S,
        )
        for name, rule in rules.items()
    }
    totals = job.device_totals
    return build_setup(
        job.policy,
        device_total=min(totals) if totals else None,
        devices=len(totals) or None,
        runtimes=runtimes,
    )


def trace_of(job: Job, setup: Setup) -> list[TraceRequest]:
    """The window as a trace: times from its first arrival, each request's own service
    time where it finished, else the mean of its service's in the window."""
    model = {name: svc.models[0] for name, svc in setup.policy.services.items()}
    known: dict[str, list[float]] = {}
    for a in job.arrivals:
        if a.duration_s is not None:
            known.setdefault(a.service, []).append(a.duration_s)
    mean = {name: sum(ds) / len(ds) for name, ds in known.items()}
    arrivals = [a for a in job.arrivals if a.service in model]
    t0 = arrivals[0].t if arrivals else 0.0
    return [
        TraceRequest(
            f"r{i}",
            a.t - t0,
            model[a.service],
            a.duration_s if a.duration_s is not None else mean.get(a.service, DEFAULT_SERVICE_S),
        )
        for i, a in enumerate(arrivals)
    ]


def replay(setup: Setup, trace: Sequence[TraceRequest], tuning: Tuning) -> Figures:
    from service.replay.vramd import fixed_system  # vramd runs the tuner: import late

    summary = run_system(fixed_system(tuning), setup, trace).summary
    return Figures(
        tuning=tuning,
        requests=summary["requests"],
        served=summary["served_within_timeout"],
        weighted_slo=summary["weighted_slo"] or 0.0,
        slo=summary["slo_attainment"] or 0.0,
        failed_oom=summary["failed_oom"] + summary["oom_loads_after_ready"],
        loads=summary["cold_starts"],
    )


def top_never_matters(setup: Setup) -> bool:
    """Whether some ``auto`` service of the highest movable priority has a lower
    unpinned priority below it (else ``never`` changes nothing)."""
    movable = (Residency.WARM, Residency.ON_DEMAND)
    rules = setup.rules.values()
    top = max((r.priority for r in rules if r.residency in movable), default=None)
    if top is None:
        return False
    auto = [r for r in rules if r.residency in movable and r.yielding is Yielding.AUTO]
    return any(r.priority == top for r in auto) and any(
        r.priority < top for r in rules if r.residency is not Residency.PINNED
    )


def evaluate(job: Job) -> list[Figures]:
    """Replay the window under every candidate (see the module's docstring)."""
    setup = replay_setup(job)
    trace = trace_of(job, setup)
    figures = [replay(setup, trace, Tuning(y)) for y in FIXED]
    if top_never_matters(setup):
        best = pick(figures)
        figures.append(replay(setup, trace, replace(best.tuning, top_never=True)))
    if all(f.tuning != job.current for f in figures):
        figures.append(replay(setup, trace, job.current))
    return figures


def eligible(figures: Sequence[Figures]) -> list[Figures]:
    """No out-of-memory failure (where any has none), and within ``SERVED_TOLERANCE`` of
    the most requests served in time."""
    safe = [f for f in figures if f.failed_oom == 0] or list(figures)
    most = max(f.served for f in safe)
    return [f for f in safe if f.served >= (1 - SERVED_TOLERANCE) * most]


def pick(figures: Sequence[Figures]) -> Figures:
    """The eligible candidate with the highest weighted SLO; ties go to the earlier."""
    ok = eligible(figures)
    return max(ok, key=lambda f: (f.weighted_slo, -ok.index(f)))


def choose(figures: Sequence[Figures], current: Tuning) -> Choice:
    best = pick(figures)
    mine = next((f for f in eligible(figures) if f.tuning == current), None)
    compared = "; ".join(f.text() for f in figures)
    if mine is not None and mine.weighted_slo >= best.weighted_slo - HYSTERESIS:
        return Choice(current, False, f"kept {current.label}: {compared}")
    why = f"chose {best.tuning.label}: {compared}"
    return Choice(best.tuning, best.tuning != current, why, urgent=mine is None)


@dataclass(slots=True)
class Tuner:
    """When to replay, and what the last round chose (``status``).

    Every so often the tuner replays the last hour of arrivals (``scheduler.Traffic``)
    through the scheduler core on a simulated box built from what the daemon has learned
    (each service's peak and load time, the devices' sizes), once per candidate: every
    fixed setting, then the best of them with the highest unpinned priority as ``protect:
    never``, and the current choice. It keeps the candidates with no out-of-memory failure
    that serve within their timeout at least ``1 - SERVED_TOLERANCE`` of the best
    candidate's requests, and among them picks the highest priority-weighted SLO. It
    switches only when the current choice is beaten by more than ``HYSTERESIS`` in two
    rounds in a row (to the best of the second; the first round alone decides from the
    untuned start), so one noisy window never flips it and traffic that does not change
    keeps its choice; a current choice that no longer qualifies is replaced at once.

    When: first ``FIRST_AFTER_S`` after start, then no sooner than ``MIN_INTERVAL_S`` after
    the last round began and no sooner than its CPU time divided by ``CPU_SHARE``, so the
    replays cost at most that share of one core on average. The daemon runs ``evaluate`` in
    a background process at low priority (``worker``) and measures its CPU time; the
    simulator runs it in place and charges ``REPLAY_CPU_S_PER_REQUEST`` per replayed request.
    """

    started_at: float
    current: Tuning = field(default_factory=Tuning)
    since: float = 0.0  # when ``current`` took effect (the start, until a round changes it)
    why: str = "not tuned yet: the first round replays the first 10 minutes of traffic"
    next_at: float = 0.0
    running: bool = False
    began_at: float = 0.0
    rounds: int = 0
    cpu_s: float = 0.0  # all rounds together
    # ``current`` was beaten in the last round: if it is again, the best then wins.
    beaten: bool = False
    figures: list[Figures] = field(default_factory=list)  # the last round's

    def __post_init__(self) -> None:
        self.next_at = self.started_at + FIRST_AFTER_S
        self.since = self.started_at

    def due(self, now: float) -> bool:
        return not self.running and now >= self.next_at

    def begin(self, now: float) -> None:
        self.running, self.began_at = True, now

    def skip(self, now: float, why: str) -> None:
        """No round this time (too little traffic): try again in ``MIN_INTERVAL_S``."""
        self.running = False
        self.next_at = now + MIN_INTERVAL_S
        if self.rounds == 0:
            self.why = f"not tuned yet: {why}"

    def conclude(self, now: float, figures: Sequence[Figures], cpu_s: float) -> Choice:
        """Take a round's figures; the choice says whether ``current`` changed."""
        self.running = False
        self.rounds += 1
        self.cpu_s += cpu_s
        self.figures = list(figures)
        self.next_at = max(self.began_at + MIN_INTERVAL_S, self.began_at + cpu_s / CPU_SHARE)
        choice = choose(figures, self.current)
        confirm = choice.changed and not choice.urgent and self.rounds > 1
        if confirm and not self.beaten:
            self.beaten = True
            why = f"kept {self.current.label} for now, {choice.tuning.label} led once: "
            choice = Choice(self.current, False, why + choice.why.split(": ", 1)[1])
        else:
            self.beaten = False
        requests = figures[0].requests if figures else 0
        self.why = f"{choice.why} ({requests} requests of the last hour, {cpu_s:.1f} s CPU)"
        if choice.changed:
            self.current, self.since = choice.tuning, now
        return choice

    def fail(self, now: float, why: str) -> None:
        self.running = False
        self.next_at = now + MIN_INTERVAL_S
        self.why = f"the last round failed ({why}); kept {self.current.label}"


def job_of(
    policy: Policy,
    arrivals: Sequence[Arrival],
    learned: Mapping[str, Learned],
    device_totals: tuple[int, ...],
    current: Tuning,
) -> Job | str:
    """The round's job, or why there is none (too little traffic, no service on auto)."""
    if not auto_services(policy):
        return "no service has yielding: auto"
    if len(arrivals) < MIN_REQUESTS:
        return f"{len(arrivals)} requests in the last hour, fewer than {MIN_REQUESTS}"
    return Job(policy, tuple(arrivals), dict(learned), device_totals, current)


def modeled_cpu_s(job: Job, figures: Sequence[Figures]) -> float:
    """The simulator's stand-in for a round's CPU time (deterministic, unlike a clock)."""
    return REPLAY_CPU_S_PER_REQUEST * len(job.arrivals) * len(figures)
