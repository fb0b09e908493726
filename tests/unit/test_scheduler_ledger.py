"""Budget arithmetic (docs/operations.md): budget, charge, available, expected peak."""

from __future__ import annotations

import pytest
from support.scheduling import rule

from service.domain import Residency
from service.policy import load_policy
from service.scheduler import (
    DeviceReading,
    DeviceRule,
    InstanceReady,
    InstanceStopped,
    Learned,
    LearnedChanged,
    MemorySampled,
    RequestArrived,
    Scheduler,
    ServiceRule,
    Start,
    UnloadRequested,
    expected_peak,
    rules_from_policy,
)
from service.scheduler.ledger import Holding, Ledger, available_of, budget_of

MiB = 1024**2
GiB = 1024**3


def reading(
    total: int, used: int = 0, *, managed: int = 0, free: int | None = None
) -> DeviceReading:
    return DeviceReading(0, total, used, total - used if free is None else free, managed)


@pytest.mark.parametrize(
    ("total", "used", "managed", "limit", "headroom", "expected"),
    [
        # budget(D) = min(budget_limit or total, total - foreign) - headroom
        (1000, 0, 0, None, 0, 1000),
        (1000, 0, 0, None, 100, 900),
        (1000, 300, 300, None, 100, 900),  # our own use is not foreign
        (1000, 300, 0, None, 100, 600),  # 300 foreign
        (1000, 300, 100, None, 100, 700),  # 200 foreign
        (1000, 0, 0, 600, 100, 500),  # the policy's ceiling binds
        (1000, 300, 0, 800, 100, 600),  # foreign binds below the ceiling
        (1000, 300, 0, 600, 100, 500),  # the ceiling binds despite foreign
        (1000, 100, 400, None, 0, 1000),  # managed above used: foreign is 0, not negative
        (1000, 950, 0, None, 100, 0),  # never negative
        (1000, 0, 0, 2000, 0, 1000),  # a ceiling above the device total is the total
    ],
)
def test_budget(
    total: int, used: int, managed: int, limit: int | None, headroom: int, expected: int
) -> None:
    device = DeviceRule(budget_limit=limit, headroom=headroom)
    assert budget_of(reading(total, used, managed=managed), device) == expected


@pytest.mark.parametrize(
    ("dev", "holdings", "released", "held", "expected"),
    [
        # nothing resident: the whole budget
        (reading(1000), [], 0, 0, 1000),
        # a ready instance measured at its peak: charged once
        (reading(1000, 300, managed=300), [Holding("a", 300, 300)], 0, 0, 700),
        # measured above the peak: the measurement is the charge
        (reading(1000, 450, managed=450), [Holding("a", 450, 450)], 0, 0, 550),
        # just started (measured 0): charged its peak in the budget term AND in the free
        # term, so a second load cannot be admitted into bytes it will grow into
        (reading(1000), [Holding("a", 300, 0)], 0, 0, 700),
        # the device's own free figure is a second ceiling (e.g. driver-reserved memory)
        (reading(1000, 200, free=500), [], 0, 0, 500),
        # growth still expected is taken off the free figure
        (reading(1000, 100, managed=100, free=600), [Holding("a", 300, 100)], 0, 0, 400),
        # a stopped instance's memory counts as free until the next sample
        (reading(1000, 800, managed=800, free=200), [], 800, 0, 1000),
        # loads waiting on evictions hold their share
        (reading(1000), [], 0, 250, 750),
        # overcommitted: negative, so nothing fits
        (reading(1000, 1000, managed=1000), [Holding("a", 1200, 1000)], 0, 0, -200),
    ],
)
def test_available(
    dev: DeviceReading, holdings: list[Holding], released: int, held: int, expected: int
) -> None:
    assert available_of(dev, DeviceRule(), holdings, released=released, held=held) == expected


def test_foreign_growth_shrinks_available() -> None:
    ledger = Ledger(DeviceRule(headroom=100))
    ours = [Holding("a", 300, 300)]
    ledger.sample([DeviceReading(0, 1000, 300, 700, 300)])
    assert ledger.available(0, ours) == 600
    ledger.sample([DeviceReading(0, 1000, 500, 500, 300)])  # 200 foreign appeared
    assert ledger.available(0, ours) == 400


def test_release_credit_lasts_until_the_next_sample() -> None:
    ledger = Ledger(DeviceRule())
    ledger.sample([DeviceReading(0, 1000, 600, 400, 600)])
    ledger.release(0, 600)
    assert ledger.available(0, []) == 1000
    ledger.sample([DeviceReading(0, 1000, 50, 950, 0)])  # the settled truth replaces it
    assert ledger.available(0, []) == 950


def test_ledger_devices_follow_the_device_rule() -> None:
    ledger = Ledger(DeviceRule(gpus=(1,)))
    ledger.sample([DeviceReading(1, 10, 0, 10), DeviceReading(0, 10, 0, 10)])
    assert ledger.devices() == (1,)
    ledger.rule = DeviceRule()
    assert ledger.devices() == (0, 1)
    assert ledger.view(5, []) is None
    assert ledger.available(5, []) == 0


@pytest.mark.parametrize(
    ("estimate", "cap", "learned", "expected"),
    [
        (300, None, None, 300),
        (300, None, 500, 500),  # a learned peak above the estimate raises it
        (300, None, 200, 300),  # ... but never lowers it
        (300, 400, 500, 400),  # never above the cap
        (300, 300, None, 300),
    ],
)
def test_expected_peak(estimate: int, cap: int | None, learned: int | None, expected: int) -> None:
    assert expected_peak(rule(estimate=estimate, cap=cap), Learned(peak_bytes=learned)) == expected


