"""The fault matrix (docs/reliability.md): one real fault per test against `vramd serve`.

Every fault is real: a runtime that ignores SIGTERM, a port another process holds, a
daemon killed with SIGKILL in the middle of traffic, a SQLite file locked by another
process, a filesystem that is read-only or full. Each test checks what the client sees
(a complete response or an OpenAI-shaped error, never a hang), what the daemon records,
and that nothing it started outlives it. Faults already covered elsewhere (a crash
mid-stream, a hung runtime, an out-of-memory start, a leak past the cap) are listed in
docs/reliability.md with the test that covers them, not repeated here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, policy_yaml, running_daemon, start_daemon, stop_daemon
from support.faults import (
    alive,
    demo_service,
    fill,
    integrity,
    no_leftovers,
    remount_read_only,
    serve_briefly,
    serve_until_exit,
    sqlite_lock,
    tmpfs,
)

pytestmark = pytest.mark.faults

# Codes the contract allows the daemon to answer with when a runtime or the daemon itself
# cannot serve (docs/api.md); a 500 is never one of them.
SERVER_ERROR_CODES = {
    "insufficient_capacity",
    "queue_timeout",
    "window_closed",
    "runtime_failed",
    "runtime_timeout",
}


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    with no_leftovers(tmp_path):
        yield tmp_path


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def ask(daemon: Daemon, model: str, timeout: float = 30, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions", json=chat(model, **extra), timeout=timeout
    )


def openai_error(response: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error response (asserting the shape)."""
    body = response.json()
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "code"} <= set(error), body
    return error


