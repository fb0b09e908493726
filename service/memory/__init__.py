"""Memory truth: what each instance really holds, what that means, and what to do about it.

sampling.py   Sampler: the probe's figures into the ledger, the watches and the database
watch.py      InstanceWatch (one live instance's series, cap streak, creep, OOM lines), Watches
diagnosis.py  pure findings over samples: creep, fragmentation or capacity, over-cap streaks
doctor.py     acting on findings: flags, cap actions, out-of-memory incidents and verdicts
release.py    after a stop: has the device's free memory come back (the settle barrier)
"""
