"""A tiny random-weight Hugging Face llama for vLLM, tokenizer included, made offline.

``LlamaForCausalLM`` with 2 layers of width 128 and 2 heads of 64, its weights drawn from a
seeded generator and saved as ``model.safetensors``, beside a byte-level BPE tokenizer
built here with ``tokenizers`` (the 256 byte symbols, no merges, ``<s>``/``</s>``) and a
chat template, so ``/v1/chat/completions`` works. Nothing comes from a model hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from service.real_runtimes.writer_cli import run_writer

# head_dim 64: the smallest vLLM's CPU attention kernels take (16 is refused).
HIDDEN, LAYERS, HEADS, FFN, CONTEXT = 128, 2, 2, 256, 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def _tokenizer(out_dir: Path) -> int:
    """Write the tokenizer files; the vocabulary's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({symbol: 3 + i for i, symbol in enumerate(sorted(alphabet))})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = CONTEXT
    fast.save_pretrained(out_dir)
    return len(vocab)


def write_tiny_hf_llama(out_dir: Path, *, seed: int = 0) -> Path:
    """Write the model directory ``out_dir`` and return it.

        python -m service.real_runtimes.hf_model --out DIR [--seed N]

    Run it with vLLM's own Python (the installer does): it needs torch, transformers and
    tokenizers.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = _tokenizer(out_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=CONTEXT,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(out_dir)
    (out_dir / "vramd.json").write_text(json.dumps({"seed": seed, "generated": True}) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    return run_writer(
        "service.real_runtimes.hf_model",
        lambda args: write_tiny_hf_llama(args.out, seed=args.seed),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
