"""runtimes.json and the installer's steps (service.real_runtimes), without a runtime."""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

import pytest

from service.real_runtimes.catalog import (
    REQUIRED_KINDS,
    SERVICE_KINDS,
    CatalogError,
    RuntimeEntry,
    load_catalog,
    write_catalog,
)
from service.real_runtimes.steps import Step, StepFailed, extract_within

ENTRY = RuntimeEntry(
    adapter="llama.cpp",
    command=("/opt/llama-server", "--port", "${PORT}", "--alias", "${MODEL}"),
    model="/models/chat.gguf",
    version="llama.cpp b1",
    routes=("/v1/chat/completions",),
    metrics="/metrics",
)


def test_a_written_catalog_reads_back_the_same_entries(tmp_path: Path) -> None:
    write_catalog(tmp_path, {"chat": ENTRY})
    assert load_catalog(tmp_path) == {"chat": ENTRY}
    raw = json.loads((tmp_path / "runtimes.json").read_text())
    assert "image_size" not in raw["chat"]  # optional fields are left out, not null


def test_a_missing_catalog_names_the_command_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="make real-runtimes"):
        load_catalog(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "expected an object keyed by kind"),
        ('{"speech": {}}', "unknown kind 'speech'"),
        ('{"chat": {"adapter": "llama.cpp"}}', "chat.command: Field required"),
        ("{not json", "runtimes.json"),
    ],
)
def test_a_bad_catalog_is_an_error_naming_the_file_and_the_fault(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "runtimes.json").write_text(content)
    with pytest.raises(CatalogError, match=message) as error:
        load_catalog(tmp_path)
    assert str(tmp_path / "runtimes.json") in str(error.value)


def test_argv_fills_the_port_and_the_model_as_a_policy_would() -> None:
    argv = ENTRY.argv(port=8123, model="tiny")
    assert argv == ["/opt/llama-server", "--port", "8123", "--alias", "tiny"]


def test_every_required_kind_has_a_service_kind() -> None:
    assert set(REQUIRED_KINDS) <= set(SERVICE_KINDS)


def test_a_step_whose_output_is_there_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []
    step = Step("thing", done=lambda: True, run=lambda: ran.append("ran"))
    assert step.perform() == 0.0
    assert ran == [] and "thing: already there" in capsys.readouterr().out


def test_a_step_that_runs_without_making_its_output_fails(tmp_path: Path) -> None:
    target = tmp_path / "binary"
    step = Step("binary", done=target.exists, run=lambda: None)
    with pytest.raises(StepFailed, match="not there"):
        step.perform()


def test_a_step_reports_how_long_it_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "model"
    step = Step("model", done=target.exists, run=lambda: target.write_text("x"))
    assert step.perform() >= 0.0
    out = capsys.readouterr().out
    assert "model: ..." in out and "model: done in " in out


def test_whisper_cpp_version_is_read_from_the_vendored_cmake_project(tmp_path: Path) -> None:
    from service.real_runtimes.whispercpp_recipe import whisper_version

    (tmp_path / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.5)\nproject("whisper.cpp" VERSION 1.8.5)\n'
    )
    assert whisper_version(tmp_path) == "1.8.5"
    assert whisper_version(tmp_path / "absent") == "unknown"


def test_a_model_writer_prints_every_byte_it_wrote_and_needs_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.real_runtimes.writer_cli import run_writer

    def write(args: argparse.Namespace) -> None:
        (args.out / "sub").mkdir(parents=True)
        (args.out / "a.bin").write_bytes(bytes(args.seed))
        (args.out / "sub" / "b.bin").write_bytes(bytes(1000))

    assert run_writer("writer", write, ["--out", str(tmp_path / "m"), "--seed", "24"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'm'}: 1,024 bytes\n"
    with pytest.raises(SystemExit):
        run_writer("writer", write, [])
    assert "--out" in capsys.readouterr().err


def _sdist(path: Path, *members: tuple[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("with_data_filter", [True, False], ids=["python>=3.11.4", "bookworm"])
def test_sources_extract_under_their_folder_with_or_without_tarfiles_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_data_filter: bool
) -> None:
    if not with_data_filter:  # Debian bookworm's python3 (3.11.2), the image's
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = _sdist(tmp_path / "good.tar.gz", ("pkg-1.0/PKG-INFO", b"Name: pkg\n"))
    with tarfile.open(archive) as opened:
        extract_within(opened, tmp_path / "out")
    assert (tmp_path / "out" / "pkg-1.0" / "PKG-INFO").read_bytes() == b"Name: pkg\n"

    evil = _sdist(tmp_path / "evil.tar.gz", ("../escaped", b"x"))
    with tarfile.open(evil) as opened, pytest.raises((StepFailed, tarfile.TarError)):
        extract_within(opened, tmp_path / "out2")
    assert not (tmp_path / "escaped").exists()
