"""What ``make real-runtimes`` installs, one recipe per program, and the catalog entries
each one gives: the command that serves its generated model, as checked against the
real program (docs/runtimes.md has what each flag is for).
"""

from __future__ import annotations

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import (
    LLAMA_CPP_PYTHON,
    LOCAL,
    Installer,
    Layout,
    Recipe,
)
from service.real_runtimes.steps import Step, output_of

THREADS = "2"


# --- llama.cpp: chat, embeddings, reranking ----------------------------------------------


def _llama_steps(installer: Installer) -> list[Step]:
    layout = installer.layout
    src = layout.src("llama-cpp-python", LLAMA_CPP_PYTHON)
    models = layout.models
    return [
        installer.sdist("llama-cpp-python", LLAMA_CPP_PYTHON),
        installer.cmake(
            "llama-server",
            lambda: src / "vendor" / "llama.cpp",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
        ),
        installer.model("chat", "gguf_models", models / "chat.gguf", "--kind", "chat"),
        installer.model(
            "embedding", "gguf_models", models / "embedding.gguf", "--kind", "embedding"
        ),
        installer.model("rerank", "gguf_models", models / "rerank.gguf", "--kind", "rerank"),
    ]


def _llama_version(layout: Layout) -> str:
    printed = output_of([layout.binary("llama-server"), "--version"])
    build = next((line for line in printed.splitlines() if line.startswith("version:")), "")
    built = build.removeprefix("version:").strip()
    return f"llama.cpp {built} (llama-cpp-python {LLAMA_CPP_PYTHON})".replace(" ()", "")


def _llama_entries(layout: Layout) -> dict[str, RuntimeEntry]:
    binary = str(layout.binary("llama-server"))
    version = _llama_version(layout)
    common = ("--host", LOCAL, "--port", "${PORT}", "--alias", "${MODEL}", "--threads", THREADS)

    def entry(model: str, routes: tuple[str, ...], *flags: str) -> RuntimeEntry:
        path = str(layout.models / model)
        return RuntimeEntry(
            adapter="llama.cpp",
            command=(binary, "--model", path, *common, "--metrics", *flags),
            model=path,
            version=version,
            routes=routes,
            metrics="/metrics",
        )

    chat_routes = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
    return {
        "chat": entry("chat.gguf", chat_routes, "--ctx-size", "256", "--parallel", "2"),
        "embedding": entry("embedding.gguf", ("/v1/embeddings",), "--embeddings"),
        "rerank": entry("rerank.gguf", ("/v1/rerank",), "--reranking"),
    }


LLAMA_CPP = Recipe("llama.cpp", _llama_steps, _llama_entries)
