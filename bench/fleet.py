"""Replay a trace over N simulated vramd nodes behind the endpoint picker, and round robin.

    python -m bench.fleet --policy POLICY.yaml --bench-data BENCH.yaml --trace TRACE.jsonl \\
        --nodes 4 [--routers affinity,picker-default,round-robin] \\
        [--weights queue=1,kv=1,lora=10] [--seed 0] [--scrape-s 0.05] \\
        [--json OUT] [--markdown OUT]

One vramd runs per machine; a pool of machines sits behind a router. Each node here is
the simulated daemon ``bench.replay`` runs, on its own box of the policy's size, all on
one virtual clock (``bench.sim.fleet``). ``affinity`` routes as the Gateway API inference
extension's endpoint picker does with its queue, KV-cache and LoRA-affinity scorers over
each node's /metrics, at the weights of the picker configuration vramd ships
(``deploy/kubernetes``) or ``--weights``; ``picker-default`` is the same at the
picker's own default weights; ``round-robin`` sends request i to node i mod N
(``bench.sim.routers``).

The figures are ``bench.replay``'s over every request of the trace, plus per node the
requests routed there and the loads it started, and per router where requests went
(``bench.sim.fleet.PLACEMENTS``). ``targets`` holds the two claims each scoring router
is held to against round robin: at most half its loads, and at least as many requests
served within their timeouts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.replay import load_setup
from bench.report import (
    CLASS_COLUMNS,
    MAIN_COLUMNS,
    class_rows,
    main_rows,
    markdown_table,
    rich_table,
    title,
    write_outputs,
)
from bench.sim.fleet import PLACEMENTS, SCRAPE_S, FleetResult, run_fleet
from bench.sim.routers import PICKER_DEFAULT, ROUTERS, Weights, make_router
from service.replay.setup import Setup
from service.replay.trace import TraceRequest, load_trace
from service.units import parse_size

FLEET_COLUMNS = ("router", *MAIN_COLUMNS[1:])
FLEET_CLASS_COLUMNS = ("router", *CLASS_COLUMNS[1:])
PLACEMENT_COLUMNS = (
    "router",
    "to running",
    "away from running",
    "to waiting",
    "away from waiting",
    "to cold",
)


def replay_fleet(
    setup: Setup,
    trace: Sequence[TraceRequest],
    nodes: int,
    routers: Sequence[str] = ROUTERS,
    *,
    weights: Weights = Weights(),
    seed: int = 0,
    scrape_s: float = SCRAPE_S,
) -> dict[str, FleetResult]:
    return {
        name: run_fleet(
            setup, trace, nodes, make_router(name, weights=weights, seed=seed), scrape_s=scrape_s
        )
        for name in routers
    }


def router_summary(result: FleetResult) -> dict[str, Any]:
    """``bench.replay``'s per-system summary, plus what each node was sent and loaded."""
    nodes = [
        {"node": i, "routed": routed, "loads": loads}
        for i, (routed, loads) in enumerate(zip(result.routed, result.loads, strict=True))
    ]
    return {
        **result.summary,
        "nodes": nodes,
        "placement": result.placement,
        "wall_s": round(result.wall_s, 3),
    }


