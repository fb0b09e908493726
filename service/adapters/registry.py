"""Finding the adapter for a service: by the name a policy gives, or from its command line.

Most policies never name a runtime: ``command: [llama-server, ...]`` already says which
one it is. ``guess_adapter`` reads that from the program's basename, or, for a Python
interpreter, from the module after ``-m``. Launchers in front of the program (``env``,
``nice``, ``taskset``, ``uv run``, ``conda run``, ...) are looked through. Anything it
does not recognise is served as a generic OpenAI-compatible server, which is always a
safe default: only the health path, metric names and OOM patterns differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from service.adapters.base import Adapter
from service.adapters.generic import OPENAI
from service.adapters.llamacpp import LLAMA_CPP
from service.adapters.llamacpp_python import LLAMA_CPP_PYTHON
from service.adapters.sdcpp import SD_CPP
from service.adapters.tei import TEI
from service.adapters.vllm import VLLM
from service.adapters.whispercpp import WHISPER_CPP

ADAPTERS: Mapping[str, Adapter] = MappingProxyType(
    {
        adapter.name: adapter
        for adapter in (LLAMA_CPP, LLAMA_CPP_PYTHON, VLLM, WHISPER_CPP, SD_CPP, TEI, OPENAI)
    }
)

# Other spellings people use for the same runtimes; the canonical names are ADAPTERS' keys.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "llamacpp": "llama.cpp",
        "llama-cpp": "llama.cpp",
        "llama-server": "llama.cpp",
        "llama_cpp_python": "llama-cpp-python",
        "llama_cpp.server": "llama-cpp-python",
        "whispercpp": "whisper.cpp",
        "whisper-server": "whisper.cpp",
        "sdcpp": "sd.cpp",
        "sd-server": "sd.cpp",
        "stable-diffusion.cpp": "sd.cpp",
        "text-embeddings-inference": "tei",
        "text-embeddings-router": "tei",
        "generic": "openai",
    }
)


def adapter_named(name: str) -> Adapter:
    """The adapter called ``name`` (case-insensitive, aliases accepted).

    Raises ``ValueError`` naming the known runtimes, so a policy error can show it as is.
    """
    key = name.strip().lower()
    adapter = ADAPTERS.get(ALIASES.get(key, key))
    if adapter is None:
        known = ", ".join(ADAPTERS)
        raise ValueError(f"unknown runtime {name!r}; known runtimes: {known}")
    return adapter


# Programs that run another program named later on their command line.
_LAUNCHERS = frozenset(
    {
        "env", "nohup", "nice", "ionice", "taskset", "numactl", "stdbuf", "setsid", "chrt",
        "time", "exec", "sudo", "uv", "uvx", "pipx", "conda", "mamba", "micromamba",
        "pixi", "poetry",
    }
)  # fmt: skip
_PYTHON = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?[tw]?$")
# Interpreter options that take a value as the next word.
_PYTHON_OPTS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def _basename(token: str) -> str:
    base = token.replace("\\", "/").rsplit("/", 1)[-1].lower()
    return base.removesuffix(".exe")


def _is_python(token: str) -> bool:
    return token == "${PYTHON}" or bool(_PYTHON.match(_basename(token)))


def _by_program(token: str) -> Adapter | None:
    base = _basename(token)
    path = token.replace("\\", "/").lower()
    if base in ("llama-server", "llama.cpp"):
        return LLAMA_CPP
    if base == "vllm":
        return VLLM
    if base in ("whisper-server", "whisper.cpp"):
        return WHISPER_CPP
    if base == "sd-server" or (base == "sd" and "stable-diffusion" in path):
        return SD_CPP
    if base == "text-embeddings-router":
        return TEI
    # Builds from before the binaries were renamed (2024) called both servers "server".
    if base == "server" and "whisper" in path:
        return WHISPER_CPP
    if base == "server" and "llama.cpp" in path:
        return LLAMA_CPP
    return None


def _by_module(module: str) -> Adapter | None:
    if module == "llama_cpp.server" or module.startswith("llama_cpp.server."):
        return LLAMA_CPP_PYTHON
    if module == "vllm" or module.startswith("vllm."):
        return VLLM
    return None


def _from_python(args: Sequence[str]) -> Adapter | None:
    """What ``python ARGS`` runs: the module after ``-m``, or the script it is given."""
    it = iter(args)
    for arg in it:
        if arg == "-m":
            return _by_module(next(it, ""))
        if arg.startswith("-m") and not arg.startswith("--"):
            return _by_module(arg[2:])
        if arg == "-c":
            return None
        if arg in _PYTHON_OPTS_WITH_VALUE:
            next(it, None)
        elif not arg.startswith("-"):
            return _by_program(arg)  # e.g. python /venv/bin/vllm serve ...
    return None


def guess_adapter(command: Sequence[str]) -> Adapter:
    """The adapter for a service's argv; the generic OpenAI one when nothing matches."""
    argv = list(command)
    start = 0
    if argv and _basename(argv[0]) in _LAUNCHERS:
        start = next(
            (i for i, arg in enumerate(argv) if _is_python(arg) or _by_program(arg)),
            len(argv),
        )
    if start >= len(argv):
        return OPENAI
    program = argv[start]
    if _is_python(program):
        return _from_python(argv[start + 1 :]) or OPENAI
    return _by_program(program) or OPENAI
