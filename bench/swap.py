"""Cold starts and swaps on a real llama-server: by hand, through vramd, through llama.cpp's router.

    python -m bench.swap [--runs 5] [--llama-server PATH] [--json OUT] [--markdown OUT]

Issue 25 asks two things of a swap: that the cold start vramd adds over the same
``llama-server`` started by hand be at most 20 ms (median), and that a swap between two
models through vramd take no longer than llama.cpp's own router (``llama-server
--models-dir DIR --models-max 1``) takes for the same swap. This measures both, on two
tiny generated GGUF models (``bench.tiny_gguf``: ~1 MB, loaded in milliseconds, so what
is timed is the path around the load), each started with the same arguments everywhere
(``RUNTIME_ARGS``), with one streamed chat completion (``max_tokens`` 8) as the request:

1. ``cold by hand``: spawn ``llama-server``, poll ``/health`` every 2 ms until 200, send
   the request; from the spawn to the answer's first byte (and to its end).
2. ``cold through vramd``: ``vramd serve`` with one on-demand service running the same
   command; from the request to vramd's ``/v1/chat/completions`` to the first byte. The
   service is unloaded (``POST /api/services/{name}/unload``) before each run.
   vramd's added cold start is the median of (2) less the median of (1).
3. ``swap through vramd``: two such services under a host budget that holds one
   (``memory.estimate`` 300MiB each, budget 500MiB): A is warmed, then requests
   alternate B, A, B...; each is a swap (stop, settle, spawn, ready, first byte). Where
   vramd's events carry per-step times (``data.steps`` of ``swap`` or ``load`` events)
   their medians are reported too.
4. ``swap through the router``: ``llama-server --models-dir DIR --models-max 1`` with the
   same two files (named by their stems) and the same arguments (children inherit
   them), the same alternation, the request's ``model`` picking the model. The router
   now and then drops a proxied request unanswered; it is asked again, timed from the
   first try, and the retry counted (``retries``).
5. ``state across a swap`` (``bench.swap_state``): with and without ``state`` on a
   larger model, a conversation's follow-up after a swap away and back: tokens
   re-processed, the save and restore (ms, bytes), and the time state adds per MiB.

Every method gets one unmeasured run first (page cache, first connections), then
``--runs`` measured ones. Every process is started in its own group and stopped, the
group killed, whatever happens. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from bench import stats
from bench.processes import Vramd, free_port, policy_text, running_vramd, spawn
from bench.report import markdown_table, rich_table, write_outputs
from bench.swap_state import (
    STATE_SHAPE,
    measure_state,
    print_state,
    state_markdown,
    summarize_state,
)
from bench.tiny_gguf import N_CTX, write_tiny_llama
from service.real_runtimes.catalog import catalog_dir

DEFAULT_BINARY = catalog_dir() / "build/llama-server/bin/llama-server"  # make real-runtimes
MODELS = ("tiny-a", "tiny-b")
RUNTIME_ARGS = ("--ctx-size", str(N_CTX), "--parallel", "1", "--threads", "1")
BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Hello"}],
    "max_tokens": 8,
    "temperature": 0,
    "stream": True,
}
HEALTH_POLL_S = 0.002
STEP_KEYS = (
    "drain_ms",
    "save_ms",
    "stop_ms",
    "settle_ms",
    "spawn_ms",
    "ready_ms",
    "restore_ms",
    "first_byte_ms",
)
TARGET_ADDED_COLD_MS = 20.0
ROUTER_TRIES = 3
STATE = "state"  # the key of bench.swap_state's results and summary


# -- one request --------------------------------------------------------------------


def timed_chat(client: httpx.Client, url: str, model: str, t0: float) -> dict[str, float]:
    """Send the streamed chat request; milliseconds from ``t0`` to its first byte and end."""
    first = None
    with client.stream("POST", url, json={"model": model, **BODY}) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{url} ({model}): {response.status_code} {response.text[:300]}")
        for chunk in response.iter_raw():
            if first is None and chunk:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None, "an answer without a body"
    return {"first_byte_ms": (first - t0) * 1000, "full_ms": (end - t0) * 1000}


def runtime_argv(binary: Path, model: Path | str, port: int | str, alias: str) -> list[str]:
    argv = [str(binary), "--model", str(model), "--alias", alias]
    return [*argv, "--host", "127.0.0.1", "--port", str(port), *RUNTIME_ARGS]


# -- 1. by hand ---------------------------------------------------------------------


def cold_by_hand(binary: Path, model: Path, log: Path) -> dict[str, float]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=60, trust_env=False) as client:
        t0 = time.perf_counter()
        with spawn(runtime_argv(binary, model, port, MODELS[0]), log=log) as proc:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if client.get(base + "/health").status_code == 200:
                        break
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode} (see {log})")
                if time.perf_counter() - t0 > 60:
                    raise TimeoutError(f"llama-server not healthy after 60 s (see {log})")
                time.sleep(HEALTH_POLL_S)
            ready_ms = (time.perf_counter() - t0) * 1000
            timing = timed_chat(client, base + "/v1/chat/completions", MODELS[0], t0)
    return {"ready_ms": ready_ms, **timing}


# -- 2 and 3. through vramd -----------------------------------------------------------


def vramd_policy(binary: Path, models: Mapping[str, Path], *, budget: str) -> str:
    services = {
        name: {
            "kind": "chat",
            "models": [name],
            "command": runtime_argv(binary, path, "${PORT}", "${MODEL}"),
            "memory": {"estimate": "300MiB"},
            "startup_timeout": "120s",
            "stop_timeout": "10s",
        }
        for name, path in models.items()
    }
    return policy_text(services, budget=budget, headroom="64MiB", sample_interval="1s")


def last_event_id(vramd: Vramd) -> int:
    events = vramd.get("/api/events?limit=1")["events"]
    return int(events[-1]["id"]) if events else 0


def event_steps(events: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The per-step milliseconds that ``swap`` or ``load`` events carry, merged in order."""
    steps: dict[str, float] = {}
    for event in events:
        data = event.get("data") or {}
        if event.get("kind") in ("swap", "load") and isinstance(data.get("steps"), dict):
            steps.update({k: float(v) for k, v in data["steps"].items() if k in STEP_KEYS})
    return steps


