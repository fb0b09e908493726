"""The client commands of ``vramd`` (DESIGN section 7): they talk to a daemon over HTTP.

``ps``, ``load``/``unload``/``restart``, ``explain``, ``apply``, ``events``, ``windows`` (``add``,
``rm``), ``incidents`` and ``import llama-swap`` (which reads a file and needs no daemon).
Each daemon command takes ``--url`` (default ``$VRAMD_URL`` or http://127.0.0.1:8400)
and sends ``$VRAMD_ADMIN_KEY`` as a bearer key when it is set. Exit codes as in
``service.cli``: 0 done, 1 the request failed or the input is invalid, 3 the daemon is
unreachable. Expected failures print one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from service import cli
from service.cli import EXIT_UNREACHABLE, UrlOption, client_settings, err, out
from service.client import AdminClient, ApiError, DaemonUnreachable, RequestFailed
from service.units import format_duration, format_size, parse_duration

EVENT_PAGE = 1000
FOLLOW_INTERVAL = 0.5  # seconds between polls of ``events -f``

JsonOption = Annotated[bool, typer.Option("--json", help="Print the daemon's JSON.")]
NameArg = Annotated[str, typer.Argument(help="Service name.")]

windows_app = typer.Typer(
    help="Maintenance windows: list them, or add and remove one-off windows.",
    invoke_without_command=True,
)
import_app = typer.Typer(
    help="Convert another tool's configuration into a vramd policy.", no_args_is_help=True
)


# ----------------------------------------------------------------- plumbing


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"vramd: {message}", markup=False)
    raise typer.Exit(code)


@contextmanager
def connect(url: str | None, context: str | None = None) -> Iterator[AdminClient]:
    """An admin client whose expected failures end the command with one line.

    ``context`` (a service or window name) prefixes API errors: ``vramd: chat: ...``.
    """
    settings = client_settings(url)
    client = AdminClient(settings.url, admin_key=settings.admin_key)
    try:
        yield client
    except DaemonUnreachable as exc:
        fail(f"{exc}; is it running? set --url or VRAMD_URL", EXIT_UNREACHABLE)
    except RequestFailed as exc:
        fail(str(exc))
    except ApiError as exc:
        if exc.status == 401:
            if settings.admin_key:
                fail("the daemon rejected the admin key in VRAMD_ADMIN_KEY")
            fail("the daemon requires an admin key: set VRAMD_ADMIN_KEY")
        fail(f"{context}: {exc}" if context else str(exc))
    finally:
        client.close()


def local_time(ts: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime(fmt)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def new_table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def add_row(table: Table, *cells: object) -> None:
    """Cells as plain text: names and messages are never read as rich markup."""
    table.add_row(*(Text("-" if cell is None else str(cell)) for cell in cells))


# ---------------------------------------------------------------------- ps


def ps(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Services and where the memory went: state, used / learned peak / cap, queues."""
    with connect(url) as client:
        status = client.status()
    if as_json:
        print_json(status)
        return
    for device in status.get("devices", []):
        out.print(device_line(device), markup=False)
    if status.get("degraded"):
        out.print(f"warning: the device probe is degraded: {status['degraded']}", markup=False)
    services = status.get("services", [])
    if not services:
        out.print("no services configured")
        return
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
        flags = list(svc.get("flags") or [])
        if svc.get("waiting_for_memory"):
            flags.append("waiting-for-memory")
        add_row(
            table,
            svc.get("name"),
            "waiting" if svc.get("waiting_for") else svc.get("state"),
            svc.get("device"),
            memory_cell(svc),
            svc.get("in_flight", 0),
            svc.get("queued", 0),
            format_duration(svc.get("idle_for_s")),
            ",".join(flags) or "-",
        )
    out.print(table)
    for svc in services:
        if svc.get("waiting_for"):
            text = str(svc["waiting_for"]).removeprefix(f"{svc['name']} ")
            out.print(f"{svc['name']}: {text}", markup=False)
        elif svc.get("last_error") and svc.get("state") in ("failed", "backoff", "stopped"):
            out.print(f"{svc['name']}: {svc['last_error']}", markup=False)


