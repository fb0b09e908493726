"""The GGUF models ``make real-runtimes`` serves with llama.cpp, written with random weights.

One tiny llama (about 1 MB, loaded in milliseconds) in three roles: ``chat``, ``embedding``
(mean pooling) and ``rerank`` (rank pooling, a rerank template). Answers are gibberish;
their shapes are real. Needs ``gguf`` and ``numpy`` (the installer's tools environment).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from service.real_runtimes.writer_cli import run_writer

N_LAYER, N_EMBD, N_HEAD, N_FF, N_CTX = 2, 64, 4, 128, 256
VOCAB = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]


def write_tiny_llama(
    path: Path,
    *,
    seed: int = 0,
    n_layer: int = N_LAYER,
    n_embd: int = N_EMBD,
    n_head: int = N_HEAD,
    n_ff: int = N_FF,
    n_ctx: int = N_CTX,
    pooling: str = "MEAN",
    templates: dict[str, str] | None = None,
) -> Path:
    """Write the model to ``path`` (its folder must exist) and return ``path``.

    The defaults give 2 layers, ``n_embd`` 64, 4 heads and a 256-token context; ``n_embd``
    must divide by ``n_head``. ``pooling`` names a ``gguf.PoolingType`` (``RANK`` makes a
    reranker); ``templates`` are chat templates by name (``default``, ``rerank``).
    """
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} does not divide by n_head {n_head}")
    import gguf  # only here: the rest of bench runs without it
    import numpy as np

    rng = np.random.default_rng(seed)

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"vramd-tiny-llama-{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(VOCAB))
    writer.add_pooling_type(gguf.PoolingType[pooling])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([0.0] * len(VOCAB))
    control = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types([*control, *[gguf.TokenType.BYTE] * 256])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, template in (templates or {}).items():
        key = "tokenizer.chat_template" + ("" if name == "default" else f".{name}")
        writer.add_string(key, template)
    # numpy shapes are ggml's dimensions reversed: token_embd is {n_embd, n_vocab} in ggml.
    writer.add_tensor("token_embd.weight", noise(len(VOCAB), n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("output.weight", noise(len(VOCAB), n_embd))
    for layer in range(n_layer):
        blk = f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(n_embd))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", noise(n_embd, n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", noise(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", noise(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", noise(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
RERANK_TEMPLATE = "<s>query: {query}</s><s>document: {document}</s>"
# Each role: its pooling type and its chat templates by name.
ROLES: dict[str, tuple[str, dict[str, str]]] = {
    "chat": ("MEAN", {"default": CHAT_TEMPLATE}),
    "embedding": ("MEAN", {}),
    "rerank": ("RANK", {"rerank": RERANK_TEMPLATE}),
}


def main(argv: list[str] | None = None) -> int:
    def write(args: argparse.Namespace) -> None:
        pooling, templates = ROLES[args.kind]
        write_tiny_llama(args.out, seed=args.seed, pooling=pooling, templates=templates)

    return run_writer(
        "service.real_runtimes.gguf_models",
        write,
        argv,
        options=lambda parser: parser.add_argument("--kind", choices=sorted(ROLES), required=True),
    )


if __name__ == "__main__":
    raise SystemExit(main())