def check_targets(routers: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each scoring router against round robin: half the cold starts or fewer, and at
    least as many requests served within their timeouts."""
    rr = routers.get("round-robin")
    if rr is None:
        return []
    out = []
    for name, fig in routers.items():
        if name == "round-robin":
            continue
        cold, cold_rr = fig["cold_starts"], rr["cold_starts"]
        served, served_rr = fig["served_within_timeout"], rr["served_within_timeout"]
        out += [
            {
                "router": name,
                "name": "cold",
                "value": cold,
                "bound": cold_rr / 2,
                "met": cold <= cold_rr / 2,
                "text": f"{cold} cold starts, round robin {cold_rr} (at most half)",
            },
            {
                "router": name,
                "name": "served",
                "value": served,
                "bound": served_rr,
                "met": served >= served_rr,
                "text": f"{served} served within timeout, round robin {served_rr}",
            },
        ]
    return out


def build_report(
    setup: Setup,
    trace: Sequence[TraceRequest],
    results: Mapping[str, FleetResult],
    *,
    nodes: int,
    names: Mapping[str, str | None],
    weights: Weights,
    seed: int,
    scrape_s: float,
) -> dict[str, Any]:
    """The ``--json`` document; ``names`` holds the trace, policy and bench data files."""
    device = setup.policy.device
    routers = {name: router_summary(result) for name, result in results.items()}
    return {
        "trace": names["trace"],
        "policy": names["policy"],
        "bench_data": names.get("bench_data"),
        "nodes": nodes,
        "requests": len(trace),
        "horizon_s": max((r.t for r in trace), default=0.0),
        "device": {
            "count": setup.devices,
            "total_bytes": setup.device_total,
            "plan_bytes": setup.plan_bytes,
            "budget_bytes": device.budget,
            "headroom_bytes": device.headroom,
        },
        "affinity": {"weights": str(weights), "tie_break_seed": seed, "scrape_s": scrape_s},
        "routers": routers,
        "targets": check_targets(routers),
    }


def _as_replay(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report in ``bench.replay``'s shape, for ``bench.report``'s row builders."""
    return {**report, "policies": report["routers"]}


def fleet_title(report: Mapping[str, Any]) -> str:
    return f"{title(_as_replay(report))}, on each of {report['nodes']} nodes"


def node_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per node: requests routed there and loads it started, per router."""
    names = list(report["routers"])
    columns = ["node"] + [f"{name} {what}" for name in names for what in ("routed", "loads")]
    rows = []
    for i in range(report["nodes"]):
        row = [str(i)]
        for name in names:
            node = report["routers"][name]["nodes"][i]
            row += [str(node["routed"]), str(node["loads"])]
        rows.append(row)
    return columns, rows


def placement_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """Per router, where requests went by the scrape they were routed on."""
    return [
        [name, *(str(fig["placement"][where]) for where in PLACEMENTS)]
        for name, fig in report["routers"].items()
    ]


def _tables(report: Mapping[str, Any]) -> list[tuple[str, Sequence[str], list[list[str]]]]:
    view = _as_replay(report)
    node_columns, nodes = node_rows(report)
    weights = f"affinity {report['affinity']['weights']}, picker-default {PICKER_DEFAULT}"
    tables = [
        (fleet_title(report), FLEET_COLUMNS, main_rows(view)),
        ("per priority class", FLEET_CLASS_COLUMNS, class_rows(view)),
        ("per node", node_columns, nodes),
        (f"where requests went ({weights})", PLACEMENT_COLUMNS, placement_rows(report)),
    ]
    if report["targets"]:
        rows = [
            [t["router"], t["name"], "met" if t["met"] else "MISSED", t["text"]]
            for t in report["targets"]
        ]
        columns = ("router", "target", "result", "figures")
        tables.append(("affinity against round robin", columns, rows))
    return tables


def print_fleet(report: Mapping[str, Any], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=170)
    for caption, columns, rows in _tables(report):
        console.print(rich_table(caption, columns, rows))


def fleet_markdown(report: Mapping[str, Any]) -> str:
    out: list[str] = []
    for caption, columns, rows in _tables(report):
        out += [f"**{caption}**", "", *markdown_table(columns, rows), ""]
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="vramd policy YAML (every node's)")
    p.add_argument("--trace", required=True, help="trace JSONL (one request per line)")
    p.add_argument("--bench-data", help="YAML: service -> {load_s, true_peak, unload_s}")
    p.add_argument("--nodes", type=int, default=4, help="simulated vramd nodes (default 4)")
    p.add_argument(
        "--routers",
        default=",".join(ROUTERS),
        help=f"comma-separated routers to compare (default {','.join(ROUTERS)})",
    )
    p.add_argument(
        "--weights",
        type=Weights.parse,
        default=Weights(),
        help=f"affinity's scorer weights (default {Weights()})",
    )
    p.add_argument("--seed", type=int, default=0, help="affinity's tie-break seed (default 0)")
    p.add_argument(
        "--scrape-s",
        type=float,
        default=SCRAPE_S,
        help=f"the picker's metrics refresh interval (default {SCRAPE_S}; 0: fresh state)",
    )
    p.add_argument("--device-total", type=parse_size, help="each node's device size, e.g. 26GiB")
    p.add_argument("--devices", type=int, help="devices per node (default: as bench.replay)")
    p.add_argument("--json", help="write the full report as JSON to this file")
    p.add_argument("--markdown", help="write the tables as Markdown to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 1 or (args.devices is not None and args.devices < 1):
        print("--nodes and --devices must be at least 1", file=sys.stderr)
        return 2
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown or not routers:
        print(f"unknown routers {unknown}; known: {', '.join(ROUTERS)}", file=sys.stderr)
        return 2
    setup = load_setup(args.policy, args.bench_data, args.device_total, args.devices)
    trace = load_trace(args.trace)
    results = replay_fleet(
        setup,
        trace,
        args.nodes,
        routers,
        weights=args.weights,
        seed=args.seed,
        scrape_s=args.scrape_s,
    )
    names = {
        "trace": Path(args.trace).name,
        "policy": Path(args.policy).name,
        "bench_data": Path(args.bench_data).name if args.bench_data else None,
    }
    report = build_report(
        setup,
        trace,
        results,
        nodes=args.nodes,
        names=names,
        weights=args.weights,
        seed=args.seed,
        scrape_s=args.scrape_s,
    )
    print_fleet(report)
    write_outputs(report, fleet_markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
