"""``yielding: auto``'s choice (``service.replay.tuner``): the rule, the hysteresis and the
schedule, on a fake clock (the rounds' times are given, nothing sleeps)."""

from __future__ import annotations

import pytest

from service.domain import Yielding
from service.replay.tuner import (
    CPU_SHARE,
    FIRST_AFTER_S,
    HYSTERESIS,
    MIN_INTERVAL_S,
    Figures,
    Tuner,
    choose,
    eligible,
)
from service.scheduler import Tuning

EAGER, BALANCED = Tuning(Yielding.EAGER), Tuning(Yielding.BALANCED)
RELUCTANT, AT_DEADLINE = Tuning(Yielding.RELUCTANT), Tuning(Yielding.AT_DEADLINE)


def fig(tuning: Tuning, weighted: float, served: int = 1000, oom: int = 0) -> Figures:
    return Figures(tuning, 1100, served, weighted, weighted, oom, 10)


def round_of(**weighted: float) -> list[Figures]:
    """One round's figures, every candidate serving alike, by weighted SLO."""
    names = {
        "eager": EAGER,
        "balanced": BALANCED,
        "reluctant": RELUCTANT,
        "at_deadline": AT_DEADLINE,
    }
    return [fig(names[name], value) for name, value in weighted.items()]


def test_the_best_weighted_slo_among_those_that_serve_as_many_wins() -> None:
    figures = [fig(EAGER, 0.80, served=1000), fig(BALANCED, 0.90, served=900)]
    assert [f.tuning for f in eligible(figures)] == [EAGER]  # balanced serves 10 % fewer
    assert choose(figures, BALANCED).tuning == EAGER


def test_serving_within_two_percent_of_the_most_keeps_a_candidate_in() -> None:
    figures = [fig(EAGER, 0.80, served=1000), fig(BALANCED, 0.90, served=981)]
    assert choose(figures, EAGER).tuning == BALANCED


def test_a_candidate_that_failed_requests_by_out_of_memory_is_never_chosen() -> None:
    figures = [fig(EAGER, 0.95, oom=1), fig(BALANCED, 0.80)]
    assert choose(figures, EAGER).tuning == BALANCED


def test_a_challenger_within_the_hysteresis_does_not_displace_the_current_choice() -> None:
    figures = round_of(eager=0.800 + HYSTERESIS / 2, balanced=0.800)
    choice = choose(figures, BALANCED)
    assert (choice.tuning, choice.changed) == (BALANCED, False)
    assert choice.why.startswith("kept balanced")


def test_the_first_round_decides_from_the_untuned_start() -> None:
    tuner = Tuner(started_at=0.0)
    assert tuner.current == BALANCED
    assert not tuner.due(FIRST_AFTER_S - 1) and tuner.due(FIRST_AFTER_S)
    tuner.begin(FIRST_AFTER_S)
    choice = tuner.conclude(FIRST_AFTER_S, round_of(eager=0.9, balanced=0.8), cpu_s=1.0)
    assert choice.changed and tuner.current == EAGER and tuner.since == FIRST_AFTER_S
    assert "chose eager" in tuner.why and "eager 0.900 weighted SLO" in tuner.why


def rounds(tuner: Tuner, figures_per_round: list[list[Figures]], start: float) -> list[Tuning]:
    """Run one round per figures list at the tuner's own schedule; the choice after each."""
    now, out = start, []
    for figures in figures_per_round:
        now = max(now, tuner.next_at)
        assert tuner.due(now)
        tuner.begin(now)
        tuner.conclude(now, figures, cpu_s=2.0)
        out.append(tuner.current)
    return out


def test_traffic_that_does_not_change_never_flips_the_choice() -> None:
    """Twenty rounds whose figures jitter around the same ranking: eager stays."""
    tuner = Tuner(started_at=0.0)
    jitter = [0.004, -0.003, 0.006, -0.005, 0.002] * 4
    figures = [round_of(eager=0.85 + j, balanced=0.846 - j, reluctant=0.80) for j in jitter]
    assert rounds(tuner, figures, FIRST_AFTER_S) == [EAGER] * 20


def test_one_noisy_round_does_not_switch_but_two_in_a_row_do() -> None:
    tuner = Tuner(started_at=0.0)
    steady = round_of(eager=0.90, at_deadline=0.80)
    turned = round_of(eager=0.80, at_deadline=0.90)
    choices = rounds(tuner, [steady, turned, steady, turned, turned, turned], FIRST_AFTER_S)
    assert choices == [EAGER, EAGER, EAGER, EAGER, AT_DEADLINE, AT_DEADLINE]
    assert "led once" not in tuner.why


def test_rounds_are_spaced_so_their_cpu_time_stays_within_its_share() -> None:
    tuner = Tuner(started_at=0.0)
    tuner.begin(FIRST_AFTER_S)
    tuner.conclude(FIRST_AFTER_S + 30, round_of(eager=0.9), cpu_s=30.0)
    assert tuner.next_at == pytest.approx(FIRST_AFTER_S + 30.0 / CPU_SHARE)
    tuner.begin(tuner.next_at)
    began = tuner.next_at
    tuner.conclude(began + 1, round_of(eager=0.9), cpu_s=1.0)
    assert tuner.next_at == began + MIN_INTERVAL_S  # a cheap round: the minimum interval


def test_too_little_traffic_skips_the_round_and_says_so() -> None:
    tuner = Tuner(started_at=0.0)
    tuner.skip(FIRST_AFTER_S, "3 requests in the last hour, fewer than 30")
    assert tuner.current == BALANCED and tuner.rounds == 0
    assert tuner.why == "not tuned yet: 3 requests in the last hour, fewer than 30"
    assert tuner.next_at == FIRST_AFTER_S + MIN_INTERVAL_S


def test_beaten_twice_by_different_candidates_switches_to_the_latest_best() -> None:
    tuner = Tuner(started_at=0.0)
    first = round_of(balanced=0.90, eager=0.80, reluctant=0.70)
    choices = rounds(
        tuner,
        [first, round_of(balanced=0.80, eager=0.90), round_of(balanced=0.80, reluctant=0.90)],
        FIRST_AFTER_S,
    )
    assert choices == [BALANCED, BALANCED, RELUCTANT]


def test_a_choice_that_no_longer_serves_enough_is_replaced_at_once() -> None:
    """Serving 10 % fewer requests in time than the best candidate disqualifies the
    current choice: no second round to confirm."""
    tuner = Tuner(started_at=0.0)
    rounds(tuner, [round_of(at_deadline=0.9, balanced=0.8)], FIRST_AFTER_S)
    assert tuner.current == AT_DEADLINE
    starving = [fig(AT_DEADLINE, 0.95, served=900), fig(EAGER, 0.85, served=1000)]
    assert rounds(tuner, [starving], tuner.next_at) == [EAGER]
    assert tuner.why.startswith("chose eager")
