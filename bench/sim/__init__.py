"""The discrete-event simulator behind ``python -m bench.replay``.

One run replays a trace (``trace``) against one system (``bench.systems``) on a virtual
clock (``clock``), on a simulated device whose memory is what the runtimes really hold
(``device``), and records what every request went through (``metrics``). ``setup``
gathers what all systems share: the policy, the bench data, the device figures.
"""