def steps_since(vramd: Vramd, since: int, *, expect: bool) -> dict[str, float]:
    """The steps recorded after event ``since``; when ``expect`` (steps were seen before),
    wait up to a second for the start's steps, which may be written after the answer."""
    deadline = time.monotonic() + (1.0 if expect else 0.0)
    while True:
        steps = event_steps(vramd.get(f"/api/events?since={since}&limit=5000")["events"])
        if "ready_ms" in steps or time.monotonic() >= deadline:
            return steps
        time.sleep(0.05)


def unload(vramd: Vramd, name: str) -> None:
    httpx.post(f"{vramd.url}/api/services/{name}/unload", timeout=60).raise_for_status()


def cold_through_vramd(binary: Path, model: Path, runs: int, workdir: Path) -> list[dict[str, Any]]:
    policy = vramd_policy(binary, {MODELS[0]: model}, budget="1GiB")
    results = []
    with running_vramd(policy, keep=workdir) as vramd, httpx.Client(timeout=120) as client:
        url = vramd.url + "/v1/chat/completions"
        seen_steps = False
        for i in range(runs + 1):
            unload(vramd, MODELS[0])
            since = last_event_id(vramd)
            timing = timed_chat(client, url, MODELS[0], time.perf_counter())
            steps = steps_since(vramd, since, expect=seen_steps)
            seen_steps = seen_steps or bool(steps)
            if i > 0:  # the first is the unmeasured warm-up
                results.append({**timing, "steps": steps})
    return results


def swaps(
    send: Callable[[str], dict[str, float]],
    runs: int,
    steps: Callable[[], Callable[[], dict[str, float]]] | None = None,
) -> list[dict[str, Any]]:
    """Warm A, one unmeasured swap, then ``runs`` measured swaps alternating B, A, B..."""
    send(MODELS[0])
    results = []
    for i in range(runs + 1):
        target = MODELS[(i + 1) % 2]
        read_steps = steps() if steps is not None else None
        timing = send(target)
        if i > 0:
            row: dict[str, Any] = {"to": target, **timing}
            if read_steps is not None:
                row["steps"] = read_steps()
            results.append(row)
    return results


