"""The pure parts of state across swaps: identity, the disk budget, the manifest, and
the verdict read from an answer's timings (service/swapstate)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from service.swapstate.files import Identity, Manifest, SavedSlot, StateDir, over_budget
from service.swapstate.verify import Restored, continues, timings_of, turns_of, verdict


def slot(n: int, size: int, at: float) -> SavedSlot:
    return SavedSlot(n, f"slot-{n}.bin", 100, size, at)


def test_identity_names_the_files_the_command_names_and_sees_them_change(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    command = ["llama-server", "-m", str(model), f"--mmproj={model}", "--port", "${PORT}"]
    before = Identity.of(command, {}, None)
    assert [path for path, _, _ in before.files] == [str(model)]
    assert Identity.of(command, {}, None).change_from(before) is None

    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert Identity.of(command, {}, None).change_from(before) == f"{model} changed (size or mtime)"
    assert Identity.of([*command, "-c", "8192"], {}, None).change_from(before) == (
        "the command changed"
    )
    assert Identity.of(command, {"X": "1"}, None).change_from(before) == "the env changed"
    model.unlink()
    assert Identity.of(command, {}, None).change_from(before) == f"{model} is gone"


def test_a_relative_path_is_read_from_the_services_cwd(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"abc")
    identity = Identity.of(["llama-server", "-m", "m.gguf"], {}, str(tmp_path))
    assert identity.files[0][:2] == ("m.gguf", 3)


def test_the_disk_budget_drops_the_oldest_files_first() -> None:
    slots = [slot(0, 400, 3.0), slot(1, 300, 1.0), slot(2, 300, 2.0)]
    assert over_budget(slots, 1000) == []
    assert [s.slot for s in over_budget(slots, 700)] == [1]
    assert [s.slot for s in over_budget(slots, 350)] == [1, 2, 0]


def test_the_manifest_survives_a_round_trip_and_a_bad_file_reads_as_empty(
    tmp_path: Path,
) -> None:
    folder = StateDir(tmp_path / "chat")
    identity = Identity(("llama-server",), (), ())
    folder.write(
        Manifest(identity, [slot(0, 10, 1.0)], {"identity": identity.to_json(), "why": "x"})
    )
    back = folder.read()
    assert back.identity == identity and back.slots == [slot(0, 10, 1.0)]
    assert back.ineffective_for(identity) == "x"
    assert back.ineffective_for(Identity(("llama-server", "-c", "1"), (), ())) is None
    (folder.path / "vramd-state.json").write_text("{not json")
    assert folder.read() == Manifest()


def test_sweep_removes_only_what_the_manifest_does_not_list(tmp_path: Path) -> None:
    folder = StateDir(tmp_path / "chat")
    folder.ensure()
    for name in ("slot-0.bin", "slot-1.saving.bin", "vramd-state.json"):
        (folder.path / name).write_bytes(b"x")
    folder.sweep(["slot-0.bin"])
    assert sorted(p.name for p in folder.path.iterdir()) == ["slot-0.bin", "vramd-state.json"]


def test_timings_are_read_from_a_json_answer_and_from_a_streams_last_event() -> None:
    whole = json.dumps({"choices": [], "timings": {"prompt_n": 5, "cache_n": 90}}).encode()
    assert timings_of(whole) == {"prompt_n": 5, "cache_n": 90}
    stream = (
        b'data: {"choices": []}\n\n'
        b'data: {"choices": [], "timings": {"prompt_n": 7, "cache_n": 0}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert timings_of(stream) == {"prompt_n": 7, "cache_n": 0}
    assert timings_of(b'{"choices": []}') is None


CHAT = json.dumps(
    {
        "messages": [
            {"role": "system", "content": "You know tides."},
            {"role": "user", "content": "Tell me."},
            {"role": "assistant", "content": "Tides rise."},
            {"role": "user", "content": "More."},
        ]
    }
).encode()


def test_a_request_continues_a_slot_only_if_its_turns_and_length_match() -> None:
    held = Restored(0, 100, "<s>system You know tides. user Tell me.", "assistant Tides rise.")
    turns = turns_of(CHAT)
    assert continues(held, turns, 110)
    assert not continues(held, turns, 50)  # shorter than what was restored
    assert not continues(held, turns[:1], 110)  # no earlier turns
    other = Restored(0, 100, "<s>system You know rivers.", "assistant Rivers flow.")
    assert not continues(other, turns, 110)
    unknown_text = Restored(0, 100, "", "")
    assert continues(unknown_text, turns, 110)  # the length must do


def test_the_verdict_says_whether_the_restore_took_and_what_it_saved() -> None:
    held = [Restored(0, 100, "You know tides. Tell me.", "Tides rise.")]
    took = json.dumps({"timings": {"prompt_n": 8, "cache_n": 100}}).encode()
    missed = json.dumps({"timings": {"prompt_n": 108, "cache_n": 0}}).encode()
    assert verdict(held, CHAT, took) == (True, 100)
    assert verdict(held, CHAT, missed) == (False, 0)
    unrelated = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    assert verdict(held, unrelated, missed) is None
