"""The smallest valid files the image and audio routes answer with: a PNG and a WAV.

Built from their formats rather than pasted as bytes, so they are plainly well-formed
and a client that decodes them (an SDK, a test) gets a real image and a real sound.
"""

from __future__ import annotations

import io
import math
import struct
import wave
import zlib


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def tiny_png() -> bytes:
    """A valid 1x1 RGB PNG, built rather than pasted so that it is plainly well-formed."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x20\x80\xff")  # filter byte, then one RGB pixel
    chunks = _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def tiny_wav(seconds: float = 0.1, rate: int = 16000) -> bytes:
    """A short 440 Hz tone as a valid 16-bit mono WAV file."""
    frames = (
        int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(int(rate * seconds))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"".join(struct.pack("<h", frame) for frame in frames))
    return buffer.getvalue()
