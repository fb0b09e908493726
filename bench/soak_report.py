"""The soak's end (``bench.soak``): the daemon's shutdown, what it left behind, what its
store and log say, and the report built and printed from it all."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from bench.processes import Vramd
from bench.soak_clients import (
    DEADLINE_S,
    QUEUE_TIMEOUT_S,
    SERVICES,
    SHUTDOWN_WAIT_S,
    WARM_UP_S,
    Live,
    Watch,
)
from bench.stats import percentile

# ---------------------------------------------------------------------------- the end


def shut_down(vramd: Vramd, pids_seen: dict[int, float]) -> dict[str, Any]:
    """SIGTERM the daemon, wait for it, then count (and kill) what it left behind."""
    died_before = vramd.proc.poll()
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(vramd.proc.pid, signal.SIGTERM)
    try:
        code: int | None = vramd.proc.wait(timeout=SHUTDOWN_WAIT_S)
    except subprocess.TimeoutExpired:
        code = None
    seconds = time.monotonic() - started
    left = leftovers(vramd.workdir, pids_seen)
    for proc in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc["pid"], signal.SIGKILL)
    return {
        "died_before_sigterm_with": died_before,
        "exit_code": code,
        "seconds": round(seconds, 2),
        "exited": code is not None,
        "runtime_pids_seen": len(pids_seen),
        "processes_left": len(left),
        "left": left,
    }


def leftovers(workdir: Path, pids_seen: dict[int, float]) -> list[dict[str, Any]]:
    """Live processes naming ``workdir`` (command line or cwd), or runtimes seen before."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "create_time", "status"]):
        info = proc.info
        if info["pid"] in mine or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(info["cmdline"] or [])
        named = str(workdir) in command or info["cwd"] == str(workdir)
        born = pids_seen.get(info["pid"])
        seen = born is not None and abs(born - (info["create_time"] or 0)) < 0.05
        if named or seen:
            found.append({"pid": info["pid"], "status": info["status"], "cmdline": command[:300]})
    return found


STATE_MESSAGE = re.compile(r"^\S+: \S+ -> \S+ \((?P<reason>.*)\)$", re.S)


def read_store(db: Path) -> list[dict[str, Any]]:
    """Every row of the ``events`` table, oldest first (read after the daemon exited)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT id, ts, kind, service, message, data FROM events ORDER BY id")
        return [
            {
                "id": i,
                "ts": ts,
                "kind": k,
                "service": s,
                "message": m,
                "data": json.loads(d or "{}"),
            }
            for i, ts, k, s, m, d in rows
        ]
    finally:
        con.close()


def event_figures(events: list[dict[str, Any]], log: Path, watch: Watch) -> dict[str, Any]:
    """Events produced (log lines, ids streamed) against events stored (rows)."""
    logged = 0
    not_stored: list[str] = []
    with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if " vramd.events: " in line:
                logged += 1
            elif "not stored" in line:
                not_stored.append(line.strip()[:300])
    ids = {e["id"] for e in events}
    top = max(ids, default=0)
    gaps = sorted(set(range(1, top + 1)) - ids)
    lost = sorted(watch.streamed_ids - ids)
    return {
        "logged": logged,
        "streamed": len(watch.streamed_ids),
        "streamed_id_range": [
            min(watch.streamed_ids, default=0),
            max(watch.streamed_ids, default=0),
        ],
        "stream_breaks": dict(watch.stream_breaks),
        "stored": len(events),
        "highest_id_stored": top,
        "id_gaps": len(gaps),
        "id_gaps_first": gaps[:20],
        "streamed_not_stored": len(lost),
        "streamed_not_stored_first": lost[:20],
        "logged_minus_stored": logged - len(events),
        "not_stored_log_lines": not_stored[:20],
        "by_kind": dict(Counter(e["kind"] for e in events).most_common()),
    }


def transitions(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of ``state`` transitions into starting, backoff and failed, by reason."""
    into: dict[str, Counter[str]] = {
        "starting": Counter(),
        "backoff": Counter(),
        "failed": Counter(),
    }
    by_service: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    for event in events:
        to = event["data"].get("to") if event["kind"] == "state" else None
        if to not in into:
            continue
        if to == "failed":
            when = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
            failed.append({"id": event["id"], "clock": when, "message": event["message"][:300]})
        match = STATE_MESSAGE.match(event["message"])
        reason = match.group("reason") if match else event["message"]
        # Pids, ports, attempts and seconds differ from one event to the next.
        reason = re.sub(r"\d+(\.\d+)?", "N", reason)[:160]
        into[to][reason] += 1
        by_service[f"{event['service']} -> {to}"] += 1
    return {
        "into": {to: dict(counts.most_common()) for to, counts in into.items()},
        "by_service": dict(sorted(by_service.items())),
        "failed": failed,
    }


