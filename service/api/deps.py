"""What routes depend on, as ``Annotated`` aliases; routes never reach into ``app.state``.

Routes see the kernel (``Orchestrator``) and, for reading history, the store; the
bundle the app factory builds (``service.app.Daemon``) stays out of their reach, and
so do processes and probes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.api.metrics import Metrics
from service.kernel.orchestrator import Orchestrator
from service.store import Store, StoreWriter


def get_orchestrator(request: Request) -> Orchestrator:
    orchestrator: Orchestrator = request.app.state.daemon.orchestrator
    return orchestrator


def get_store(request: Request) -> Store:
    store: Store = request.app.state.daemon.store
    return store


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.daemon.metrics
    return metrics


def get_writer(request: Request) -> StoreWriter:
    writer: StoreWriter = request.app.state.daemon.writer
    return writer


MetricsDep = Annotated[Metrics, Depends(get_metrics)]
OrchestratorDep = Annotated[Orchestrator, Depends(get_orchestrator)]
StoreDep = Annotated[Store, Depends(get_store)]
WriterDep = Annotated[StoreWriter, Depends(get_writer)]
