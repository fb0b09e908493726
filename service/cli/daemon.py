"""The ``vramd`` commands that work on this machine and need no running daemon.

``serve`` runs the daemon; ``check`` and ``schema`` validate and describe policy files;
``db upgrade`` creates or migrates the database; ``import llama-swap`` converts another tool's
configuration. They read files and settings (``--config``, ``$VRAMD_*``), never ``--url``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.console import EXIT_FAILED, err, fail, out, read_text
from service.errors import PolicyError, StoreError
from service.policy import Policy, Service, load_policy, policy_json_schema, starvation_warnings
from service.policy.clients import key_warnings, unmatched_patterns
from service.settings import Settings, refuse_unsafe_bind, server_address
from service.units import format_duration, format_size

if TYPE_CHECKING:
    from service.handover import Predecessor

db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
import_app = typer.Typer(
    help="Convert another tool's configuration into a vramd policy.", no_args_is_help=True
)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Policy file (default $VRAMD_CONFIG).")
]


def read_policy_or_exit(path: Path) -> tuple[Policy, str]:
    """Load and validate a policy file, or print every problem and exit 1."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        err.print(f"{path}: cannot read policy file: {exc.strerror or exc}")
        raise typer.Exit(EXIT_FAILED) from None
    except UnicodeDecodeError:
        err.print(f"{path}: the policy file is not UTF-8 text")
        raise typer.Exit(EXIT_FAILED) from None
    try:
        return load_policy(text), text
    except PolicyError as exc:
        for issue in exc.issues:
            err.print(f"{path}: {issue}", markup=False)
        count = len(exc.issues)
        err.print(f"{path}: {count} error{'s' if count != 1 else ''}; nothing was changed")
        raise typer.Exit(EXIT_FAILED) from None


# -------------------------------------------------------------- check, schema


def check(path: Annotated[Path, typer.Argument(help="Policy file to validate.")]) -> None:
    """Validate a policy file: print every error with its key path and line, or a summary."""
    policy, _ = read_policy_or_exit(path)
    out.print(f"{path}: valid policy, {len(policy.services)} services", markup=False)
    for name, service in policy.services.items():
        cap = format_size(service.memory.cap) if service.memory.cap else "none"
        ttl = format_duration(service.idle_ttl) if service.idle_ttl else "never"
        protect = "" if service.residency.value == "pinned" else f", protect {_protect(service)}"
        span = ""
        if service.span > 1:
            shares = "/".join(f"{share:g}" for share in service.shares)
            span = f", span {service.span} ({shares} per device)"
        out.print(
            f"  {name}: {service.kind} {service.residency} priority {service.priority}, "
            f"estimate {format_size(service.memory.estimate)} cap {cap}, idle unload {ttl}"
            f"{protect}{span}, models {', '.join(service.models)}",
            markup=False,
        )
    for window in policy.maintenance.windows:
        out.print(
            f"  window {window.name}: '{window.cron}' {window.timezone} for "
            f"{format_duration(window.duration)}",
            markup=False,
        )
    for name, client in policy.server.clients.items():
        models = "all models" if client.models is None else "models " + ", ".join(client.models)
        limit = f", max_concurrency {client.max_concurrency}" if client.max_concurrency else ""
        out.print(f"  client {name}: {models}, share {client.share:g}{limit}", markup=False)
    server = policy.server
    served = [model for service in policy.services.values() for model in service.models]
    for warning in (
        *starvation_warnings(policy),
        *key_warnings(server.clients, server.admin_keys),
        *unmatched_patterns(server.clients, served),
    ):
        out.print(f"warning: {warning}", markup=False)


def _protect(service: Service) -> str:
    if service.protect == "never":
        return "never"
    return format_duration(service.protect) if service.protect else "0s"


def schema() -> None:
    """Print the JSON Schema of the policy file (for editor completion)."""
    out.print_json(json.dumps(policy_json_schema()))


# ---------------------------------------------------------------------- serve


def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    db: Annotated[Path | None, typer.Option(help="SQLite database file.")] = None,
    keep_runtimes: Annotated[
        bool,
        typer.Option(
            "--keep-runtimes",
            help="On SIGTERM leave ready runtimes running for the next vramd to adopt.",
        ),
    ] = False,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Take over from the vramd serving the same database, without a gap.",
        ),
    ] = False,
) -> None:
    """Run the daemon."""
    from service.server import assemble

    settings = _settings(
        config=config, host=host, port=port, db=db, keep_runtimes=keep_runtimes or None,
        replacing=replace or None,
    )  # fmt: skip
    policy, _ = read_policy_or_exit(settings.config)
    address = server_address(settings, policy)
    problem = refuse_unsafe_bind(address.host, policy)
    if problem:
        err.print(problem)
        raise typer.Exit(EXIT_FAILED)
    configure_logging(settings.log_level)
    predecessor = _take_over(address.database) if replace else None
    preflight_database(address.database)
    handed = list(predecessor.sockets) if predecessor is not None else []
    listener = handed.pop(0) if handed else _bind_or_exit(address.host, address.port)
    ollama = None
    if policy.server.ollama is not None:
        ollama = handed[0] if handed else _ollama_listener(address.host, policy)
    server = assemble(
        settings,
        listener=listener,
        database=address.database,
        ollama=ollama,
        predecessor=predecessor,
    )
    application = server.app
    logging.getLogger("uvicorn.access").addFilter(drop_answered_scrapes)
    with logging_off_the_loop("vramd", "uvicorn", "uvicorn.access"):
        server.run_all()
    if getattr(application.state, "startup_failed", None):
        raise typer.Exit(EXIT_FAILED)