def swaps_through_vramd(
    binary: Path, models: Mapping[str, Path], runs: int, workdir: Path
) -> list[dict[str, Any]]:
    policy = vramd_policy(binary, models, budget="500MiB")
    with running_vramd(policy, keep=workdir) as vramd, httpx.Client(timeout=120) as client:
        url = vramd.url + "/v1/chat/completions"
        seen = [False]

        def send(model: str) -> dict[str, float]:
            return timed_chat(client, url, model, time.perf_counter())

        def steps() -> Callable[[], dict[str, float]]:
            since = last_event_id(vramd)

            def read() -> dict[str, float]:
                found = steps_since(vramd, since, expect=seen[0])
                seen[0] = seen[0] or bool(found)
                return found

            return read

        results = swaps(send, runs, steps)
        loaded = [s["name"] for s in vramd.services() if s["state"] == "ready"]
        if len(loaded) > 1:
            raise RuntimeError(f"both services loaded at once ({loaded}): the budget is wrong")
    return results


# -- 4. llama.cpp's router ------------------------------------------------------------


@contextlib.contextmanager
def running_router(binary: Path, models_dir: Path, log: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(binary), "--models-dir", str(models_dir), "--models-max", "1"]
    argv += ["--host", "127.0.0.1", "--port", str(port), *RUNTIME_ARGS]
    base = f"http://127.0.0.1:{port}"
    with spawn(argv, log=log) as proc, httpx.Client(timeout=2, trust_env=False) as client:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get(base + "/health").status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the router did not come up (see {log})")
            time.sleep(0.01)
        yield base


def swaps_through_router(
    binary: Path, models_dir: Path, runs: int, workdir: Path
) -> list[dict[str, Any]]:
    with (
        running_router(binary, models_dir, workdir / "router.log") as base,
        httpx.Client(timeout=120, trust_env=False) as client,
    ):
        url = base + "/v1/chat/completions"

        def send(model: str) -> dict[str, float]:
            # The router sometimes drops a proxied request without an answer ("Server
            # disconnected"): asked again, timed from the first try, and counted.
            t0 = time.perf_counter()
            for attempt in range(ROUTER_TRIES):
                try:
                    return {**timed_chat(client, url, model, t0), "retries": attempt}
                except httpx.RemoteProtocolError:
                    if attempt == ROUTER_TRIES - 1:
                        raise
            raise AssertionError("unreachable")

        return swaps(send, runs)


# -- figures (pure) -------------------------------------------------------------------


