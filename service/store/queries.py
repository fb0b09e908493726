"""Every query function of the store, in one namespace: ``from service.store import queries``.

The functions live in one module per concept and are re-exported here, so callers need
not know the split:

- ``queries_policy``: policy versions, the normalized service rules, maintenance windows;
- ``queries_history``: instances, events, maintenance runs, incidents;
- ``queries_samples``: device and instance memory samples, downsampling;
- ``queries_stats``: learned figures and counters per service;
- ``queries_usage``: usage per client and service, per hour.

All take the session first and everything else by keyword. They flush but never commit:
the caller's ``store.session()`` block is the transaction, so several calls (storing a
policy version and its rules) succeed or fail together.
"""

from __future__ import annotations

from service.store.queries_history import (
    finish_maintenance_run,
    get_incident,
    last_ids,
    list_events,
    list_incidents,
    list_instances,
    list_maintenance_runs,
    live_instances,
    prune_events,
    recent_peaks,
    record_event,
    record_incident,
    record_instance_adopted,
    record_instance_asleep,
    record_instance_exit,
    record_instance_ready,
    record_instance_spawn,
    record_maintenance_run,
    set_incident_verdict,
)
from service.store.queries_policy import (
    activate_policy_version,
    active_policy_version,
    add_api_window,
    delete_api_window,
    get_policy_version,
    list_services,
    list_windows,
    policy_history,
    replace_active_rules,
    store_policy_version,
)
from service.store.queries_samples import (
    DownsampleCounts,
    add_device_samples,
    add_instance_samples,
    device_samples,
    downsample,
    instance_samples,
)
from service.store.queries_stats import all_stats, bump_counter, get_stats, update_stats
from service.store.queries_usage import add_usage, usage_since

__all__ = [
    "DownsampleCounts",
    "activate_policy_version",
    "active_policy_version",
    "add_api_window",
    "add_device_samples",
    "add_instance_samples",
    "add_usage",
    "all_stats",
    "bump_counter",
    "delete_api_window",
    "device_samples",
    "downsample",
    "finish_maintenance_run",
    "get_incident",
    "get_policy_version",
    "get_stats",
    "instance_samples",
    "last_ids",
    "list_events",
    "list_incidents",
    "list_instances",
    "list_maintenance_runs",
    "list_services",
    "list_windows",
    "live_instances",
    "policy_history",
    "prune_events",
    "recent_peaks",
    "record_event",
    "record_incident",
    "record_instance_adopted",
    "record_instance_asleep",
    "record_instance_exit",
    "record_instance_ready",
    "record_instance_spawn",
    "record_maintenance_run",
    "replace_active_rules",
    "set_incident_verdict",
    "store_policy_version",
    "update_stats",
    "usage_since",
]
