"""A tiny random-weight llama GGUF, written by the test suite itself with ``gguf``.

    path = write_tiny_llama(tmp_path / "tiny.gguf")

Real llama.cpp loads it like any model: architecture ``llama``, 2 layers, ``n_embd`` 64,
4 heads, a 256-token context, an SPM (``tokenizer.ggml.model = "llama"``) vocabulary of
``<unk>``, ``<s>``, ``</s>`` and the 256 byte tokens ``<0x00>``..``<0xFF>`` (so any text
tokenizes, byte by byte), and ``llama.pooling_type = 1`` (mean) so ``/v1/embeddings``
answers one vector per input. The weights are seeded noise: what it says is gibberish,
which is why tests assert on the shape of answers, never on their text. About 1 MB.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class TinyLlama:
    """The hyperparameters; the defaults are the ones the tests rely on."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx: int = 256
    seed: int = 0

    @property
    def vocab(self) -> list[str]:
        return ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]


UNK, BOS, EOS = 0, 1, 2


def write_tiny_llama(path: Path, spec: TinyLlama | None = None) -> Path:
    """Write the model to ``path`` (its directory must exist) and return ``path``."""
    spec = spec or TinyLlama()
    rng = np.random.default_rng(spec.seed)
    vocab = spec.vocab
    head_dim = spec.n_embd // spec.n_head
    n_embd_kv = head_dim * spec.n_head_kv

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("vramd-tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab))
    writer.add_pooling_type(gguf.PoolingType.MEAN)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * len(vocab))
    token_types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types([*token_types, *[gguf.TokenType.BYTE] * 256])
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)

    # numpy shapes are ggml's dimensions reversed: token_embd is {n_embd, n_vocab} in ggml.
    writer.add_tensor("token_embd.weight", noise(len(vocab), spec.n_embd))
    writer.add_tensor("output_norm.weight", ones(spec.n_embd))
    writer.add_tensor("output.weight", noise(len(vocab), spec.n_embd))
    for layer in range(spec.n_layer):
        blk = f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(spec.n_embd))
        writer.add_tensor(f"{blk}.attn_q.weight", noise(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", noise(n_embd_kv, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", noise(n_embd_kv, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", noise(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", noise(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", noise(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", noise(spec.n_embd, spec.n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
