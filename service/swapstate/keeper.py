"""StateKeeper: saves a service's slots before every stop vramd chooses, restores them
after the next start, and checks that they took (docs/policy.md, "State across swaps").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.clock import Clock
from service.domain import EventKind, Flag
from service.live.events import EventLog
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.supervisor.launch import uses_state_dir
from service.swapstate.files import Identity, Manifest, SavedSlot, StateDir, over_budget
from service.swapstate.slots import SlotActionFailed, list_slots, restore_slot, save_slot
from service.swapstate.verify import ANSWERS_TO_WAIT, Restored, keep_text, verdict
from service.units import format_size

SLOTS_TIMEOUT_S = 5.0
SAVE_TIMEOUT_S = 120.0
# A restore may take this long, plus the time to read its bytes at a slow disk's pace.
RESTORE_BASE_S = 2.0
RESTORE_BYTES_PER_S = 200 * 1024**2

FlagRaiser = Callable[[ServiceRuntime, str, str], None]
FlagClearer = Callable[[ServiceRuntime, Iterable[str], str], None]


@dataclass
class StateFigures:
    """What ``/api/services``, ``vramd ps`` and ``/metrics`` show of a service's state."""

    saved_bytes: int = 0
    saved_slots: int = 0
    saved_tokens: int = 0
    saves: int = 0
    restores: int = 0
    tokens_restored: int = 0
    # Prompt tokens the first request after a restore took from the restored cache.
    tokens_not_reprocessed: int = 0
    last_save_ms: float | None = None
    last_restore_ms: float | None = None
    ineffective: str | None = None

    def view(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Pending:
    """A restore waiting for the answer that says whether it took."""

    slots: list[Restored]
    answers_left: int = ANSWERS_TO_WAIT


@dataclass
class _Service:
    dir: StateDir
    figures: StateFigures = field(default_factory=StateFigures)
    identity: Identity | None = None  # of the instance running now (set at spawn)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    saved_run: float | None = None  # ready_at of the instance already saved
    pending: _Pending | None = None


class StateKeeper:
    """The kernel's effects call it at two moments, and it never holds up more than it must:

    - ``save`` runs after a stop is decided and before the process is signalled (the
      instance takes no new requests by then). Each slot that may hold tokens is saved to a
      temporary name and renamed once llama-server answers, so a stop that cuts a save short
      leaves the previous file. The disk budget then drops the oldest files.
    - ``restore`` runs after the new instance answers health and before the scheduler
      hears it is ready, so no request can land in a slot being restored. Each call has a
      timeout sized to the bytes to read; a restore that fails or hangs is an event and the
      instance is declared ready anyway.

    A crash saves nothing: ``save`` is only called on stops vramd carries out; what was saved
    before stays. State is dropped, with an event that says why, when the runtime's identity
    (``files.Identity``) no longer matches, and when a restore is seen to have done nothing
    (``state-ineffective``): then saving stops for that service until its command changes.
    """

    def __init__(
        self,
        root: Path | None,
        *,
        runtimes: RuntimeTable,
        events: EventLog,
        clock: Clock,
        flag: FlagRaiser,
        clear_flags: FlagClearer,
    ) -> None:
        """``root``: where the per-service directories go (``state/`` beside the
        database); None keeps no state (``${STATE_DIR}`` is then a temporary path)."""
        self._root = root
        self._runtimes = runtimes
        self._events = events
        self._clock = clock
        self._flag = flag
        self._clear_flags = clear_flags
        self._services: dict[str, _Service] = {}

    # ------------------------------------------------------------------ reading

    def state_dir(self, name: str) -> str:
        """``${STATE_DIR}`` for ``name``, created (0700) if it does not exist."""
        return str(self._service(name).dir.ensure())

    def figures(self, name: str) -> StateFigures:
        """The service's figures; what is saved on disk is read once, when first asked."""
        service = self._services.get(name)
        if service is None:
            service = self._service(name)
            self._show_saved(service, service.dir.read())
        return service.figures

    def checking(self, name: str) -> Callable[[bytes, bytes], None] | None:
        """A reader of (request, answer) while a restore awaits its verdict, else None."""
        service = self._services.get(name)
        if service is None or service.pending is None:
            return None
        return lambda request, answer: self._answer(name, request, answer)

    # ---------------------------------------------------------------- lifecycle

    def spawning(self, rt: ServiceRuntime) -> None:
        """A new process of ``rt`` is about to start: its identity decides what it may
        restore, and a changed command lifts ``state-ineffective``. Also for a service
        that only names ``${STATE_DIR}``: ``state`` may be switched on in place later."""
        if rt.spec.state is None and not uses_state_dir(rt.spec):
            return
        service = self._service(rt.name)
        service.pending = None
        service.identity = Identity.of(rt.spec.command, rt.spec.env, rt.spec.cwd)
        if rt.spec.state is None:
            return
        manifest = service.dir.read()
        why = manifest.ineffective_for(service.identity)
        service.figures.ineffective = why
        self._show_saved(service, manifest)
        if why is None and Flag.STATE_INEFFECTIVE in rt.health.flags:
            self._clear_flags(rt, {Flag.STATE_INEFFECTIVE}, "a changed command")
        elif why is not None and Flag.STATE_INEFFECTIVE not in rt.health.flags:
            # Found on disk (the daemon restarted): the verdict still holds.
            self._flag(rt, Flag.STATE_INEFFECTIVE, f"saving is off: {why}")

    async def save(self, rt: ServiceRuntime, reason: str) -> None:
        """Save every slot that may hold tokens; never raises."""
        service = self._services.get(rt.name)
        client, ready_at = rt.client, rt.instance.ready_at
        if rt.spec.state is None or service is None or client is None or service.identity is None:
            return
        async with service.lock:
            if service.saved_run == ready_at:
                return  # this instance was saved already (a stop and the shutdown)
            service.saved_run = ready_at
            manifest = service.dir.read()
            if manifest.ineffective_for(service.identity) is not None:
                return
            started = time.perf_counter()
            saved, failures = await self._save_slots(client, service.dir)
            ms = (time.perf_counter() - started) * 1000
            manifest.identity, manifest.slots = service.identity, saved
            dropped = over_budget(saved, rt.spec.state.disk)
            if dropped:
                manifest.slots = [s for s in saved if s not in dropped]
            service.dir.write(manifest)
            service.dir.sweep(s.file for s in manifest.slots)
            self._show_saved(service, manifest)
            service.figures.saves += 1
            service.figures.last_save_ms = round(ms, 1)
            self._record_save(rt, manifest, ms, reason, dropped, failures)

    async def _save_slots(self, client: Any, folder: StateDir) -> tuple[list[SavedSlot], list[str]]:
        failures: list[str] = []
        try:
            slots = await list_slots(client, timeout_s=SLOTS_TIMEOUT_S)
        except SlotActionFailed as exc:
            return [], [str(exc)]
        saved: list[SavedSlot] = []
        for info in slots:
            if info.tokens == 0:
                continue
            name, temp = f"slot-{info.slot}.bin", f"slot-{info.slot}.saving.bin"
            try:
                done = await save_slot(client, info.slot, temp, timeout_s=SAVE_TIMEOUT_S)
            except SlotActionFailed as exc:
                failures.append(str(exc))
                folder.remove([temp])
                if "HTTP" not in str(exc):
                    break  # the runtime is gone or stuck: the rest would fail too
                continue
            if done.tokens == 0:
                folder.remove([temp])
                continue
            try:
                (folder.path / temp).replace(folder.path / name)
            except OSError as exc:
                failures.append(f"slot {info.slot}: {exc}")
                continue
            head, tail = keep_text(info.text)
            saved.append(
                SavedSlot(info.slot, name, done.tokens, done.bytes, self._clock.now(), head, tail)
            )
        return saved, failures

    async def restore(self, rt: ServiceRuntime) -> None:
        """Restore what the last instance saved, if it belongs to this one; never raises."""
        service = self._services.get(rt.name)
        client = rt.client
        if rt.spec.state is None or service is None or client is None or service.identity is None:
            return
        async with service.lock:
            manifest = service.dir.read()
            if not manifest.slots:
                return
            change = (
                service.identity.change_from(manifest.identity)
                if manifest.identity is not None
                else "no identity was recorded"
            )
            if change is not None:
                self._drop(rt, service, manifest, f"not restored: {change}")
                return
            started = time.perf_counter()
            restored, failures, short = await self._restore_slots(client, manifest.slots)
            ms = (time.perf_counter() - started) * 1000
        figures = service.figures
        figures.restores += 1
        figures.last_restore_ms = round(ms, 1)
        figures.tokens_restored += sum(s.tokens for s in restored)
        self._record_restore(rt, manifest, restored, ms, failures)
        if short:
            self.ineffective(rt, short)
        elif restored:
            service.pending = _Pending(restored)

    async def _restore_slots(
        self, client: Any, slots: list[SavedSlot]
    ) -> tuple[list[Restored], list[str], str | None]:
        restored: list[Restored] = []
        failures: list[str] = []
        for saved in slots:
            timeout = RESTORE_BASE_S + saved.bytes / RESTORE_BYTES_PER_S
            try:
                done = await restore_slot(client, saved.slot, saved.file, timeout_s=timeout)
            except SlotActionFailed as exc:
                failures.append(str(exc))
                if "HTTP" not in str(exc):
                    break  # a hung or dead runtime: do not make waiters wait for more
                continue
            if done.tokens < saved.tokens:
                short = f"slot {saved.slot} restored {done.tokens} of {saved.tokens} saved tokens"
                return restored, failures, short
            restored.append(Restored(saved.slot, saved.tokens, saved.head, saved.tail))
        return restored, failures, None

    def ineffective(self, rt: ServiceRuntime, why: str) -> None:
        """A restore did nothing: drop the files, stop saving, raise the flag."""
        service = self._service(rt.name)
        service.pending = None
        manifest = service.dir.read()
        if service.identity is not None:
            manifest.ineffective = {"identity": service.identity.to_json(), "why": why}
        service.figures.ineffective = why
        self._drop(rt, service, manifest, f"restore did nothing ({why})", kind=None)
        self._flag(
            rt,
            Flag.STATE_INEFFECTIVE,
            f"a restore did nothing ({why}); saved state dropped and saving stopped "
            "until the command changes",
        )

    def stopped(self, name: str) -> None:
        """The instance is gone: a pending verdict can no longer come."""
        service = self._services.get(name)
        if service is not None:
            service.pending = None

    # ---------------------------------------------------------------- internals

    def _answer(self, name: str, request: bytes, answer: bytes) -> None:
        service = self._services.get(name)
        pending = service.pending if service is not None else None
        if service is None or pending is None:
            return
        found = verdict(pending.slots, request, answer)
        if found is None:
            pending.answers_left -= 1
            if pending.answers_left <= 0:
                service.pending = None
            return
        service.pending = None
        took, cached = found
        if took:
            service.figures.tokens_not_reprocessed += cached
            self._events.record(
                EventKind.STATE_VERIFIED,
                f"{name}: the first request after the restore re-used {cached} cached tokens",
                service=name,
                data={"cache_n": cached},
            )
        else:
            rt = self._runtimes.get(name)
            if rt is not None:
                why = "the first request continuing a restored conversation re-used 0 tokens"
                self.ineffective(rt, why)

    def _drop(
        self,
        rt: ServiceRuntime,
        service: _Service,
        manifest: Manifest,
        why: str,
        *,
        kind: EventKind | None = EventKind.STATE_DROPPED,
    ) -> None:
        files = [s.file for s in manifest.slots]
        manifest.slots = []
        service.dir.write(manifest)
        service.dir.sweep([])
        self._show_saved(service, manifest)
        message = f"{rt.name}: saved state {why}; {len(files)} file(s) dropped"
        self._events.record(
            kind or EventKind.STATE_INEFFECTIVE,
            message,
            service=rt.name,
            data={"why": why, "files": files},
        )

    def _service(self, name: str) -> _Service:
        service = self._services.get(name)
        if service is None:
            root = self._root or Path("/tmp/vramd-state")
            service = self._services[name] = _Service(StateDir(root / name))
        return service

    @staticmethod
    def _show_saved(service: _Service, manifest: Manifest) -> None:
        figures = service.figures
        figures.saved_bytes, figures.saved_tokens = manifest.bytes, manifest.tokens
        figures.saved_slots = len(manifest.slots)

    def _record_save(
        self,
        rt: ServiceRuntime,
        manifest: Manifest,
        ms: float,
        reason: str,
        dropped: list[SavedSlot],
        failures: list[str],
    ) -> None:
        text = (
            f"{rt.name}: saved {len(manifest.slots)} slot(s), {manifest.tokens} tokens, "
            f"{format_size(manifest.bytes)} in {ms:.0f} ms ({reason})"
        )
        if dropped:
            text += f"; {len(dropped)} oldest file(s) dropped for state.disk"
        if failures:
            text += f"; {len(failures)} failed: {failures[0]}"
        self._events.record(
            EventKind.STATE_SAVE,
            text,
            service=rt.name,
            data={
                "slots": [s.slot for s in manifest.slots],
                "tokens": manifest.tokens,
                "bytes": manifest.bytes,
                "ms": round(ms, 1),
                "reason": reason,
                "dropped": [s.file for s in dropped],
                "failures": failures,
            },
        )

    def _record_restore(
        self,
        rt: ServiceRuntime,
        manifest: Manifest,
        restored: list[Restored],
        ms: float,
        failures: list[str],
    ) -> None:
        tokens = sum(s.tokens for s in restored)
        size = sum(s.bytes for s in manifest.slots if s.slot in {r.slot for r in restored})
        text = (
            f"{rt.name}: restored {len(restored)} of {len(manifest.slots)} slot(s), "
            f"{tokens} tokens, {format_size(size)} in {ms:.0f} ms"
        )
        if failures:
            text += f"; {len(failures)} failed: {failures[0]}"
        self._events.record(
            EventKind.STATE_RESTORE,
            text,
            service=rt.name,
            data={
                "slots": [s.slot for s in restored],
                "tokens": tokens,
                "bytes": size,
                "ms": round(ms, 1),
                "failures": failures,
            },
        )
