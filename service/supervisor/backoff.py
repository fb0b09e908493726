"""Restart backoff, give-up and crash-loop detection, as pure arithmetic over given times."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Deaths of a ready instance within this window count towards crash-looping.
LOOP_WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """``max_retries`` failed starts in a row are retried; the next one gives up.

    ``max_retries`` deaths of a ready instance within ``LOOP_WINDOW_S`` make it
    crash-looping (never given up on)."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float
    stable_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("need 0 <= backoff_s <= max_backoff_s")
        if self.stable_after_s < 0:
            raise ValueError("stable_after_s must be >= 0")

    @property
    def loop_deaths(self) -> int:
        """Deaths within ``LOOP_WINDOW_S`` that make a ready-then-dying instance looping."""
        return max(1, self.max_retries)


DEFAULT_POLICY = RestartPolicy(max_retries=5, backoff_s=2.0, max_backoff_s=120.0)


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """What to do after a failure: retry after ``delay_s``, or give up.

    ``attempt``: failures since the last stable run, this one included (the backoff's
    step). ``was_ready``: the instance had become ready (a death, never given up on).
    ``failed_starts``: starts in a row that never became ready, this one included (0
    for a death). ``deaths``: deaths of a ready instance within ``LOOP_WINDOW_S``.
    """

    retry: bool
    delay_s: float
    attempt: int
    was_ready: bool = False
    failed_starts: int = 0
    deaths: int = 0
    looping: bool = False

    def describe(self, max_retries: int) -> str:
        """``died after being ready (3 times in 10 min), restart in 8s`` and the like."""
        if not self.retry:
            return f"gave up after {self.failed_starts} failed starts in a row"
        if self.was_ready:
            times = "once" if self.deaths == 1 else f"{self.deaths} times"
            what = f"died after being ready ({times} in {LOOP_WINDOW_S / 60:g} min)"
        else:
            left = max_retries + 1 - self.failed_starts
            what = f"start failed ({self.failed_starts} in a row, gives up after {left} more)"
        return f"{what}, restart in {self.delay_s:g}s"


class RestartTracker:
    """Counts one instance's failures and turns them into decisions.

    Two faults look alike from outside (the process ended) and are told apart by whether
    the instance ever became ready (docs/reliability.md, "Restarts"):

    - **A start that never became ready** (a missing file, a model that cannot load, a
      runtime that dies while loading): retried after ``backoff``, ``2·backoff``,
      ``4·backoff`` … capped at ``max_backoff``; after ``max_retries`` such starts in a row,
      the next one gives up: the instance goes FAILED and stays there until someone asks
      for a load. Retrying a binary that cannot start for ever helps nobody.
    - **A ready instance that died** (the OOM killer, a driver reset, a kill): it has shown
      that it can come up, so it is never given up on. It is restarted with the same
      doubling backoff, and it *is crash-looping* while it has died ``max_retries`` times
      (at least once) within ``LOOP_WINDOW_S``. Becoming ready again ends a run of failed
      starts; staying ready for ``stable_after_s`` also resets the backoff to its first step.

    Nothing here reads a clock or sleeps: the caller passes ``now`` (monotonic seconds), so
    every schedule can be checked with plain numbers.
    """

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._failures = 0
        self._failed_starts = 0
        self._deaths: deque[float] = deque()
        self._ready_since: float | None = None

    @property
    def failures(self) -> int:
        """Failures not yet forgiven by a stable run: the backoff's step."""
        return self._failures

    def on_ready(self, now: float) -> None:
        """The instance answers: it can start, so a run of failed starts is over."""
        self._ready_since = now
        self._failed_starts = 0

    def on_stable_check(self, now: float) -> bool:
        """Forget past failures if the instance has been ready long enough; say if it has."""
        ready_since = self._ready_since
        if ready_since is not None and now - ready_since >= self.policy.stable_after_s:
            self._failures = 0
            return True
        return False

    def deaths(self, now: float) -> int:
        """Deaths of a ready instance within ``LOOP_WINDOW_S`` before ``now``."""
        while self._deaths and now - self._deaths[0] > LOOP_WINDOW_S:
            self._deaths.popleft()
        return len(self._deaths)

    def looping(self, now: float) -> bool:
        """Crash-looping: enough recent deaths, and not ready for ``stable_after_s`` since."""
        return self.deaths(now) >= self.policy.loop_deaths and not self._stable(now)

    def on_failure(self, now: float, *, was_ready: bool) -> RestartDecision:
        """The process ended on its own; ``was_ready``: it had become ready."""
        # A crash after a long stable run is a first failure, not the next in a loop; the
        # check happens here too so the caller need not poll on_stable_check.
        self.on_stable_check(now)
        self._ready_since = None
        self._failures += 1
        if was_ready:
            self._deaths.append(now)
            deaths = self.deaths(now)
            return RestartDecision(
                retry=True,
                delay_s=self.delay_for(self._failures),
                attempt=self._failures,
                was_ready=True,
                deaths=deaths,
                looping=deaths >= self.policy.loop_deaths,
            )
        self._failed_starts += 1
        return RestartDecision(
            retry=self._failed_starts <= self.policy.max_retries,
            delay_s=self.delay_for(self._failures),
            attempt=self._failures,
            failed_starts=self._failed_starts,
            deaths=self.deaths(now),
            looping=self.deaths(now) >= self.policy.loop_deaths,
        )

    def delay_for(self, attempt: int) -> float:
        """Delay before restart number ``attempt`` (1-based): backoff · 2^(attempt-1), capped."""
        p = self.policy
        # Cap the exponent too: 2.0**2000 overflows a float long before any cap matters.
        return min(p.backoff_s * 2.0 ** min(attempt - 1, 64), p.max_backoff_s)

    def reset(self) -> None:
        """Start counting afresh: an operator or a request asked for a load after FAILED
        or STOPPED (the deaths are forgotten too: the flag they raised is cleared then)."""
        self._failures = 0
        self._failed_starts = 0
        self._deaths.clear()
        self._ready_since = None

    def _stable(self, now: float) -> bool:
        ready_since = self._ready_since
        return ready_since is not None and now - ready_since >= self.policy.stable_after_s
