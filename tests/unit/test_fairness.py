"""Fair queues between clients (docs/policy.md, "Fair queues"), on the pure scheduler.

One service, one slot (``max_concurrency: 1``) unless a test says otherwise, so the
order of grants is the order in which the queue hands out its turns. The clock is the
``now`` each event is given: nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from service.domain import Residency
from service.scheduler import (
    Action,
    ClientRule,
    DeviceReading,
    DeviceRule,
    Grant,
    InstanceReady,
    MemorySampled,
    PolicyChanged,
    Reject,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Scheduler,
    ServiceRule,
)
from service.scheduler.fairness import FairQueue, Waiter

MiB = 1024**2


def svc(max_concurrency: int = 1, queue_max: int = 64, *, fair: bool = True) -> ServiceRule:
    return ServiceRule(
        name="img",
        residency=Residency.ON_DEMAND,
        priority=100,
        estimate=100 * MiB,
        cap=None,
        max_concurrency=max_concurrency,
        queue_max=queue_max,
        queue_timeout_s=600.0,
        idle_ttl_s=0.0,
        stop_timeout_s=15.0,
        fair=fair,
    )


class Box:
    """A scheduler with one ready service and the clients of a policy."""

    def __init__(self, rule: ServiceRule, *clients: ClientRule, service_s: float = 0.0) -> None:
        self.rule = rule
        self.sched = Scheduler({rule.name: rule}, DeviceRule())
        self.now = 0.0
        self.send(
            PolicyChanged({rule.name: rule}, DeviceRule(), clients={c.name: c for c in clients})
        )
        reading = DeviceReading(0, 1000 * MiB, 0, 1000 * MiB, 0)
        self.send(MemorySampled((reading,), {}))
        self.ids = iter(range(10**6))
        warm = self.request("warmup")
        self.send(InstanceReady(rule.name))
        self.now += service_s  # what the service's requests take, learned from this one
        self.send(RequestFinished(warm[0]))

    def send(self, event: object) -> list[Action]:
        self.now += 0.001
        return self.sched.handle(event, self.now)  # type: ignore[arg-type]

    def request(self, client: str, count: int = 1) -> list[str]:
        """``count`` requests of ``client``; their ids (``client-n``)."""
        ids = []
        for _ in range(count):
            rid = f"{client}-{next(self.ids)}"
            self.last = self.send(RequestArrived(rid, self.rule.name, client))
            ids.append(rid)
        return ids

    def finish(self, rid: str) -> list[str]:
        """Finish ``rid``; the clients of the requests granted in its place."""
        return clients_of(granted(self.send(RequestFinished(rid))))

    def drain(self, first: str, n: int) -> list[str]:
        """Finish the request in flight ``n`` times over: the clients served, in order."""
        order, in_flight = [], first
        for _ in range(n):
            grants = granted(self.send(RequestFinished(in_flight)))
            assert len(grants) == 1, grants
            in_flight = grants[0]
            order.append(in_flight.split("-")[0])
        return order

    def waiting(self) -> dict[str, int]:
        return self.sched.explain(self.rule.name, self.now).waiting


def granted(actions: Iterable[Action]) -> list[str]:
    return [a.request_id for a in actions if isinstance(a, Grant)]


def refused(actions: Iterable[Action]) -> list[Reject]:
    return [a for a in actions if isinstance(a, Reject)]


def clients_of(ids: list[str]) -> list[str]:
    return [rid.split("-")[0] for rid in ids]


def test_a_flood_does_not_delay_another_client_more_than_one_turn() -> None:
    box = Box(svc())
    flood = box.request("alice", 40)  # the first runs, 39 wait
    box.request("bob")
    # alice's turn (one request), then bob's, then alice's again.
    assert box.drain(flood[0], 3) == ["alice", "bob", "alice"]


def test_fifo_keeps_arrival_order_behind_the_flood() -> None:
    box = Box(svc(fair=False))
    flood = box.request("alice", 10)
    box.request("bob")
    assert box.drain(flood[0], 10) == ["alice"] * 9 + ["bob"]


def test_shares_weigh_the_turns() -> None:
    box = Box(svc(), ClientRule("alice", share=2), ClientRule("bob", share=1))
    first = box.request("alice", 13)[0]
    box.request("bob", 12)
    order = box.drain(first, 18)
    assert order.count("alice") == 12 and order.count("bob") == 6, order
    assert order[:6] == ["alice", "alice", "bob"] * 2, order


def test_a_fractional_share_waits_for_its_credit() -> None:
    box = Box(svc(), ClientRule("slow", share=0.5))
    first = box.request("fast", 9)[0]
    box.request("slow", 8)
    order = box.drain(first, 12)
    assert order.count("fast") == 8 and order.count("slow") == 4, order


def test_three_clients_take_turns() -> None:
    box = Box(svc())
    first = box.request("a", 5)[0]
    box.request("b", 4)
    box.request("c", 4)
    assert box.drain(first, 9) == ["a", "b", "c"] * 3


def test_a_client_that_leaves_gives_up_its_turns_and_credit() -> None:
    box = Box(svc(), ClientRule("b", share=3))
    first = box.request("a", 6)[0]
    gone = box.request("b", 3)
    box.request("c", 3)
    for rid in gone:
        box.send(RequestCancelled(rid))
    assert box.waiting() == {"a": 5, "c": 3}
    assert box.drain(first, 6) == ["a", "c", "a", "c", "a", "c"]
    # b comes back with nothing saved: one turn of its share, like anyone arriving.
    box.request("b", 4)
    assert box.waiting() == {"a": 2, "b": 4}


def test_a_full_service_admits_a_client_under_its_share_by_refusing_the_greedy_one() -> None:
    box = Box(svc(max_concurrency=2, queue_max=8))
    flood = box.request("alice", 10)  # the bound: 2 in flight, 8 waiting
    assert refused(box.last) == []
    box.request("bob")
    (pushed,) = refused(box.last)
    assert pushed.request_id == flood[-1] and pushed.code == "queue_full"
    assert pushed.client == "alice" and pushed.retry_after is not None
    assert "client alice holds 10 of the 10 places" in pushed.message
    assert "made room for client bob" in pushed.message
    assert box.waiting() == {"alice": 7, "bob": 1}
    # The service's bound still holds for everyone together.
    view = box.sched.service_view("img")
    assert view.in_flight + view.queued == 10


def test_a_refused_flood_is_told_to_come_back_when_its_line_has_moved() -> None:
    box = Box(svc(max_concurrency=2, queue_max=8), service_s=0.5)
    box.request("alice", 10)
    box.request("bob")
    (pushed,) = refused(box.last)
    # alice has 7 requests still waiting and bob 1 between them: 8 requests on 2 slots of
    # 0.5 s each, 2 s; not a blind second that would bring the flood back many times over.
    assert pushed.retry_after == pytest.approx(2.0, rel=0.01)
    box.request("bob", 4)  # bob: 5 waiting; alice: 3 (4 more of hers made room)
    (own,) = refused(box.request("bob") and box.last)
    assert own.client == "bob" and own.retry_after == pytest.approx(8 * 0.5 / 2, rel=0.01)


def test_a_client_at_its_share_of_a_full_service_gets_429_naming_it() -> None:
    box = Box(svc(max_concurrency=2, queue_max=8))
    box.request("alice", 10)
    box.request("bob", 5)  # bob's part of 10 places among two clients: 5
    assert [r.client for r in refused(box.last)] == ["alice"]
    box.request("bob")
    (own,) = refused(box.last)
    assert own.client == "bob" and own.request_id.startswith("bob")
    assert "client bob holds 5 of the 10 places, its share (5 among 2 client(s))" in own.message
    assert box.waiting() == {"alice": 3, "bob": 5}


def test_a_full_fifo_service_refuses_whoever_comes_last() -> None:
    box = Box(svc(max_concurrency=2, queue_max=8, fair=False))
    box.request("alice", 10)
    box.request("bob")
    (own,) = refused(box.last)
    assert own.client == "bob" and "max_concurrency 2 + queue.max 8" in own.message


def test_a_client_over_its_own_max_concurrency_gets_429_while_others_are_admitted() -> None:
    box = Box(svc(max_concurrency=4), ClientRule("script", max_concurrency=2))
    box.request("script", 2)
    assert refused(box.last) == []
    box.request("script")
    (own,) = refused(box.last)
    assert own.code == "queue_full" and own.client == "script"
    assert "its max_concurrency (2)" in own.message
    (alice,) = box.request("alice")
    assert granted(box.last) == [alice]


def test_explain_lists_who_waits_and_who_is_served_by_client() -> None:
    box = Box(svc(max_concurrency=1))
    box.request("alice", 3)
    box.request("bob", 2)
    answer = box.sched.explain("img", box.now).as_dict()
    assert answer["waiting_by_client"] == {"alice": 2, "bob": 2}
    assert answer["in_flight_by_client"] == {"alice": 1}
    assert box.sched.service_view("img").queued_by_client == {"alice": 2, "bob": 2}


def test_the_queue_keeps_arrival_order_to_look_at() -> None:
    queue = FairQueue()
    for i, client in enumerate(["a", "a", "b", "a", "c"]):
        queue.append(Waiter(f"r{i}", float(i), i, client), lambda _: 1.0)
    assert [w.request_id for w in queue] == ["r0", "r1", "r2", "r3", "r4"]
    assert queue.oldest.request_id == "r0" and len(queue) == 5
    taken = [queue.pop_next(fair=True, share=lambda _: 1.0).request_id for _ in range(5)]
    assert taken == ["r0", "r2", "r4", "r1", "r3"]
    assert not queue and queue.by_client() == {}
