"""The command line of ``python -m service.real_runtimes``.

``exec KIND --port P [--model NAME]`` turns into the runtime ``runtimes.json`` names for
KIND (``os.execvpe``: the same process, so the daemon supervises, signals and measures the
runtime itself, not a wrapper). It lets a policy kept in the repository
(``config/real.yaml``) run runtimes whose paths are only known once installed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from service.real_runtimes.catalog import CatalogError, catalog_dir, load_catalog


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["install"]:
        from service.real_runtimes.install import main as install

        return install(args[1:])
    parser = argparse.ArgumentParser(prog="python -m service.real_runtimes")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="install or build every runtime (make real-runtimes)")
    commands.add_parser("show", help="print each kind's command from runtimes.json")
    run = commands.add_parser("exec", help="become one kind's runtime")
    run.add_argument("kind")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--model", default="model", help="the name it serves (${MODEL})")
    options = parser.parse_args(args)
    try:
        catalog = load_catalog()
    except CatalogError as exc:
        print(f"vramd real runtimes: {exc}", file=sys.stderr)
        return 2
    if options.command == "show":
        print(f"# {catalog_dir()}")
        for kind, shown in catalog.items():
            env = " ".join(f"{key}={shlex.quote(value)}" for key, value in shown.env.items())
            print(f"{kind:15} {shown.adapter:12} {shown.version}")
            print(f"  {env + ' ' if env else ''}{shlex.join(shown.command)}")
        return 0
    entry = catalog.get(options.kind)
    if entry is None:
        known = ", ".join(catalog)
        print(
            f"vramd real runtimes: no {options.kind!r} in runtimes.json ({known})", file=sys.stderr
        )
        return 2
    argv_ = entry.argv(port=options.port, model=options.model)
    os.execvpe(argv_[0], argv_, {**os.environ, **entry.env})
