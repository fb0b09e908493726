"""The ``vramd`` command (docs/cli.md), assembled from its parts.

    console.py    the consoles, exit codes and one-line failures every command shares
    daemon.py     commands on this machine, no daemon needed: check, schema, serve, db, import
    client.py     commands that talk to a running daemon over HTTP: ps, load ... usage
    windows.py    the ``windows`` group, a client command group of its own
    render.py     how the daemon's JSON reads on a terminal: its tables and lines
    admin_api.py  AdminClient: the admin API's requests, typed, for the client commands
    __main__.py   ``python -m service.cli``: the ``vramd`` command, as the tests and make run it

Imports go one way: ``console``, ``render`` and ``admin_api`` import no other part,
``daemon`` and ``client`` import them, ``windows`` imports ``client``, and this module imports the
command modules and registers their commands in the order ``vramd --help`` lists them
(typer lists single commands first, then groups).
"""

from __future__ import annotations

import sys

import typer

from service.cli import client, daemon
from service.cli.windows import windows_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="vramd",
    help="One daemon that owns the accelerator memory and runs local AI runtimes.",
    no_args_is_help=True,
    add_completion=False,
)

for command in (
    daemon.check,
    daemon.schema,
    daemon.serve,
    client.ps,
    client.load,
    client.unload,
    client.restart,
    client.explain,
    client.apply,
    client.events,
    client.incidents,
    client.usage,
):
    app.command()(command)
app.add_typer(daemon.db_app, name="db")
app.add_typer(windows_app, name="windows")
app.add_typer(daemon.import_app, name="import")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
