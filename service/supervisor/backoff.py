"""Restart backoff and give-up, as pure arithmetic over the times it is told.

A runtime that crashes is restarted after ``backoff``, then ``2·backoff``, ``4·backoff``
… capped at ``max_backoff``; after ``max_retries`` restarts in a row that did not hold,
the next failure gives up (the instance goes FAILED and the service is flagged
``crash-looping``, DESIGN section 5). An instance that stayed ready for
``stable_after_s`` has proven the fix (or the transient) and its count starts again from
zero, so a runtime that crashes once a week is never given up on.

Nothing here reads a clock or sleeps: the caller passes ``now`` (monotonic seconds), so
every schedule can be checked with plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """``max_retries`` restarts are attempted; failure number ``max_retries + 1`` gives up."""

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


DEFAULT_POLICY = RestartPolicy(max_retries=5, backoff_s=2.0, max_backoff_s=120.0)


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """What to do after a failure: retry after ``delay_s``, or give up.

    ``attempt`` is the number of consecutive failures including this one.
    """

    retry: bool
    delay_s: float
    attempt: int


class RestartTracker:
    """Counts consecutive failures of one instance and turns them into decisions."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._failures = 0
        self._ready_since: float | None = None

    @property
    def failures(self) -> int:
        """Consecutive failures not yet forgiven by a stable run."""
        return self._failures

    def on_ready(self, now: float) -> None:
        self._ready_since = now

    def on_stable_check(self, now: float) -> bool:
        """Forget past failures if the instance has been ready long enough; say if it has."""
        ready_since = self._ready_since
        if ready_since is not None and now - ready_since >= self.policy.stable_after_s:
            self._failures = 0
            return True
        return False

    def on_failure(self, now: float) -> RestartDecision:
        # A crash after a long stable run is a first failure, not the next in a loop; the
        # check happens here too so the caller need not poll on_stable_check.
        self.on_stable_check(now)
        self._ready_since = None
        self._failures += 1
        if self._failures > self.policy.max_retries:
            return RestartDecision(retry=False, delay_s=0.0, attempt=self._failures)
        return RestartDecision(
            retry=True, delay_s=self.delay_for(self._failures), attempt=self._failures
        )

    def delay_for(self, attempt: int) -> float:
        """Delay before restart number ``attempt`` (1-based): backoff · 2^(attempt-1), capped."""
        p = self.policy
        # Cap the exponent too: 2.0**2000 overflows a float long before any cap matters.
        return min(p.backoff_s * 2.0 ** min(attempt - 1, 64), p.max_backoff_s)

    def reset(self) -> None:
        """Start counting afresh: an operator or a request asked for a load after FAILED."""
        self._failures = 0
        self._ready_since = None
