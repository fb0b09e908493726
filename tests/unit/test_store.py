"""The store: every query function against a real SQLite file, and the ways opening fails.

Failure cases are real conditions, not mocks: a lock held by another process, a file of
garbage bytes, a path under a regular file, permissions enforced on a process without
root rights, SQLite's own page limit standing in for a full disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.exc import IntegrityError
from support.faults import sqlite_lock

from service.errors import StoreError
from service.store import Store, open_store, queries
from service.store.engine import explain_sqlite_error
from service.store.models import InstanceSample, PolicyVersion

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(tmp_path / "data" / "vramd.db")
    yield store
    store.close()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def apply(store: Store, text: str, *, at: float = 1000.0) -> PolicyVersion:
    with store.session() as s:
        return queries.store_policy_version(
            s, text=text, sha256=sha(text), source="policy.yaml", applied_at=at
        )


def service_row(name: str, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "kind": "chat",
        "models": [f"{name}-model"],
        "command": ["llama-server", "--port", "${PORT}"],
        "env": {},
        "health": "/health",
        "residency": "on-demand",
        "priority": 100,
        "preload": False,
        "estimate_bytes": 6 * 2**30,
        "cap_bytes": 7 * 2**30,
        "on_cap": "restart",
        "idle_ttl_s": 900.0,
        "max_concurrency": 4,
        "queue_max": 16,
        "queue_timeout_s": 60.0,
        "startup_timeout_s": 120.0,
        "stop_timeout_s": 15.0,
        "restart": {"max_retries": 5, "backoff_s": 2.0, "max_backoff_s": 120.0},
    }
    row.update(overrides)
    return row


def window_row(name: str, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "cron": "30 3 * * *",
        "duration_s": 3600.0,
        "timezone": "UTC",
        "restart": "flagged",
        "allow": [],
    }
    row.update(overrides)
    return row


# --------------------------------------------------------------------------- policy


def test_same_policy_text_keeps_its_version_and_new_text_becomes_active(store: Store) -> None:
    first = apply(store, "version: 1\n", at=1.0)
    again = apply(store, "version: 1\n", at=2.0)
    second = apply(store, "version: 1\nservices: {}\n", at=3.0)
    rollback = apply(store, "version: 1\n", at=4.0)

    assert again.version == first.version and again.applied_at == 1.0
    assert second.version == first.version + 1
    assert rollback.version == second.version + 1  # history only grows
    with store.session() as s:
        history = queries.policy_history(s)
        assert [v.version for v in history] == [rollback.version, second.version, first.version]
        assert [v.active for v in history] == [True, False, False]
        active = queries.active_policy_version(s)
        assert active is not None and active.version == rollback.version
        fetched = queries.get_policy_version(s, version=second.version)
        assert fetched is not None and fetched.text == "version: 1\nservices: {}\n"
        assert queries.get_policy_version(s, version=999) is None
        assert len(queries.policy_history(s, limit=2)) == 2


def test_activate_policy_version_moves_the_active_flag(store: Store) -> None:
    first = apply(store, "a")
    second = apply(store, "b")
    with store.session() as s:
        queries.activate_policy_version(s, version=first.version)
    with store.session() as s:
        active = queries.active_policy_version(s)
        assert active is not None and active.version == first.version
        previous = queries.get_policy_version(s, version=second.version)
        assert previous is not None and previous.active is False
        with pytest.raises(LookupError):
            queries.activate_policy_version(s, version=42)


def test_no_policy_means_no_active_version(store: Store) -> None:
    with store.session() as s:
        assert queries.active_policy_version(s) is None
        assert queries.policy_history(s) == []


def test_database_refuses_a_second_active_version(store: Store) -> None:
    apply(store, "a")
    with pytest.raises(IntegrityError, match="UNIQUE"), store.session() as s:
        s.add(PolicyVersion(text="b", sha256=sha("b"), source="x", applied_at=1.0, active=True))
        s.flush()


def test_replace_active_rules_writes_services_and_keeps_api_windows(store: Store) -> None:
    v1 = apply(store, "one", at=10.0)
    with store.session() as s:
        queries.add_api_window(
            s,
            name="hotfix",
            start_at=5000.0,
            duration_s=600.0,
            restart=["chat"],
            allow=[],
            created_at=20.0,
        )
        queries.replace_active_rules(
            s,
            version=v1.version,
            services=[service_row("chat", gpus=[0]), service_row("embed", kind="embedding")],
            windows=[window_row("nightly"), window_row("weekly", cron="0 4 * * 0")],
        )

    v2 = apply(store, "two", at=30.0)
    with store.session() as s:
        queries.replace_active_rules(
            s,
            version=v2.version,
            services=[service_row("chat", priority=500, spec={"name": "chat", "future": 1})],
            windows=[window_row("nightly", duration_s=1800.0)],
        )

    with store.session() as s:
        services = queries.list_services(s)
        windows = {w.name: w for w in queries.list_windows(s)}
    assert [r.name for r in services] == ["chat"]
    chat = services[0]
    assert (chat.priority, chat.policy_version, chat.gpus) == (500, v2.version, None)
    assert chat.spec == {"name": "chat", "future": 1}
    assert chat.restart["max_retries"] == 5
    assert sorted(windows) == ["hotfix", "nightly"]
    assert windows["nightly"].duration_s == 1800.0
    assert windows["nightly"].created_at == 10.0  # first defined by version 1
    assert windows["nightly"].policy_version == v2.version
    assert (windows["hotfix"].origin, windows["hotfix"].policy_version) == ("api", None)


def test_service_spec_defaults_to_the_row_itself(store: Store) -> None:
    v = apply(store, "x")
    with store.session() as s:
        queries.replace_active_rules(s, version=v.version, services=[service_row("a")], windows=[])
        (rule,) = queries.list_services(s)
    assert rule.spec == service_row("a")
    assert (rule.cwd, rule.metrics, rule.upstream_model) == (None, None, None)


@pytest.mark.parametrize(
    ("services", "windows", "message"),
    [
        ([service_row("a", colour="red")], [], "unknown keys colour"),
        ([{k: v for k, v in service_row("a").items() if k != "kind"}], [], "missing keys kind"),
        ([], [window_row("hotfix")], "created through the API"),
    ],
)
def test_bad_rules_roll_back_the_whole_apply(
    store: Store, services: list[dict[str, Any]], windows: list[dict[str, Any]], message: str
) -> None:
    v1 = apply(store, "one")
    with store.session() as s:
        queries.replace_active_rules(
            s, version=v1.version, services=[service_row("old")], windows=[]
        )
        queries.add_api_window(
            s, name="hotfix", start_at=1.0, duration_s=1.0, restart="all", allow=[], created_at=1.0
        )

    with pytest.raises(ValueError, match=message), store.session() as s:
        v2 = queries.store_policy_version(
            s, text="two", sha256=sha("two"), source="api", applied_at=2.0
        )
        queries.replace_active_rules(s, version=v2.version, services=services, windows=windows)

    with store.session() as s:
        assert [r.name for r in queries.list_services(s)] == ["old"]
        active = queries.active_policy_version(s)
        assert active is not None and active.version == v1.version


def test_api_windows_add_delete_and_refuse_duplicates(store: Store) -> None:
    v = apply(store, "x")
    with store.session() as s:
        queries.replace_active_rules(
            s, version=v.version, services=[], windows=[window_row("nightly")]
        )
        window = queries.add_api_window(
            s,
            name="once",
            start_at=100.0,
            duration_s=60.0,
            restart=["chat", "embed"],
            allow=["indexer"],
            timezone="Europe/Paris",
            created_at=50.0,
        )
        assert (window.origin, window.cron, window.timezone) == ("api", None, "Europe/Paris")
        with pytest.raises(ValueError, match="already exists"):
            queries.add_api_window(
                s,
                name="nightly",
                start_at=1.0,
                duration_s=1.0,
                restart="all",
                allow=[],
                created_at=1.0,
            )
    with store.session() as s:
        assert queries.delete_api_window(s, name="nightly") is False  # policy-owned
        assert queries.delete_api_window(s, name="missing") is False
        assert queries.delete_api_window(s, name="once") is True
    with store.session() as s:
        assert [w.name for w in queries.list_windows(s)] == ["nightly"]


# --------------------------------------------------------------------------- history


def test_instances_are_live_until_their_exit_is_recorded(store: Store) -> None:
    with store.session() as s:
        a = queries.record_instance_spawn(
            s,
            service="chat",
            pid=100,
            pgid=100,
            proc_start_time=5.5,
            port=9001,
            device=0,
            started_at=10.0,
        )
        b = queries.record_instance_spawn(
            s,
            service="embed",
            pid=200,
            pgid=200,
            proc_start_time=6.5,
            port=9002,
            device=None,
            started_at=11.0,
        )
        queries.record_instance_ready(s, instance_id=a, ready_at=12.0)
    with store.session() as s:
        queries.record_instance_exit(
            s, instance_id=b, stopped_at=20.0, exit_code=-9, reason="evicted", peak_bytes=2**30
        )
    with store.session() as s:
        live = queries.live_instances(s)
        history = queries.list_instances(s)
        embed_only = queries.list_instances(s, service="embed")
        with pytest.raises(LookupError):
            queries.record_instance_ready(s, instance_id=999, ready_at=1.0)
    assert [(r.id, r.pid, r.proc_start_time, r.ready_at) for r in live] == [(a, 100, 5.5, 12.0)]
    assert [r.id for r in history] == [b, a]
    (stopped,) = embed_only
    assert (stopped.exit_code, stopped.reason, stopped.peak_bytes, stopped.reaped) == (
        -9,
        "evicted",
        2**30,
        False,
    )


def test_recent_peaks_are_each_services_last_instances_newest_first(store: Store) -> None:
    peaks = {"chat": [10, None, 30, 40, 0, 60, 70], "embed": [5]}
    with store.session() as s:
        for service, values in peaks.items():
            for peak in values:
                instance = queries.record_instance_spawn(
                    s,
                    service=service,
                    pid=1,
                    pgid=1,
                    proc_start_time=0.0,
                    port=1,
                    device=0,
                    started_at=0.0,
                )
                queries.record_instance_exit(
                    s,
                    instance_id=instance,
                    stopped_at=1.0,
                    exit_code=0,
                    reason="stopped",
                    peak_bytes=peak,
                )
    with store.read() as s:
        recent = queries.recent_peaks(s, per_service=5)
    assert recent == {"chat": [70, 60, None, 40, 30], "embed": [5]}


def test_reaped_instances_are_marked(store: Store) -> None:
    with store.session() as s:
        i = queries.record_instance_spawn(
            s, service="chat", pid=1, pgid=1, proc_start_time=1.0, port=1, device=0, started_at=1.0
        )
        queries.record_instance_exit(
            s, instance_id=i, stopped_at=2.0, exit_code=None, reason="reaped", reaped=True
        )
        assert queries.live_instances(s) == []
        assert queries.list_instances(s)[0].reaped is True


def test_event_filters_and_cursor(store: Store) -> None:
    with store.session() as s:
        ids = [
            queries.record_event(
                s,
                ts=float(t),
                kind="load" if t % 2 else "evict",
                message=f"event {t}",
                service="chat" if t < 6 else "embed",
                instance_id=t,
                data={"t": t},
            ).id
            for t in range(10)
        ]
        queries.record_event(s, ts=10.0, kind="state", message="no service")
    with store.session() as s:
        assert [e.id for e in queries.list_events(s, since_id=ids[7])] == [
            ids[8],
            ids[9],
            ids[9] + 1,
        ]
        assert [e.ts for e in queries.list_events(s, since_ts=8.0)] == [8.0, 9.0, 10.0]
        assert [e.ts for e in queries.list_events(s, service="embed")] == [6.0, 7.0, 8.0, 9.0]
        assert [e.ts for e in queries.list_events(s, kind="load", service="chat")] == [
            1.0,
            3.0,
            5.0,
        ]
        # Paging forward from a cursor gives the next events; no cursor gives the newest.
        assert [e.ts for e in queries.list_events(s, since_id=0, limit=2)] == [0.0, 1.0]
        assert [e.ts for e in queries.list_events(s, limit=2)] == [9.0, 10.0]
        last = queries.list_events(s)[-1]
        assert (last.data, last.service, last.instance_id) == ({}, None, None)
        assert queries.list_events(s, service="chat")[0].data == {"t": 0}
    with store.session() as s:
        assert queries.prune_events(s, before_ts=5.0) == 5
        assert len(queries.list_events(s)) == 6


def test_maintenance_runs(store: Store) -> None:
    with store.session() as s:
        first = queries.record_maintenance_run(
            s, window="nightly", trigger="schedule", started_at=1.0
        )
        second = queries.record_maintenance_run(
            s, window="hotfix", trigger="manual", started_at=2.0
        )
    with store.session() as s:
        queries.finish_maintenance_run(
            s, run_id=first, ended_at=5.0, actions=[{"service": "chat", "action": "restart"}]
        )
        with pytest.raises(LookupError):
            queries.finish_maintenance_run(s, run_id=999, ended_at=1.0, actions=[])
    with store.session() as s:
        runs = queries.list_maintenance_runs(s)
        nightly = queries.list_maintenance_runs(s, window="nightly")
    assert [r.id for r in runs] == [second, first]
    assert runs[0].ended_at is None and runs[0].actions == []
    assert (nightly[0].trigger, nightly[0].ended_at) == ("schedule", 5.0)
    assert nightly[0].actions == [{"service": "chat", "action": "restart"}]


def test_incidents(store: Store) -> None:
    evidence = {"device": {"total": 8, "free": 1}, "events": [1, 2]}
    with store.session() as s:
        first = queries.record_incident(
            s, ts=1.0, service="chat", kind="load", summary="load failed: OOM", data=evidence
        )
        second = queries.record_incident(
            s, ts=2.0, service="sd", kind="request", summary="5xx OOM", data={}, verdict="capacity"
        )
        queries.set_incident_verdict(s, id=first, verdict="fragmentation")
    with store.session() as s:
        assert [i.id for i in queries.list_incidents(s)] == [second, first]
        assert [i.id for i in queries.list_incidents(s, limit=1)] == [second]
        incident = queries.get_incident(s, id=first)
        assert queries.get_incident(s, id=999) is None
    assert incident is not None
    assert (incident.kind, incident.verdict, incident.data) == ("load", "fragmentation", evidence)


# --------------------------------------------------------------------------- stats


def test_stats_start_at_zero_and_count(store: Store) -> None:
    with store.session() as s:
        fresh = queries.get_stats(s, service="chat")
        assert (fresh.loads, fresh.learned_peak_bytes, fresh.flags) == (0, None, [])
        assert queries.bump_counter(s, service="chat", name="loads") == 1
        assert queries.bump_counter(s, service="chat", name="requests_served", by=10) == 10
    with store.session() as s:
        assert queries.bump_counter(s, service="chat", name="loads") == 2
        queries.update_stats(
            s,
            service="chat",
            learned_peak_bytes=5 * 2**30,
            learned_load_s=12.5,
            flags=["creeping"],
            last_error="oom",
            updated_at=99.0,
        )
        with pytest.raises(ValueError, match="unknown counter"):
            queries.bump_counter(s, service="chat", name="flags")
        with pytest.raises(ValueError, match="unknown service_stats fields: colour"):
            queries.update_stats(s, service="chat", colour="red")
    with store.session() as s:
        stats = queries.get_stats(s, service="chat")
        assert (stats.loads, stats.requests_served, stats.evictions) == (2, 10, 0)
        assert (stats.learned_peak_bytes, stats.learned_load_s) == (5 * 2**30, 12.5)
        assert (stats.flags, stats.last_error, stats.updated_at) == (["creeping"], "oom", 99.0)
        assert [st.service for st in queries.all_stats(s)] == ["chat"]


# --------------------------------------------------------------------------- samples


def device_row(ts: float, used: int, free: int, device: int = 0) -> dict[str, Any]:
    return {
        "ts": ts,
        "device": device,
        "total_bytes": 100,
        "used_bytes": used,
        "free_bytes": free,
        "foreign_bytes": used // 2,
        "budget_bytes": 90 - used // 10,
    }


def instance_row(ts: float, device_bytes: int, served: int, **extra: Any) -> dict[str, Any]:
    return {
        "ts": ts,
        "service": "chat",
        "instance_id": 1,
        "device_bytes": device_bytes,
        "host_bytes": device_bytes // 2,
        "in_flight": served % 3,
        "requests_served": served,
        **extra,
    }


def test_samples_round_trip_newest_window_oldest_first(store: Store) -> None:
    with store.session() as s:
        queries.add_instance_samples(s, rows=[instance_row(float(t), t, t) for t in range(10)])
        queries.add_instance_samples(s, rows=[])
        queries.add_device_samples(s, rows=[device_row(float(t), t, 100 - t) for t in range(5)])
        queries.add_device_samples(s, rows=[device_row(1.0, 7, 93, device=1)])
    with store.session() as s:
        recent = queries.instance_samples(s, service="chat", since_ts=7.0)
        assert [r.ts for r in recent] == [7.0, 8.0, 9.0]
        assert [r.ts for r in queries.instance_samples(s, service="chat", limit=2)] == [8.0, 9.0]
        assert queries.instance_samples(s, service="other") == []
        first = queries.instance_samples(s, service="chat")[0]
        assert (first.resolution, first.kv_cache_bytes) == ("1s", None)
        assert len(queries.device_samples(s)) == 6
        assert [r.used_bytes for r in queries.device_samples(s, device=1)] == [7]
        assert [r.ts for r in queries.device_samples(s, device=0, since_ts=3.0)] == [3.0, 4.0]


def test_downsample_folds_whole_old_minutes_and_prunes_coarse_rows(store: Store) -> None:
    now = 10_000.0
    # keep_fine_s=3600 -> cut-off 6400 (a whole minute). Minute 6300..6360 folds;
    # 6390 is inside minute 6360..6420, which straddles the cut-off and stays fine.
    fine_old = [
        instance_row(6300.0, 10, 100, kv_cache_bytes=None),
        instance_row(6320.0, 50, 105, kv_cache_bytes=4),
        instance_row(6359.0, 20, 110, kv_cache_bytes=3),
        instance_row(6330.0, 99, 7, instance_id=2),  # another process of the same service
    ]
    fine_recent = [instance_row(6390.0, 1, 1), instance_row(9990.0, 1, 1)]
    coarse = [
        instance_row(now - 8 * 86400, 1, 1, resolution="1m"),  # past a week: pruned
        instance_row(now - 6 * 86400, 1, 1, resolution="1m"),
    ]
    devices = [device_row(6300.0, 10, 90), device_row(6310.0, 40, 60), device_row(6330.0, 20, 80)]
    with store.session() as s:
        queries.add_instance_samples(s, rows=fine_old + fine_recent + coarse)
        queries.add_device_samples(s, rows=[*devices, device_row(6305.0, 5, 95, device=1)])

    with store.session() as s:
        counts = queries.downsample(s, now=now)
    assert counts == queries.DownsampleCounts(fine_deleted=8, coarse_written=4, coarse_pruned=1)

    with store.session() as s:
        rows = s.scalars(
            select(InstanceSample).order_by(InstanceSample.ts, InstanceSample.instance_id)
        ).all()
        dev0 = queries.device_samples(s, device=0)
        dev1 = queries.device_samples(s, device=1)
    fields = attrgetter(
        "ts",
        "resolution",
        "instance_id",
        "device_bytes",
        "host_bytes",
        "kv_cache_bytes",
        "in_flight",
        "requests_served",
    )
    summary = [fields(r) for r in rows]
    assert summary == [
        (now - 6 * 86400, "1m", 1, 1, 0, None, 1, 1),
        (6300.0, "1m", 1, 50, 25, 4, 2, 110),  # peaks, and the last running total
        (6300.0, "1m", 2, 99, 49, None, 1, 7),
        (6390.0, "1s", 1, 1, 0, None, 1, 1),
        (9990.0, "1s", 1, 1, 0, None, 1, 1),
    ]
    (d0,) = dev0
    assert (d0.ts, d0.resolution, d0.used_bytes, d0.foreign_bytes) == (6300.0, "1m", 40, 20)
    assert (d0.free_bytes, d0.budget_bytes) == (60, 86)  # free and budget: the trough
    assert [(r.ts, r.used_bytes) for r in dev1] == [(6300.0, 5)]

    with store.session() as s:  # a second run finds nothing new to fold
        assert queries.downsample(s, now=now) == (0, 0, 0)


# --------------------------------------------------------------------------- store


def test_session_rolls_back_on_error_and_rows_outlive_it(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session() as s:
        queries.record_event(s, ts=1.0, kind="load", message="lost")
        raise RuntimeError("boom")
    with store.session() as s:
        event_ = queries.record_event(s, ts=2.0, kind="load", message="kept")
    with store.session() as s:
        assert [e.message for e in queries.list_events(s)] == ["kept"]
    assert event_.message == "kept"  # readable after its session ended


def test_reopening_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "vramd.db"
    first = open_store(path)
    apply(first, "text")
    first.close()
    second = open_store(path)
    with second.session() as s:
        active = queries.active_policy_version(s)
    second.close()
    assert active is not None and active.text == "text"


# --------------------------------------------------------------------------- opening fails


def test_parent_that_is_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="not a directory") as info:
        open_store(blocker / "vramd.db")
    assert str(blocker) in str(info.value)


def test_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        open_store(tmp_path)


def test_garbage_file_is_not_a_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "vramd.db"
    garbage = os.urandom(4096)
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match="not a SQLite database") as info:
        open_store(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == garbage  # left exactly as found


def test_database_locked_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "vramd.db"
    open_store(path).close()
    with (
        sqlite_lock(path),
        pytest.raises(StoreError, match="locked by another process") as info,
    ):
        open_store(path, busy_timeout_ms=100)
    assert str(path) in str(info.value)
    open_store(path, busy_timeout_ms=100).close()  # usable once the lock is gone


def test_database_from_a_newer_vramd(tmp_path: Path) -> None:
    path = tmp_path / "vramd.db"
    open_store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_future'")
    conn.close()
    with pytest.raises(StoreError, match="newer vramd"):
        open_store(path)


def test_full_database_is_a_store_error_naming_the_file(store: Store) -> None:
    # SQLite's page limit fails a write with the same SQLITE_FULL as a full disk does.
    store.engine.dispose()

    @event.listens_for(store.engine, "connect")
    def _limit(dbapi_connection: Any, _record: Any) -> None:
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    with pytest.raises(StoreError, match="disk is full") as info, store.session() as s:
        queries.record_event(s, ts=1.0, kind="x", message="y" * 100_000)
    assert str(store.path) in str(info.value)


def test_explain_names_the_file_for_each_sqlite_failure(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("PRAGMA max_page_count = 1")
        with pytest.raises(sqlite3.Error) as full:
            conn.execute("CREATE TABLE t (x)")
    finally:
        conn.close()
    assert "disk is full" in explain_sqlite_error(full.value, path)
    assert str(path) in explain_sqlite_error(RuntimeError("odd"), path)


READ_ONLY_PROBE = """
import json, os, sys
from service.errors import StoreError
from service.store import open_store

