"""The systems ``bench.replay`` compares, each in its own module, by name."""

from __future__ import annotations

from bench.sim.harness import System
from bench.systems.lru_count import LruCount
from bench.systems.static import Static
from bench.systems.swap_one import SwapOne
from bench.systems.unbounded import Unbounded
from bench.systems.vramd import Vramd

SYSTEMS: dict[str, type[System]] = {
    cls.name: cls for cls in (Vramd, SwapOne, LruCount, Static, Unbounded)
}

__all__ = ["SYSTEMS", "LruCount", "Static", "SwapOne", "Unbounded", "Vramd"]
