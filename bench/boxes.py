"""The sweep's space: boxes, the priority mixes on each, and the trace grid per mix.

A ``Box`` is a GPU box and the services its owner runs on it: a base policy that lists
them most popular first (``bench/policies/box-*.yaml``), the bench data that says how
they really behave, the request rates that leave it quiet or saturate it, and which of
its services are used together (the trace generator's bursty groups). A ``Case`` is one
priority mix on one box: a ``bench.mixes`` mix of the base policy, or a committed
policy file of that box (the 24 GiB box's four: ``home-box``, ``inverted``,
``ten-services``, ``ten-services-tiered``).

Each case gets ``POINTS_PER_CASE`` trace points of its own, a Latin-hypercube draw
seeded by the case's name: every Zipf alpha of ``ALPHAS`` once, the gap CVs of ``CVS``
(one twice), each of the box's three rates twice, and a seed per point. So the mixes
of one box are compared on different traces, and the sweep covers 6 x the number of
cases distinct (alpha, CV, rate) points rather than six.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from bench.mixes import MIXES, mix_policy
from bench.traces.generate import DEFAULT_GROUPS

POLICY_DIR = Path(__file__).parent / "policies"
ALPHAS = (0.6, 0.9, 1.2, 1.5, 1.8, 2.1)
CVS = (1.0, 2.0, 3.0, 4.0, 5.0)
POINTS_PER_CASE = 6
COMMITTED_24GIB = ("home-box", "inverted", "ten-services", "ten-services-tiered")


@dataclass(frozen=True, slots=True)
class Box:
    name: str
    policy: str  # base policy, in POLICY_DIR: services most popular first
    bench: str  # bench data, in POLICY_DIR
    rates: tuple[float, float, float]  # requests/s: quiet, busy, saturating
    groups: str  # bursty groups, as bench.traces.generate --groups takes them
    files: tuple[str, ...] = ()  # committed policies of this box, swept as mixes too

    def read(self, name: str) -> str:
        return (POLICY_DIR / name).read_text(encoding="utf-8")


BOXES = (
    Box(
        "12gib",
        "box-12gib.yaml",
        "box-12gib.bench.yaml",
        (0.1, 0.3, 0.7),
        "coder,small-chat;sdxl,flux;whisper,tts",
    ),
    Box(
        "24gib",
        "box-24gib.yaml",
        "ten-services.bench.yaml",
        (0.2, 0.5, 1.0),
        DEFAULT_GROUPS,
        files=COMMITTED_24GIB,
    ),
    Box(
        "48gib",
        "box-48gib.yaml",
        "box-48gib.bench.yaml",
        (0.3, 0.6, 1.2),
        "coder,chat-large;sdxl,flux,vision;whisper,tts",
    ),
    Box(
        "2x24gib",
        "box-2x24gib.yaml",
        "box-2x24gib.bench.yaml",
        (0.3, 0.6, 1.2),
        "coder,coder-large,chat-large;sdxl,flux,flux-dev,vision;whisper,tts",
    ),
)


@dataclass(frozen=True, slots=True)
class Case:
    box: Box
    mix: str  # a bench.mixes name, or the stem of one of box.files
    committed: bool = False  # True: mix names one of box.files

    @property
    def name(self) -> str:
        """``12gib/equal``; a committed policy by its file: ``24gib/inverted.yaml``."""
        return f"{self.box.name}/{self.mix}" + (".yaml" if self.committed else "")

    def policy_text(self) -> str:
        if self.committed:
            return self.box.read(f"{self.mix}.yaml")
        return mix_policy(self.box.read(self.box.policy), self.mix, base_name=self.box.policy)

    def groups(self) -> str:
        return DEFAULT_GROUPS if self.committed else self.box.groups


CASES = tuple(
    case
    for box in BOXES
    for case in (
        *(Case(box, mix) for mix in MIXES),
        *(Case(box, stem, committed=True) for stem in box.files),
    )
)


@dataclass(frozen=True, slots=True)
class Point:
    alpha: float
    cv: float
    rate: float
    seed: int

    @property
    def name(self) -> str:
        return f"a{self.alpha:g}-cv{self.cv:g}-r{self.rate:g}-s{self.seed}"


def points(case: Case) -> tuple[Point, ...]:
    """The case's trace points: a Latin-hypercube draw seeded by its name."""
    rng = random.Random(f"bench.boxes:{case.name}")
    n = POINTS_PER_CASE
    alphas = [ALPHAS[i * len(ALPHAS) // n] for i in range(n)]
    cvs = [CVS[i % len(CVS)] for i in range(n)]
    rates = [case.box.rates[i % 3] for i in range(n)]
    for column in (alphas, cvs, rates):
        rng.shuffle(column)
    return tuple(
        Point(a, cv, rate, _seed(f"{case.name}:{k}"))
        for k, (a, cv, rate) in enumerate(zip(alphas, cvs, rates, strict=True))
    )


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 1_000_000


def select(names: str) -> list[Case]:
    """Cases by name (``12gib/equal``, ``24gib/home-box.yaml``), box (``12gib``), mix
    (``equal``: on every box) or committed file's stem (``home-box``; ``inverted`` is
    both a mix and a file), comma-separated; every case for an empty string."""
    wanted = [part.strip() for part in names.split(",") if part.strip()]
    if not wanted:
        return list(CASES)
    unknown = [w for w in wanted if not any(w in (c.name, c.box.name, c.mix) for c in CASES)]
    if unknown:
        raise ValueError(f"no such case, box or mix: {', '.join(unknown)}")
    return [c for c in CASES if any(w in (c.name, c.box.name, c.mix) for w in wanted)]
