"""llama.cpp's slots: the prompt each one keeps cached, the slot a request takes, timings."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from service.demo_runtime.replies import Reply

T = TypeVar("T")
SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default
# Routes whose answers carry llama-server's ``timings`` object.
TIMED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # the cached prompt
    held: list[int] = field(default_factory=list)  # KV tokens of each request in it now
    last_used: int = 0  # when a request last took it, on SlotCache's clock

    @property
    def busy(self) -> bool:
        return bool(self.held)


@dataclass(frozen=True)
class Claim:
    """A request's place in a slot: what it re-uses, processes, and leaves behind."""

    slot: int
    tokens: list[int]
    held: int
    cache_n: int
    owner: bool  # False when it found no idle slot: it then leaves the cache alone

    @property
    def prompt_n(self) -> int:
        return len(self.tokens) - self.cache_n


@dataclass(frozen=True)
class SlotView:
    """What ``GET /slots`` shows of one slot."""

    id: int
    busy: bool
    held: int  # KV tokens of the requests in it (busy), or of its cached prompt (idle)


def common_prefix(left: list[int], right: list[int]) -> int:
    count = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        count += 1
    return count


class SlotCache:
    """The slots of one runtime; every change happens under one condition's lock.

    Each of the ``--parallel`` slots keeps the tokens of the last prompt it processed (the
    prompt only, not the reply: a follow-up repeats the reply after an assistant marker, so
    the prompt is the prefix it can share). An inference request takes the idle slot whose
    cached tokens share the longest common prefix with its prompt, the lowest id on a tie, as
    long as that prefix is over a tenth of the prompt (llama-server's default
    ``--slot-prompt-similarity 0.1``); otherwise the least recently used idle slot, the
    lowest id among those never used (llama.cpp then takes the highest). The request re-uses
    the common prefix (``cache_n``) and processes the rest (``prompt_n``), at least one token,
    as llama.cpp must to get logits. Once answered (an error answer changes nothing) the slot
    holds the new prompt. The demo does not queue requests beyond ``--parallel``: a request
    that finds no idle slot shares the least crowded busy one, re-uses nothing and leaves its
    cache alone, so the busy slots of ``GET /slots`` still hold every request in flight.

    ``SlotCache.act`` runs a slot action (save, restore, erase: ``slot_actions``) once the slot
    is idle, as llama.cpp defers such a task while the slot works. ``with_timings`` adds
    llama-server's ``timings`` object to a chat or completions answer (to the last data chunk
    of a stream).
    """

    def __init__(self, count: int, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self._slots = [Slot(index) for index in range(count)]
        self._changed = threading.Condition()
        self._clock = 0

    def __len__(self) -> int:
        return len(self._slots)

    def claim(self, tokens: list[int], held: int) -> Claim:
        """Put a request with this prompt in a slot; ``held`` is the KV tokens it holds."""
        with self._changed:
            self._clock += 1
            best = self._pick(tokens)
            if best is None:  # every slot busy: share the least crowded one
                best = min(self._slots, key=lambda slot: (len(slot.held), slot.id))
                claim = Claim(best.id, tokens, held, 0, owner=False)
            else:
                cache_n = common_prefix(best.tokens, tokens)
                if cache_n == len(tokens) and cache_n > 0:
                    cache_n -= 1  # llama.cpp evaluates at least one token, for its logits
                claim = Claim(best.id, tokens, held, cache_n, owner=True)
                best.last_used = self._clock
            best.held.append(held)
            return claim

    def _pick(self, tokens: list[int]) -> Slot | None:
        """llama.cpp's choice: the idle slot most similar to the prompt (the common prefix
        over the prompt's length, above SIMILARITY), else the least recently used one."""
        idle = [slot for slot in self._slots if not slot.busy]
        best, best_share = None, SIMILARITY
        for slot in idle:
            share = common_prefix(slot.tokens, tokens) / len(tokens) if tokens else 0.0
            if slot.tokens and share > best_share:
                best, best_share = slot, share
        if best is None and idle:
            best = min(idle, key=lambda slot: (slot.last_used, slot.id))
        return best

    def release(self, claim: Claim, *, keep: bool = True) -> None:
        """The request is done: its slot keeps its prompt (with ``keep``), and may be idle
        again."""
        with self._changed:
            slot = self._slots[claim.slot]
            slot.held.remove(claim.held)
            if claim.owner and keep:
                slot.tokens = list(claim.tokens)
            self._changed.notify_all()

    def view(self) -> list[SlotView]:
        with self._changed:
            return [
                SlotView(slot.id, slot.busy, sum(slot.held) if slot.busy else len(slot.tokens))
                for slot in self._slots
            ]

    def act(self, index: int, action: Callable[[Slot], T]) -> T:
        """Run ``action`` on slot ``index`` once it is idle, with no request let in meanwhile."""
        with self._changed:
            slot = self._slots[index]
            self._changed.wait_for(lambda: not slot.busy)
            return action(slot)


def timings(
    cache_n: int, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float
) -> dict[str, object]:
    """llama-server's ``timings`` object (server_slot_stats::to_json), field for field."""
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n > 0 else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n > 0 else 0.0,
        "predicted_per_second": 1e3 / predicted_ms * predicted_n if predicted_ms > 0 else 0.0,
    }


def with_timings(reply: Reply, stats: dict[str, object]) -> Reply:
    """The answer with ``timings`` added: to its JSON body, or to a stream's last event."""
    if reply.status != 200:
        return reply
    if reply.events is not None:
        if reply.named_events or not reply.events:
            return reply
        return replace(reply, events=[*reply.events[:-1], {**reply.events[-1], "timings": stats}])
    try:
        body = json.loads(reply.body)
    except ValueError:
        return reply
    if not isinstance(body, dict) or "choices" not in body:
        return reply
    return replace(reply, body=json.dumps({**body, "timings": stats}).encode())
