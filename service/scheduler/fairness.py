"""Fair queues: which waiting request of a service goes next, and who may still join.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from service.policy.clients import ANONYMOUS


@dataclass(slots=True)
class Waiter:
    """A queued request. ``seq`` orders arrivals across services."""

    request_id: str
    arrived_at: float
    seq: int
    client: str = ANONYMOUS


@dataclass(frozen=True, slots=True)
class ClientRule:
    """What the scheduler knows of a client (``server.clients``): its weight and limit."""

    name: str
    share: float = 1.0
    max_concurrency: int | None = None


class FairQueue:
    """A service's waiting requests: in arrival order to look at (timeouts, views), in
    turn by client (or in arrival order, ``fair=False``) to take the next."""

    def __init__(self) -> None:
        self._all: dict[str, Waiter] = {}  # by request id, in arrival order
        self._by_client: dict[str, deque[Waiter]] = {}
        # Clients with requests waiting, in turn order; the first has the turn and has
        # been credited its share for it.
        self._ring: deque[str] = deque()
        self._credit: dict[str, float] = {}
        self._share: Callable[[str], float] = lambda _: 1.0

    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __iter__(self) -> Iterator[Waiter]:
        return iter(list(self._all.values()))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._all

    def get(self, request_id: str) -> Waiter | None:
        return self._all.get(request_id)

    @property
    def oldest(self) -> Waiter:
        return next(iter(self._all.values()))

    def by_client(self) -> dict[str, int]:
        """How many requests each client has waiting."""
        return {client: len(waiting) for client, waiting in self._by_client.items()}

    def waiting_of(self, client: str) -> int:
        waiting = self._by_client.get(client)
        return len(waiting) if waiting else 0

    def newest_of(self, client: str) -> Waiter:
        return self._by_client[client][-1]

    def append(self, waiter: Waiter, share: Callable[[str], float]) -> None:
        self._share = share
        self._all[waiter.request_id] = waiter
        waiting = self._by_client.get(waiter.client)
        if waiting is None:
            self._by_client[waiter.client] = deque([waiter])
            self._ring.append(waiter.client)
            self._credit[waiter.client] = 0.0
            if len(self._ring) == 1:
                self._start_turn()
        else:
            waiting.append(waiter)

    def remove(self, waiter: Waiter) -> None:
        """Take a waiter out (refused, timed out, or its client went away)."""
        if self._all.pop(waiter.request_id, None) is None:
            return
        waiting = self._by_client[waiter.client]
        waiting.remove(waiter)
        if not waiting:
            self._leave(waiter.client)

    def pop_next(self, *, fair: bool, share: Callable[[str], float]) -> Waiter:
        """The request to serve next; the queue must not be empty."""
        self._share = share
        if not fair:
            waiter = self.oldest
        else:
            client = self._ring[0]
            while self._credit[client] < 1.0 - 1e-9:  # its turn is spent: the next one's
                self._ring.rotate(-1)
                self._start_turn()
                client = self._ring[0]
            self._credit[client] -= 1.0
            waiter = self._by_client[client][0]
        self.remove(waiter)
        return waiter

    def _start_turn(self) -> None:
        client = self._ring[0]
        self._credit[client] += max(self._share(client), 0.01)

    def _leave(self, client: str) -> None:
        """A client with nothing waiting leaves the ring and forgets its credit (a client
        cannot save turns while it sends nothing)."""
        had_turn = self._ring[0] == client
        self._ring.remove(client)
        del self._by_client[client]
        del self._credit[client]
        if had_turn and self._ring:
            self._start_turn()


@dataclass(frozen=True, slots=True)
class Crowding:
    """Who holds a service's bound: each client's requests (in flight and waiting)."""

    held: Mapping[str, int]
    bound: int
    shares: Mapping[str, float]

    def fair_part(self, client: str) -> int:
        """``client``'s part of the bound among the clients present (at least 1)."""
        total = sum(self.shares.values())
        return max(1, math.floor(self.bound * self.shares[client] / total))

    def over(self, client: str) -> float:
        return self.held.get(client, 0) / self.shares[client]


def make_room_for(queue: FairQueue, client: str, crowding: Crowding) -> tuple[Waiter | None, str]:
    """At a full service: the waiting request to refuse so that ``client`` may join
    (None: ``client`` has its part already), and the sentence that says why."""
    if crowding.held.get(client, 0) + 1 > crowding.fair_part(client):
        held = crowding.held.get(client, 0)
        return None, (
            f"client {client} holds {held} of the {crowding.bound} places, its share "
            f"({crowding.fair_part(client)} among {len(crowding.shares)} client(s))"
        )
    over = [
        other
        for other in crowding.shares
        if other != client
        and queue.waiting_of(other)
        and crowding.held.get(other, 0) > crowding.fair_part(other)
    ]
    if not over:  # cannot happen while the bound is full and client is under its part
        return None, f"no client holds more than its share of the {crowding.bound} places"
    greedy = max(over, key=crowding.over)
    held = crowding.held[greedy]
    return queue.newest_of(greedy), (
        f"client {greedy} holds {held} of the {crowding.bound} places, above its share "
        f"({crowding.fair_part(greedy)}); its newest request made room for client {client}"
    )


__all__ = ["ANONYMOUS", "ClientRule", "Crowding", "FairQueue", "Waiter", "make_room_for"]
