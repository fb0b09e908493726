"""How the daemon's JSON reads on a terminal: the tables and lines the client commands print.

Pure functions from the admin API's answers (docs/api.md) to text and ``rich`` tables;
they ask nothing and print nothing, so the commands in ``client.py`` and ``windows.py`` read
as "ask the daemon, print its view". Missing values show as ``-``; times are local.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from service.contract import (
    Backoff,
    DeviceStatus,
    EventRecord,
    Explanation,
    Incident,
    IncidentSummary,
    ServiceStatus,
    UsageRow,
    Window,
    YieldingView,
)
from service.units import format_duration, format_size


def local_time(ts: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime(fmt)


def new_table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def add_row(table: Table, *cells: object) -> None:
    """Cells as plain text: names and messages are never read as rich markup."""
    table.add_row(*(Text("-" if cell is None else str(cell)) for cell in cells))


# ---------------------------------------------------------------------- ps


def device_line(device: DeviceStatus) -> str:
    size = format_size
    charged = sum(device.charges.values())
    return (
        f"device {device.index} ({device.name}, "
        f"{size(device.total_bytes)}): used {size(device.used_bytes)} · "
        f"budget {size(device.budget_bytes)} ({size(charged)} charged, "
        f"{size(device.available_bytes)} available) · "
        f"foreign {size(device.foreign_bytes)} · free {size(device.free_bytes)}"
    )


def services_table(services: Iterable[ServiceStatus]) -> Table:
    table = new_table(
        "SERVICE",
        "STATE",
        "DEVICE",
        "USED / PEAK / CAP",
        "IN-FLIGHT",
        "QUEUED",
        "IDLE FOR",
        "FLAGS",
        right=("IN-FLIGHT", "QUEUED", "IDLE FOR"),
    )
    for svc in services:
        flags = list(svc.flags or [])
        if svc.waiting_for_memory:
            flags.append("waiting-for-memory")
        add_row(
            table,
            svc.name,
            state_cell(svc),
            device_cell(svc),
            memory_cell(svc),
            svc.in_flight,
            svc.queued,
            format_duration(svc.idle_for_s),
            ",".join(flags) or "-",
        )
    return table


def device_cell(svc: ServiceStatus) -> str:
    """``0``; for an instance spanning devices one line each: ``0: 9.5GiB``."""
    devices = svc.devices or []
    if len(devices) <= 1:
        return str(svc.device) if svc.device is not None else "-"
    measured = svc.device_bytes or {}
    charged = svc.charge_by_device or {}
    return "\n".join(
        f"{d}: {format_size(measured.get(str(d)) or charged.get(str(d)))}" for d in devices
    )


def state_cell(svc: ServiceStatus) -> str:
    """``ready``, ``ready (adopted)`` for a runtime a previous daemon started, ``waiting``."""
    if svc.waiting_for:
        return "waiting"
    return f"{svc.state} (adopted)" if svc.adopted else str(svc.state)


def memory_cell(svc: ServiceStatus) -> str:
    """``120MiB / 130MiB / 200MiB``; ``~4GiB est`` while the service was never measured."""
    used = svc.footprint_bytes if svc.pid is not None else None
    learned = svc.learned_peak_bytes
    peak = format_size(learned) if learned else f"~{format_size(svc.estimate_bytes)} est"
    return f"{format_size(used)} / {peak} / {format_size(svc.cap_bytes)}"


def service_notes(services: Iterable[ServiceStatus]) -> Iterator[str]:
    """The line under the table for each service that waits or failed: what and why."""
    for svc in services:
        if svc.waiting_for:
            text = str(svc.waiting_for).removeprefix(f"{svc.name} ")
            yield f"{svc.name}: {text}"
        elif svc.backoff:
            yield f"{svc.name}: {backoff_text(svc.backoff, svc.last_error)}"
        elif svc.last_error and svc.state in ("failed", "backoff", "stopped"):
            yield f"{svc.name}: {svc.last_error}"


def state_notes(services: Iterable[ServiceStatus]) -> Iterator[str]:
    """A line for each service that keeps state across swaps: what is saved, what it saved."""
    for svc in services:
        state = svc.saved_state
        if not state:
            continue
        if state.ineffective:
            yield f"{svc.name}: state not saved: {state.ineffective}"
            continue
        yield (
            f"{svc.name}: state {format_size(state.saved_bytes)} saved "
            f"({state.saved_slots} slots, {state.saved_tokens} tokens) of "
            f"{format_size(state.disk_bytes)}; "
            f"{state.tokens_not_reprocessed} prompt tokens not re-processed"
        )


def backoff_text(backoff: Backoff, error: str | None) -> str:
    """``died after being ready, 3 times in 10 min (killed by signal SIGKILL); next start
    12:03:10`` or ``start failed 2 times in a row (…); next start …``."""
    if backoff.cause == "died":
        deaths = backoff.deaths_in_10_min or 1
        what = "died after being ready" + ("" if deaths == 1 else f", {deaths} times in 10 min")
    else:
        starts = backoff.failed_starts or 1
        what = "start failed" + ("" if starts == 1 else f" {starts} times in a row")
    why = f" ({error})" if error else ""
    return f"{what}{why}; next start {local_time(backoff.next_start_at, '%H:%M:%S')}"


# ------------------------------------------------------- load/unload/restart


def describe_service(svc: ServiceStatus) -> str:
    """``chat: ready (pid 123, device 0, 40MiB, loaded in 1.2s)``."""
    running = svc.pid is not None
    devices = svc.devices or ([] if svc.device is None else [svc.device])
    where = f"device{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))}"
    parts = [f"pid {svc.pid}", where] if running else []
    if running and svc.footprint_bytes:
        parts.append(format_size(svc.footprint_bytes))
    if svc.state == "ready" and svc.last_load_s is not None:
        parts.append(f"loaded in {format_duration(svc.last_load_s)}")
    detail = f" ({', '.join(parts)})" if parts else ""
    line = f"{svc.name}: {svc.state}{detail}"
    if svc.waiting_for:
        line += f"; {svc.waiting_for} (it loads as soon as it can)"
    return line


def admission_lines(answer: Explanation) -> Iterator[str]:
    """``explain``: the verdict, then each service it would evict and each it waits for."""
    yield answer.message
    for victim in answer.victims:
        state = (
            "already stopping"
            if victim.already_stopping
            else ("busy, drained first" if victim.busy else "idle")
        )
        yield (
            f"  evicts {victim.service} ({victim.residency}, priority "
            f"{victim.priority}, {state}): frees {format_size(victim.bytes)}"
        )
    for holder in answer.holders:
        yield f"  waits for {holder.text}"
    yield from client_lines(answer)


def yielding_lines(yielding: YieldingView, service: str | None = None) -> Iterator[str]:
    """``GET /api/scheduler``'s ``yielding``: the setting, what it stands for, and why."""
    current = yielding.current + (" with top-never" if yielding.top_never else "")
    if yielding.setting == "auto":
        since = local_time(yielding.since, "%H:%M:%S")
        yield f"yielding: auto, now {current} (since {since})"
    else:
        yield f"yielding: {yielding.setting}"
    own = yielding.services.get(service) if service else None
    if own is not None:
        yield f"  {service} yields as {own}"
    yield f"  why: {yielding.why}"


