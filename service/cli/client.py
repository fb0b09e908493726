"""The ``vramd`` commands that talk to a running daemon over HTTP (docs/cli.md)."""

from __future__ import annotations

import os
import select
import signal
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Self

import typer

from service.cli.admin_api import AdminClient, ApiError, DaemonUnreachable, RequestFailed
from service.cli.console import EXIT_UNREACHABLE, err, fail, out, print_json, read_text
from service.cli.render import (
    admission_lines,
    describe_service,
    device_line,
    event_line,
    incident_lines,
    incidents_table,
    issue_text,
    local_time,
    service_notes,
    services_table,
    state_notes,
    usage_table,
    yielding_lines,
)
from service.contract import EventRecord
from service.settings import ClientSettings

EVENT_PAGE = 1000
FOLLOW_INTERVAL = 0.5  # seconds between polls of ``events -f``

UrlOption = Annotated[
    str | None, typer.Option("--url", help="Daemon URL (default $VRAMD_URL or :8400).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the daemon's JSON.")]
NameArg = Annotated[str, typer.Argument(help="Service name.")]


def client_settings(url: str | None) -> ClientSettings:
    settings = ClientSettings()
    if url:
        settings = settings.model_copy(update={"url": url})
    return settings


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


# ---------------------------------------------------------------------- ps


def ps(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Services and where the memory went: state, used / learned peak / cap, queues."""
    with connect(url) as client:
        status = client.status()
    if as_json:
        print_json(status)
        return
    for device in status.devices:
        out.print(device_line(device), markup=False)
    if status.degraded:
        out.print(f"warning: the device probe is degraded: {status.degraded}", markup=False)
    services = status.services
    if not services:
        out.print("no services configured")
        return
    out.print(services_table(services))
    for line in [*service_notes(services), *state_notes(services)]:
        out.print(line, markup=False)


# ------------------------------------------------------- load/unload/restart


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
    """What loading a service now would do (fit, evict, wait, never), changing nothing,
    and how the scheduler's yielding is set now."""
    with connect(url, name) as client:
        answer = client.admission(name)
        yielding = client.scheduler().yielding
    if as_json:
        print_json({**answer.model_dump(mode="json"), "yielding": yielding.model_dump(mode="json")})
        return
    for line in admission_lines(answer):
        out.print(line, markup=False)
    for line in yielding_lines(yielding, name):
        out.print(line, markup=False)


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
            for line in preview.lines:
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
    if result.changed:
        out.print(f"applied as policy version {result.version}", markup=False)
    else:
        out.print(f"unchanged: policy version {result.version} is already active")


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
    # Ctrl-C is how a follow ends, so it ends the command with 0, not as an error.
    with CtrlC() as ctrl_c, connect(url) as client:
        recent = latest_events(client, service=service, kind=kind, limit=limit, ctrl_c=ctrl_c)
        if ctrl_c.pressed:
            return
        for event in recent:
            out.print(event_line(event), markup=False)
        last = recent[-1].id if recent else None
        while follow and not ctrl_c.wait(FOLLOW_INTERVAL):
            for event in client.events(since=last, service=service, kind=kind, limit=EVENT_PAGE):
                out.print(event_line(event), markup=False)
                last = event.id


def latest_events(
    client: AdminClient, *, service: str | None, kind: str | None, limit: int, ctrl_c: CtrlC
) -> list[EventRecord]:
    """The last ``limit`` events; the API pages forward from the oldest."""
    kept: deque[EventRecord] = deque(maxlen=limit)
    since: int | None = None
    while not ctrl_c.pressed:
        page = client.events(since=since, service=service, kind=kind, limit=EVENT_PAGE)
        kept.extend(page)
        if len(page) < EVENT_PAGE:
            break
        since = page[-1].id
    return list(kept)


class CtrlC:
    """Within: Ctrl-C (SIGINT) marks ``pressed`` and wakes ``wait``; it raises nothing.

    A KeyboardInterrupt is raised wherever the main thread happens to be. Inside httpcore
    that can be just after its connection pool took a lock and before the ``with`` that
    releases it, and closing the client then blocks on that lock for good. So the loop
    asks instead, between requests: an idle follow ends at once, one waiting for an answer
    ends when it comes. A second Ctrl-C, for a daemon that never answers, ends the process.
    """

    def __init__(self) -> None:
        self.pressed = False

    def __enter__(self) -> Self:
        # The handler writes to this pipe and ``wait`` selects on it: the signal interrupts
        # select, the handler runs, select resumes and finds the pipe readable.
        self._wake_read, self._wake_write = os.pipe()
        self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.signal(signal.SIGINT, self._previous)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until Ctrl-C; true once it was pressed."""
        if not self.pressed:
            select.select([self._wake_read], [], [], seconds)
        return self.pressed

    def _press(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        os.write(self._wake_write, b"\0")
        signal.signal(signal.SIGINT, signal.SIG_DFL)


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
                    for line in incident_lines(record):
                        out.print(line, markup=False)
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
    out.print(incidents_table(listed))


# -------------------------------------------------------------------- usage


def usage(
    client: Annotated[str | None, typer.Option("--client", help="Only this client.")] = None,
    since: Annotated[
        str, typer.Option("--since", help="How far back, in whole hours: 24h, 7d, 90m.")
    ] = "24h",
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each client's use of each service: requests, errors, tokens, runtime seconds."""
    with connect(url) as client_api:
        answer = client_api.usage(since=since, client=client)
    if as_json:
        print_json(answer)
        return
    rows = answer.usage
    if not rows:
        out.print(f"no requests since {local_time(answer.since)}", markup=False)
        return
    out.print(usage_table(rows))
