"""The bench's own simulation parts: many boxes behind a router (``fleet``, ``routers``).

The simulator itself (virtual clock, simulated device, recorder, the vramd system) is
``service.replay``, which the daemon's ``yielding: auto`` tuner runs too.
"""
