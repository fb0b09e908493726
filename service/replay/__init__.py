"""Replays of traffic through the scheduler core on a virtual clock.

The daemon's ``yielding: auto`` tuner and the bench (``python -m bench.replay``,
``bench.sweep``) run the same code here: a trace of arrivals is replayed against the
daemon's own ``Pump`` and ``Scheduler`` (``vramd``), on a simulated box whose memory is
what the runtimes really hold (``device``), and every request's outcome is recorded
(``metrics``).

clock.py      VirtualClock: callbacks in time order, nothing sleeps
device.py     SimBox, SimDevice: the simulated devices and when a load runs out of memory
trace.py      TraceRequest, parse_trace, dump_trace: one request per JSON line
benchdata.py  RuntimeBench: how each runtime really behaves (load time, true peak)
setup.py      Setup, build_setup: the policy, the runtimes and the device, shared by systems
metrics.py    Recorder, summarize: what a run records and the figures it reports
harness.py    World, System, run_system, Slots: one simulated run
vramd.py      Vramd: the daemon's scheduler core driven on the virtual clock
tuner.py      Tuner, evaluate: what ``yielding: auto`` chooses, from replays of recent traffic
worker.py     the tuner's replays in a background process at low priority
"""
