"""State across swaps: a llama.cpp runtime's prompt cache kept over the stops vramd
chooses (docs/policy.md, "State across swaps").

The kernel calls ``StateKeeper`` before it stops an instance of a service with ``state``
(save each slot) and after the next instance answers health, before the scheduler hears
it is ready (restore them, then check the first request that continues a restored
conversation). Its parts::

    files.py   the state directory: slot files, the manifest, the runtime's identity,
               the disk budget
    slots.py   llama-server's slot API: list, save, restore
    verify.py  whether a restore took, read from an answer's timings
    keeper.py  StateKeeper: when to save, restore, drop and stop saving; the figures
"""

from service.swapstate.keeper import StateFigures, StateKeeper

__all__ = ["StateFigures", "StateKeeper"]
