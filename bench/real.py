"""Cold starts and a swap on every real runtime: by hand against through vramd.

    python -m bench.real [--runs 5] [--kinds chat,vllm,...] [--json OUT] [--markdown OUT]

Every runtime ``make real-runtimes`` installed (``runtimes.json``) is started the way a
user would start it by hand, and through ``vramd serve`` as an on-demand service running
the very same command, and timed from the start to the first byte of one request of its
kind (a streamed chat, an embedding, a rerank, a transcription of a one-second WAV, one
image at the catalog's ``image_size``):

1. ``by hand``: spawn the runtime, poll its adapter's readiness route every 2 ms until
   the adapter says ready, send the request; from the spawn to the first byte.
2. ``through vramd``: unload the service (``POST /api/services/KIND/unload``), then send
   the request to vramd; from the request to the first byte. vramd's added cold start
   is the median of (2) less the median of (1). (1) and (2) alternate, so that a slow
   spell of the box slows both.
3. ``swap``: chat (llama.cpp) and speech-to-text (whisper.cpp) under a budget that holds
   one; requests alternate between them through vramd, each a swap (stop one, start the
   other, first byte), reported per direction; by hand, the same swap is a SIGTERM, a
   wait for the exit, then (1) for the other.

Every method gets one unmeasured run first (page cache, first connections). Not a test:
the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from bench import stats
from bench.processes import free_port, policy_text, running_vramd, spawn
from bench.real_requests import request, runtime_path, runtime_request
from bench.report import markdown_table, rich_table, write_outputs
from service.adapters import adapter_named
from service.real_runtimes.catalog import SERVICE_KINDS, RuntimeEntry, load_catalog

HEALTH_POLL_S = 0.002
# A runtime started by hand gets this long after SIGTERM before it is killed.
STOP_GRACE_S = 20.0
SWAP = ("chat", "speech-to-text")
COLUMNS = ("runtime", "by hand ms", "through vramd ms", "vramd adds ms", "runs")


def first_byte(client: httpx.Client, url: str, kwargs: dict[str, Any], t0: float) -> float:
    """POST a request (``httpx`` keyword arguments) to ``url``; milliseconds from ``t0``
    to the answer's first byte."""
    with client.stream("POST", url, **kwargs) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        for chunk in response.iter_raw():
            if chunk:
                return (time.perf_counter() - t0) * 1000
    raise RuntimeError(f"{url}: an answer without a body")


@contextlib.contextmanager
def by_hand(kind: str, entry: RuntimeEntry, log: Path) -> Iterator[tuple[str, float]]:
    """The runtime started as a user would, polled every 2 ms until its adapter says
    ready; yields its request's URL and the ``perf_counter`` of the spawn, then stops it
    with SIGTERM and waits for the exit."""
    adapter = adapter_named(entry.adapter)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, **entry.env}
    with httpx.Client(timeout=5, trust_env=False) as client:
        t0 = time.perf_counter()
        with spawn(entry.argv(port=port, model=kind), log=log, env=env) as proc:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    answer = client.get(base + adapter.health_path)
                    if adapter.health_ok(answer.status_code, answer.content):
                        break
                if proc.poll() is not None:
                    raise RuntimeError(f"{kind} exited with {proc.returncode} (see {log})")
                if time.perf_counter() - t0 > 600:
                    raise TimeoutError(f"{kind} not ready after 600 s (see {log})")
                time.sleep(HEALTH_POLL_S)
            yield base + runtime_path(kind, entry), t0
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                # llama-server can deadlock at SIGTERM (docs/runtimes.md); vramd kills too.
                print(f"  {kind} by hand: still running {STOP_GRACE_S:.0f} s after SIGTERM; killed")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(60)


def cold_pairs(
    kind: str, catalog: dict[str, RuntimeEntry], runs: int, workdir: Path
) -> tuple[list[float], list[float]]:
    """``runs`` cold starts by hand and through vramd, alternated (after one unmeasured
    pair), so that whatever slows the box for a while slows both alike."""
    entry = catalog[kind]
    policy = policy_text({kind: service(kind, entry)}, budget="5GiB")
    hand: list[float] = []
    vramd_ms: list[float] = []
    with running_vramd(policy, keep=workdir) as vramd, httpx.Client(timeout=600) as client:
        for i in range(runs + 1):
            with by_hand(kind, entry, workdir / f"{kind}-by-hand.log") as (url, t0):
                by_hand_ms = first_byte(client, url, runtime_request(kind, entry, kind), t0)
            httpx.post(f"{vramd.url}/api/services/{kind}/unload", timeout=60).raise_for_status()
            route, kwargs = request(kind, entry, kind)
            through = first_byte(client, vramd.url + route, kwargs, time.perf_counter())
            if i > 0:
                hand.append(by_hand_ms)
                vramd_ms.append(through)
    return hand, vramd_ms


