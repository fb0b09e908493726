"""``yielding`` on a running daemon (docs/api.md, ``GET /api/scheduler``): what ``auto``
stands for and why, a round run on demand in a child process that is gone once it has
answered, a fixed setting applied by policy, and the scope the round needs."""

from __future__ import annotations

import hashlib
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from support.daemon import policy_yaml, running_daemon
from support.faults import demo_service

OPERATE_KEY = "sk-ops-0123456789abcdef"
READ_KEY = "sk-read-0123456789abcdef"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy(workdir: Path, extra: str = "") -> str:
    keys = f"""
    server:
      admin_keys:
        - {{name: ops, key_sha256: {sha(OPERATE_KEY)}, scopes: [read, operate]}}
        - {{name: dash, key_sha256: {sha(READ_KEY)}, scopes: [read]}}
    """
    services = {
        "chat": demo_service(workdir, ["chat"], "--latency-ms", "50", priority=300),
        "embed": demo_service(workdir, ["emb"], kind="embedding", priority=100),
    }
    return policy_yaml(services, extra=textwrap.dedent(keys) + extra)


def workers(pid: int) -> list[psutil.Process]:
    children = psutil.Process(pid).children(recursive=True)
    return [p for p in children if "service.replay.worker" in " ".join(p.cmdline())]


def test_auto_says_what_it_stands_for_and_a_round_replays_the_traffic(tmp_path: Path) -> None:
    with running_daemon(policy(tmp_path), tmp_path) as daemon:
        ops = {"Authorization": f"Bearer {OPERATE_KEY}"}
        read = {"Authorization": f"Bearer {READ_KEY}"}
        before = daemon.get("/api/scheduler", headers=read).json()["yielding"]
        assert before["setting"] == "auto" and before["current"] == "balanced"
        assert before["services"] == {"chat": "balanced", "embed": "balanced"}
        assert before["rounds"] == 0 and before["figures"] == []
        assert before["why"].startswith("not tuned yet")
        assert before["next_round"] > before["since"]

        def ask(i: int) -> int:
            body = {"model": "emb" if i % 2 else "chat", "input": "x"}
            if i % 2 == 0:
                body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            route = "/v1/embeddings" if i % 2 else "/v1/chat/completions"
            return daemon.post(route, json=body, timeout=60).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(ask, range(40))) == {200}

        refused = daemon.post("/api/scheduler/tune", headers=read)
        assert refused.status_code == 403  # a round changes things: scope operate
        after = daemon.post("/api/scheduler/tune", headers=ops, timeout=120).json()["yielding"]
        assert after["rounds"] == 1 and after["cpu_s"] > 0
        labels = [f["candidate"] for f in after["figures"]]
        assert labels[:4] == ["eager", "balanced", "reluctant", "at-deadline"]
        assert all(f["requests"] == 40 for f in after["figures"])
        assert after["current"] in ("eager", "balanced", "reluctant", "at-deadline")
        assert "40 requests of the last hour" in after["why"]
        assert workers(daemon.proc.pid) == []  # the round's child is gone
        if after["current"] != "balanced":
            (event,) = daemon.events(kind="tuning")
            assert event["data"]["current"] == after["current"]
        # /metrics says the same (its snapshot is renewed within a sample interval).
        chat = after["services"]["chat"]
        series = f'vramd_service_yielding{{service="chat",setting="{chat}"}} 1'
        daemon.wait_for(lambda: series in daemon.get("/metrics").text.splitlines())
        assert "vramd_tuning_rounds_total 1" in daemon.get("/metrics").text.splitlines()


def test_a_fixed_setting_is_what_the_scheduler_uses_and_nothing_is_tuned(tmp_path: Path) -> None:
    fixed = "\ndefaults:\n  yielding: reluctant\n"
    with running_daemon(policy(tmp_path, fixed), tmp_path) as daemon:
        ops = {"Authorization": f"Bearer {OPERATE_KEY}"}
        view = daemon.get("/api/scheduler", headers=ops).json()["yielding"]
        assert (view["setting"], view["current"]) == ("reluctant", "reluctant")
        assert view["services"] == {"chat": "reluctant", "embed": "reluctant"}
        assert view["why"] == "no service has yielding: auto (defaults.yielding: reluctant)"
        assert view["next_round"] is None
        tuned = daemon.post("/api/scheduler/tune", headers=ops).json()["yielding"]
        assert tuned["rounds"] == 0 and tuned["current"] == "reluctant"
