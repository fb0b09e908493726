"""``diff_policies``: what applying one policy over another changes, service by service.

``vramd apply`` prints it before asking, and ``POST /api/policy`` returns it. A changed
field in ``RESTART_FIELDS`` (or a cap change that a ``${CAP_*}`` argument carries) means
the service restarts, drained; every other change takes effect in place.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from service.policy.placeholders import CAP_PLACEHOLDERS, placeholders_in
from service.policy.schema import Policy, Service

# Fields whose change alters the process a service runs: applying such a change restarts
# the service at once, drained (docs/policy.md, "Applying a changed policy"). Everything
# else takes effect in place.
RESTART_FIELDS = frozenset({"kind", "command", "env", "cwd", "health", "gpus", "span"})


def process_defining(service: Service) -> dict[str, Any]:
    """What defines the process ``service`` runs: ``RESTART_FIELDS``, the split of a span
    instance, and the cap and first model where its command or env carries them
    (``${CAP_*}``, ``${MODEL}``). Applying a change of any restarts the service; a
    runtime a previous daemon left is adopted only if none changed (``process_identity``)."""
    dump = service.model_dump(mode="json")
    defining = {key: dump[key] for key in sorted(RESTART_FIELDS)}
    defining["memory.split"] = dump["memory"]["split"]
    carried = {
        p for text in [*service.command, *service.env.values()] for p in placeholders_in(text)
    }
    if carried & CAP_PLACEHOLDERS:
        defining["memory.cap"] = dump["memory"]["cap"]
    if "MODEL" in carried:
        defining["model"] = service.models[0]
    return defining


def process_identity(service: Service) -> str:
    """A SHA-256 of ``process_defining``: recorded with each instance, compared at adoption."""
    text = json.dumps(process_defining(service), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ServiceChange(BaseModel):
    name: str
    fields: dict[str, tuple[Any, Any]]
    restart: bool


class PolicyDiff(BaseModel):
    """What applying ``new`` over ``old`` changes, for ``vramd apply`` and the API."""

    added: list[str] = []
    removed: list[str] = []
    changed: list[ServiceChange] = []
    windows_added: list[str] = []
    windows_removed: list[str] = []
    windows_changed: list[str] = []
    settings_changed: list[str] = []

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.added,
                self.removed,
                self.changed,
                self.windows_added,
                self.windows_removed,
                self.windows_changed,
                self.settings_changed,
            )
        )

    def lines(self) -> list[str]:
        """The diff as plain lines: ``+ svc``, ``- svc``, ``~ svc.field: old -> new``."""
        out = [f"+ service {name}" for name in self.added]
        out += [f"- service {name}" for name in self.removed]
        for change in self.changed:
            note = " (restarts, drained)" if change.restart else ""
            out.append(f"~ service {change.name}{note}")
            out += [f"    {key}: {old!r} -> {new!r}" for key, (old, new) in change.fields.items()]
        out += [f"+ window {name}" for name in self.windows_added]
        out += [f"- window {name}" for name in self.windows_removed]
        out += [f"~ window {name}" for name in self.windows_changed]
        out += [f"~ {key}" for key in self.settings_changed]
        return out or ["no changes"]


def diff_policies(old: Policy | None, new: Policy) -> PolicyDiff:
    old_services = old.services if old else {}
    diff = PolicyDiff(
        added=sorted(set(new.services) - set(old_services)),
        removed=sorted(set(old_services) - set(new.services)),
    )
    for name in sorted(set(new.services) & set(old_services)):
        before = old_services[name].model_dump(mode="json")
        after = new.services[name].model_dump(mode="json")
        fields = _changed_fields(before, after)
        if fields:
            # A span instance's devices are charged by its split: a new split is a new
            # placement, so it counts as a new process too.
            restart = process_defining(old_services[name]) != process_defining(new.services[name])
            diff.changed.append(ServiceChange(name=name, fields=fields, restart=restart))
    old_windows = {w.name: w for w in old.maintenance.windows} if old else {}
    new_windows = {w.name: w for w in new.maintenance.windows}
    diff.windows_added = sorted(set(new_windows) - set(old_windows))
    diff.windows_removed = sorted(set(old_windows) - set(new_windows))
    diff.windows_changed = sorted(
        name
        for name in set(new_windows) & set(old_windows)
        if new_windows[name] != old_windows[name]
    )
    if old is not None:
        for section in ("server", "device", "defaults"):
            fields = _changed_fields(
                getattr(old, section).model_dump(mode="json"),
                getattr(new, section).model_dump(mode="json"),
            )
            diff.settings_changed += [f"{section}.{key}" for key in fields]
    return diff


def _changed_fields(
    before: dict[str, Any], after: dict[str, Any], prefix: str = ""
) -> dict[str, tuple[Any, Any]]:
    changes: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key != "env":
            changes.update(_changed_fields(a, b, f"{prefix}{key}."))
        elif a != b:
            changes[f"{prefix}{key}"] = (a, b)
    return changes
