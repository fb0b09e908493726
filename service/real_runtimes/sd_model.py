"""A random-weight Stable Diffusion model that stable-diffusion.cpp's ``sd-server`` serves,
written as two GGUF files in a directory: ``model.gguf`` and ``taesd.gguf``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.real_runtimes.writer_cli import run_writer

MODEL_FILE = "model.gguf"
TAESD_FILE = "taesd.gguf"

# sd.cpp's UnetModelBlock for VERSION_SDXS_512_DS.
MODEL_CHANNELS = 320
TIME_EMBED = 4 * MODEL_CHANNELS
CHANNEL_MULT = (1, 2, 4)
ATTENTION_AT = (4, 2)  # downsampling factors with a SpatialTransformer
CONTEXT = 768
# CLIP ViT-L/14 text model.
VOCAB, N_TOKEN, HIDDEN, INTERMEDIATE, N_LAYER = 49408, 77, 768, 3072, 12
TAE_CHANNELS, TAE_BLOCKS, LATENT = 64, 3, 4

Shape = tuple[int, ...]  # PyTorch order (outermost first)
Tensor = tuple[str, Shape, str]  # name, shape, "linear" | "conv" | "norm" | "bias"


def _linear(name: str, n_in: int, n_out: int, *, bias: bool = True) -> list[Tensor]:
    out: list[Tensor] = [(f"{name}.weight", (n_out, n_in), "linear")]
    return out + ([(f"{name}.bias", (n_out,), "bias")] if bias else [])


def _conv(name: str, n_in: int, n_out: int, k: int = 3, *, bias: bool = True) -> list[Tensor]:
    out: list[Tensor] = [(f"{name}.weight", (n_out, n_in, k, k), "conv")]
    return out + ([(f"{name}.bias", (n_out,), "bias")] if bias else [])


def _norm(name: str, n: int) -> list[Tensor]:
    return [(f"{name}.weight", (n,), "norm"), (f"{name}.bias", (n,), "bias")]


def _resblock(name: str, ch: int, out: int) -> list[Tensor]:
    tensors = [
        *_norm(f"{name}.in_layers.0", ch),
        *_conv(f"{name}.in_layers.2", ch, out),
        *_linear(f"{name}.emb_layers.1", TIME_EMBED, out),
        *_norm(f"{name}.out_layers.0", out),
        *_conv(f"{name}.out_layers.3", out, out),
    ]
    if ch != out:
        tensors += _conv(f"{name}.skip_connection", ch, out, 1)
    return tensors


def _transformer(name: str, ch: int) -> list[Tensor]:
    block = f"{name}.transformer_blocks.0"
    tensors = [*_norm(f"{name}.norm", ch), *_conv(f"{name}.proj_in", ch, ch, 1)]
    for attn, ctx in (("attn1", ch), ("attn2", CONTEXT)):
        tensors += _linear(f"{block}.{attn}.to_q", ch, ch, bias=False)
        tensors += _linear(f"{block}.{attn}.to_k", ctx, ch, bias=False)
        tensors += _linear(f"{block}.{attn}.to_v", ctx, ch, bias=False)
        tensors += _linear(f"{block}.{attn}.to_out.0", ch, ch)
    tensors += _linear(f"{block}.ff.net.0.proj", ch, 8 * ch)  # GEGLU: 2 x 4ch
    tensors += _linear(f"{block}.ff.net.2", 4 * ch, ch)
    for i in (1, 2, 3):
        tensors += _norm(f"{block}.norm{i}", ch)
    return tensors + _conv(f"{name}.proj_out", ch, ch, 1)


def unet_tensors() -> list[Tensor]:
    """The tensors of sd.cpp's tiny UNet (``UnetModelBlock`` with ``tiny_unet``),
    following its constructor's block numbering."""
    p = "model.diffusion_model."
    tensors = [
        *_linear(p + "time_embed.0", MODEL_CHANNELS, TIME_EMBED),
        *_linear(p + "time_embed.2", TIME_EMBED, TIME_EMBED),
        *_conv(p + "input_blocks.0.0", LATENT, MODEL_CHANNELS),
    ]
    chans, ch, idx, ds = [MODEL_CHANNELS], MODEL_CHANNELS, 0, 1
    for i, mult in enumerate(CHANNEL_MULT):
        idx += 1
        tensors += _resblock(f"{p}input_blocks.{idx}.0", ch, mult * MODEL_CHANNELS)
        ch = mult * MODEL_CHANNELS
        if ds in ATTENTION_AT:
            tensors += _transformer(f"{p}input_blocks.{idx}.1", ch)
        chans.append(ch)
        idx += 1  # tiny_unet skips the second resblock's index
        if i != len(CHANNEL_MULT) - 1:
            idx += 1
            tensors += _conv(f"{p}input_blocks.{idx}.0.op", ch, ch)
            chans.append(ch)
            ds *= 2
    out_idx = 0
    for i in reversed(range(len(CHANNEL_MULT))):
        mult = CHANNEL_MULT[i]
        for j in range(2):
            ich = chans.pop()
            tensors += _resblock(f"{p}output_blocks.{out_idx}.0", ch + ich, mult * MODEL_CHANNELS)
            ch = mult * MODEL_CHANNELS
            up = 1
            if ds in ATTENTION_AT:
                tensors += _transformer(f"{p}output_blocks.{out_idx}.1", ch)
                up += 1
            if i > 0 and j == 1:
                out_idx += 1
                if out_idx == 2:
                    up = 1
                tensors += _conv(f"{p}output_blocks.{out_idx}.{up}.conv", ch, ch)
                ds //= 2
            out_idx += 1
    return [*tensors, *_norm(p + "out.0", ch), *_conv(p + "out.2", MODEL_CHANNELS, LATENT)]