def _take_over(database: Path) -> Predecessor | None:
    """``--replace``: the sockets of the daemon serving ``database``; None if none runs."""
    from service.handover import HandoverRefused, ask_to_hand_over

    try:
        predecessor = ask_to_hand_over(database)
    except HandoverRefused as exc:
        err.print(f"vramd cannot take over: {exc}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    if predecessor is None:
        logging.getLogger("vramd").info("no vramd serves %s: starting afresh", database)
    return predecessor


def _bind_or_exit(host: str, port: int) -> socket.socket:
    from service.server import bind_listener

    try:
        return bind_listener(host, port)
    except OSError as exc:
        err.print(f"vramd cannot listen on {host}:{port}: {exc.strerror or exc}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None


def _ollama_listener(host: str, policy: Policy) -> socket.socket:
    """The Ollama-compatible listener's socket (``server.ollama``), bound now so that a
    port in use is one clear line and exit 1 before anything starts."""

    from service.server import bind_listener

    assert policy.server.ollama is not None
    port = policy.server.ollama.port
    try:
        return bind_listener(host, port)
    except OSError as exc:
        err.print(
            f"vramd cannot listen for Ollama clients on {host}:{port}: {exc.strerror or exc} "
            "(is Ollama itself running there? set server.ollama.port to another port)",
            markup=False,
        )
        raise typer.Exit(EXIT_FAILED) from None


def preflight_database(path: Path) -> None:
    """Open (and migrate) the database before serving: a locked, read-only, full or
    foreign file is one clear line and exit 1, not a server traceback."""
    from service.store import open_store
    from service.store.lock import DatabaseLock

    try:
        lock = DatabaseLock(path)
        try:
            open_store(path).close()
        finally:
            lock.release()
    except (StoreError, OSError) as exc:
        err.print(f"vramd cannot start: {exc}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None


def configure_logging(level: str) -> None:
    """vramd's own log lines (decisions, state changes) on stderr beside uvicorn's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("vramd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class _Enqueue(logging.Handler):
    """Hands records to the writer thread as they are, with the handlers of the logger
    they reached: formatting happens there, with the record's own args (uvicorn's access
    formatter reads them), and each logger's lines go to its own handlers only."""

    def __init__(self, records: queue.SimpleQueue[Any], targets: tuple[logging.Handler, ...]):
        super().__init__()
        self.records = records
        self.targets = targets

    def emit(self, record: logging.LogRecord) -> None:
        self.records.put_nowait((self.targets, record))


class _Writer(threading.Thread):
    """The writer thread: each record to the handlers of the logger it came through,
    until ``stop`` (which returns once every record queued before it is written)."""

    def __init__(self, records: queue.SimpleQueue[Any]) -> None:
        super().__init__(name="vramd-log-writer", daemon=True)
        self.records = records

    def run(self) -> None:
        while (item := self.records.get()) is not None:
            targets, record = item
            for handler in targets:
                if record.levelno >= handler.level:
                    handler.handle(record)

    def stop(self) -> None:
        self.records.put(None)
        self.join()


@contextlib.contextmanager
def logging_off_the_loop(*names: str) -> Iterator[None]:
    """Write these loggers' lines from a thread of their own: a write to a slow stderr
    (a pipe, a journal, a file on a busy disk) never holds up the event loop, where every
    decision is logged (1-2 ms a line on a loaded disk, on the path of a cold start).
    One thread keeps the lines of all of them in order; every line queued is written
    before this returns."""
    records: queue.SimpleQueue[Any] = queue.SimpleQueue()
    loggers = [logging.getLogger(name) for name in names]
    saved = [list(logger.handlers) for logger in loggers]
    for logger, before in zip(loggers, saved, strict=True):
        logger.handlers[:] = [_Enqueue(records, tuple(before))]
    writer = _Writer(records)
    writer.start()
    try:
        yield
    finally:
        writer.stop()
        for logger, before in zip(loggers, saved, strict=True):
            logger.handlers[:] = before


def drop_answered_scrapes(record: logging.LogRecord) -> bool:
    """No access line for a ``/metrics`` scrape that was answered: a cluster router asks
    20 times a second (1.7 million lines a day); a failed scrape is still logged."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 5:
        _, method, path, _, status = args
        if method == "GET" and path == "/metrics" and isinstance(status, int) and status < 400:
            return False
    return True


# ------------------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(
    config: ConfigOption = None, db: Annotated[Path | None, typer.Option()] = None
) -> None:
    """Create the database or migrate it to the newest schema."""
    from service.store import open_store

    settings = _settings(config=config, db=db)
    if settings.db is None:
        policy, _ = read_policy_or_exit(settings.config)
        path = server_address(settings, policy).database
    else:
        path = settings.db
    try:
        open_store(path).close()
    except StoreError as exc:
        err.print(str(exc), markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    out.print(f"{path}: database is at the newest schema", markup=False)


def _settings(**overrides: Any) -> Settings:
    return Settings(**{key: value for key, value in overrides.items() if value is not None})


# --------------------------------------------------------------------- import


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
