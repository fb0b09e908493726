"""The systems ``bench.replay`` compares, each in its own module, by name.

``vramd`` runs ``yielding: auto`` as the daemon does; ``vramd:<setting>`` holds one fixed
setting for every ``auto`` service (``FIXED_SYSTEMS``: the four settings; the
``+top-never`` variants, the tuner's other candidates, are there by name too).
"""

from __future__ import annotations

from bench.systems.lru_count import LruCount
from bench.systems.static import Static
from bench.systems.swap_one import SwapOne
from bench.systems.unbounded import Unbounded
from service.replay.harness import System
from service.replay.vramd import Vramd, fixed_system
from service.scheduler import FIXED, Tuning

FIXED_SYSTEMS = tuple(f"vramd:{setting.value}" for setting in FIXED)
_ALL: tuple[type[System], ...] = (
    Vramd,
    *(fixed_system(Tuning(setting, never)) for never in (False, True) for setting in FIXED),
    SwapOne,
    LruCount,
    Static,
    Unbounded,
)
SYSTEMS: dict[str, type[System]] = {cls.name: cls for cls in _ALL}

__all__ = ["FIXED_SYSTEMS", "SYSTEMS", "LruCount", "Static", "SwapOne", "Unbounded", "Vramd"]
