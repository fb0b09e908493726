"""bench.swap's pure figures: medians, vramd's added cold start, the swap ratio, steps."""

from __future__ import annotations

import pytest

from bench.swap import event_steps, markdown, median_steps, summarize


def rows(*first_bytes: float) -> list[dict[str, float]]:
    return [{"first_byte_ms": ms, "full_ms": ms + 5} for ms in first_bytes]


def test_summary_gives_the_added_cold_start_and_the_swap_ratio() -> None:
    summary = summarize(
        {
            "cold_by_hand": rows(100, 120, 110),
            "cold_vramd": rows(118, 140, 125),
            "swap_vramd": rows(90, 80, 100),
            "swap_router": rows(40, 50, 45),
        }
    )
    assert summary["medians"]["cold_by_hand"] == {"first_byte_ms": 110, "full_ms": 115}
    assert summary["added_cold_start_ms"] == pytest.approx(15)
    assert summary["added_cold_start_met"] is True
    assert summary["swap_ratio"] == pytest.approx(2.0)
    assert summary["swap_ratio_met"] is False
    assert summary["swap_steps_ms"] == {}  # no events carried steps


def test_summary_of_missing_methods_is_none_not_an_error() -> None:
    summary = summarize({"cold_by_hand": rows(100), "swap_router": rows(0.0)})
    assert summary["added_cold_start_ms"] is None and summary["swap_ratio"] is None
    assert summary["added_cold_start_met"] is False and summary["swap_ratio_met"] is False


def test_steps_are_merged_from_swap_and_load_events_only() -> None:
    events = [
        {"kind": "swap", "data": {"phase": "stop", "steps": {"stop_ms": 4.0, "settle_ms": 9}}},
        {"kind": "state", "data": {"steps": {"stop_ms": 99.0}}},
        {"kind": "load", "data": {"device": 0}},
        {"kind": "swap", "data": {"phase": "start", "steps": {"ready_ms": 50, "other": 1}}},
    ]
    assert event_steps(events) == {"stop_ms": 4.0, "settle_ms": 9.0, "ready_ms": 50.0}


def test_step_medians_skip_runs_without_the_step_and_keep_the_swap_order() -> None:
    runs = [
        {"steps": {"ready_ms": 30.0, "stop_ms": 10.0}},
        {"steps": {"ready_ms": 50.0}},
        {"steps": {}},
    ]
    assert list(median_steps(runs).items()) == [("stop_ms", 10.0), ("ready_ms", 40.0)]


def test_markdown_leaves_the_steps_table_out_when_no_event_had_steps() -> None:
    results = {"cold_by_hand": rows(100), "cold_vramd": rows(130)}
    report = {"setup": {"runs": 1, "cpus": 2}, "results": results, "summary": summarize(results)}
    text = markdown(report)
    assert "added cold start (median): 30.0 ms" in text and "MISSED" in text
    assert "step p50" not in text