class Outcome:
    """What one client got: a status and body, or the exception its client raised."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""
        self.error: BaseException | None = None
        self.seconds = 0.0

    def __repr__(self) -> str:
        return f"<Outcome {self.status} {self.body[-120:]!r} {self.error!r} {self.seconds:.1f}s>"

    @property
    def complete_stream(self) -> bool:
        return self.status == 200 and self.body.rstrip().endswith(b"data: [DONE]")

    @property
    def openai_error(self) -> bool:
        """An OpenAI-shaped error: an error status with an error body, or an error event."""
        if self.status is None:
            return False
        if self.status >= 400:
            try:
                return {"message", "type", "code"} <= set(json.loads(self.body)["error"])
            except (ValueError, KeyError, TypeError):
                return False
        return b'"error"' in self.body.rsplit(b"data: ", 1)[-1]


def send(url: str, body: dict[str, Any], timeout: float = 60) -> Outcome:
    """POST ``body`` and read the whole answer (streamed or not) into an ``Outcome``."""
    outcome = Outcome()
    started = time.monotonic()
    try:
        with httpx.stream("POST", url, json=body, timeout=timeout) as response:
            outcome.status = response.status_code
            for chunk in response.iter_bytes():
                outcome.body += chunk
    except httpx.HTTPError as exc:
        outcome.error = exc
    outcome.seconds = time.monotonic() - started
    return outcome


def clients(
    pool: ThreadPoolExecutor, daemon: Daemon, bodies: list[dict[str, Any]], timeout: float = 60
) -> list[Future[Outcome]]:
    url = f"{daemon.url}/v1/chat/completions"
    return [pool.submit(send, url, body, timeout) for body in bodies]


# --- runtimes misbehaving -----------------------------------------------------------------


def test_a_port_taken_by_another_process_is_a_clean_start_failure(workdir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        spec = demo_service(workdir, ["m-fixed"], restart={"max_retries": 1, "backoff": "0.1s"})
        # A runtime hard-coded to a port (or one that lost the race for ${PORT}).
        spec["command"] = [
            "${PYTHON}",
            "-m",
            "service.demo_runtime",
            "--port",
            str(taken),
            "--model",
            "${MODEL}",
        ]
        with running_daemon(policy_yaml({"fixed": spec}), workdir) as daemon:
            response = ask(daemon, "m-fixed")
            assert response.status_code == 502, response.text
            error = openai_error(response)
            assert error["code"] == "runtime_failed"
            assert "Address already in use" in error["message"]
            fixed = daemon.service("fixed")
            assert fixed["state"] == "failed" and fixed["pid"] is None
            assert fixed["restarts"] == 1  # backoff was tried once, then it gave up
            assert "Address already in use" in fixed["last_error"]
            assert "crash-looping" in fixed["flags"]
            assert daemon.get("/healthz").status_code == 200
        # The daemon took nothing from the process that owns the port.
        with socket.create_connection(("127.0.0.1", taken), timeout=2):
            pass


def test_a_runtime_ignoring_sigterm_is_killed_after_its_stop_timeout(workdir: Path) -> None:
    spec = demo_service(
        workdir,
        ["m-stubborn"],
        "--ignore-sigterm",
        "--workers",
        "1",  # a helper that ignores SIGTERM too: only a group SIGKILL ends it
        residency="pinned",
        stop_timeout="1s",
    )
    with running_daemon(policy_yaml({"stubborn": spec}), workdir) as daemon:
        daemon.wait_for(lambda: daemon.service("stubborn")["state"] == "ready")
        group = daemon.runtime_pids()
        assert len(group) == 2
        unloaded = daemon.post("/api/services/stubborn/unload", timeout=30)
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "stopped"
        # Killed once its stop_timeout had passed, the group with it.
        assert "still running 1.0s after SIGTERM: killing its process group" in daemon.output()
        assert not [pid for pid in group if alive(pid)]

        assert daemon.post("/api/services/stubborn/load", timeout=30).json()["state"] == "ready"
        group = daemon.runtime_pids()
        assert stop_daemon(daemon) in (0, -signal.SIGTERM)
        assert not [pid for pid in group if alive(pid)]


def test_a_llama_server_hung_after_sigterm_is_killed_before_a_long_stop_timeout(
    workdir: Path,
) -> None:
    # llama-server exits within milliseconds of SIGTERM or deadlocks (docs/runtimes.md):
    # its adapter's exit grace, not the service's 60 s, decides when to kill.
    spec = demo_service(
        workdir, ["m-hung"], "--ignore-sigterm", adapter="llama.cpp", stop_timeout="60s"
    )
    with running_daemon(policy_yaml({"hung": spec}), workdir) as daemon:
        assert daemon.post("/api/services/hung/load", timeout=30).json()["state"] == "ready"
        group = daemon.runtime_pids()
        unloaded = daemon.post("/api/services/hung/unload", timeout=30)
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "stopped"
        assert not [pid for pid in group if alive(pid)]
        assert "still running 3.0s after SIGTERM: killing its process group" in daemon.output()


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_a_hung_runtime_frees_its_slots_after_504_and_others_keep_serving(
    workdir: Path,
) -> None:
    services = {
        "hung": demo_service(
            workdir, ["m-hung"], "--hang", max_concurrency=2, queue={"max": 2, "timeout": "30s"}
        ),
        "chat": demo_service(workdir, ["m-chat"], residency="pinned"),
    }
    extra = "server:\n  request_timeout: 3s\n"
    with running_daemon(policy_yaml(services, extra=extra), workdir) as daemon:
        assert daemon.post("/api/services/hung/load", timeout=30).status_code == 200
        with ThreadPoolExecutor(4) as pool:
            stuck = clients(pool, daemon, [chat("m-hung")] * 4)
            daemon.wait_for(lambda: daemon.service("hung")["in_flight"] == 2, timeout=10)
            # While every slot and the queue of "hung" are taken, the rest is prompt.
            for _ in range(5):
                started = time.monotonic()
                assert ask(daemon, "m-chat").status_code == 200
                assert daemon.get("/healthz").status_code == 200
                assert daemon.get("/api/services").status_code == 200
                assert time.monotonic() - started < 1.5
            outcomes = [f.result(timeout=30) for f in stuck]
        assert [o.status for o in outcomes] == [504] * 4, outcomes
        assert all(o.openai_error for o in outcomes)
        hung = daemon.service("hung")
        assert (hung["in_flight"], hung["queued"], hung["state"]) == (0, 0, "ready")


# --- the daemon killed or stopped ---------------------------------------------------------


def test_daemon_sigkill_mid_traffic_keeps_the_database_adopts_the_ready_and_reaps_the_rest(
    workdir: Path,
) -> None:
    services = {
        "chat": demo_service(
            workdir, ["m-chat"], "--chunks", "100", "--chunk-delay-ms", "50", residency="pinned"
        ),
        # Long enough that it is still loading when the daemon is killed, however busy
        # the machine is between the two (a ready one would rightly be adopted).
        "embed": demo_service(workdir, ["m-embed"], kind="embedding", load_seconds=30.0),
    }
    with running_daemon(policy_yaml(services), workdir) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        for _ in range(3):
            assert ask(daemon, "m-chat").status_code == 200
        with ThreadPoolExecutor(4) as pool:
            streams = clients(pool, daemon, [chat("m-chat", stream=True)] * 3)
            load = pool.submit(
                send, f"{daemon.url}/v1/embeddings", {"model": "m-embed", "input": "x"}
            )
            daemon.wait_for(
                lambda: (
                    daemon.service("chat")["in_flight"] == 3
                    and daemon.service("embed")["state"] == "starting"
                )
            )
            before = daemon.events(limit=5000)
            version = daemon.get("/api/policy").json()["version"]
            leaders = {s["name"]: s["pid"] for s in daemon.get("/api/services").json()}
            orphans = daemon.runtime_pids()
            os.kill(daemon.proc.pid, signal.SIGKILL)
            daemon.proc.wait(10)
            # Every client learns at once: the connection drops, nothing hangs.
            outcomes = [f.result(timeout=10) for f in [*streams, load]]
        assert all(o.error is not None or o.complete_stream for o in outcomes), outcomes
        assert integrity(daemon.db) == "ok"

        assert all(alive(pid) for pid in orphans), "no runtime dies with its daemon"
        second = start_daemon(workdir)
        try:
            # The ready chat is adopted; the embeddings, still loading, do not answer
            # their health check: stopped, with the group it started.
            assert alive(leaders["chat"]) and not alive(leaders["embed"])
            assert second.service("chat")["pid"] == leaders["chat"]
            after = {e["id"]: e for e in second.events(limit=5000)}
            assert all(after.get(e["id"]) == e for e in before), "events survive as written"
            assert second.get("/api/policy").json()["version"] == version
            # The adopted instance's record goes on; the other one's is closed, saying why.
            with sqlite3.connect(daemon.db) as db:
                rows = dict(
                    db.execute(
                        "select pid, coalesce(reason, 'adopted' || (adopted_at > 0)) "
                        "from instances where pid in (?, ?)",
                        (leaders["chat"], leaders["embed"]),
                    ).fetchall()
                )
            db.close()
            assert rows[leaders["chat"]] == "adopted1", rows
            assert rows[leaders["embed"]].startswith("not adopted: it does not answer"), rows
            refused = {e["data"]["pid"] for e in second.events(kind="not-adopted")}
            assert refused == {leaders["embed"]}
            second.wait_for(lambda: second.service("chat")["state"] == "ready")
            assert ask(second, "m-chat").status_code == 200
        finally:
            stop_daemon(second)
        assert integrity(daemon.db) == "ok"


def test_daemon_sigterm_during_a_load_and_streams_answers_every_client(workdir: Path) -> None:
    services = {
        "chat": demo_service(
            workdir, ["m-chat"], "--chunks", "60", "--chunk-delay-ms", "50", residency="pinned"
        ),
        "slow": demo_service(workdir, ["m-slow"], load_seconds=3.0),
    }
    with running_daemon(policy_yaml(services), workdir) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        with ThreadPoolExecutor(5) as pool:
            bodies = [chat("m-chat", stream=True)] * 3 + [chat("m-slow")] * 2
            futures = clients(pool, daemon, bodies, timeout=60)
            daemon.wait_for(
                lambda: (
                    daemon.service("chat")["in_flight"] == 3
                    and daemon.service("slow")["queued"] == 2
                )
            )
            runtimes = daemon.runtime_pids()
            daemon.proc.send_signal(signal.SIGTERM)
            outcomes = [f.result(timeout=30) for f in futures]
            # A new client is turned away at once rather than left waiting.
            late = send(f"{daemon.url}/v1/chat/completions", chat("m-chat"), timeout=5)
            assert late.error is not None or late.openai_error, late
        code = daemon.proc.wait(30)  # a shutdown that hangs fails here
    assert code in (0, -signal.SIGTERM)
    streams, loads = outcomes[:3], outcomes[3:]
    assert all(o.complete_stream or o.openai_error for o in streams), streams
    assert all(o.status == 200 or o.openai_error for o in loads), loads
    assert "every runtime was stopped" in daemon.output()
    assert not [pid for pid in runtimes if alive(pid)]


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_daemon_sigterm_refuses_requests_that_cannot_finish_promptly(workdir: Path) -> None:
    services = {
        "never": demo_service(workdir, ["m-never"], "--never-ready", startup_timeout="120s"),
        "hung": demo_service(workdir, ["m-hung"], "--hang", residency="pinned"),
    }
    daemon = start_daemon(_write_policy(workdir, policy_yaml(services)))
    try:
        daemon.wait_for(lambda: daemon.service("hung")["state"] == "ready")
        with ThreadPoolExecutor(2) as pool:
            futures = clients(pool, daemon, [chat("m-never"), chat("m-hung")], timeout=8)
            daemon.wait_for(
                lambda: (
                    daemon.service("never")["queued"] == 1
                    and daemon.service("hung")["in_flight"] == 1
                )
            )
            daemon.proc.send_signal(signal.SIGTERM)
            outcomes = [f.result(timeout=30) for f in futures]
        # Within stop_timeout and change, each gets an OpenAI-shaped error (503 or 502).
        assert all(o.openai_error and o.seconds < 7 for o in outcomes), outcomes
        assert daemon.proc.wait(15) in (0, -signal.SIGTERM)
    finally:
        stop_daemon(daemon, sig=signal.SIGKILL, grace=5)


def _write_policy(workdir: Path, text: str) -> Path:
    (workdir / "policy.yaml").write_text(text)
    return workdir


# --- decisions racing a load --------------------------------------------------------------


@pytest.mark.parametrize("change", ["priority", "command", "removed"])
def test_a_policy_applied_during_a_load(workdir: Path, change: str) -> None:
    def services(**slow: Any) -> dict[str, Any]:
        spec = demo_service(workdir, ["m-slow"], load_seconds=slow.pop("load", 2.5), **slow)
        return {"slow": spec, "chat": demo_service(workdir, ["m-chat"])}

    with running_daemon(policy_yaml(services()), workdir) as daemon:
        with ThreadPoolExecutor(1) as pool:
            [waiting] = clients(pool, daemon, [chat("m-slow")])
            daemon.wait_for(lambda: daemon.service("slow")["state"] == "starting")
            starting_pid = daemon.service("slow")["pid"]
            new = {
                "priority": services(priority=500),
                "command": services(load=0.2),
                "removed": {"chat": services()["chat"]},
            }[change]
            applied = daemon.post("/api/policy", content=policy_yaml(new), timeout=30)
            assert applied.status_code == 200, applied.text
            outcome = waiting.result(timeout=30)

        if change == "removed":
            # The request is refused at once, and the removed service's process ends.
            assert outcome.status == 404 and outcome.openai_error, outcome
            daemon.wait_for(lambda: not alive(starting_pid))
            # Listed while it stops (its memory settles), then gone.
            daemon.wait_for(
                lambda: [s["name"] for s in daemon.get("/api/services").json()] == ["chat"]
            )
            return
        assert outcome.status == 200, outcome  # the load it waited for went on
        if change == "priority":
            slow = daemon.service("slow")
            assert (slow["priority"], slow["pid"], slow["state"]) == (500, starting_pid, "ready")
        else:
            # The old command finished its load and served; it is replaced once idle.
            daemon.wait_for(lambda: not alive(starting_pid))
            assert ask(daemon, "m-slow").status_code == 200
            loads = [e for e in daemon.events(kind="load", service="slow")]
            assert "0.2" in loads[-1]["data"]["argv"], loads[-1]
        assert daemon.get("/healthz").status_code == 200


def test_a_client_leaving_does_not_cancel_a_load_others_wait_for(workdir: Path) -> None:
    services = {"slow": demo_service(workdir, ["m-slow"], load_seconds=3.0)}
    with running_daemon(policy_yaml(services), workdir) as daemon:
        body = json.dumps(chat("m-slow")).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: vramd\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        with ThreadPoolExecutor(1) as pool:
            leaver = socket.create_connection(("127.0.0.1", daemon.port))
            leaver.sendall(request)
            daemon.wait_for(lambda: daemon.service("slow")["state"] == "starting")
            [stayer] = clients(pool, daemon, [chat("m-slow")])
            daemon.wait_for(lambda: daemon.service("slow")["queued"] == 2)
            leaver.close()  # the first client gives up while the load is under way
            daemon.wait_for(lambda: daemon.service("slow")["queued"] == 1)
            outcome = stayer.result(timeout=30)
        assert outcome.status == 200, outcome
        slow = daemon.service("slow")
        assert (slow["state"], slow["loads"], slow["in_flight"], slow["queued"]) == (
            "ready",
            1,
            0,
            0,
        )
        states = [e["data"]["to"] for e in daemon.events(kind="state", service="slow")]
        assert states == ["starting", "ready"], "one load, never stopped or restarted"


# --- the database at startup --------------------------------------------------------------


def explains(output: str, db: Path, *words: str) -> bool:
    """Whether vramd itself said what is wrong with ``db``: a line naming the file and one
    of ``words`` that is not a raw exception (``OSError: [Errno 30] ...``) in a traceback."""
    for line in output.splitlines():
        raw = re.match(r"^\s*[\w.]+(Error|Exception): ", line) or line.startswith(" ")
        if not raw and str(db) in line and any(w in line.lower() for w in words):
            return True
    return False


def _policy_with_one_service(workdir: Path) -> None:
    services = {"chat": demo_service(workdir, ["m-chat"])}
    (workdir / "policy.yaml").write_text(policy_yaml(services))


def _policy_versions(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?immutable=1", uri=True) as conn:
        count: int = conn.execute("select count(*) from policy_versions").fetchone()[0]
    conn.close()
    return count


def test_a_database_locked_by_another_process_is_a_clear_startup_error(workdir: Path) -> None:
    _policy_with_one_service(workdir)
    db = workdir / "vramd.db"
    serve_briefly(workdir, db=db)
    with sqlite_lock(db):
        # It waits for the busy timeout, not forever: one that never exits fails here.
        code, output = serve_until_exit(workdir, db=db, timeout=30)
    assert code != 0
    assert f"database {db} is locked by another process" in output
    assert integrity(db) == "ok"
    assert _policy_versions(db) == 1
    with running_daemon(policy_yaml({}), workdir) as daemon:  # usable once released
        assert daemon.get("/healthz").status_code == 200


def _locked_for_writers(db: Path) -> bool:
    """Whether a writer (``BEGIN IMMEDIATE``, as the daemon's) is refused at once."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    else:
        conn.rollback()
        return False
    finally:
        conn.close()


def _hold_lock(db: Path, seconds: float, held: threading.Event) -> tuple[float, float]:
    """Hold ``db``'s write lock from another process for ``seconds``; returns from when to
    when (epoch seconds), having checked at both ends that it blocks writers."""
    with sqlite_lock(db):
        assert _locked_for_writers(db), "the holder must block every writer"
        locked_at = time.time()
        held.set()
        time.sleep(seconds)
        assert _locked_for_writers(db), "still locked: nothing was written meanwhile"
        return locked_at, time.time()


def _timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_a_database_locked_while_serving_delays_records_never_requests(workdir: Path) -> None:
    services = {
        "chat": demo_service(workdir, ["m-chat"], residency="pinned"),
        "other": demo_service(workdir, ["m-other"], load_seconds=0.5),
    }
    with running_daemon(policy_yaml(services), workdir) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        assert ask(daemon, "m-chat").status_code == 200  # warm
        load = lambda: daemon.post("/api/services/other/load", timeout=30)  # noqa: E731
        loaded, normal_load_s = _timed(load)
        assert loaded.status_code == 200, loaded.text
        assert daemon.post("/api/services/other/unload", timeout=30).status_code == 200
        daemon.wait_for(lambda: daemon.service("other")["state"] == "stopped")
        served_before = daemon.service("chat")["requests_served"]

        changed = policy_yaml({**services, "chat": dict(services["chat"], priority=101)})
        apply = lambda: daemon.post("/api/policy", content=changed, timeout=30)  # noqa: E731

        warm: list[float] = []
        held = threading.Event()
        with ThreadPoolExecutor(4) as pool:
            holder = pool.submit(_hold_lock, daemon.db, 5.0, held)
            assert held.wait(10)
            pending = pool.submit(_timed, load)
            # A policy applied meanwhile waits for its version's row (its answer carries
            # the version number), not the loop: requests go on.
            applying = pool.submit(apply)
            # Reads answer too: they wait for the writer a bounded while (2 s), then
            # say what is committed.
            reading = pool.submit(_timed, lambda: daemon.get("/api/events", timeout=30))
            while not holder.done():
                answer, seconds = _timed(lambda: ask(daemon, "m-chat"))
                assert answer.status_code == 200, answer.text
                warm.append(seconds)
                time.sleep(0.2)
            locked_at, released_at = holder.result()
            loaded, load_s = pending.result(timeout=30)
            events, events_s = reading.result(timeout=30)
            applied = applying.result(timeout=30)

        assert applied.status_code == 200 and applied.json()["changed"], applied.text
        assert daemon.service("chat")["priority"] == 101
        assert _health(daemon)["last_stall"] is None  # the loop never stood still

        assert warm and max(warm) < 1.0, f"warm requests during the lock took {warm}"
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
        assert load_s < normal_load_s + 2.0, (load_s, normal_load_s)
        assert events.status_code == 200 and events_s < 4, events_s
        # Once released, every record of the lock's period is in the database.
        during = [e for e in daemon.events(limit=5000) if locked_at <= e["ts"] <= released_at]
        mine = [(e["kind"], e["service"]) for e in during]
        assert ("operator", "other") in mine and ("load", "other") in mine, mine
        states = [
            (e["service"], e["data"]["from"], e["data"]["to"])
            for e in during
            if e["kind"] == "state"
        ]
        assert ("other", "starting", "ready") in states, states
        with sqlite3.connect(daemon.db) as db:
            instance = db.execute(
                "select started_at, ready_at from instances where service = 'other' "
                "order by id desc limit 1"
            ).fetchone()
            device_samples = db.execute(
                "select count(*) from device_samples where ts between ? and ?",
                (locked_at, released_at),
            ).fetchone()[0]
            served = db.execute(
                "select max(requests_served) from instance_samples "
                "where service = 'chat' and ts between ? and ?",
                (locked_at, released_at),
            ).fetchone()[0]
        db.close()
        assert locked_at <= instance[0] <= instance[1] <= released_at, instance
        # One sample per 0.2 s is taken; on a busy machine at least a third of them.
        assert device_samples >= (released_at - locked_at) / 0.2 / 3, device_samples
        assert served >= served_before + len(warm) - 1, (served, served_before, len(warm))


def test_a_read_only_database_is_a_clear_startup_error(workdir: Path) -> None:
    _policy_with_one_service(workdir)
    with tmpfs("4m") as disk:
        db = disk / "vramd.db"
        serve_briefly(workdir, db=db)
        before = db.read_bytes()
        remount_read_only(disk)  # EROFS: binds root too, unlike file modes
        code, output = serve_until_exit(workdir, db=db)
        assert code != 0
        assert explains(output, db, "read-only", "not writable"), output
        assert db.read_bytes() == before
        assert integrity(db, read_only=True) == "ok"


def test_a_full_disk_is_a_startup_error_that_corrupts_nothing(workdir: Path) -> None:
    _policy_with_one_service(workdir)
    with tmpfs("1m") as disk:
        db = disk / "vramd.db"
        serve_briefly(workdir, db=db)
        filler = fill(disk)
        # A changed policy: the daemon would have to write a new version.
        (workdir / "policy.yaml").write_text(policy_yaml({}))
        code, output = serve_until_exit(workdir, db=db)
        assert code != 0
        assert explains(output, db, "disk", "space", "cannot"), output
        filler.unlink()
        assert integrity(db) == "ok"
        assert _policy_versions(db) == 1
        # With space again, the same file serves and takes the new version.
        serve_briefly(workdir, db=db)
        assert _policy_versions(db) == 2


def test_a_full_disk_at_startup_says_the_disk_is_full(workdir: Path) -> None:
    _policy_with_one_service(workdir)
    with tmpfs("1m") as disk:
        db = disk / "vramd.db"
        serve_briefly(workdir, db=db)
        filler = fill(disk)
        try:
            code, output = serve_until_exit(workdir, db=db)
        finally:
            filler.unlink()
    assert code != 0
    assert f"database {db} cannot be written: the disk is full" in output, output


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_database_fault_at_startup_prints_no_traceback(workdir: Path, fault: str) -> None:
    _policy_with_one_service(workdir)
    with tmpfs("1m") as disk:
        db = disk / "vramd.db"
        serve_briefly(workdir, db=db)
        if fault == "read-only":
            remount_read_only(disk)
            code, output = serve_until_exit(workdir, db=db)
        else:
            filler = fill(disk)
            code, output = serve_until_exit(workdir, db=db)
            filler.unlink()
    assert code == 1
    assert str(db) in output
    assert "Traceback" not in output, output


# --- the daemon's own liveness ------------------------------------------------------------


def _health(daemon: Daemon) -> dict[str, Any]:
    data: dict[str, Any] = daemon.get("/healthz", timeout=30).json()
    return data


def stuck_in_a_blocking_call() -> None:
    time.sleep(3)


def test_a_blocked_event_loop_is_noticed_reported_and_recovered(workdir: Path) -> None:
    services = {"chat": demo_service(workdir, ["m-chat"], residency="pinned")}
    env = {"VRAMD_WATCHDOG_STALL_S": "1"}
    # In a thread of this process, so the test can block the daemon's own loop.
    with running_daemon(policy_yaml(services), workdir, env=env, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        assert _health(daemon)["last_stall"] is None
        # A block of the test's making: a callback on the daemon's loop that makes a
        # blocking call where none belongs (a decision stuck in a loop looks the same).
        # Nothing on the loop can report it; the watchdog's thread does.
        daemon.loop.call_soon_threadsafe(stuck_in_a_blocking_call)
        daemon.wait_for(lambda: _health(daemon)["last_stall"] is not None)
        stall = _health(daemon)["last_stall"]
        assert stall["blocked_s"] >= 1.0
        assert "stuck_in_a_blocking_call" in stall["where"], stall
        # The stall is recorded while it lasts (from the watchdog's thread), then the
        # recovery from the loop.
        events = daemon.events(limit=5000)
        stalled = [e for e in events if e["kind"] == "watchdog"]
        recovered = [e for e in events if e["kind"] == "watchdog-recovered"]
        assert stalled and recovered, [e["kind"] for e in events]
        assert stalled[0]["ts"] <= recovered[0]["ts"]
        daemon.wait_for(lambda: daemon.get("/healthz").status_code == 200)


# --- the document that lists all this ------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_docs_reliability_names_real_tests_and_every_fault_test() -> None:
    text = DOC.read_text()
    root = DOC.parents[1]
    referenced = re.findall(r"`(tests/\w+/test_\w+\.py)::(\w+)`", text)
    missing = [f"{p}::{n}" for p, n in referenced if n not in _test_names(root / p)]
    # The security table names tests of tests/e2e/test_security.py without the file.
    bare = re.findall(r"(?<![:\w])`(test_\w+)`", text)
    security = _test_names(root / "tests" / "e2e" / "test_security.py")
    missing += [f"tests/e2e/test_security.py::{n}" for n in bare if n not in security]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
    here = {n for n in _test_names(Path(__file__)) if n.startswith("test_")}
    listed = {n for p, n in referenced if p == "tests/e2e/test_faults.py"}
    undocumented = here - listed - {"test_docs_reliability_names_real_tests_and_every_fault_test"}
    assert not undocumented, f"fault tests missing from docs/reliability.md: {undocumented}"
