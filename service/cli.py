"""The ``vramd`` command (DESIGN section 7).

Daemon-side commands (``serve``, ``check``, ``schema``, ``db upgrade``) work on files;
client commands (``ps``, ``load`` ...) talk to a running daemon over HTTP at ``--url``
(default ``$VRAMD_URL`` or http://127.0.0.1:8400). Exit codes: 0 success, 1 the thing
asked for failed or is invalid, 2 usage errors (typer's), 3 the daemon is unreachable.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from service.errors import PolicyError, StoreError
from service.policy import Policy, Service, load_policy, policy_json_schema
from service.settings import ClientSettings, Settings, refuse_unsafe_bind, server_address
from service.units import format_duration, format_size

app = typer.Typer(
    name="vramd",
    help="One daemon that owns the accelerator memory and runs local AI runtimes.",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

# Piped output (scripts, `watch`, logs) gets wide tables rather than rich's 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_UNREACHABLE = 3

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Policy file (default $VRAMD_CONFIG).")
]
UrlOption = Annotated[
    str | None, typer.Option("--url", help="Daemon URL (default $VRAMD_URL or :8400).")
]


def read_policy_or_exit(path: Path) -> tuple[Policy, str]:
    """Load and validate a policy file, or print every problem and exit 1."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        err.print(f"{path}: cannot read policy file: {exc.strerror or exc}")
        raise typer.Exit(1) from None
    except UnicodeDecodeError:
        err.print(f"{path}: the policy file is not UTF-8 text")
        raise typer.Exit(1) from None
    try:
        return load_policy(text), text
    except PolicyError as exc:
        for issue in exc.issues:
            err.print(f"{path}: {issue}", markup=False)
        count = len(exc.issues)
        err.print(f"{path}: {count} error{'s' if count != 1 else ''}; nothing was changed")
        raise typer.Exit(1) from None


@app.command()
def check(path: Annotated[Path, typer.Argument(help="Policy file to validate.")]) -> None:
    """Validate a policy file: print every error with its key path and line, or a summary."""
    policy, _ = read_policy_or_exit(path)
    out.print(f"{path}: valid policy, {len(policy.services)} services", markup=False)
    for name, service in policy.services.items():
        cap = format_size(service.memory.cap) if service.memory.cap else "none"
        ttl = format_duration(service.idle_ttl) if service.idle_ttl else "never"
        protect = "" if service.residency.value == "pinned" else f", protect {_protect(service)}"
        out.print(
            f"  {name}: {service.kind} {service.residency} priority {service.priority}, "
            f"estimate {format_size(service.memory.estimate)} cap {cap}, idle unload {ttl}"
            f"{protect}, models {', '.join(service.models)}",
            markup=False,
        )
    for window in policy.maintenance.windows:
        out.print(
            f"  window {window.name}: '{window.cron}' {window.timezone} for "
            f"{format_duration(window.duration)}",
            markup=False,
        )


@app.command()
def schema() -> None:
    """Print the JSON Schema of the policy file (for editor completion)."""
    out.print_json(json.dumps(policy_json_schema()))


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    db: Annotated[Path | None, typer.Option(help="SQLite database file.")] = None,
) -> None:
    """Run the daemon."""
    import uvicorn

    from service.app import create_app
    from service.server import DaemonServer

    settings = _settings(config=config, host=host, port=port, db=db)
    policy, _ = read_policy_or_exit(settings.config)
    address = server_address(settings, policy)
    problem = refuse_unsafe_bind(address.host, policy)
    if problem:
        err.print(problem)
        raise typer.Exit(1)
    configure_logging(settings.log_level)
    preflight_database(address.database)
    application = create_app(settings)
    server = DaemonServer(
        application,
        uvicorn.Config(
            application,
            host=address.host,
            port=address.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=30,
        ),
    )
    server.run()
    if getattr(application.state, "startup_failed", None):
        raise typer.Exit(1)


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
        raise typer.Exit(1) from None


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
        raise typer.Exit(1) from None
    out.print(f"{path}: database is at the newest schema", markup=False)


def configure_logging(level: str) -> None:
    """vramd's own log lines (decisions, state changes) on stderr beside uvicorn's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("vramd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _protect(service: Service) -> str:
    if service.protect == "never":
        return "never"
    return format_duration(service.protect) if service.protect else "0s"


def _settings(**overrides: Any) -> Settings:
    return Settings(**{key: value for key, value in overrides.items() if value is not None})


def client_settings(url: str | None) -> ClientSettings:
    settings = ClientSettings()
    if url:
        settings = settings.model_copy(update={"url": url})
    return settings


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


from service import cli_client  # noqa: E402,F401  (registers client commands)

if __name__ == "__main__":
    # ``python -m service.cli`` runs this file as __main__, a second copy of the module;
    # the client commands registered themselves on the importable one, so run that.
    from service.cli import main as registered_main

    registered_main()