def median_steps(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per step, the median over the rows whose events carried it, in ``STEP_KEYS`` order."""
    out = {}
    for key in STEP_KEYS:
        values = [row["steps"][key] for row in rows if key in row.get("steps", {})]
        if values:
            out[key] = stats.percentile(values, 50)
    return out


def summarize(results: Mapping[str, Any]) -> dict[str, Any]:
    """Medians per method, vramd's added cold start, the swap ratio against the router,
    and (under ``state``) bench.swap_state's figures."""
    medians = {
        method: {key: stats.median_of(rows, key) for key in ("first_byte_ms", "full_ms")}
        for method, rows in results.items()
        if method != STATE
    }
    hand = medians.get("cold_by_hand", {}).get("first_byte_ms")
    cold = medians.get("cold_vramd", {}).get("first_byte_ms")
    vramd_swap = medians.get("swap_vramd", {}).get("first_byte_ms")
    router_swap = medians.get("swap_router", {}).get("first_byte_ms")
    added = cold - hand if cold is not None and hand is not None else None
    ratio = vramd_swap / router_swap if vramd_swap is not None and router_swap else None
    return {
        "medians": medians,
        "added_cold_start_ms": added,
        "swap_ratio": ratio,
        "added_cold_start_met": added is not None and added <= TARGET_ADDED_COLD_MS,
        "swap_ratio_met": ratio is not None and ratio <= 1.0,
        "swap_steps_ms": median_steps(results.get("swap_vramd", [])),
        "cold_steps_ms": median_steps(results.get("cold_vramd", [])),
        **({STATE: summarize_state(results[STATE])} if STATE in results else {}),
    }


LABELS = {
    "cold_by_hand": "cold start by hand (spawn → first byte)",
    "cold_vramd": "cold start through vramd (request → first byte)",
    "swap_vramd": "swap through vramd",
    "swap_router": "swap through llama.cpp's router (--models-max 1)",
}
COLUMNS = ("measure", "runs", "first byte p50 ms", "full p50 ms", "first byte, each run (ms)")


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for method, label in LABELS.items():
        runs = report["results"].get(method, [])
        med = report["summary"]["medians"].get(method, {})
        rows.append(
            [
                label,
                str(len(runs)),
                _ms(med.get("first_byte_ms")),
                _ms(med.get("full_ms")),
                ", ".join(f"{row['first_byte_ms']:.1f}" for row in runs),
            ]
        )
    return rows


def steps_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    summary = report["summary"]
    keys = [k for k in STEP_KEYS if k in summary["swap_steps_ms"] or k in summary["cold_steps_ms"]]
    rows = [
        [label, *(_ms(summary[field].get(k)) for k in keys)]
        for label, field in (("cold start", "cold_steps_ms"), ("swap", "swap_steps_ms"))
    ]
    return ["vramd step p50 (events)", *(k.removesuffix("_ms") + " ms" for k in keys)], rows


def verdicts(report: Mapping[str, Any]) -> list[str]:
    s = report["summary"]
    added, ratio = s["added_cold_start_ms"], s["swap_ratio"]
    met = {True: "met", False: "MISSED"}
    return [
        f"vramd's added cold start (median): {_ms(added)} ms "
        f"(target <= {TARGET_ADDED_COLD_MS:g} ms: {met[s['added_cold_start_met']]})",
        f"vramd swap / router swap (medians, first byte): "
        f"{'-' if ratio is None else f'{ratio:.2f}'} (target <= 1: {met[s['swap_ratio_met']]})",
    ]


def caption(report: Mapping[str, Any]) -> str:
    setup = report["setup"]
    return (
        f"bench.swap: llama-server on two tiny GGUF models, {setup['runs']} runs each, "
        f"{setup['cpus']} CPUs"
    )


def markdown(report: Mapping[str, Any]) -> str:
    lines = [f"**{caption(report)}**", "", *markdown_table(COLUMNS, table_rows(report))]
    columns, rows = steps_rows(report)
    if len(columns) > 1:
        lines += ["", *markdown_table(columns, rows)]
    lines += ["", *(f"- {line}" for line in verdicts(report))]
    state = state_markdown(report)
    return "\n".join([*lines, *([""] if state else []), *state]) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# -- the command ----------------------------------------------------------------------


def measure(binary: Path, runs: int, workdir: Path) -> dict[str, Any]:
    models_dir = workdir / "models"
    models_dir.mkdir(exist_ok=True)
    models = {
        name: write_tiny_llama(models_dir / f"{name}.gguf", seed=seed)
        for seed, name in enumerate(MODELS, start=1)
    }
    hand_log = workdir / "by-hand.log"
    cold_by_hand(binary, models[MODELS[0]], hand_log)  # unmeasured
    return {
        "cold_by_hand": [cold_by_hand(binary, models[MODELS[0]], hand_log) for _ in range(runs)],
        "cold_vramd": cold_through_vramd(binary, models[MODELS[0]], runs, workdir / "vramd-cold"),
        "swap_vramd": swaps_through_vramd(binary, models, runs, workdir / "vramd-swap"),
        "swap_router": swaps_through_router(binary, models_dir, runs, workdir),
        STATE: measure_state(binary, runs, workdir / "state"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.swap",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5, help="measured runs per method")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BINARY)
    parser.add_argument("--keep", type=Path, help="keep models and logs in this folder")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args(argv)
    if not args.llama_server.is_file():
        parser.error(f"no llama-server at {args.llama_server} (make bench-swap builds it)")
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            workdir = args.keep
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-swap-")))
        results = measure(args.llama_server.resolve(), args.runs, workdir)
    report = {
        "setup": {
            "runs": args.runs,
            "llama_server": str(args.llama_server),
            "runtime_args": list(RUNTIME_ARGS),
            "request": BODY,
            "state_model": STATE_SHAPE,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
        },
        "results": results,
        "summary": summarize(results),
    }
    console = Console() if sys.stdout.isatty() else Console(width=140)
    console.print(rich_table(caption(report), COLUMNS, table_rows(report)))
    columns, rows = steps_rows(report)
    if len(columns) > 1:
        console.print(rich_table("vramd's steps, from its events", columns, rows))
    for line in verdicts(report):
        console.print(line, markup=False)
    print_state(console, report)
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
