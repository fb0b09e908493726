"""The tables ``bench.replay`` prints (rich) and writes (Markdown), from its JSON report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

CODE_ABBREV = {
    "queue_full": "full",
    "queue_timeout": "timeout",
    "insufficient_capacity": "capacity",
    "runtime_failed": "failed",
    "model_not_found": "unknown",
    "window_closed": "window",
}

MAIN_COLUMNS = (
    "policy",
    "served",
    "within timeout",
    "refused",
    "OOM loads / reqs",
    "cold starts",
    "GiB loaded",
    "p50 s",
    "p99 s",
    "queue p50",
    "queue p99",
    "SLO",
    "mem avg",
)
TARGET_COLUMNS = ("target", "result", "figures")
CLASS_COLUMNS = (
    "policy",
    "priority",
    "requests",
    "served",
    "within timeout",
    "refused",
    "OOM",
    "p50 s",
    "p99 s",
    "SLO",
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _refused(fig: Mapping[str, Any]) -> str:
    total = fig["refused_total"]
    if not total:
        return "0"
    parts = ", ".join(f"{CODE_ABBREV.get(c, c)} {n}" for c, n in fig["refused"].items())
    return f"{total} ({parts})"


def main_rows(report: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, fig in report["policies"].items():
        served = f"{fig['served']}/{fig['requests']}"
        if fig["killed"]:
            served += f" ({fig['killed']} killed)"
        if fig["unfinished"]:
            served += f" ({fig['unfinished']} unfinished)"
        rows.append(
            [
                name,
                served,
                str(fig["served_within_timeout"]),
                _refused(fig),
                f"{fig['oom_loads']} / {fig['failed_oom']}",
                str(fig["cold_starts"]),
                _num(fig["gb_loaded"]),
                _num(fig["latency_s"]["p50"]),
                _num(fig["latency_s"]["p99"]),
                _num(fig["queue_s"]["p50"]),
                _num(fig["queue_s"]["p99"]),
                _pct(fig["slo_attainment"]),
                _pct(fig["mem_avg_fraction"]),
            ]
        )
    return rows


def class_rows(report: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, fig in report["policies"].items():
        for priority, cls in fig["by_priority"].items():
            rows.append(
                [
                    name,
                    priority,
                    str(cls["requests"]),
                    str(cls["served"]),
                    str(cls["served_within_timeout"]),
                    _refused(cls),
                    str(cls["failed_oom"]),
                    _num(cls["latency_s"]["p50"]),
                    _num(cls["latency_s"]["p99"]),
                    _pct(cls["slo_attainment"]),
                ]
            )
    return rows


def target_rows(report: Mapping[str, Any]) -> list[list[str]]:
    return [
        [t["name"], "met" if t["met"] else "MISSED", t["text"]] for t in report.get("targets", [])
    ]


def title(report: Mapping[str, Any]) -> str:
    device = report["device"]
    count = device.get("count", 1)
    plan, total = device["plan_bytes"] / 1024**3, device["total_bytes"] / 1024**3
    where = f"a {total:g} GiB device" if count == 1 else f"each of {count} {total:g} GiB devices"
    return (
        f"{report['trace']}: {report['requests']} requests over {report['horizon_s']:.0f} s, "
        f"{plan:g} GiB to plan with on {where}"
    )


def markdown_table(columns: Sequence[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the first column left, the figures right-aligned."""
    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("|" + "|".join(["---"] + ["--:"] * (len(columns) - 1)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def rich_table(caption: str, columns: Sequence[str], rows: list[list[str]]) -> Table:
    """The same table for a terminal."""
    table = Table(title=caption, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def print_report(report: Mapping[str, Any], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log or a pipe: do not squeeze into 80 columns
            console = Console(width=170)
    for columns, rows, caption in (
        (MAIN_COLUMNS, main_rows(report), title(report)),
        (CLASS_COLUMNS, class_rows(report), "per priority class"),
    ):
        console.print(rich_table(caption, columns, rows))
    if report.get("targets"):
        table = Table(title="vramd against the targets (bench.targets)", title_justify="left")
        for column in TARGET_COLUMNS:
            table.add_column(column)
        for row in target_rows(report):
            table.add_row(*row)
        console.print(table)
        for reason in report.get("why_lost", []):
            console.print(f"where vramd loses: {reason}", markup=False)


def markdown(report: Mapping[str, Any], *, per_class: bool = True) -> str:
    table = markdown_table
    out = [f"**{title(report)}**", ""]
    out += table(MAIN_COLUMNS, main_rows(report))
    if per_class:
        out += ["", "Per priority class:", ""]
        out += table(CLASS_COLUMNS, class_rows(report))
    if report.get("targets"):
        out += ["", "Targets:", ""]
        out += table(TARGET_COLUMNS, target_rows(report))
        out += [""] + [f"- where vramd loses: {reason}" for reason in report.get("why_lost", [])]
    return "\n".join(out) + "\n"


def write_outputs(
    data: Any, markdown_text: str, *, json_path: str | None, markdown_path: str | None
) -> None:
    """Write ``--json`` and ``--markdown`` where asked, creating their folders."""
    for path, text in (
        (json_path, json.dumps(data, indent=2) + "\n"),
        (markdown_path, markdown_text),
    ):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
