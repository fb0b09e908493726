"""A service's state directory: the saved slot files, their manifest, and the identity
they belong to (docs/policy.md, "State across swaps").
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("vramd.swapstate")

MANIFEST = "vramd-state.json"


@dataclass(frozen=True)
class Identity:
    """The runtime a state file belongs to: its command, env and named files."""

    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    # (path, size, mtime in ns) of every existing file the command or env names.
    files: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, command: Sequence[str], env: Mapping[str, str], cwd: str | None) -> Identity:
        named: dict[str, tuple[int, int]] = {}
        for text in [*command, *env.values()]:
            for candidate in _paths_in(text):
                path = Path(cwd or ".", candidate) if not os.path.isabs(candidate) else None
                try:
                    stat = (path or Path(candidate)).stat()
                except (OSError, ValueError):
                    continue
                if (path or Path(candidate)).is_file():
                    named[candidate] = (stat.st_size, stat.st_mtime_ns)
        files = tuple((p, size, mtime) for p, (size, mtime) in sorted(named.items()))
        return cls(tuple(command), tuple(sorted(env.items())), files)

    def change_from(self, saved: Identity) -> str | None:
        """Why state saved by ``saved`` cannot be restored into this runtime; None if it can."""
        if saved.command != self.command:
            return "the command changed"
        if saved.env != self.env:
            return "the env changed"
        now = {path: (size, mtime) for path, size, mtime in self.files}
        for path, size, mtime in saved.files:
            if path not in now:
                return f"{path} is gone"
            if now[path] != (size, mtime):
                return f"{path} changed (size or mtime)"
        added = set(now) - {path for path, _, _ in saved.files}
        if added:
            return f"the command now names {sorted(added)[0]}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "env": dict(self.env), "files": self.files}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Identity:
        return cls(
            tuple(str(a) for a in data["command"]),
            tuple(sorted((str(k), str(v)) for k, v in dict(data["env"]).items())),
            tuple((str(p), int(s), int(m)) for p, s, m in data["files"]),
        )


def _paths_in(text: str) -> list[str]:
    """The argument itself, and the value of ``--flag=value``; never a placeholder."""
    found = [text]
    if text.startswith("-") and "=" in text:
        found.append(text.split("=", 1)[1])
    return [t for t in found if t and "${" not in t and not t.startswith("-")]


@dataclass(frozen=True)
class SavedSlot:
    slot: int
    file: str
    tokens: int
    bytes: int
    saved_at: float  # wall time
    # The start and end of the text the slot held (when the runtime said), to recognise
    # the request that continues it (``verify.continues``).
    head: str = ""
    tail: str = ""


@dataclass
class Manifest:
    identity: Identity | None = None
    slots: list[SavedSlot] = field(default_factory=list)
    # Restores were seen not to work for this identity: {"identity": ..., "why": ...}.
    ineffective: dict[str, Any] | None = None

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.slots)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slots)

    def ineffective_for(self, identity: Identity) -> str | None:
        """Why saving is off for ``identity`` (restores did nothing for it), else None."""
        marked = self.ineffective
        if marked is None:
            return None
        try:
            same = Identity.from_json(marked["identity"]).change_from(identity) is None
        except (KeyError, TypeError, ValueError):
            return None
        return str(marked.get("why", "restores did nothing")) if same else None


class StateDir:
    """One service's ``${STATE_DIR}``: created with the daemon's user only (0700).

    ``${STATE_DIR}`` is ``state/<service>`` beside the database. llama-server writes the
    slot files there itself (``--slot-save-path``); vramd writes ``vramd-state.json`` beside
    them: which slot each file holds, its tokens, bytes and when it was saved, the identity
    of the runtime that saved them, and whether restores were found not to work for that
    identity. Every write of the manifest replaces it whole (write, fsync, rename), so a
    crash leaves the old manifest or the new one, never half of one.

    The identity is what the saved bytes are only valid for: the command line and env as the
    policy writes them (placeholders unexpanded, so a new port is not a new runtime), and
    the size and mtime of every file the command names. A changed model, context size or
    build never gets old state restored into it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def ensure(self) -> Path:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.path

    def read(self) -> Manifest:
        """The manifest; an empty one if there is none or it cannot be read."""
        try:
            data = json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
            identity = data.get("identity")
            return Manifest(
                identity=Identity.from_json(identity) if identity else None,
                slots=[SavedSlot(**slot) for slot in data.get("slots", [])],
                ineffective=data.get("ineffective"),
            )
        except FileNotFoundError:
            return Manifest()
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("%s: unreadable state manifest (%s); starting afresh", self.path, exc)
            return Manifest()

    def write(self, manifest: Manifest) -> None:
        self.ensure()
        data = {
            "identity": manifest.identity.to_json() if manifest.identity else None,
            "slots": [asdict(slot) for slot in manifest.slots],
            "ineffective": manifest.ineffective,
        }
        tmp = self.path / (MANIFEST + ".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path / MANIFEST)

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                (self.path / name).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("%s: cannot remove %s: %s", self.path, name, exc)

    def sweep(self, keep: Iterable[str]) -> None:
        """Remove every file the manifest does not list (half-written saves, old slots)."""
        kept = {MANIFEST, *keep}
        try:
            names = [p.name for p in self.path.iterdir() if p.is_file()]
        except FileNotFoundError:
            return
        self.remove(name for name in names if name not in kept)


def over_budget(slots: Sequence[SavedSlot], disk: int) -> list[SavedSlot]:
    """The slots to drop, oldest first, until the rest fit in ``disk`` bytes."""
    total = sum(slot.bytes for slot in slots)
    dropped: list[SavedSlot] = []
    for slot in sorted(slots, key=lambda s: (s.saved_at, s.slot)):
        if total <= disk:
            break
        dropped.append(slot)
        total -= slot.bytes
    return dropped