def log_problems(log: Path) -> dict[str, Any]:
    """The daemon log's WARNING and ERROR lines by logger, tracebacks, a few of each."""
    levels: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    tracebacks = 0
    pattern = re.compile(r"^\S+ \S+ (?P<level>WARNING|ERROR|CRITICAL)\s+(?P<logger>\S+): ")
    with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("Traceback"):
                tracebacks += 1
            match = pattern.match(line)
            if match:
                key = f"{match.group('level')} {match.group('logger')}"
                levels[key] += 1
                kept = examples.setdefault(key, [])
                if len(kept) < 5:
                    kept.append(line.strip()[:300])
    return {
        "by_level_logger": dict(levels.most_common()),
        "tracebacks": tracebacks,
        "examples": examples,
    }


# ---------------------------------------------------------------------------- figures


def slope_per_10k(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` against ``xs``, times 10,000 (None: too few points)."""
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return 10_000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def series(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [s[key] for s in samples]
    skip = max(-(-len(samples) * 20 // 100), sum(1 for s in samples if s["t"] < WARM_UP_S))
    warm = [s for s in samples[skip:] if not s.get("idle")]
    xs = [float(s["requests_completed"]) for s in warm]
    slope = slope_per_10k(xs, [float(s[key]) for s in warm])
    return {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "max": max(values, default=None),
        "slope_per_10k_requests": None if slope is None else round(slope, 3),
        "samples_in_slope": len(warm),
    }


def setup_figures(
    args: argparse.Namespace, workdir: Path, loadavg_before: tuple[float, float, float]
) -> dict[str, Any]:
    return {
        "duration_s": args.duration,
        "clients": args.clients,
        "kill_every_s": args.kill_every,
        "apply_every_s": args.apply_every,
        "seed": args.seed,
        "queue_timeout_s": QUEUE_TIMEOUT_S,
        "client_deadline_s": DEADLINE_S,
        "services": {
            name: dict(
                zip(
                    ("kind", "model", "residency", "priority", "memory_mib", "load_s"),
                    spec,
                    strict=True,
                )
            )
            for name, spec in SERVICES.items()
        },
        "budget": "384MiB - 32MiB headroom",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "workdir": str(workdir),
    }


def request_figures(live: Live) -> dict[str, Any]:
    tally = live.tally
    statuses: dict[str, dict[str, int]] = {}
    for (route, label), count in sorted(tally.statuses.items()):
        statuses.setdefault(route, {})[label] = count
    return {
        "total": tally.completed,
        "seconds": round(live.seconds, 1),
        "per_second": round(tally.completed / live.seconds, 2) if live.seconds else None,
        "by_route_status": statuses,
        "by_service_status": {
            f"{svc} {label}": n for (svc, label), n in sorted(tally.status_by_service.items())
        },
        "error_codes": dict(tally.error_codes.most_common()),
        "stream_error_event_codes": dict(tally.stream_error_codes.most_common()),
        "seconds_by_route": {
            route: {
                "p50": round(percentile(values, 50), 3),
                "p99": round(percentile(values, 99), 3),
                "max": round(max(values), 3),
            }
            for route, values in sorted(tally.seconds.items())
        },
        "daemon_requests_total_by_code": live.requests_total,
    }


def build_report(
    args: argparse.Namespace,
    live: Live,
    ending: dict[str, Any],
    events: list[dict[str, Any]],
    workdir: Path,
    loadavg_before: tuple[float, float, float],
) -> dict[str, Any]:
    tally, faults = live.tally, live.faults
    kills = faults.injected["kill"] + faults.injected["kill-mid-stream"]
    status_502 = sum(n for (_, label), n in tally.statuses.items() if label == "502")
    log = workdir / "vramd.log"
    return {
        "setup": setup_figures(args, workdir, loadavg_before),
        "requests": request_figures(live),
        "anomalies": {
            "hung_clients": tally.anomaly_counts["hung"],
            "transport_errors": dict(tally.transport.most_common()),
            "malformed_error_bodies": tally.anomaly_counts["malformed-error"],
            "malformed_success_bodies": tally.anomaly_counts["malformed-success"],
            "malformed_stream_events": tally.anomaly_counts["malformed-event"],
            "client_exceptions": tally.anomaly_counts["client-exception"],
            "streams_cut_without_error_event": tally.anomaly_counts["cut-stream"],
            "examples": tally.anomalies,
        },
        "status_502": {
            "count": status_502,
            "kills": kills,
            "per_kill": round(status_502 / kills, 2) if kills else None,
        },
        "faults": {
            "injected": dict(sorted(faults.injected.items())),
            "skipped": dict(sorted(faults.skipped.items())),
            "log": faults.log,
        },
        "daemon": {
            "rss_mib": series(live.watch.samples, "rss_mib"),
            "fds": series(live.watch.samples, "fds"),
            "samples": live.watch.samples,
            "healthz_at_end": live.healthz,
            "log": log_problems(log),
        },
        "events": event_figures(events, log, live.watch),
        "restarts": transitions(events),
        "final_services": [
            {
                key: svc.get(key)
                for key in (
                    "name",
                    "state",
                    "restarts",
                    "loads",
                    "evictions",
                    "requests_served",
                    "flags",
                    "last_error",
                )
            }
            for svc in live.final_services
        ],
        "shutdown": ending,
    }


# ---------------------------------------------------------------------------- printing


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def summary_rows(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    req, anomalies, daemon = report["requests"], report["anomalies"], report["daemon"]
    yield "requests", f"{req['total']} in {req['seconds']} s ({req['per_second']}/s)"
    yield "faults injected", ", ".join(f"{k} {v}" for k, v in report["faults"]["injected"].items())
    yield "faults skipped", ", ".join(f"{k} {v}" for k, v in report["faults"]["skipped"].items())
    yield "hung clients", str(anomalies["hung_clients"])
    transport = anomalies["transport_errors"]
    yield "transport errors", ", ".join(f"{k} {v}" for k, v in transport.items()) or "0"
    yield "malformed error bodies", str(anomalies["malformed_error_bodies"])
    yield (
        "malformed 2xx bodies / stream events",
        (f"{anomalies['malformed_success_bodies']} / {anomalies['malformed_stream_events']}"),
    )
    yield "streams cut without an error event", str(anomalies["streams_cut_without_error_event"])
    yield "client exceptions (not httpx's)", str(anomalies["client_exceptions"])
    s502 = report["status_502"]
    yield (
        "502s / kills / 502 per kill",
        f"{s502['count']} / {s502['kills']} / {_fmt(s502['per_kill'])}",
    )
    for key, unit in (("rss_mib", "MiB"), ("fds", "fds")):
        fig = daemon[key]
        yield (
            f"daemon {unit}: first / last / max / per 10k req",
            f"{_fmt(fig['first'])} / {_fmt(fig['last'])} / {_fmt(fig['max'])} / "
            f"{_fmt(fig['slope_per_10k_requests'])} ({fig['samples_in_slope']} samples)",
        )
    for at in (0, -1):
        row = daemon["samples"][at] if daemon["samples"] else {}
        kinds = ", ".join(f"{k} {v}" for k, v in row.get("fd_kinds", {}).items())
        tcp = ", ".join(f"{k} {v}" for k, v in row.get("tcp", {}).items())
        yield f"daemon fds and TCP at t={row.get('t')} s", f"{kinds}; {tcp}"
    ev = report["events"]
    yield "events logged / streamed / stored", f"{ev['logged']} / {ev['streamed']} / {ev['stored']}"
    yield "event id gaps / streamed not stored", f"{ev['id_gaps']} / {ev['streamed_not_stored']}"
    failed = [s["name"] for s in report["final_services"] if s["state"] == "failed"]
    yield "services failed at the end", ", ".join(failed) or "none"
    end = report["shutdown"]
    if end["died_before_sigterm_with"] is not None:
        yield "daemon died during the run", f"exit code {end['died_before_sigterm_with']}"
    # uvicorn re-raises the SIGTERM it handled once shut down: -15 is a clean exit.
    yield "SIGTERM -> exit", f"{end['seconds']} s, exit code {_fmt(end['exit_code'])}"
    yield "processes left after SIGTERM", str(end["processes_left"])
    log = daemon["log"]
    yield (
        "daemon log warnings/errors",
        ", ".join(f"{k} {v}" for k, v in log["by_level_logger"].items())
        + f"; tracebacks {log['tracebacks']}",
    )


def _print_codes_and_restarts(console: Console, report: dict[str, Any]) -> None:
    table = _table("error bodies (status, code) and stream error events", ["what", "count"])
    for code, count in report["requests"]["error_codes"].items():
        table.add_row(f"answer {code}", str(count))
    for code, count in report["requests"]["stream_error_event_codes"].items():
        table.add_row(f"stream error event {code}", str(count))
    for code, count in report["requests"]["daemon_requests_total_by_code"].items():
        table.add_row(f"daemon vramd_requests_total {code}", str(count))
    console.print(table)

    table = _table("runtime transitions by reason (events table)", ["into", "reason", "count"])
    for to, reasons in report["restarts"]["into"].items():
        for reason, count in reasons.items():
            table.add_row(to, reason, str(count))
    console.print(table)

    for failed in report["restarts"]["failed"]:
        console.print(
            f"into failed: event {failed['id']} at {failed['clock']}: {failed['message']}"
        )

    table = _table(
        "services just before SIGTERM",
        ["service", "state", "restarts", "loads", "evictions", "served", "flags", "last error"],
    )
    for svc in report["final_services"]:
        table.add_row(
            *(
                _fmt(svc[k])
                for k in ("name", "state", "restarts", "loads", "evictions", "requests_served")
            ),
            ", ".join(svc["flags"] or []),
            (svc["last_error"] or "")[:60],
        )
    console.print(table)


def print_report(report: dict[str, Any]) -> None:
    console = Console() if sys.stdout.isatty() else Console(width=140)
    setup = report["setup"]
    title = (
        f"bench.soak: {setup['duration_s']:g} s, {setup['clients']} clients, seed {setup['seed']}, "
        f"on {setup['cpus']} CPUs (load {setup['loadavg_after'][0]:.2f} at the end)"
    )
    table = _table(title, ["figure", "value"])
    for name, value in summary_rows(report):
        table.add_row(name, value)
    console.print(table)

    by_route = report["requests"]["by_route_status"]
    labels = sorted(
        {label for counts in by_route.values() for label in counts},
        key=lambda label: (not label.isdigit(), label),
    )
    table = _table("requests by route and status", ["route", *labels])
    for route, counts in by_route.items():
        table.add_row(route, *(str(counts.get(label, "")) for label in labels))
    console.print(table)

    by_service: dict[str, dict[str, int]] = {}
    for key, count in report["requests"]["by_service_status"].items():
        name, label = key.split(" ", 1)
        by_service.setdefault(name, {})[label] = count
    table = _table("requests by service and status", ["service", *labels])
    for name, counts in by_service.items():
        table.add_row(name, *(str(counts.get(label, "")) for label in labels))
    console.print(table)

    _print_codes_and_restarts(console, report)

    examples = report["anomalies"]["examples"]
    if examples:
        table = _table(
            "anomalies (first 5 of each)",
            ["kind", "t s", "clock", "route", "model", "status", "s", "detail"],
        )
        for kind, rows in examples.items():
            for row in rows[:5]:
                table.add_row(
                    kind,
                    *(
                        _fmt(row[k])
                        for k in ("t", "clock", "route", "model", "status", "seconds", "detail")
                    ),
                )
        console.print(table)