def swap_by_hand(
    kinds: Sequence[str], catalog: dict[str, RuntimeEntry], runs: int, workdir: Path
) -> list[tuple[str, float]]:
    """The same swaps by hand: stop the resident one (SIGTERM, wait), start the other,
    first byte; timed from the stop."""
    results = []
    with httpx.Client(timeout=600, trust_env=False) as client, contextlib.ExitStack() as stack:
        first = kinds[0]
        stack.enter_context(by_hand(first, catalog[first], workdir / f"{first}-swap.log"))
        for i in range(1, runs + 2):
            kind = kinds[i % len(kinds)]
            t0 = time.perf_counter()
            stack.close()  # SIGTERM the resident runtime and wait for its exit
            url, _ = stack.enter_context(by_hand(kind, catalog[kind], workdir / f"{kind}-swap.log"))
            took = first_byte(client, url, runtime_request(kind, catalog[kind], kind), t0)
            if i > 1:
                results.append((kind, took))
    return results


def service(kind: str, entry: RuntimeEntry) -> dict[str, Any]:
    """The runtime's command as an on-demand service whose model is named ``kind``."""
    return {
        "kind": SERVICE_KINDS[kind].value,
        "adapter": entry.adapter,
        "models": [kind],
        "command": list(entry.command),
        "env": entry.env,
        "memory": {"estimate": "3GiB"},
        "startup_timeout": "600s",
        "stop_timeout": "20s",
        "protect": "never",
    }


def swaps_through_vramd(
    kinds: Sequence[str], catalog: dict[str, RuntimeEntry], runs: int, workdir: Path
) -> list[tuple[str, float]]:
    """Requests to vramd alternating between two kinds under a budget that holds one:
    each a swap to the kind named beside its time."""
    services = {kind: service(kind, catalog[kind]) for kind in kinds}
    policy = policy_text(services, budget="5GiB")  # one 3 GiB estimate fits, two do not
    results = []
    with running_vramd(policy, keep=workdir) as vramd, httpx.Client(timeout=600) as client:
        for i in range(runs + 1):
            kind = kinds[(i + 1) % len(kinds)]
            route, kwargs = request(kind, catalog[kind], kind)
            took = first_byte(client, vramd.url + route, kwargs, time.perf_counter())
            if i > 0:
                results.append((kind, took))
    return results


def row(name: str, hand: Sequence[float], vramd: Sequence[float]) -> dict[str, Any]:
    return {
        "name": name,
        "by_hand_ms": hand,
        "through_vramd_ms": vramd,
        "by_hand_median_ms": (by_hand := stats.median(hand)),
        "through_vramd_median_ms": (through := stats.median(vramd)),
        "vramd_adds_ms": None if by_hand is None or through is None else through - by_hand,
    }


def _ms(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["name"],
            _ms(r["by_hand_median_ms"], "{:.1f}"),
            _ms(r["through_vramd_median_ms"], "{:.1f}"),
            _ms(r["vramd_adds_ms"], "{:+.1f}"),
            str(len(r["through_vramd_ms"])),
        ]
        for r in rows
    ]


def measure(kinds: Sequence[str], runs: int, workdir: Path) -> dict[str, Any]:
    catalog = load_catalog()
    rows = []
    for kind in kinds:
        entry = catalog[kind]
        print(f"{kind} ({entry.adapter} {entry.version}): by hand and through vramd ...")
        hand, vramd = cold_pairs(kind, catalog, runs, workdir / kind)
        rows.append(row(f"{kind} ({entry.adapter})", hand, vramd))
    swap = []
    if all(kind in catalog for kind in SWAP):
        print(f"swap {' <-> '.join(SWAP)} ...", flush=True)
        by_hand_swaps = swap_by_hand(SWAP, catalog, 2 * runs, workdir)
        vramd_swaps = swaps_through_vramd(SWAP, catalog, 2 * runs, workdir / "swap")
        for to, other in ((SWAP[0], SWAP[1]), (SWAP[1], SWAP[0])):
            swap.append(
                row(
                    f"{other} -> {to}",
                    [ms for kind, ms in by_hand_swaps if kind == to],
                    [ms for kind, ms in vramd_swaps if kind == to],
                )
            )
    return {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "runs": runs,
        "cold": rows,
        "swap": swap,
        "versions": {kind: catalog[kind].version for kind in kinds},
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Cold start to first byte, medians of {report['runs']} runs:", ""]
    lines += markdown_table(COLUMNS, table_rows(report["cold"]))
    if report["swap"]:
        lines += ["", "A swap between two kinds (stop one, start the other, first byte):", ""]
        lines += markdown_table(COLUMNS, table_rows(report["swap"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kinds", default=None, help="comma-separated; default: every one")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    catalog = load_catalog()
    kinds = args.kinds.split(",") if args.kinds else list(catalog)
    unknown = [kind for kind in kinds if kind not in catalog]
    if unknown:
        parser.error(f"not in runtimes.json: {', '.join(unknown)} (have: {', '.join(catalog)})")
    with tempfile.TemporaryDirectory(prefix="vramd-bench-real-") as tmp:
        report = measure(kinds, args.runs, Path(tmp))
    console = Console(width=170)
    console.print(rich_table("cold start to first byte (ms)", COLUMNS, table_rows(report["cold"])))
    if report["swap"]:
        console.print(rich_table("swap (ms)", COLUMNS, table_rows(report["swap"])))
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