def device_line(device: dict[str, Any]) -> str:
    size = format_size
    charged = sum(device.get("charges", {}).values())
    return (
        f"device {device.get('index')} ({device.get('name')}, "
        f"{size(device.get('total_bytes'))}): used {size(device.get('used_bytes'))} · "
        f"budget {size(device.get('budget_bytes'))} ({size(charged)} charged, "
        f"{size(device.get('available_bytes'))} available) · "
        f"foreign {size(device.get('foreign_bytes'))} · free {size(device.get('free_bytes'))}"
    )


def memory_cell(svc: dict[str, Any]) -> str:
    """``120MiB / 130MiB / 200MiB``; ``~4GiB est`` while the service was never measured."""
    used = svc.get("footprint_bytes") if svc.get("pid") is not None else None
    learned = svc.get("learned_peak_bytes")
    peak = format_size(learned) if learned else f"~{format_size(svc.get('estimate_bytes'))} est"
    return f"{format_size(used)} / {peak} / {format_size(svc.get('cap_bytes'))}"


# ------------------------------------------------------- load/unload/restart


def describe_service(svc: dict[str, Any]) -> str:
    """``chat: ready (pid 123, device 0, 40MiB, loaded in 1.2s)``."""
    running = svc.get("pid") is not None
    parts = [f"pid {svc['pid']}", f"device {svc.get('device')}"] if running else []
    if running and svc.get("footprint_bytes"):
        parts.append(format_size(svc["footprint_bytes"]))
    if svc.get("state") == "ready" and svc.get("last_load_s") is not None:
        parts.append(f"loaded in {format_duration(svc['last_load_s'])}")
    detail = f" ({', '.join(parts)})" if parts else ""
    line = f"{svc.get('name')}: {svc.get('state')}{detail}"
    if svc.get("waiting_for"):
        line += f"; {svc['waiting_for']} (it loads as soon as it can)"
    return line


def load(name: NameArg, url: UrlOption = None) -> None:
    """Load a service now (clears a failed state) and wait until it is ready."""
    with connect(url, name) as client:
        out.print(describe_service(client.load(name)), markup=False)


def unload(name: NameArg, url: UrlOption = None) -> None:
    """Drain a service and stop it (a pinned one stays down until loaded again)."""
    with connect(url, name) as client:
        out.print(describe_service(client.unload(name)), markup=False)


def restart(name: NameArg, url: UrlOption = None) -> None:
    """Restart a service, drained: requests in flight finish, new ones wait for it."""
    with connect(url, name) as client:
        out.print(describe_service(client.restart(name)), markup=False)


def explain(name: NameArg, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """What loading a service now would do (fit, evict, wait, never), changing nothing."""
    with connect(url, name) as client:
        answer = client.admission(name)
    if as_json:
        print_json(answer)
        return
    out.print(answer["message"], markup=False)
    for victim in answer.get("victims", []):
        state = (
            "already stopping"
            if victim.get("already_stopping")
            else ("busy, drained first" if victim.get("busy") else "idle")
        )
        out.print(
            f"  evicts {victim['service']} ({victim['residency']}, priority "
            f"{victim['priority']}, {state}): frees {format_size(victim['bytes'])}",
            markup=False,
        )
    for holder in answer.get("holders", []):
        when = holder.get("yields_in_s")
        suffix = f" [can yield in {format_duration(when)}]" if when is not None else ""
        out.print(f"  waits for {holder['text']}{suffix}", markup=False)


# -------------------------------------------------------------------- apply


def apply(
    path: Annotated[Path, typer.Argument(help="Policy file to apply.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the diff only.")] = False,
    url: UrlOption = None,
) -> None:
    """Apply a policy file to the running daemon; shows the diff first."""
    text = read_text(path, "policy file")
    with connect(url) as client:
        try:
            preview = client.apply_policy(text, dry_run=True)
            for line in preview.get("lines", []):
                out.print(line, markup=False)
            if dry_run:
                out.print("dry run: nothing was changed")
                return
            result = client.apply_policy(text)
        except ApiError as exc:
            if exc.status != 422 or not exc.errors:
                raise
            for issue in exc.errors:
                err.print(f"{path}: {issue_text(issue)}", markup=False)
            fail(f"{path}: {exc.message}")
    if result.get("changed"):
        out.print(f"applied as policy version {result.get('version')}", markup=False)
    else:
        out.print(f"unchanged: policy version {result.get('version')} is already active")


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot read {what}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{path}: the {what} is not UTF-8 text")


def issue_text(issue: dict[str, Any]) -> str:
    """``services.chat.priority (line 8): ...`` from a 422's ``errors[]`` item."""
    where = str(issue.get("path") or "")
    if issue.get("line") is not None:
        where = f"{where} (line {issue['line']})".strip()
    return f"{where}: {issue.get('message')}" if where else str(issue.get("message"))


# ------------------------------------------------------------------- events


def events(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    service: Annotated[str | None, typer.Option(help="Only this service's events.")] = None,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="How many recent events to show.")] = 50,
    url: UrlOption = None,
) -> None:
    """Recent events, oldest first: state changes, loads, evictions, flags, windows."""
    try:
        with connect(url) as client:
            recent = latest_events(client, service=service, kind=kind, limit=limit)
            for event in recent:
                print_event(event)
            last = recent[-1]["id"] if recent else None
            while follow:
                time.sleep(FOLLOW_INTERVAL)
                for event in client.events(
                    since=last, service=service, kind=kind, limit=EVENT_PAGE
                ):
                    print_event(event)
                    last = event["id"]
    except KeyboardInterrupt:
        return  # Ctrl-C is how a follow ends: not an error