def client_lines(answer: Explanation) -> Iterator[str]:
    """Who has requests at the service, by client: waiting, and in flight."""
    for key, what in (("waiting_by_client", "waiting"), ("in_flight_by_client", "in flight")):
        counts: dict[str, int] = getattr(answer, key)
        if counts:
            listed = ", ".join(f"{client} {n}" for client, n in counts.items())
            yield f"  {what}, by client: {listed}"


# --------------------------------------------------------------- apply, events


def issue_text(issue: dict[str, Any]) -> str:
    """``services.chat.priority (line 8): ...`` from a 422's ``errors[]`` item."""
    where = str(issue.get("path") or "")
    if issue.get("line") is not None:
        where = f"{where} (line {issue['line']})".strip()
    return f"{where}: {issue.get('message')}" if where else str(issue.get("message"))


def event_line(event: EventRecord) -> str:
    return f"{local_time(event.ts)}  {event.kind:<14} {event.service or '-':<16} {event.message}"


# ---------------------------------------------------------- windows, incidents


def windows_table(windows: Iterable[Window]) -> Table:
    table = new_table(
        "NAME", "ORIGIN", "SCHEDULE", "DURATION", "RESTART", "ALLOW", "NEXT START", "OPEN"
    )
    for window in windows:
        if window.cron:
            schedule = f"{window.cron} ({window.timezone or 'UTC'})"
        else:
            schedule = f"at {local_time(window.start_at)}"
        restart = window.restart
        opened = "no"
        if window.open:
            opened = f"yes, until {local_time(window.closes_at, '%H:%M:%S')}"
        add_row(
            table,
            window.name,
            window.origin,
            schedule,
            format_duration(window.duration_s),
            ",".join(restart) if isinstance(restart, list) else restart,
            ",".join(window.allow or []) or "-",
            local_time(window.next_start),
            opened,
        )
    return table


def incidents_table(incidents: Iterable[IncidentSummary]) -> Table:
    table = new_table("ID", "TIME", "SERVICE", "KIND", "VERDICT", "SUMMARY")
    for incident in incidents:
        add_row(
            table,
            incident.id,
            local_time(incident.ts),
            incident.service,
            incident.kind,
            incident.verdict,
            incident.summary,
        )
    return table


def usage_table(rows: Iterable[UsageRow]) -> Table:
    table = new_table(
        "CLIENT", "SERVICE", "REQUESTS", "ERRORS", "TOKENS IN", "TOKENS OUT", "RUNTIME", "MEDIA"
    )
    for row in rows:
        errors = row.errors_by_code or {}
        media = [f"{row.images} images"] if row.images else []
        media += [f"{format_duration(row.audio_s)} audio"] if row.audio_s else []
        add_row(
            table,
            row.client,
            row.service,
            row.requests,
            ", ".join(f"{n} {code}" for code, n in errors.items()) or "0",
            row.tokens_in,
            row.tokens_out,
            format_duration(row.runtime_s or 0),
            ", ".join(media) or "-",
        )
    return table


def incident_lines(record: Incident) -> Iterator[str]:
    """One incident in full, a ``key: value`` entry per field; nested values as JSON."""
    for key, value in record.model_dump().items():
        if key == "ts" and isinstance(value, int | float):
            value = f"{local_time(value)} ({value})"
        if isinstance(value, dict | list):
            text = json.dumps(value, indent=2, sort_keys=True).replace("\n", "\n  ")
            yield f"{key}:\n  {text}"
        else:
            yield f"{key}: {value}"
