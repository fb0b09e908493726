"""State across a swap, on a real llama-server: what saving and restoring a slot costs and saves.

``python -m bench.swap`` runs this after its other measures (issue 25 asks for both in
one run). Two services, ``a`` and ``b``, each a ``llama-server`` on a generated model
large enough for its saved state to be measured (``STATE_SHAPE``: 8 layers, ``n_embd``
256, a 1024-token context; ~20 MB, loaded in ~0.1 s; its KV cache is 8 KiB a token),
under a host budget that holds one (``memory.estimate`` 300MiB each, budget 500MiB), in
two separate ``vramd serve`` runs:

- ``with state``: ``a`` has ``state: {disk: 1GiB}`` and ``--slot-save-path
  "${STATE_DIR}"`` (and ``--parallel 1``): vramd saves ``a``'s slot before it stops it
  and restores it before ``a``'s next instance takes a request;
- ``without state``: the same service without them.

Each run is a conversation: a system prompt and a user message of a few hundred
characters on ``a`` (~560 tokens: the byte-level vocabulary makes a character a token,
a space three), then one request to ``b`` (a swap away: ``a`` is stopped, its state
saved first), then the conversation's follow-up on ``a`` (the earlier messages, ``a``'s
answer and a new user message, ~720 tokens: a swap back, its state restored first). All
non-streamed, ``max_tokens`` 8, temperature 0. Per run: each request's first byte, the
follow-up's ``timings.prompt_n`` (tokens re-processed), ``cache_n`` and prompt and
generation milliseconds, and from vramd's events for ``a``: ``state-save`` and
``state-restore`` (ms, bytes, tokens), ``state-verified``, and the ``swap`` events'
``save_ms`` (stop) and ``restore_ms`` (start) steps. One unmeasured run first.

The derived figures: tokens saved per swap, the save and restore milliseconds per MiB of
state, and the time a stateful swap adds over a stateless one (medians) per MiB of state,
twice: to the swap back's first byte, where restoring also spares the follow-up its
prefill (so state usually makes it faster, and then that is what is said), and to the
swap path (both swaps' first bytes less llama-server's own prompt and generation time:
stop, save, spawn, load, restore). A difference within the runs' spread (the larger
median absolute deviation of the two variants) is said to be so, not divided.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from bench import stats
from bench.processes import Vramd, policy_text, running_vramd
from bench.report import markdown_table, rich_table
from bench.tiny_gguf import write_tiny_llama
from service.units import MIB

STATE_SHAPE: dict[str, int] = {"n_layer": 8, "n_embd": 256, "n_head": 4, "n_ff": 512, "n_ctx": 1024}
SERVICES = ("a", "b")
VARIANTS = {"stateful": "with state", "stateless": "without state"}
MAX_TOKENS = 8
SYSTEM = (
    "You are the assistant of a mountain hut. Answer in two short sentences, give times "
    "in 24-hour form, and say so when you do not know."
)
USER = (
    "Conversation {run}. We are four, arriving on Friday evening by the north trail. We "
    "would like half board for two nights and advice on the ridge on Saturday: when should "
    "we leave to be back before the afternoon storms?"
)
FOLLOW_UP = "Thanks. If the storm comes early, which descent is safest?"
EVENT_WAIT_S = 1.0


# -- the runtimes and the policy ------------------------------------------------------


def state_argv(binary: Path, model: Path, *, stateful: bool) -> list[str]:
    argv = [str(binary), "--model", str(model), "--alias", "${MODEL}"]
    argv += ["--host", "127.0.0.1", "--port", "${PORT}", "--ctx-size", str(STATE_SHAPE["n_ctx"])]
    argv += ["--parallel", "1", "--threads", "1"]
    return [*argv, "--slot-save-path", "${STATE_DIR}"] if stateful else argv


def state_policy(binary: Path, models: Mapping[str, Path], *, stateful: bool) -> str:
    services: dict[str, dict[str, Any]] = {}
    for name, path in models.items():
        keeps = stateful and name == SERVICES[0]
        services[name] = {
            "kind": "chat",
            "models": [name],
            "command": state_argv(binary, path, stateful=keeps),
            "memory": {"estimate": "300MiB"},
            "startup_timeout": "120s",
            "stop_timeout": "10s",
        }
        if keeps:
            services[name]["state"] = {"disk": "1GiB"}
    return policy_text(services, budget="500MiB", headroom="64MiB", sample_interval="1s")


def write_state_models(models_dir: Path) -> dict[str, Path]:
    return {
        name: write_tiny_llama(
            models_dir / f"state-{name}.gguf",
            seed=seed,
            n_layer=STATE_SHAPE["n_layer"],
            n_embd=STATE_SHAPE["n_embd"],
            n_head=STATE_SHAPE["n_head"],
            n_ff=STATE_SHAPE["n_ff"],
            n_ctx=STATE_SHAPE["n_ctx"],
        )
        for seed, name in enumerate(SERVICES, start=11)
    }


# -- one request, one run -------------------------------------------------------------


def conversation(run: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER.format(run=run)},
    ]


def follow_up(messages: Sequence[Mapping[str, str]], answer: str) -> list[dict[str, str]]:
    return [
        *(dict(m) for m in messages),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": FOLLOW_UP},
    ]


def chat(
    client: httpx.Client, url: str, model: str, messages: list[dict[str, str]]
) -> dict[str, Any]:
    """One non-streamed chat completion: first byte and end (ms), answer, timings."""
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", url, json=body) as response:
        chunks = []
        for chunk in response.iter_bytes():
            if first is None and chunk:
                first = time.perf_counter()
            chunks.append(chunk)
    end = time.perf_counter()
    text = b"".join(chunks).decode("utf-8", "replace")
    if response.status_code != 200 or first is None:
        raise RuntimeError(f"{url} ({model}): {response.status_code} {text[:300]}")
    answer = json.loads(text)
    timings = answer.get("timings") or {}
    return {
        "first_byte_ms": (first - t0) * 1000,
        "full_ms": (end - t0) * 1000,
        "answer": answer["choices"][0]["message"]["content"] or "",
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "work_ms": float(timings.get("prompt_ms", 0)) + float(timings.get("predicted_ms", 0)),
    }


def last_event_id(vramd: Vramd) -> int:
    events = vramd.get("/api/events?limit=1")["events"]
    return int(events[-1]["id"]) if events else 0


def events_since(vramd: Vramd, since: int, *, stateful: bool) -> list[dict[str, Any]]:
    """Service ``a``'s events after ``since``, waiting up to ``EVENT_WAIT_S`` for those
    the run must have written (its start's steps; with state, the save and restore)."""
    wanted = {"swap", "state-save", "state-restore"} if stateful else {"swap"}
    deadline = time.monotonic() + EVENT_WAIT_S
    while True:
        path = f"/api/events?service={SERVICES[0]}&since={since}&limit=500"
        events: list[dict[str, Any]] = vramd.get(path)["events"]
        kinds = {e["kind"] for e in events}
        started = any((e.get("data") or {}).get("phase") == "start" for e in events)
        if (wanted <= kinds and started) or time.monotonic() >= deadline:
            return events
        time.sleep(0.05)


def one_run(client: httpx.Client, vramd: Vramd, run: int, *, stateful: bool) -> dict[str, Any]:
    """The conversation on ``a``, a request to ``b``, the follow-up on ``a``."""
    url = vramd.url + "/v1/chat/completions"
    messages = conversation(run)
    first = chat(client, url, SERVICES[0], messages)
    since = last_event_id(vramd)
    away = chat(client, url, SERVICES[1], [{"role": "user", "content": "Hello"}])
    back = chat(client, url, SERVICES[0], follow_up(messages, first["answer"]))
    events = events_since(vramd, since, stateful=stateful)
    return {
        "away_first_byte_ms": away["first_byte_ms"],
        "back_first_byte_ms": back["first_byte_ms"],
        "back_full_ms": back["full_ms"],
        "prompt_n": back["prompt_n"],
        "cache_n": back["cache_n"],
        "back_prompt_ms": back["work_ms"],
        # Both swaps' first bytes less the runtimes' own prompt and generation time: what
        # is left is the swap path (stop, save, spawn, load, restore).
        "swap_path_ms": away["first_byte_ms"]
        + back["first_byte_ms"]
        - away["work_ms"]
        - back["work_ms"],
        **state_figures(events),
    }


def measure_variant(
    binary: Path, models: Mapping[str, Path], runs: int, workdir: Path, *, stateful: bool
) -> list[dict[str, Any]]:
    policy = state_policy(binary, models, stateful=stateful)
    results = []
    with running_vramd(policy, keep=workdir) as vramd, httpx.Client(timeout=120) as client:
        for run in range(runs + 1):
            row = one_run(client, vramd, run, stateful=stateful)
            if run > 0:  # the first is the unmeasured warm-up
                results.append(row)
        loaded = [s["name"] for s in vramd.services() if s["state"] == "ready"]
        if len(loaded) > 1:
            raise RuntimeError(f"both services loaded at once ({loaded}): the budget is wrong")
    return results


def measure_state(binary: Path, runs: int, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    models_dir = workdir / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    models = write_state_models(models_dir)
    return {
        variant: measure_variant(
            binary, models, runs, workdir / f"vramd-{variant}", stateful=variant == "stateful"
        )
        for variant in VARIANTS
    }


# -- figures (pure) -------------------------------------------------------------------


def state_figures(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What one swap's events say: the save and restore (ms, bytes, tokens, failures),
    the ``save_ms`` and ``restore_ms`` steps of its ``swap`` events, and other state
    events by kind (``state-ineffective``, ``state-dropped``)."""
    out: dict[str, Any] = {}
    others: list[str] = []
    for event in events:
        kind, data = event.get("kind"), event.get("data") or {}
        if kind in ("state-save", "state-restore"):
            prefix = kind.removeprefix("state-")
            for key in ("ms", "bytes", "tokens"):
                if data.get(key) is not None:
                    out[f"{prefix}_{key}"] = float(data[key])
            out[f"{prefix}_failures"] = len(data.get("failures") or [])
        elif kind == "swap" and isinstance(data.get("steps"), dict):
            for key in ("save_ms", "restore_ms", "ready_ms"):
                if key in data["steps"]:
                    out[f"{key.removesuffix('_ms')}_step_ms"] = float(data["steps"][key])
        elif kind == "state-verified":
            out["verified"] = True
        elif isinstance(kind, str) and kind.startswith("state-"):
            others.append(kind)  # state-ineffective, state-dropped: the state did not help
    if others:
        out["other_state_events"] = others
    return out


MEDIAN_KEYS = (
    "away_first_byte_ms",
    "back_first_byte_ms",
    "back_full_ms",
    "prompt_n",
    "cache_n",
    "save_ms",
    "save_bytes",
    "save_tokens",
    "restore_ms",
    "restore_bytes",
    "restore_tokens",
    "save_step_ms",
    "restore_step_ms",
    "ready_step_ms",
    "back_prompt_ms",
    "swap_path_ms",
)


def variant_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    medians = {key: stats.median_of(rows, key) for key in MEDIAN_KEYS}
    totals = [
        float(r["prompt_n"]) + float(r.get("cache_n") or 0)
        for r in rows
        if r.get("prompt_n") is not None
    ]
    return {
        **medians,
        "prompt_tokens": stats.median(totals),
        "back_spread_ms": stats.spread([r["back_first_byte_ms"] for r in rows]),
        "swap_path_spread_ms": stats.spread([r["swap_path_ms"] for r in rows]),
        "runs": len(rows),
        "verified": sum(1 for r in rows if r.get("verified")),
        "failures": sum(r.get("save_failures", 0) + r.get("restore_failures", 0) for r in rows),
        "other_state_events": sorted({k for r in rows for k in r.get("other_state_events", [])}),
    }


def added_per_mib(
    stateful_ms: float | None, stateless_ms: float | None, noise_ms: float, mib: float | None
) -> dict[str, Any]:
    """The time state adds (medians, stateful less stateless) per MiB of state, or why
    there is no such figure: ``verdict`` is ``added``, ``faster``, ``noise`` or ``unknown``."""
    if stateful_ms is None or stateless_ms is None or not mib:
        return {"added_ms": None, "noise_ms": noise_ms, "ms_per_mib": None, "verdict": "unknown"}
    added = stateful_ms - stateless_ms
    verdict = "noise" if abs(added) <= noise_ms else ("added" if added > 0 else "faster")
    per_mib = added / mib if verdict == "added" else None
    return {"added_ms": added, "noise_ms": noise_ms, "ms_per_mib": per_mib, "verdict": verdict}


def summarize_state(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per variant, the medians; then tokens saved, the save and restore cost per MiB,
    and the time a stateful swap adds per MiB: to the swap back's first byte (prefill
    spared included), and to the swap path (away and back, less the runtimes' work)."""
    per = {variant: variant_summary(results.get(variant, [])) for variant in VARIANTS}
    on, off = per["stateful"], per["stateless"]
    size = on["save_bytes"]
    mib = size / MIB if size else None
    saved = (
        off["prompt_n"] - on["prompt_n"]
        if off["prompt_n"] is not None and on["prompt_n"] is not None
        else None
    )
    cost = [v for v in (on["save_ms"], on["restore_ms"]) if v is not None]
    back_noise = max(on["back_spread_ms"], off["back_spread_ms"])
    path_noise = max(on["swap_path_spread_ms"], off["swap_path_spread_ms"])
    return {
        "variants": per,
        "state_mib": mib,
        "tokens_saved": saved,
        "save_restore_ms": sum(cost) if len(cost) == 2 else None,
        "save_restore_ms_per_mib": sum(cost) / mib if len(cost) == 2 and mib else None,
        "swap_back": added_per_mib(
            on["back_first_byte_ms"], off["back_first_byte_ms"], back_noise, mib
        ),
        "swap_path": added_per_mib(on["swap_path_ms"], off["swap_path_ms"], path_noise, mib),
    }


# -- tables ---------------------------------------------------------------------------


STATE_COLUMNS = (
    "variant",
    "runs",
    "swap back first byte p50 ms",
    "swap away p50 ms",
    "re-processed / prompt tokens",
    "follow-up prompt+gen ms",
    "swap path p50 ms",
    "save ms",
    "restore ms",
    "state MiB",
    "swap back, each run (ms)",
)


def state_rows(results: Mapping[str, Any], summary: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for variant, label in VARIANTS.items():
        runs = results.get(variant, [])
        med = summary["variants"][variant]
        size = med["save_bytes"]
        rows.append(
            [
                label,
                str(len(runs)),
                _num(med["back_first_byte_ms"]),
                _num(med["away_first_byte_ms"]),
                f"{_num(med['prompt_n'], 0)} / {_num(med['prompt_tokens'], 0)}",
                _num(med["back_prompt_ms"]),
                _num(med["swap_path_ms"]),
                _num(med["save_ms"]),
                _num(med["restore_ms"]),
                "-" if size is None else f"{size / MIB:.2f}",
                ", ".join(f"{row['back_first_byte_ms']:.1f}" for row in runs),
            ]
        )
    return rows


def _added_line(what: str, figure: Mapping[str, Any]) -> str:
    added, noise, verdict = figure["added_ms"], figure["noise_ms"], figure["verdict"]
    if verdict == "unknown":
        return f"{what}: not measured (a variant or the state size is missing)"
    head = f"{what}, with state less without (medians): {added:+.1f} ms (runs stray ±{noise:.1f})"
    if verdict == "added":
        return f"{head}: {figure['ms_per_mib']:.1f} ms per MiB of state"
    if verdict == "faster":
        return f"{head}: faster with state (the prefill it spares outweighs it), nothing added"
    return f"{head}: within the runs' spread, no added time measured"


def state_verdicts(summary: Mapping[str, Any]) -> list[str]:
    on, off = summary["variants"]["stateful"], summary["variants"]["stateless"]
    lines = [
        f"tokens re-processed after a swap: {_num(on['prompt_n'], 0)} of "
        f"{_num(on['prompt_tokens'], 0)} with state, {_num(off['prompt_n'], 0)} of "
        f"{_num(off['prompt_tokens'], 0)} without: {_num(summary['tokens_saved'], 0)} "
        "saved per swap",
    ]
    if summary["state_mib"] is not None:
        lines.append(
            f"state {summary['state_mib']:.2f} MiB ({_num(on['save_tokens'], 0)} tokens): "
            f"saved in {_num(on['save_ms'])} ms, restored in {_num(on['restore_ms'])} ms "
            f"(steps in the swap events: save {_num(on['save_step_ms'])} ms, restore "
            f"{_num(on['restore_step_ms'])} ms); save + restore "
            f"{_num(summary['save_restore_ms_per_mib'])} ms per MiB"
        )
    else:
        lines.append("state: no state-save event seen (nothing was saved)")
    lines.append(_added_line("swap back (first byte)", summary["swap_back"]))
    lines.append(
        _added_line("swap path (away and back, less prompt and generation)", summary["swap_path"])
    )
    lines.append(
        f"vramd verified the restore (state-verified) in {on['verified']} of {on['runs']} "
        f"runs; save or restore failures: {on['failures']}; other state events: "
        f"{', '.join(on['other_state_events']) or 'none'}"
    )
    return lines


STATE_TITLE = (
    "state across a swap: llama-server, 8 layers, n_embd 256, --ctx-size 1024, "
    "a → b → a (non-streamed, max_tokens 8)"
)


def state_markdown(report: Mapping[str, Any]) -> list[str]:
    results, summary = report["results"].get("state"), report["summary"].get("state")
    if not results or not summary:
        return []
    lines = [f"**{STATE_TITLE}**", ""]
    lines += markdown_table(STATE_COLUMNS, state_rows(results, summary))
    return [*lines, "", *(f"- {line}" for line in state_verdicts(summary))]


def print_state(console: Console, report: Mapping[str, Any]) -> None:
    results, summary = report["results"].get("state"), report["summary"].get("state")
    if not results or not summary:
        return
    console.print(rich_table(STATE_TITLE, STATE_COLUMNS, state_rows(results, summary)))
    for line in state_verdicts(summary):
        console.print(line, markup=False)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