def _sched(*rules: ServiceRule, headroom: int = 0) -> Scheduler:
    return Scheduler({r.name: r for r in rules}, DeviceRule(headroom=headroom))


def test_charge_is_the_larger_of_measured_and_peak() -> None:
    sched = _sched(rule("a", estimate=300 * MiB))
    sched.handle(MemorySampled((DeviceReading(0, 1000 * MiB, 0, 1000 * MiB),)), 0)
    [start] = [a for a in sched.handle(RequestArrived("r1", "a"), 1) if isinstance(a, Start)]
    assert start.device == 0
    assert sched.service_view("a").charge == 300 * MiB  # starting: the peak, measured 0
    sched.handle(InstanceReady("a"), 2)
    used = 350 * MiB
    sched.handle(
        MemorySampled((DeviceReading(0, 1000 * MiB, used, 650 * MiB, used),), {"a": used}), 3
    )
    view = sched.service_view("a")
    assert (view.measured, view.charge, view.expected_peak) == (used, used, 300 * MiB)
    sched.handle(
        MemorySampled(
            (DeviceReading(0, 1000 * MiB, 100 * MiB, 900 * MiB, 100 * MiB),), {"a": 100 * MiB}
        ),
        4,
    )
    assert sched.service_view("a").charge == 300 * MiB


def test_ledger_view_reports_every_figure() -> None:
    sched = _sched(rule("a", estimate=300 * MiB), rule("b", estimate=200 * MiB), headroom=100 * MiB)
    sched.handle(
        MemorySampled(
            (DeviceReading(0, 1000 * MiB, 250 * MiB, 750 * MiB, 0),),
        ),
        0,
    )
    sched.handle(RequestArrived("r1", "a"), 1)
    view = sched.ledger_view(0)
    assert view is not None
    assert view.total == 1000 * MiB
    assert view.foreign == 250 * MiB
    assert view.headroom == 100 * MiB
    assert view.budget == 650 * MiB
    assert dict(view.charges) == {"a": 300 * MiB}
    assert view.available == 350 * MiB
    assert sched.ledger_view(3) is None


def test_learned_peak_raises_the_charge() -> None:
    sched = _sched(rule("a", estimate=300 * MiB))
    sched.handle(MemorySampled((DeviceReading(0, 1000 * MiB, 0, 1000 * MiB),)), 0)
    sched.handle(RequestArrived("r1", "a"), 1)
    sched.handle(LearnedChanged("a", Learned(peak_bytes=700 * MiB)), 2)
    assert sched.service_view("a").charge == 700 * MiB
    view = sched.ledger_view(0)
    assert view is not None and view.available == 300 * MiB


def test_stopped_instance_is_free_before_the_next_sample() -> None:
    sched = _sched(rule("a", estimate=600 * MiB))
    sched.handle(MemorySampled((DeviceReading(0, 1000 * MiB, 0, 1000 * MiB),)), 0)
    sched.handle(RequestArrived("r1", "a"), 1)
    sched.handle(InstanceReady("a"), 2)
    used = 600 * MiB
    sched.handle(
        MemorySampled((DeviceReading(0, 1000 * MiB, used, 400 * MiB, used),), {"a": used}), 3
    )
    sched.handle(UnloadRequested("a"), 4)
    sched.handle(InstanceStopped("a"), 5)
    view = sched.ledger_view(0)
    assert view is not None
    assert view.free == 400 * MiB  # the last sample, still
    assert view.available == 1000 * MiB  # but the release is counted


def test_rules_from_policy() -> None:
    policy = load_policy(
        """
version: 1
device: {budget: 20GiB, headroom: 512MiB, gpus: [0, 1]}
services:
  chat:
    kind: chat
    models: [qwen]
    command: [llama-server]
    memory: {estimate: 6GiB, cap: 7GiB}
    residency: pinned
    priority: 300
    queue: {max: 16, timeout: 60s}
    gpus: [1]
  embed:
    kind: embedding
    models: [bge]
    command: [embed-server]
    memory: {estimate: 1GiB}
    residency: warm
    preload: true
  batch:
    kind: chat
    models: [batch]
    command: [batch-server]
    memory: {estimate: 2GiB}
    residency: window-only
    idle_ttl: 5m
    stop_timeout: 30s
    max_concurrency: 2
"""
    )
    rules, device = rules_from_policy(policy)
    assert device == DeviceRule(budget_limit=20 * GiB, headroom=512 * MiB, gpus=(0, 1))
    assert list(rules) == ["batch", "chat", "embed"]
    chat = rules["chat"]
    assert (chat.residency, chat.priority, chat.estimate, chat.cap) == (
        Residency.PINNED,
        300,
        6 * GiB,
        7 * GiB,
    )
    assert (chat.queue_max, chat.queue_timeout_s, chat.idle_ttl_s, chat.gpus) == (
        16,
        60.0,
        0.0,
        (1,),
    )
    assert rules["embed"].preload and rules["embed"].idle_ttl_s == 0.0  # warm: no TTL unless set
    batch = rules["batch"]
    assert (batch.idle_ttl_s, batch.stop_timeout_s, batch.max_concurrency, batch.gpus) == (
        300.0,
        30.0,
        2,
        None,
    )
    all_gpus = load_policy(
        "version: 1\nservices: {a: {kind: chat, models: [a], command: [a], memory: {estimate: 1}}}"
    )
    assert rules_from_policy(all_gpus)[1].gpus is None
    assert rules_from_policy(all_gpus)[0]["a"].idle_ttl_s == 900.0  # on-demand default 15m