def latest_events(
    client: AdminClient, *, service: str | None, kind: str | None, limit: int
) -> list[dict[str, Any]]:
    """The last ``limit`` events; the API pages forward from the oldest."""
    kept: deque[dict[str, Any]] = deque(maxlen=limit)
    since: int | None = None
    while True:
        page = client.events(since=since, service=service, kind=kind, limit=EVENT_PAGE)
        kept.extend(page)
        if len(page) < EVENT_PAGE:
            return list(kept)
        since = page[-1]["id"]


def print_event(event: dict[str, Any]) -> None:
    out.print(
        f"{local_time(event.get('ts'))}  {event.get('kind', ''):<14} "
        f"{event.get('service') or '-':<16} {event.get('message', '')}",
        markup=False,
    )


# ------------------------------------------------------------------ windows


@windows_app.callback()
def windows(ctx: typer.Context, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """List maintenance windows: schedule, what they restart, next start, open now."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(url) as client:
        listed = client.windows()
    if as_json:
        print_json(listed)
        return
    if not listed:
        out.print("no maintenance windows")
        return
    table = new_table(
        "NAME", "ORIGIN", "SCHEDULE", "DURATION", "RESTART", "ALLOW", "NEXT START", "OPEN"
    )
    for window in listed:
        if window.get("cron"):
            schedule = f"{window['cron']} ({window.get('timezone') or 'UTC'})"
        else:
            schedule = f"at {local_time(window.get('start_at'))}"
        restart = window.get("restart")
        opened = "no"
        if window.get("open"):
            opened = f"yes, until {local_time(window.get('closes_at'), '%H:%M:%S')}"
        add_row(
            table,
            window.get("name"),
            window.get("origin"),
            schedule,
            format_duration(window.get("duration_s")),
            ",".join(restart) if isinstance(restart, list) else restart,
            ",".join(window.get("allow") or []) or "-",
            local_time(window.get("next_start")),
            opened,
        )
    out.print(table)


@windows_app.command("add")
def windows_add(
    name: Annotated[str, typer.Argument(help="Window name.")],
    at: Annotated[
        str,
        typer.Option(
            "--at",
            help="When it opens: now, +30m, HH:MM (the next one, local time) or ISO 8601 "
            "(local time unless it has an offset).",
        ),
    ],
    duration: Annotated[str, typer.Option(help="How long it stays open, e.g. 30m.")],
    restart: Annotated[
        str, typer.Option(help="Services to restart (a,b), or flagged, all or none.")
    ],
    allow: Annotated[
        str, typer.Option(help="Window-only services that may run inside it (a,b).")
    ] = "",
    url: UrlOption = None,
) -> None:
    """Schedule a one-off maintenance window (the daemon stores it)."""
    try:
        start = parse_at(at, now=datetime.now())
    except ValueError as exc:
        fail(f"--at: {exc}")
    try:
        parse_duration(duration)
    except ValueError as exc:
        fail(f"--duration: {exc}")
    targets: str | list[str] = restart
    if restart not in ("flagged", "all", "none"):
        targets = split_names(restart)
    with connect(url, name) as client:
        window = client.add_window(
            name=name, start=start, duration=duration, restart=targets, allow=split_names(allow)
        )
    opens = "open now" if window.get("open") else f"opens {local_time(window.get('next_start'))}"
    out.print(
        f"window {name} added: {opens} for {format_duration(window.get('duration_s'))}",
        markup=False,
    )


@windows_app.command("rm")
def windows_rm(
    name: Annotated[str, typer.Argument(help="Window name.")], url: UrlOption = None
) -> None:
    """Remove a window created through the API (policy windows live in the policy)."""
    with connect(url, name) as client:
        client.delete_window(name)
    out.print(f"window {name} removed", markup=False)


def split_names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})$")


def parse_at(text: str, *, now: datetime) -> str:
    """``--at`` as the API takes it: ``now`` or an ISO 8601 time in UTC.

    ``now`` is naive local time (``datetime.now()``), passed in so tests need no clock.
    """
    text = text.strip()
    if text.lower() == "now":
        return "now"
    if text.startswith("+"):
        start = now + timedelta(seconds=parse_duration(text[1:]))
    elif match := _CLOCK_RE.match(text):
        hour, minute = int(match.group(1)), int(match.group(2))
        if hour > 23 or minute > 59:
            raise ValueError(f"no such time of day: {text!r}")
        start = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if start <= now:
            start += timedelta(days=1)
    else:
        try:
            start = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"expected now, +DURATION (e.g. +30m), HH:MM or an ISO 8601 time, got {text!r}"
            ) from None
    # A naive time is local; astimezone() applies the local zone's rules for that date.
    return start.astimezone(UTC).isoformat()


# ---------------------------------------------------------------- incidents


def incidents(
    incident_id: Annotated[int | None, typer.Argument(help="Show this incident.")] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Out-of-memory incidents, or one incident in full."""
    with connect(url) as client:
        try:
            if incident_id is not None:
                record = client.incident(incident_id)
                if as_json:
                    print_json(record)
                else:
                    print_incident(record)
                return
            listed = client.incidents()
        except ApiError as exc:
            # Starlette's own 404 for a route the daemon lacks says just "Not Found".
            if exc.status == 404 and exc.message == "Not Found":
                fail(
                    "this daemon does not serve incidents yet "
                    "(GET /api/incidents answered 404); upgrade vramd"
                )
            raise
    if as_json:
        print_json(listed)
        return
    if not listed:
        out.print("no incidents recorded")
        return
    table = new_table("ID", "TIME", "SERVICE", "KIND", "VERDICT", "SUMMARY")
    for incident in listed:
        add_row(
            table,
            incident.get("id"),
            local_time(incident.get("ts")),
            incident.get("service"),
            incident.get("kind"),
            incident.get("verdict"),
            incident.get("summary"),
        )
    out.print(table)


def print_incident(record: dict[str, Any]) -> None:
    for key, value in record.items():
        if key == "ts" and isinstance(value, int | float):
            value = f"{local_time(value)} ({value})"
        if isinstance(value, dict | list):
            text = json.dumps(value, indent=2, sort_keys=True).replace("\n", "\n  ")
            out.print(f"{key}:\n  {text}", markup=False)
        else:
            out.print(f"{key}: {value}", markup=False)


# ------------------------------------------------------------------- import


@import_app.command("llama-swap")
def import_llamaswap(
    path: Annotated[Path, typer.Argument(help="llama-swap config.yaml to convert.")],
) -> None:
    """Print a vramd policy equivalent to a llama-swap config (review its TODOs)."""
    from service.importers import ImportFailed
    from service.importers.llamaswap import convert

    text = read_text(path, "llama-swap config")
    try:
        policy = convert(text, source=path.name)
    except ImportFailed as exc:
        fail(f"{path}: {exc}")
    typer.echo(policy, nl=False)


# ------------------------------------------------------------- registration


def _register(app: typer.Typer) -> None:
    for command in (ps, load, unload, restart, explain, apply, events, incidents):
        app.command()(command)
    app.add_typer(windows_app, name="windows")
    app.add_typer(import_app, name="import")


_register(cli.app)