open_store(sys.argv[1]).close()  # load everything while we may still read it
if os.getuid() == 0:  # chmod does not bind root: become nobody, for real
    os.setgid(65534)
    os.setuid(65534)
results = []
for target in sys.argv[2:]:
    try:
        open_store(target).close()
        results.append(None)
    except StoreError as exc:
        results.append(str(exc))
print(json.dumps(results))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged process can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="vramd-store-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    subprocess.run(["rm", "-rf", str(path)], check=True)


def test_read_only_file_and_directory(tmp_path: Path, shared_dir: Path) -> None:
    writable_dir = shared_dir / "rw"
    read_only_dir = shared_dir / "ro"
    for d in (writable_dir, read_only_dir):
        d.mkdir()
        open_store(d / "vramd.db").close()
        (d / "vramd.db").chmod(0o444)
    writable_dir.chmod(0o777)
    read_only_dir.chmod(0o555)
    before = (read_only_dir / "vramd.db").read_bytes()
    targets = [writable_dir / "vramd.db", read_only_dir / "vramd.db", read_only_dir / "new.db"]

    result = subprocess.run(
        [sys.executable, "-c", READ_ONLY_PROBE, str(tmp_path / "warm.db"), *map(str, targets)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    read_only_file, in_read_only_dir, new_in_read_only_dir = json.loads(result.stdout)
    assert read_only_file == f"database {targets[0]} is read-only; make it writable"
    assert f"directory {read_only_dir} is not writable" in in_read_only_dir
    assert str(targets[1]) in in_read_only_dir
    assert f"directory {read_only_dir} is not writable" in new_in_read_only_dir
    assert not targets[2].exists()
    assert (read_only_dir / "vramd.db").read_bytes() == before
