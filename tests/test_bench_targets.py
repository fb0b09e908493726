"""The targets vramd is held to (``bench.targets``), the sweep and the protect tuning."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import sweep, targets
from bench.sweep import POLICY_DIR, parse_protect_overrides, setup_with
from service.domain import Residency


def run(served: int, **figures: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "requests": 100,
        "served": served,
        "refused": {},
        "oom_loads": 0,
        "failed_oom": 0,
        "slo_attainment": 0.5,
        "cold_starts": 10,
        "served_past_timeout": 0,
        "by_priority": {"500": {"served": 10, "latency_s": {"p99": 10.0}}},
    }
    base.update(figures)
    return base


def report(vramd: dict[str, Any], **others: dict[str, Any]) -> dict[str, Any]:
    runs = {"vramd": vramd, "lru-count": run(100), "static": run(60), "unbounded": run(100)}
    runs.update(others)
    return {"policies": runs, "priorities": {}}


def met(checked: list[targets.Target]) -> dict[str, bool]:
    return {t.name: t.met for t in checked}


def test_every_target_met() -> None:
    good = run(99, cold_starts=5, slo_attainment=0.6)
    assert met(targets.check(report(good))) == dict.fromkeys(
        ["no-oom", "served", "slo", "top-p99", "cold"], True
    )


@pytest.mark.parametrize(
    ("figures", "missed"),
    [
        ({"oom_loads": 1}, "no-oom"),
        ({"served": 97}, "served"),  # below 98 % of lru-count's 100
        ({"slo_attainment": 0.49}, "slo"),  # below max(lru-count 0.5, static 0.5)
        ({"by_priority": {"500": {"served": 10, "latency_s": {"p99": 12.1}}}}, "top-p99"),
        ({"cold_starts": 6}, "cold"),  # above half of lru-count's 10
    ],
)
def test_each_target_is_missed_by_its_own_figure(figures: dict[str, Any], missed: str) -> None:
    vramd = run(99, cold_starts=5, slo_attainment=0.6)
    vramd.update(figures)
    checked = targets.check(report(vramd))
    assert [name for name, ok in met(checked).items() if not ok] == [missed]


def test_why_lost_names_what_lru_count_served_after_vramds_timeout() -> None:
    lru = run(100, served_past_timeout=30)
    vramd = run(80, refused={"queue_timeout": 20}, cold_starts=5, slo_attainment=0.6)
    data = report(vramd, **{"lru-count": lru})
    (reason,) = targets.why_lost(data, targets.check(data))
    assert "20 queue_timeout" in reason
    assert "within the timeouts it served 70, vramd 80" in reason


def test_the_targets_need_every_baseline() -> None:
    with pytest.raises(ValueError, match="static"):
        targets.check({"policies": {"vramd": run(1), "lru-count": run(1), "unbounded": run(1)}})


def test_protect_overrides_apply_only_where_the_file_sets_none(tmp_path: Path) -> None:
    assert parse_protect_overrides("warm=5m, on-demand=never") == {
        Residency.WARM: 300.0,
        Residency.ON_DEMAND: "never",
    }
    with pytest.raises(ValueError, match="pinned"):
        parse_protect_overrides("pinned=1m")
    with pytest.raises(ValueError, match="unknown residency"):
        parse_protect_overrides("hot=1m")
    policy = (POLICY_DIR / "home-box.yaml").read_text()
    own = policy.replace("    priority: 150\n", "    priority: 150\n    protect: 7s\n", 1)
    (tmp_path / "p.yaml").write_text(own)
    setup = setup_with(tmp_path / "p.yaml", parse_protect_overrides("on-demand=30s"))
    protects = {name: rule.protection_s for name, rule in setup.rules.items()}
    assert protects["vision"] == 7.0  # set in the file: kept
    assert protects["coder"] == 30.0  # on-demand without its own: the override
    assert protects["chat"] == 600.0  # warm: its default
    assert math.isinf(protects["whisper"])  # pinned


def test_the_sweep_replays_generated_traces_and_writes_every_target(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    argv = ["--quick", "--duration", "240", "--policies", "home-box", "--json", str(out)]
    assert sweep.main(argv) == 0
    reports = json.loads(out.read_text())
    assert [r["trace"] for r in reports] == [p.name for p in sweep.QUICK]
    for r in reports:
        assert [t["name"] for t in r["targets"]] == ["no-oom", "served", "slo", "top-p99", "cold"]
        assert set(r["policies"]) == set(targets.NEEDED)
    assert sweep.main(["--policies", "nope"]) == 2
