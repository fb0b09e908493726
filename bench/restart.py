"""What a restart of the daemon costs its clients, three ways (docs/benchmarks.md,
"Restarts of the daemon").

    python -m bench.restart [--before 3] [--after 4] [--rounds 1] [--json OUT] [--markdown OUT]

A ``vramd serve`` with three loaded demo runtimes (one pinned, two on demand) and eight
clients on keep-alive connections (three streamed chats, two chats, three embeddings),
then the daemon is restarted:

- ``replace``: ``vramd serve --replace`` with the same arguments;
- ``crash``: ``kill -9`` of the daemon, then a new ``vramd serve``;
- ``sigterm``: SIGTERM, then a new ``vramd serve`` once the old one has exited (the way
  before adoption: every runtime stopped, every model loaded again).

For each: requests that failed and how (an error answer by code, connection refused --
counted per try, each client tries again every 20 ms -- reset or dropped mid-answer),
loads after the restart, seconds until every service has answered a request sent after
the restart (from the restart, and from the new daemon's spawn), the new daemon's RSS and
open descriptors, and the runtimes left running once it is stopped in turn. Not a test: the figures
depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console

from bench.processes import REPO_ROOT, demo_command, free_port, policy_text
from bench.report import markdown_table, rich_table, write_outputs

WAYS = ("replace", "crash", "sigterm")
CLIENTS = (("stream", "chat"),) * 3 + (("chat", "chat2"),) * 2 + (("embed", "embed"),) * 3
COLUMNS = (
    "way", "requests", "failed", "refused tries", "reset", "error answers", "loads after",
    "all answer s", "after new start s", "new RSS MiB", "new fds", "left after stop",
)  # fmt: skip


def policy() -> str:
    chunks = ("--chunks", "8", "--chunk-delay-ms", "20", "--load-seconds", "1")
    service = {"memory": {"estimate": "120MiB"}, "stop_timeout": "5s"}
    chat = [*demo_command(*chunks), "--memory", "80MiB"]
    chat2 = [*demo_command(*chunks), "--memory", "60MiB"]
    embed = [*demo_command("--load-seconds", "1"), "--memory", "40MiB"]
    services = {
        "chat": {**service, "kind": "chat", "models": ["m-chat"], "residency": "pinned",
                 "command": chat},
        "chat2": {**service, "kind": "chat", "models": ["m-chat2"],
                  "residency": "on-demand", "command": chat2},
        "embed": {**service, "kind": "embedding", "models": ["m-embed"],
                  "residency": "on-demand", "command": embed},
    }  # fmt: skip
    return policy_text(services, budget="2GiB")


@dataclass
class Outcome:
    service: str
    began: float
    ended: float
    result: str  # "ok", "status 503", "refused", "reset", "error: ..."


@dataclass
class Traffic:
    url: str
    done: threading.Event = field(default_factory=threading.Event)
    outcomes: list[Outcome] = field(default_factory=list)

    def client(self, kind: str, service: str) -> None:
        model = {"chat": "m-chat", "chat2": "m-chat2", "embed": "m-embed"}[service]
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.done.is_set():
                began = time.monotonic()
                result = _one(http, kind, model)
                self.outcomes.append(Outcome(service, began, time.monotonic(), result))
                if result == "refused":
                    time.sleep(0.02)


def _one(http: httpx.Client, kind: str, model: str) -> str:
    try:
        if kind == "embed":
            r = http.post("/v1/embeddings", json={"model": model, "input": "x"})
            return "ok" if r.status_code == 200 else f"status {r.status_code}"
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "stream": kind == "stream"}  # fmt: skip
        r = http.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return f"status {r.status_code}"
        return "ok" if kind != "stream" or "[DONE]" in r.text else "reset"
    except httpx.ConnectError:
        return "refused"
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
        return "reset"
    except httpx.HTTPError as exc:
        return f"error: {type(exc).__name__}"


def serve(workdir: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "service.cli", "serve", "--config", str(workdir / "p.yaml")]
    argv += ["--port", str(port), "--db", str(workdir / "vramd.db"), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")}
    with (workdir / "daemon.log").open("ab") as log:
        return subprocess.Popen(
            argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True,
        )  # fmt: skip


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError):
            if check():
                return
        time.sleep(0.02)
    raise TimeoutError(what)


def states(url: str) -> dict[str, str]:
    return {s["name"]: s["state"] for s in httpx.get(url + "/api/services", timeout=5).json()}


def one_way(way: str, before_s: float, after_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vramd-restart-") as tmp:
        workdir = Path(tmp)
        (workdir / "p.yaml").write_text(policy())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        old = serve(workdir, port)
        new: subprocess.Popen[bytes] | None = None
        traffic = Traffic(url)
        threads = [threading.Thread(target=traffic.client, args=c) for c in CLIENTS]
        try:
            wait_for(lambda: states(url)["chat"] == "ready", 60, "the first daemon")
            for thread in threads:
                thread.start()
            wait_for(lambda: set(states(url).values()) == {"ready"}, 60, "every service")
            time.sleep(before_s)
            restart_at, restart_wall = time.monotonic(), time.time()
            if way == "replace":
                new_at = time.monotonic()
                new = serve(workdir, port, "--replace")
                old.wait(60)
                if os.environ.get("BENCH_RESTART_DEBUG"):
                    print(f"old exited {time.monotonic() - restart_at:+.3f}s")
            elif way == "crash":
                old.send_signal(signal.SIGKILL)
                old.wait(10)
                new_at = time.monotonic()
                new = serve(workdir, port)
            else:
                old.send_signal(signal.SIGTERM)
                old.wait(60)
                new_at = time.monotonic()
                new = serve(workdir, port)
            time.sleep(after_s)
            traffic.done.set()
            for thread in threads:
                thread.join(60)
            events = httpx.get(url + "/api/events", params={"kind": "load", "limit": 5000}).json()
            loads = [e for e in events["events"] if e["ts"] >= restart_wall]
            runtime_pids = [s["pid"] for s in httpx.get(url + "/api/services").json() if s["pid"]]
            proc = psutil.Process(new.pid)
            rss, fds = proc.memory_info().rss, proc.num_fds()
            new.send_signal(signal.SIGTERM)
            new.wait(60)
            left = [pid for pid in runtime_pids if _running(pid)]
        finally:
            traffic.done.set()
            for p in (old, new):
                if p is not None and p.poll() is None:
                    p.kill()
            for pid in _demo_runtimes(workdir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if os.environ.get("BENCH_RESTART_DEBUG"):
                (Path(os.environ["BENCH_RESTART_DEBUG"]) / f"{way}.log").write_bytes(
                    (workdir / "daemon.log").read_bytes()
                )
    result = summarize(way, traffic.outcomes, restart_at, loads, rss, fds, left)
    result["after_new_start_s"] = result["answering_again_s"] - (new_at - restart_at)
    return result


def _running(pid: int) -> bool:
    """Alive and not a zombie (an adopted runtime's parent may be an init that does not
    reap: its exit is what counts)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _demo_runtimes(workdir: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if "service.demo_runtime" in " ".join(proc.info["cmdline"] or []) and str(
                workdir
            ) in str(proc.info["environ"] or ""):
                found.append(proc.pid)
    return found


def summarize(
    way: str,
    outcomes: list[Outcome],
    restart_at: float,
    loads: list[dict[str, Any]],
    rss: int,
    fds: int,
    left: list[int],
) -> dict[str, Any]:
    failed = [o for o in outcomes if o.result != "ok"]
    if os.environ.get("BENCH_RESTART_DEBUG"):
        for o in failed:
            print(f"{o.service}: {o.result} began {o.began - restart_at:+.3f}s "
                  f"ended {o.ended - restart_at:+.3f}s")  # fmt: skip
    again = {
        service: min((o.ended for o in outcomes
                      if o.service == service and o.result == "ok" and o.began >= restart_at),
                     default=float("nan"))
        for service in ("chat", "chat2", "embed")
    }  # fmt: skip
    return {
        "way": way,
        "requests": len(outcomes),
        "failed": len(failed),
        "refused": sum(o.result == "refused" for o in failed),
        "reset": sum(o.result == "reset" for o in failed),
        "error_answers": sorted({o.result for o in failed if o.result.startswith("status")}),
        "loads_after": len(loads),
        "answering_again_s": max(again.values()) - restart_at,
        "new_rss_bytes": rss,
        "new_fds": fds,
        "left_after_stop": len(left),
    }


def row(result: dict[str, Any]) -> list[str]:
    return [
        result["way"], str(result["requests"]), str(result["failed"]), str(result["refused"]),
        str(result["reset"]), ", ".join(result["error_answers"]) or "0",
        str(result["loads_after"]), f"{result['answering_again_s']:.2f}",
        f"{result['after_new_start_s']:.2f}",
        f"{result['new_rss_bytes'] / 2**20:.0f}", str(result["new_fds"]),
        str(result["left_after_stop"]),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", type=float, default=3.0, help="seconds of traffic before")
    parser.add_argument("--after", type=float, default=4.0, help="seconds of traffic after")
    parser.add_argument("--rounds", type=int, default=1, help="restarts of each way")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    results = [
        one_way(way, args.before, args.after)
        for _ in range(args.rounds)
        for way in args.ways.split(",")
    ]
    rows = [row(r) for r in results]
    Console().print(rich_table("Restarts of the daemon under 8 clients", COLUMNS, rows))
    text = "\n".join(markdown_table(COLUMNS, rows)) + "\n"
    write_outputs(results, text, json_path=args.json, markdown_path=args.markdown)


if __name__ == "__main__":
    main()