def clip_tensors() -> list[Tensor]:
    p = "cond_stage_model.transformer.text_model."
    tensors: list[Tensor] = [
        (p + "embeddings.token_embedding.weight", (VOCAB, HIDDEN), "linear"),
        (p + "embeddings.position_embedding.weight", (N_TOKEN, HIDDEN), "norm"),
    ]
    for layer in range(N_LAYER):
        q = f"{p}encoder.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            tensors += _linear(q + "self_attn." + proj, HIDDEN, HIDDEN)
        tensors += _norm(q + "layer_norm1", HIDDEN) + _norm(q + "layer_norm2", HIDDEN)
        tensors += _linear(q + "mlp.fc1", HIDDEN, INTERMEDIATE)
        tensors += _linear(q + "mlp.fc2", INTERMEDIATE, HIDDEN)
    return tensors + _norm(p + "final_layer_norm", HIDDEN)


def _tae_block(name: str) -> list[Tensor]:
    c = TAE_CHANNELS
    return [*_conv(f"{name}.conv.0", c, c), *_conv(f"{name}.conv.2", c, c),
            *_conv(f"{name}.conv.4", c, c)]  # fmt: skip


def taesd_tensors() -> list[Tensor]:
    """TAESD as sd.cpp's ``TinyEncoder``/``TinyDecoder`` number their layers."""
    c, n = TAE_CHANNELS, TAE_BLOCKS
    enc, dec = "encoder.layers.", "decoder.layers."
    tensors = [*_conv(enc + "0", 3, c), *_tae_block(enc + "1")]
    idx = 2
    for _ in range(3):
        tensors += _conv(f"{enc}{idx}", c, c, bias=False)
        idx += 1
        for _ in range(n):
            tensors += _tae_block(f"{enc}{idx}")
            idx += 1
    tensors += _conv(f"{enc}{idx}", c, LATENT)
    tensors += _conv(dec + "0", LATENT, c)
    idx = 2  # layer 1 is a ReLU
    for _ in range(3):
        for _ in range(n):
            tensors += _tae_block(f"{dec}{idx}")
            idx += 1
        idx += 1  # Upsample
        tensors += _conv(f"{dec}{idx}", c, c, bias=False)
        idx += 1
    tensors += _tae_block(f"{dec}{idx}")
    return tensors + _conv(f"{dec}{idx + 1}", c, 3)


def _write(path: Path, tensors: list[Tensor], rng: Any) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="sd")
    for name, shape, kind in tensors:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if kind == "linear" and shape[-1] % 32 == 0:
            # q8_0 without quantising: random int8 codes and a per-block scale giving
            # the weights a standard deviation of about 1/sqrt(fan_in).
            blocks = int(np.prod(shape)) // 32
            scale = np.full((blocks, 1), 1.0 / (73.0 * fan_in**0.5), np.float16)
            codes = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8)
            raw = np.concatenate([scale.view(np.uint8), codes.view(np.uint8)], axis=1)
            # gguf takes a quantised tensor's shape in bytes (34 per block of 32).
            raw = raw.reshape(*shape[:-1], shape[-1] // 32 * 34)
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif kind in ("linear", "conv"):
            data = rng.standard_normal(shape, dtype=np.float32) / np.float32(fan_in**0.5)
            writer.add_tensor(name, data.astype(np.float16))
        elif kind == "norm":
            writer.add_tensor(name, np.ones(shape, np.float32))
        else:
            writer.add_tensor(name, np.zeros(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_sd(out: Path, *, seed: int = 0) -> Path:
    """Write ``model.gguf`` (tiny UNet + CLIP-L) and ``taesd.gguf`` into the directory
    ``out``; return ``out``.

    sd.cpp takes every width of its UNet models from code, not from the file (SD1's 320
    channels, CLIP-L's 12 layers of 768), so the smallest model it accepts is a real
    architecture: SDXS-512's UNet (sd.cpp's ``VERSION_SDXS_512_DS``: one resblock per level, no
    middle block, no attention at full resolution), picked by its tensor names, with SD1's
    CLIP-L text encoder, plus TAESD (``--taesd``) instead of the 83M-parameter VAE. Linear
    weights are q8_0 (random bytes, one scale per block), convolutions f16, norms f32.

        python -m service.real_runtimes.sd_model --out DIR [--seed N]
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / MODEL_FILE, unet_tensors() + clip_tensors(), rng)
    _write(out / TAESD_FILE, taesd_tensors(), rng)
    return out


def main(argv: list[str] | None = None) -> int:
    return run_writer(
        "service.real_runtimes.sd_model", lambda args: write_tiny_sd(args.out, seed=args.seed), argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
