"""A tiny random-weight whisper model in whisper.cpp's ggml ``.bin`` format, and a WAV to
transcribe with it.
"""

from __future__ import annotations

import io
import math
import struct
import wave
from pathlib import Path

from service.real_runtimes.writer_cli import run_writer

GGML_MAGIC = 0x67676D6C
N_VOCAB = 51864  # English-only whisper: no language tokens
N_AUDIO_CTX = 1500  # 30 s of 10 ms mel frames, halved by the second convolution
N_TEXT_CTX = 64  # decoding stops at half of it: a random model never says "end"
N_STATE = 64
N_HEAD = 4
N_LAYER = 2
N_MELS = 80
N_FFT = 201
FTYPE_F16 = 1
F32, F16 = 0, 1


def _tensors() -> list[tuple[str, tuple[int, ...], int]]:
    """Every tensor whisper.cpp expects: name, ggml dims (fastest first), type."""
    s, m = N_STATE, 4 * N_STATE
    out: list[tuple[str, tuple[int, ...], int]] = [
        ("encoder.positional_embedding", (s, N_AUDIO_CTX), F32),
        ("encoder.conv1.weight", (3, N_MELS, s), F16),
        ("encoder.conv1.bias", (1, s), F32),
        ("encoder.conv2.weight", (3, s, s), F16),
        ("encoder.conv2.bias", (1, s), F32),
        ("encoder.ln_post.weight", (s,), F32),
        ("encoder.ln_post.bias", (s,), F32),
        ("decoder.positional_embedding", (s, N_TEXT_CTX), F32),
        ("decoder.token_embedding.weight", (s, N_VOCAB), F16),
        ("decoder.ln.weight", (s,), F32),
        ("decoder.ln.bias", (s,), F32),
    ]

    def block(prefix: str, attentions: tuple[str, ...]) -> None:
        out.extend(
            [
                (f"{prefix}.mlp_ln.weight", (s,), F32),
                (f"{prefix}.mlp_ln.bias", (s,), F32),
                (f"{prefix}.mlp.0.weight", (s, m), F16),
                (f"{prefix}.mlp.0.bias", (m,), F32),
                (f"{prefix}.mlp.2.weight", (m, s), F16),
                (f"{prefix}.mlp.2.bias", (s,), F32),
            ]
        )
        for attn in attentions:
            out.extend(
                [
                    (f"{prefix}.{attn}_ln.weight", (s,), F32),
                    (f"{prefix}.{attn}_ln.bias", (s,), F32),
                    (f"{prefix}.{attn}.query.weight", (s, s), F16),
                    (f"{prefix}.{attn}.query.bias", (s,), F32),
                    (f"{prefix}.{attn}.key.weight", (s, s), F16),
                    (f"{prefix}.{attn}.value.weight", (s, s), F16),
                    (f"{prefix}.{attn}.value.bias", (s,), F32),
                    (f"{prefix}.{attn}.out.weight", (s, s), F16),
                    (f"{prefix}.{attn}.out.bias", (s,), F32),
                ]
            )

    for layer in range(N_LAYER):
        block(f"encoder.blocks.{layer}", ("attn",))
    for layer in range(N_LAYER):
        block(f"decoder.blocks.{layer}", ("attn", "cross_attn"))
    return out


def write_tiny_whisper(path: Path, *, seed: int = 0) -> Path:
    """Write the model to ``path`` and return ``path``; the same file for the same seed.

    The file is what ``whisper_model_load`` reads: the ggml magic, eleven hyperparameters, the
    mel filter bank, a vocabulary (the 256 single bytes; whisper.cpp names the special tokens
    up to ``n_vocab`` itself), then each tensor as dims, name and data. Whisper's own shapes
    (80 mel bins, a 1500-frame encoder for 30 s windows, the 51864-token English vocabulary)
    with 2 layers of width 64: a 7 MB file that loads in milliseconds and transcribes
    gibberish, in whisper-server's real code path.

        python -m service.real_runtimes.whisper_model --out PATH [--seed N]
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    with path.open("wb") as out:
        hparams = (N_VOCAB, N_AUDIO_CTX, N_STATE, N_HEAD, N_LAYER, N_TEXT_CTX, N_STATE,
                   N_HEAD, N_LAYER, N_MELS, FTYPE_F16)  # fmt: skip
        out.write(struct.pack("<I11i", GGML_MAGIC, *hparams))
        out.write(struct.pack("<ii", N_MELS, N_FFT))
        out.write(np.abs(rng.standard_normal(N_MELS * N_FFT) * 0.01).astype("<f4").tobytes())
        out.write(struct.pack("<i", 256))
        for byte in range(256):
            out.write(struct.pack("<i", 1) + bytes([byte]))
        for name, dims, ttype in _tensors():
            count = math.prod(dims)
            if name.endswith("ln.weight") or name.endswith("ln_post.weight"):
                data = np.ones(count)
            else:
                data = rng.standard_normal(count) * 0.02
            encoded = name.encode()
            out.write(struct.pack(f"<iii{len(dims)}i", len(dims), len(encoded), ttype, *dims))
            out.write(encoded)
            out.write(data.astype("<f2" if ttype == F16 else "<f4").tobytes())
    return path


def wav_bytes(seconds: float = 1.0, *, rate: int = 16000) -> bytes:
    """A 16-bit mono WAV of a 440 Hz tone, at whisper's 16 kHz."""
    frames = bytearray()
    for i in range(int(seconds * rate)):
        frames += struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(bytes(frames))
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    return run_writer(
        "service.real_runtimes.whisper_model",
        lambda args: write_tiny_whisper(args.out, seed=args.seed),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
