"""The daemon's own health: is its periodic work on time, and its event loop running?

healthz.py   Health: the answer of GET /healthz, from the watchdog and the samples
watchdog.py  Liveness (heartbeats of periodic work) and Watchdog (event-loop stalls)
"""
