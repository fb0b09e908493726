"""``yielding: auto`` on a real daemon against the simulator, on the same arrivals.

    python -m bench.live_tuning [--traces a2.1-cv4,a0.9-cv4] [--speed 10]
        [--live-duration 180] [--json bench/out/live-tuning.json]
        [--markdown bench/out/live-tuning.md]

For each trace: a fresh ``vramd serve`` on ``bench/policies/live-demo.yaml`` (the ten
benchmark services as demo runtimes, 32x smaller and 10x faster), its pinned and
preloaded services ready; the trace compressed and sent in real time (``bench.live``);
then a tuning round at once (``POST /api/scheduler/tune``), and the simulator's tuner on
the arrivals of its own replay of the same compressed trace (``bench.live.sim_tuning``).
The report gives each side's choice and its candidates' weighted SLO.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.live import compress, daemon_tuning, drive, live_setup, sim_tuning
from bench.processes import running_vramd
from bench.replay import load_setup
from bench.report import write_outputs
from service.domain import Residency
from service.replay.trace import load_trace

ROOT = Path(__file__).parent
POLICY = ROOT / "policies" / "live-demo.yaml"


def run_trace(name: str, speed: float, wall_s: float) -> dict[str, Any]:
    setup, timing = live_setup(load_setup(POLICY, None))
    short = compress(
        load_trace(ROOT / "traces" / f"{name}.jsonl"),
        speed=speed,
        wall_s=wall_s,
        setup=setup,
        timing=timing,
    )
    startup = [
        n
        for n, s in setup.policy.services.items()
        if s.residency is Residency.PINNED or (s.residency is Residency.WARM and s.preload)
    ]
    with running_vramd(POLICY) as daemon:
        daemon.wait_ready(startup)

        async def go() -> dict[str, Any]:
            limits = httpx.Limits(max_connections=512, keepalive_expiry=2.0)
            timeout = httpx.Timeout(600.0, connect=10.0)
            async with (
                httpx.AsyncClient(base_url=daemon.url, timeout=timeout, limits=limits) as client,
                httpx.AsyncClient(base_url=daemon.url, timeout=30.0) as admin,
            ):
                await drive(client, admin, short, setup)
                return await daemon_tuning(admin)

        live = asyncio.run(go())
    sim = sim_tuning(setup, short)
    return {
        "trace": name,
        "requests": len(short),
        "live": live,
        "sim": sim,
        "same_choice": live["chose"] == sim["chose"],
    }


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    out = [
        "| trace | requests | live chose | sim chose | same "
        "| weighted SLO per candidate, live / sim |",
        "|---|--:|---|---|---|---|",
    ]
    for r in rows:
        live, sim = r["live"]["figures"], r["sim"].get("figures", {})
        cells = ", ".join(f"{k} {live[k]:.3f} / {sim.get(k, float('nan')):.3f}" for k in live)
        same = "yes" if r["same_choice"] else "**no**"
        out.append(
            f"| {r['trace']} | {r['requests']} | {r['live']['chose']} | {r['sim']['chose']} "
            f"| {same} | {cells} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_tuning", description=__doc__)
    p.add_argument("--traces", default="a2.1-cv4,a0.9-cv4")
    p.add_argument("--speed", type=float, default=10.0)
    p.add_argument("--live-duration", type=float, default=180.0)
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    rows = []
    for name in filter(None, (t.strip() for t in args.traces.split(","))):
        print(f"{name}: driving a fresh daemon for {args.live_duration:g} s ...", flush=True)
        rows.append(run_trace(name, args.speed, args.live_duration))
        print(f"{name}: live chose {rows[-1]['live']['chose']}, sim {rows[-1]['sim']['chose']}")
    text = markdown(rows)
    print(text, end="")
    write_outputs({"traces": rows}, text, json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
