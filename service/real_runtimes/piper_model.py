"""A tiny random piper voice: VITS (piper's own training code) exported to ONNX, with the
JSON config piper reads beside it (``<voice>.onnx.json``), in one directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.real_runtimes.writer_cli import run_writer

SAMPLE_RATE = 22050
# piper's defaults: hop 256 = 8 * 8 * 4 upsampling, HiFi-GAN resblock type 2.
UPSAMPLE_RATES = (8, 8, 4)
WIDTH = 32  # piper's voices use 192
VOICE_FILE = "en_US-random-tiny.onnx"  # piper names a voice after its file


def write_tiny_voice(out: Path, *, seed: int = 0) -> Path:
    """Write the voice (``VOICE_FILE``) and its config beside it into the directory
    ``out``; return the voice's path.

    The architecture is piper's ``SynthesizerTrn`` (text encoder, stochastic duration
    predictor, flow, HiFi-GAN decoder) at a fraction of its widths, exported as piper's
    ``export_onnx`` does (inputs ``input``, ``input_lengths``, ``scales``); it speaks noise,
    about a second of it per sentence, in milliseconds. Needs torch and onnx (the piper
    environment has both). Nothing comes from a model hub; the same seed gives the same voice.
    """
    import torch
    from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP
    from piper.train.vits.models import SynthesizerTrn

    torch.manual_seed(seed)
    symbols = 1 + max(i for ids in DEFAULT_PHONEME_ID_MAP.values() for i in ids)
    model = SynthesizerTrn(
        n_vocab=symbols, spec_channels=513, segment_size=32,
        inter_channels=WIDTH, hidden_channels=WIDTH, filter_channels=2 * WIDTH,
        n_heads=2, n_layers=2, kernel_size=3, p_dropout=0.0,
        resblock="2", resblock_kernel_sizes=(3, 5, 7),
        resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)),
        upsample_rates=UPSAMPLE_RATES, upsample_initial_channel=2 * WIDTH,
        upsample_kernel_sizes=(16, 16, 8),
    )  # fmt: skip
    model.eval()
    with torch.no_grad():
        model.dec.remove_weight_norm()

    def infer(text: Any, text_lengths: Any, scales: Any, sid: Any = None) -> Any:
        noise, length, noise_w = scales[0], scales[1], scales[2]
        audio = model.infer(
            text, text_lengths, sid=sid, noise_scale=noise, length_scale=length,
            noise_scale_w=noise_w,
        )[0]  # fmt: skip
        return audio.unsqueeze(1)

    model.forward = infer
    phonemes = torch.randint(0, symbols, (1, 50), dtype=torch.long)
    example = (phonemes, torch.LongTensor([50]), torch.FloatTensor([0.667, 1.0, 0.8]), None)
    out.mkdir(parents=True, exist_ok=True)
    voice = out / VOICE_FILE
    torch.onnx.export(
        model, example, str(voice), dynamo=False, opset_version=15,
        input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
        dynamic_axes={
            "input": {0: "batch_size", 1: "phonemes"},
            "input_lengths": {0: "batch_size"},
            "output": {0: "batch_size", 2: "time"},
        },
    )  # fmt: skip
    config = {
        "audio": {"sample_rate": SAMPLE_RATE},
        "espeak": {"voice": "en-us"},
        "phoneme_type": "espeak",
        "num_symbols": symbols,
        "num_speakers": 1,
        "inference": {"noise_scale": 0.667, "length_scale": 1.0, "noise_w": 0.8},
        "phoneme_id_map": DEFAULT_PHONEME_ID_MAP,
    }
    Path(f"{voice}.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return voice


def main(argv: list[str] | None = None) -> int:
    return run_writer(
        "service.real_runtimes.piper_model",
        lambda args: write_tiny_voice(args.out, seed=args.seed),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
