"""``vramd windows``: list maintenance windows, add a one-off window, remove one.

A client command group like those in ``client.py`` (same ``--url``, admin key and exit
codes), apart because of ``--at``: ``parse_at`` turns ``now``, ``+30m``, ``HH:MM`` or an
ISO 8601 time in local time into the UTC time the API takes.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from service.cli.client import JsonOption, UrlOption, connect
from service.cli.console import fail, out, print_json
from service.cli.render import local_time, windows_table
from service.units import format_duration, parse_duration

windows_app = typer.Typer(
    help="Maintenance windows: list them, or add and remove one-off windows.",
    invoke_without_command=True,
)


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
    out.print(windows_table(listed))


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
    opens = "open now" if window.open else f"opens {local_time(window.next_start)}"
    out.print(
        f"window {name} added: {opens} for {format_duration(window.duration_s)}",
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
