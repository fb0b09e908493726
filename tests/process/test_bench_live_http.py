"""The live benchmarks (``bench.proxy``, ``bench.idle``) against real processes, cut short.

They start ``vramd serve``, the demo runtime and the reference relay for real; here each
runs for a few requests or a second, to show the harness measures what it says: every
side and mode gets its samples, the lean client reads both ways a body is framed, and
what is written matches what is printed. The figures themselves are not checked.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from bench import idle, proxy
from bench.load import Target, burst
from bench.processes import answers, free_port, spawn, wait_until


def test_the_client_reads_length_framed_and_chunked_answers() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "service.demo_runtime", "--port", str(port)]
    argv += ["--model", "m", "--chunk-delay-ms", "20", "--chunks", "3"]
    bodies = proxy.payloads("m", "direct")

    async def both() -> tuple[list[float], list[float]]:
        target = Target(url, proxy.CHAT_PATH)
        try:
            chat = await burst(target, target.request(bodies["chat"]), count=4, concurrency=2)
            stream = await burst(target, target.request(bodies["stream"]), count=4, concurrency=2)
        finally:
            await target.close()
        return (
            [t.total for t in chat.timings],
            [t.total - t.first for t in stream.timings],
        )

    with spawn(argv) as proc:
        wait_until(answers(url + "/health"), timeout=20, what="demo runtime", proc=proc)
        chat, stream_after_first = asyncio.run(both())
    assert len(chat) == 4 and all(t > 0 for t in chat)
    # Three events 20 ms apart, then [DONE]: the first came 40 ms or more before the end,
    # so the chunks were read as they came, not the body whole.
    assert len(stream_after_first) == 4 and all(t >= 0.035 for t in stream_after_first)


@pytest.mark.timeout(180)
def test_bench_proxy_measures_every_side_mode_and_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "proxy.json"
    args = ["--concurrency", "1,2", "--rounds", "2", "--per-round", "5", "--warmup", "2"]
    args += ["--sides", "direct,vramd,relay,router,ollama", "--json", str(out)]
    args += ["--markdown", str(tmp_path / "proxy.md")]
    assert proxy.main(args) == 0
    report = json.loads(out.read_text())
    cells = {(r["mode"], r["concurrency"], r["side"]) for r in report["rows"]}
    assert cells == {
        (mode, conc, side)
        for mode in ("chat", "ttfb", "stream")
        for conc in (1, 2)
        for side in ("direct", "vramd", "relay", "router", "ollama")
    }
    for row in report["rows"]:
        assert row["n"] == 10
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert ("added_ms" in row) == (row["side"] != "direct")
    assert report["setup"]["sides"]["direct"] != report["setup"]["sides"]["vramd"]
    assert "| chat | 1 | vramd |" in (tmp_path / "proxy.md").read_text()
    assert "vramd" in capsys.readouterr().out


@pytest.mark.timeout(180)
def test_bench_idle_measures_the_daemon_alone(tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    args = ["--policies", "demo", "--settle", "0", "--duration", "1", "--json", str(out)]
    assert idle.main(args) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["policy"], run["services"], run["running"]) == ("demo", 4, 2)
    assert run["cpu_pct"] >= 0 and run["runtimes_cpu_pct"] >= 0
    assert 20 < run["rss_mib"] < 1000


def test_the_twenty_service_policy_is_valid_and_runs_five() -> None:
    from service.domain import Residency
    from service.policy import load_policy

    policy = load_policy(idle.twenty_services())
    assert len(policy.services) == 20
    running = [s for s in policy.services.values() if s.residency is Residency.PINNED or s.preload]
    assert len(running) == 5
