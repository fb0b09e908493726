"""SIGHUP: apply the policy file again; an invalid file is reported and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from service.domain import EventKind
from service.errors import PolicyError

if TYPE_CHECKING:
    from service.kernel.orchestrator import Orchestrator


async def reload_policy_file(orchestrator: Orchestrator, path: Path) -> None:
    events = orchestrator.events
    try:
        result = await orchestrator.apply_policy(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, UnicodeDecodeError) as exc:
        events.record(EventKind.POLICY_ERROR, f"SIGHUP: cannot read {path}: {exc}")
    except PolicyError as exc:
        events.record(
            EventKind.POLICY_ERROR,
            f"SIGHUP: {path} is invalid; nothing changed: {exc}",
            data={"errors": [issue.as_dict() for issue in exc.issues]},
        )
    else:
        if not result.changed:
            events.record(EventKind.POLICY, f"SIGHUP: {path} unchanged")
