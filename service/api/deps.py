"""What routes depend on, as ``Annotated`` aliases; routes never reach into ``app.state``.

``Daemon`` is the bundle the app factory builds in its lifespan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from service.clock import Clock
from service.devices import DeviceProbe
from service.orchestrator import Orchestrator
from service.settings import Settings
from service.store import Store, StoreWriter
from service.store.lock import DatabaseLock


@dataclass
class Daemon:
    """Everything the routes reach, built once per app in the lifespan."""

    settings: Settings
    store: Store
    writer: StoreWriter
    probe: DeviceProbe
    clock: Clock
    orchestrator: Orchestrator
    lock: DatabaseLock


def get_daemon(request: Request) -> Daemon:
    daemon: Daemon = request.app.state.daemon
    return daemon


def get_orchestrator(request: Request) -> Orchestrator:
    return get_daemon(request).orchestrator


def get_store(request: Request) -> Store:
    return get_daemon(request).store


def get_writer(request: Request) -> StoreWriter:
    return get_daemon(request).writer


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
OrchestratorDep = Annotated[Orchestrator, Depends(get_orchestrator)]
StoreDep = Annotated[Store, Depends(get_store)]
WriterDep = Annotated[StoreWriter, Depends(get_writer)]
