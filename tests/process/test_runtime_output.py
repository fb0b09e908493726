"""A runtime's output files, followed into its log ring (``service.supervisor.output``):
every line read as it is written (inotify, or polling where there is none), disk use
bounded by punching out what was read without losing a line, and a daemon that adopts
the runtime reading back only the end, from a whole line."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from service.clock import SystemClock
from service.supervisor import LogRing, OutputFiles, OutputFollower
from service.supervisor import output as output_module


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.01)


def write(files: OutputFiles, stream: str, text: str) -> None:
    out, err = files.open_for_runtime()
    try:
        os.write(out if stream == "stdout" else err, text.encode())
    finally:
        os.close(out)
        os.close(err)


def texts(ring: LogRing) -> list[str]:
    return [line.text for line in ring.tail(ring.max_lines)]


@pytest.mark.parametrize("notified", [True, False], ids=["inotify", "polling"])
def test_lines_are_followed_as_written_and_the_files_removed_once_the_process_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, notified: bool
) -> None:
    if not notified:
        monkeypatch.setattr(output_module, "_watch", lambda paths: None)

    async def scenario() -> None:
        files = OutputFiles.create(tmp_path, "runtime")
        files.open_for_runtime()  # created, as the launcher does before the spawn
        ring = LogRing()
        follower = OutputFollower(files, ring, SystemClock().now)
        write(files, "stdout", "first\nsec")
        await until(lambda: texts(ring) == ["first"])
        write(files, "stderr", "oops\n")
        write(files, "stdout", "ond\n")
        await until(lambda: sorted(texts(ring)) == ["first", "oops", "second"])
        assert [line.stream for line in ring.tail(3) if line.text == "oops"] == ["stderr"]
        write(files, "stdout", "no newline at the end")
        follower.close(remove=True)
        assert texts(ring)[-1] == "no newline at the end"
        assert not files.path("stdout").exists() and not files.path("stderr").exists()

    asyncio.run(scenario())


def test_what_was_read_is_punched_out_of_the_file_and_no_line_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output_module, "TRIM_STEP", 256 * 1024)
    monkeypatch.setattr(output_module, "KEEP_BYTES", 64 * 1024)

    async def scenario() -> None:
        files = OutputFiles.create(tmp_path, "chatty")
        files.open_for_runtime()
        ring = LogRing(max_lines=50_000)
        follower = OutputFollower(files, ring, SystemClock().now)
        lines = [f"line {i:06d} " + "x" * 90 for i in range(20_000)]  # ~2 MiB
        for start in range(0, len(lines), 1000):
            write(files, "stdout", "".join(f"{line}\n" for line in lines[start : start + 1000]))
            follower.read()
        await until(lambda: len(ring) == len(lines))
        assert texts(ring) == lines
        stat = files.path("stdout").stat()
        assert stat.st_size > 2_000_000
        assert stat.st_blocks * 512 < 600 * 1024, "read output stays on disk"
        follower.close(remove=False)

        # A daemon adopting the runtime reads back the end only, from a whole line.
        again = LogRing(max_lines=50_000)
        OutputFollower(files, again, SystemClock().now, from_end=True).close(remove=True)
        assert 0 < len(again) < 1000
        assert texts(again) == lines[-len(again) :]

    asyncio.run(scenario())
