"""llama.cpp's ``POST /slots/{id}?action=save|restore|erase``: a slot's prompt cache on disk."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from urllib.parse import parse_qs

from service.demo_runtime.log import log
from service.demo_runtime.replies import ApiError, Reply, json_reply
from service.demo_runtime.slots import Slot
from service.demo_runtime.state import Runtime
from service.demo_runtime.text import VOCABULARY

PREFIX = "/slots/"
MAGIC = b"DEMOSLOT"
VERSION = 1
HEADER = struct.Struct("<8sII")  # magic, version, token count
PAD_CHUNK = 1 << 20
NOT_SUPPORTED = "This server does not support slots action. Start it with `--slot-save-path`"
BAD_FILE = "No available space in KV cache or invalid slot save file"  # llama.cpp's words
# Characters fs_validate_filename refuses besides controls and separators.
FORBIDDEN = frozenset(':*?"<>|\\/' + "\ufeff\ufffd\uff0e\u2215\u2216")


def handle(runtime: Runtime, target: str, body: bytes) -> Reply:
    """Answer ``POST /slots/{id}?action=...`` (``target`` is the request's path and query).

    Enabled by ``--slot-save-path DIR``, as in llama-server; without it every action answers
    501 ``not_supported_error``. Save and restore take ``{"filename": "name.bin"}``, a plain
    name inside DIR (llama.cpp's ``fs_validate_filename``: no separators, no ``..``). The
    checks run in llama-server's order: the path's slot id must be a number, the action one
    of the three, the filename valid, and only then the slot must exist. An action on a busy
    slot waits until the slot is idle, as llama-server defers the task.

    A state file is a 16-byte header (``DEMOSLOT``, version, token count), the tokens as
    little-endian 32-bit ids, then padding, so that it is ``n_tokens * --state-bytes-per-
    token`` bytes long (the header at least) as a real KV-cache dump grows with its tokens.
    The answers are llama-server's (``server_task_result_slot_save_load``): save
    ``{id_slot, filename, n_saved, n_written, timings: {save_ms}}``, restore ``{id_slot,
    filename, n_restored, n_read, timings: {restore_ms}}``, erase ``{id_slot, n_erased}``.

    An action holds the slot cache's lock while it reads or writes, so requests wait for it
    to finish, as llama-server's single task loop does nothing else meanwhile.

    ``--slot-restore`` makes restore misbehave: ``noop`` reads the file and answers success
    but leaves the slot as it was (the llama.cpp failure where a restore reports success and
    did nothing; a missing or corrupt file still fails), ``error`` answers 500, ``hang`` never
    answers (without holding the lock: the rest of the runtime goes on).
    """
    opts = runtime.opts
    if opts.slot_save_path is None:
        raise ApiError(501, NOT_SUPPORTED, "not_supported_error")
    path, _, query = target.partition("?")
    try:
        index = int(path[len(PREFIX) :])
    except ValueError:
        raise ApiError(400, "Invalid slot ID") from None
    action = parse_qs(query).get("action", [""])[0]
    if action == "erase":
        _check_slot(runtime, index)
        n_erased = runtime.slots.act(index, _erase)
        log(f"slot {index}: erased {n_erased} tokens")
        return json_reply({"id_slot": index, "n_erased": n_erased})
    if action not in ("save", "restore"):
        raise ApiError(400, "Invalid action")
    filename = _filename(body)
    _check_slot(runtime, index)
    file = os.path.join(opts.slot_save_path, filename)
    if action == "save":
        return _save(runtime, index, filename, file)
    return _restore(runtime, index, filename, file)


def _check_slot(runtime: Runtime, index: int) -> None:
    if not 0 <= index < len(runtime.slots):
        raise ApiError(400, "Invalid slot ID")


def _filename(body: bytes) -> str:
    # llama-server reads the body with json::parse and .at("filename"): a missing or
    # mistyped name is an exception there, answered 500.
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise ApiError(500, f"[json.exception.parse_error.101] {exc}", "server_error") from None
    filename = payload.get("filename") if isinstance(payload, dict) else None
    if filename is None:
        raise ApiError(
            500, "[json.exception.out_of_range.403] key 'filename' not found", "server_error"
        )
    if not isinstance(filename, str):
        raise ApiError(500, "[json.exception.type_error.302] type must be string", "server_error")
    if not valid_filename(filename):
        raise ApiError(400, "Invalid filename")
    return filename


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename without subdirectories: one plain file name."""
    if not name or len(name.encode()) > 255 or name in (".", "..") or ".." in name:
        return False
    if name[0] == " " or name[-1] in " .":
        return False
    for char in name:
        code = ord(char)
        if code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF or char in FORBIDDEN:
            return False
    return True


def _erase(slot: Slot) -> int:
    n_erased = len(slot.tokens)
    slot.tokens = []
    return n_erased


def _save(runtime: Runtime, index: int, filename: str, file: str) -> Reply:
    started = time.perf_counter()

    def write(slot: Slot) -> tuple[int, int]:
        return len(slot.tokens), write_state(file, slot.tokens, runtime.opts.state_bytes_per_token)

    try:
        n_saved, n_written = runtime.slots.act(index, write)
    except OSError as exc:
        log(f"slot {index}: save to {file} failed: {exc}")
        raise ApiError(500, "Unable to save slot", "server_error") from None
    save_ms = (time.perf_counter() - started) * 1000
    log(f"slot {index}: saved {n_saved} tokens, {n_written} bytes to {filename}")
    return json_reply(
        {
            "id_slot": index,
            "filename": filename,
            "n_saved": n_saved,
            "n_written": n_written,
            "timings": {"save_ms": save_ms},
        }
    )


def _restore(runtime: Runtime, index: int, filename: str, file: str) -> Reply:
    mode = runtime.opts.slot_restore
    if mode == "hang":
        log(f"slot {index}: restoring {filename} (--slot-restore hang: never answering)")
        threading.Event().wait()  # never set: a restore stuck inside the runtime
    if mode == "error":
        log(f"slot {index}: restore of {filename} failed (--slot-restore error)")
        raise ApiError(500, "Unable to restore slot: simulated failure", "server_error")
    started = time.perf_counter()

    def load(slot: Slot) -> tuple[int, int]:
        try:
            tokens, n_read = read_state(file, runtime.slots.n_ctx)
        except ValueError as exc:
            slot.tokens = []  # llama.cpp clears the slot's prompt when a restore fails
            raise ApiError(400, f"Unable to restore slot: {exc}") from None
        if mode != "noop":
            slot.tokens = tokens
        return len(tokens), n_read

    n_restored, n_read = runtime.slots.act(index, load)
    restore_ms = (time.perf_counter() - started) * 1000
    log(f"slot {index}: restored {n_restored} tokens from {filename} ({mode})")
    return json_reply(
        {
            "id_slot": index,
            "filename": filename,
            "n_restored": n_restored,
            "n_read": n_read,
            "timings": {"restore_ms": restore_ms},
        }
    )


def write_state(file: str, tokens: list[int], bytes_per_token: int) -> int:
    """Write a state file; returns its size in bytes (every byte written, none sparse)."""
    data = HEADER.pack(MAGIC, VERSION, len(tokens)) + struct.pack(f"<{len(tokens)}I", *tokens)
    size = max(len(tokens) * bytes_per_token, len(data))
    with open(file, "wb") as out:
        out.write(data)
        left = size - len(data)
        while left > 0:
            step = min(left, PAD_CHUNK)
            out.write(bytes(step))
            left -= step
    return size


def read_state(file: str, n_ctx: int) -> tuple[list[int], int]:
    """The tokens in a state file and the bytes read; ValueError with llama.cpp's reason."""
    try:
        with open(file, "rb") as source:
            data = source.read()
    except OSError:
        raise ValueError(BAD_FILE) from None
    if len(data) < HEADER.size:
        raise ValueError(BAD_FILE)
    magic, version, count = HEADER.unpack_from(data)
    end = HEADER.size + 4 * count
    if magic != MAGIC or version != VERSION or len(data) < end:
        raise ValueError(BAD_FILE)
    tokens = list(struct.unpack_from(f"<{count}I", data, HEADER.size))
    if count > n_ctx:
        raise ValueError("Restored prompt does not fit in the slot context")
    if any(not 0 <= token < VOCABULARY for token in tokens):
        raise ValueError("Invalid tokens in slot save file")
    return tokens, len(data)
