"""The runtimes vramd knows, by name, and which one a command line runs: values only."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

# The canonical names, in the order error messages list them.
ADAPTER_NAMES = (
    "llama.cpp", "llama-cpp-python", "vllm", "whisper.cpp", "sd.cpp", "tei", "piper", "openai",
)  # fmt: skip
GENERIC = "openai"
# Runtimes with a sleep mode vramd can drive (vLLM's /sleep and /wake_up).
SLEEP_ADAPTERS = frozenset({"vllm"})
# Runtimes whose prompt cache vramd can save and restore (``state:``): llama.cpp's slots.
STATE_ADAPTERS = frozenset({"llama.cpp"})
STATE_DIR_ARG = "${STATE_DIR}"

# Other spellings people use for the same runtimes.
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
        "piper-tts": "piper",
        "piper.http_server": "piper",
        "generic": "openai",
    }
)


def canonical_name(name: str) -> str:
    """The canonical name of the runtime called ``name`` (case-insensitive, aliases accepted).

    Raises ``ValueError`` naming the known runtimes, so a policy error can show it as is.
    """
    key = name.strip().lower()
    canonical = ALIASES.get(key, key)
    if canonical not in ADAPTER_NAMES:
        known = ", ".join(ADAPTER_NAMES)
        raise ValueError(f"unknown runtime {name!r}; known runtimes: {known}")
    return canonical


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


def _by_program(token: str) -> str | None:
    base = _basename(token)
    path = token.replace("\\", "/").lower()
    if base in ("llama-server", "llama.cpp"):
        return "llama.cpp"
    if base == "vllm":
        return "vllm"
    if base in ("whisper-server", "whisper.cpp"):
        return "whisper.cpp"
    if base == "sd-server" or (base == "sd" and "stable-diffusion" in path):
        return "sd.cpp"
    if base == "text-embeddings-router":
        return "tei"
    # Builds from before the binaries were renamed (2024) called both servers "server".
    if base == "server" and "whisper" in path:
        return "whisper.cpp"
    if base == "server" and "llama.cpp" in path:
        return "llama.cpp"
    return None


def _by_module(module: str) -> str | None:
    if module == "llama_cpp.server" or module.startswith("llama_cpp.server."):
        return "llama-cpp-python"
    if module == "vllm" or module.startswith("vllm."):
        return "vllm"
    if module == "piper.http_server":
        return "piper"
    return None


def _from_python(args: Sequence[str]) -> str | None:
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


def guess_name(command: Sequence[str]) -> str:
    """The runtime a service's argv runs; the generic OpenAI one when nothing matches.

    A policy names a service's runtime with ``adapter:`` (or leaves it to be guessed from the
    command), and the policy loader must check that name and whether the runtime can sleep.
    It needs names, not adapters: ``service.adapters`` holds per-runtime parsers and vLLM's
    HTTP sleep helpers, which the policy and the pure scheduler must not import. So the
    names, their aliases and the guess live here, and ``service.adapters.registry`` maps a
    name to its adapter; a test keeps the two lists the same.

    Most policies never name a runtime: ``command: [llama-server, ...]`` already says which
    one it is. ``guess_name`` reads that from the program's basename, or, for a Python
    interpreter, from the module after ``-m``. Launchers in front of the program (``env``,
    ``nice``, ``taskset``, ``uv run``, ``conda run``, ...) are looked through. Anything it
    does not recognise is served as a generic OpenAI-compatible server, which is always a
    safe default: only the health path, metric names and OOM patterns differ.
    """
    argv = list(command)
    start = 0
    if argv and _basename(argv[0]) in _LAUNCHERS:
        start = next(
            (i for i, arg in enumerate(argv) if _is_python(arg) or _by_program(arg)),
            len(argv),
        )
    if start >= len(argv):
        return GENERIC
    program = argv[start]
    if _is_python(program):
        return _from_python(argv[start + 1 :]) or GENERIC
    return _by_program(program) or GENERIC


def saves_to_state_dir(command: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether llama-server is told to save its slots in ``${STATE_DIR}``: the flag
    ``--slot-save-path`` (``--slot-save-path=...`` too) or ``LLAMA_ARG_SLOT_SAVE_PATH``."""
    if env.get("LLAMA_ARG_SLOT_SAVE_PATH") == STATE_DIR_ARG:
        return True
    for i, arg in enumerate(command):
        if arg == "--slot-save-path" and i + 1 < len(command):
            if command[i + 1] == STATE_DIR_ARG:
                return True
        elif arg == f"--slot-save-path={STATE_DIR_ARG}":
            return True
    return False
