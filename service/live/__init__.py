"""What the daemon keeps live per service, and the contract between the proxy and the kernel.

runtimes.py  ServiceRuntime (one service's live record) and RuntimeTable (all of them)
events.py    EventLog: every decision and state change, stored, logged and streamed
leases.py    Lease, LeaseProvider, Outcome: a request's right to one ready instance
usage.py     Accounts, UsageBook: how each request ended, per client and service
"""
