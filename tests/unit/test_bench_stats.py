"""bench.stats: one meaning of a percentile, shared with the simulator's figures."""

import ast
from pathlib import Path

import pytest

from bench import stats
from service.replay import metrics

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert stats.percentile(samples, 50) == pytest.approx(50.5)
    assert stats.percentile(samples, 99) == pytest.approx(99.01)
    assert stats.percentile(samples, 100) == 100.0
    assert stats.percentile(samples, 0) == 1.0
    assert stats.percentile([3.0], 99) == 3.0


def test_percentile_refuses_no_values_and_a_rank_outside_0_to_100() -> None:
    with pytest.raises(ValueError, match="no values"):
        stats.percentile([], 50)
    with pytest.raises(ValueError, match="outside 0-100"):
        stats.percentile([1.0], 101)


def test_median_mean_and_spread_answer_none_or_zero_for_no_values() -> None:
    assert (stats.median([]), stats.mean([]), stats.spread([])) == (None, None, 0.0)
    assert stats.median([1.0, 9.0, 2.0]) == 2.0
    assert stats.mean([1.0, 2.0, 6.0]) == 3.0
    assert stats.spread([1.0, 2.0, 3.0, 100.0]) == 1.0


def test_the_simulator_and_the_bench_share_one_percentile() -> None:
    assert stats.percentile is metrics.percentile


def test_no_bench_module_defines_a_percentile_or_median_of_its_own() -> None:
    own = []
    for path in sorted(BENCH.rglob("*.py")):
        if path.name == "stats.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in {"percentile", "median"}:
                own.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Import) and any(a.name == "statistics" for a in node.names):
                own.append(f"{path.name}:{node.lineno} imports statistics")
    assert own == []
