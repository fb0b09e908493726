"""bench.swap's pure figures: medians, vramd's added cold start, the swap ratio, steps, and
bench.swap_state's: tokens re-processed, save and restore, the time state adds per MiB."""

from __future__ import annotations

from typing import Any

import pytest

from bench.swap import event_steps, markdown, median_steps, summarize
from bench.swap_state import added_per_mib, state_figures, state_verdicts, summarize_state


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


# -- bench.swap_state -----------------------------------------------------------------


def state_row(back: float, prompt_n: int, cache_n: int, **extra: float) -> dict[str, Any]:
    return {
        "away_first_byte_ms": 200.0,
        "back_first_byte_ms": back,
        "back_full_ms": back,
        "prompt_n": prompt_n,
        "cache_n": cache_n,
        "back_prompt_ms": 0.3 * prompt_n,
        "swap_path_ms": extra.pop("path", 400.0),
        **extra,
    }


def test_state_figures_read_save_restore_and_the_swap_steps() -> None:
    events = [
        {"kind": "evict", "data": {}},
        {
            "kind": "state-save",
            "data": {"slots": [0], "tokens": 562, "bytes": 4613132, "ms": 13.1, "failures": []},
        },
        {"kind": "swap", "data": {"phase": "stop", "steps": {"save_ms": 17.6, "stop_ms": 112}}},
        {"kind": "state-restore", "data": {"tokens": 562, "bytes": 4613132, "ms": 8.0}},
        {"kind": "swap", "data": {"phase": "start", "steps": {"ready_ms": 55, "restore_ms": 12}}},
        {"kind": "swap", "data": {"phase": "first-byte", "steps": {"first_byte_ms": 91.6}}},
        {"kind": "state-verified", "data": {}},
        {"kind": "state-ineffective", "data": {}},
    ]
    assert state_figures(events) == {
        "save_ms": 13.1,
        "save_bytes": 4613132.0,
        "save_tokens": 562.0,
        "save_failures": 0,
        "save_step_ms": 17.6,
        "restore_ms": 8.0,
        "restore_bytes": 4613132.0,
        "restore_tokens": 562.0,
        "restore_failures": 0,
        "ready_step_ms": 55.0,
        "restore_step_ms": 12.0,
        "verified": True,
        "other_state_events": ["state-ineffective"],
    }


def test_added_time_is_divided_by_the_state_only_when_state_adds_time() -> None:
    added = added_per_mib(150.0, 100.0, noise_ms=10.0, mib=5.0)
    assert added == {"added_ms": 50.0, "noise_ms": 10.0, "ms_per_mib": 10.0, "verdict": "added"}
    assert added_per_mib(60.0, 100.0, noise_ms=10.0, mib=5.0)["verdict"] == "faster"
    noise = added_per_mib(105.0, 100.0, noise_ms=10.0, mib=5.0)
    assert noise["verdict"] == "noise" and noise["ms_per_mib"] is None
    assert added_per_mib(None, 100.0, noise_ms=0.0, mib=5.0)["verdict"] == "unknown"
    assert added_per_mib(150.0, 100.0, noise_ms=0.0, mib=None)["verdict"] == "unknown"


def test_state_summary_gives_tokens_saved_cost_per_mib_and_the_verdicts() -> None:
    mib = 1024 * 1024
    saved = {"save_ms": 12.0, "restore_ms": 8.0, "save_bytes": 4.0 * mib, "verified": True}
    results = {
        "stateful": [
            state_row(300, 160, 556, path=430, **saved),
            state_row(320, 160, 556, path=450, **saved),
            state_row(310, 160, 556, path=440, **saved),
        ],
        "stateless": [
            state_row(450, 716, 0, path=380),
            state_row(470, 716, 0, path=400),
            state_row(460, 716, 0, path=390),
        ],
    }
    summary = summarize_state(results)
    on = summary["variants"]["stateful"]
    assert on["prompt_n"] == 160 and on["prompt_tokens"] == 716 and on["verified"] == 3
    assert summary["tokens_saved"] == 556
    assert summary["state_mib"] == pytest.approx(4.0)
    assert summary["save_restore_ms_per_mib"] == pytest.approx(5.0)
    assert summary["swap_back"]["verdict"] == "faster"
    assert summary["swap_back"]["added_ms"] == pytest.approx(-150.0)
    assert summary["swap_path"]["ms_per_mib"] == pytest.approx(50.0 / 4)
    text = "\n".join(state_verdicts(summary))
    assert "160 of 716 with state, 716 of 716 without: 556 saved per swap" in text
    assert "faster with state" in text and "12.5 ms per MiB of state" in text
    assert "in 3 of 3 runs" in text


def test_state_summary_without_a_save_says_so_and_the_markdown_carries_it() -> None:
    results = {
        "cold_by_hand": rows(100),
        "state": {"stateful": [state_row(400, 716, 0)], "stateless": [state_row(405, 716, 0)]},
    }
    summary = summarize(results)
    assert "state" not in summary["medians"]
    assert summary["state"]["state_mib"] is None and summary["state"]["tokens_saved"] == 0
    report = {"setup": {"runs": 1, "cpus": 2}, "results": results, "summary": summary}
    text = markdown(report)
    assert "state across a swap" in text and "716 / 716" in text
    assert "no state-save event seen" in text and "not measured" in text


def test_the_state_model_keeps_the_small_model_by_default() -> None:
    pytest.importorskip("gguf")
    import tempfile
    from pathlib import Path

    from bench.tiny_gguf import write_tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        small = write_tiny_llama(Path(tmp) / "small.gguf", seed=3)
        same = write_tiny_llama(
            Path(tmp) / "same.gguf", seed=3, n_layer=2, n_embd=64, n_head=4, n_ff=128, n_ctx=256
        )
        assert small.read_bytes() == same.read_bytes()
        with pytest.raises(ValueError, match="divide"):
            write_tiny_llama(Path(tmp) / "bad.gguf", n_embd=100, n_head=3)
