"""The environment a runtime process starts with."""

from __future__ import annotations

import os
from collections.abc import Mapping

INHERITED: Mapping[str, str] = {
    "PATH": "to find the runtime binary and the tools it calls",
    "HOME": "runtimes and their libraries keep caches and config under it",
    "USER": "some libraries derive per-user paths and lock names from it",
    "LOGNAME": "the POSIX twin of USER; getpass() reads it first",
    "LANG": "so the runtime decodes model paths and prompts as the operator's locale",
    "LC_ALL": "overrides LANG; passed so the runtime sees the same locale as the daemon",
    "LC_CTYPE": "the character-encoding part of the locale",
    "TZ": "so runtime log timestamps match the daemon's",
    "TMPDIR": "runtimes write temporary files (uploads, compiled kernels) there",
    "LD_LIBRARY_PATH": "where CUDA/ROCm libraries live on hosts without a system install",
    "CUDA_HOME": "CUDA toolkits and JIT compilers (Triton, vLLM) look for nvcc there",
    "HF_HOME": "the Hugging Face cache, so runtimes find already-downloaded weights",
    "XDG_CACHE_HOME": "the generic cache root (torch, llama.cpp downloads) under it",
    "PYTHONPATH": "Python runtimes installed outside site-packages need it",
    "VIRTUAL_ENV": "Python runtimes launched from a virtualenv's bin/ expect it",
}


def runtime_environment(
    extra: Mapping[str, str], *, base: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The allow-listed part of ``base`` overlaid with ``extra``.

    A runtime gets a minimal environment, not a copy of the daemon's: the daemon's own
    configuration (``VRAMD_*`` variables, API and admin keys, cloud credentials someone
    exported in the unit file) must never reach a third-party binary that logs its
    environment or hands it to plugins. Only the variables named in ``INHERITED`` pass
    through, each for a stated reason; everything else a service needs is set explicitly in
    its policy ``env`` (the ``extra`` mapping), which wins over anything inherited.

    ``CUDA_VISIBLE_DEVICES`` is deliberately not inherited: the orchestrator chooses the
    device per instance and passes it in ``extra``.
    """
    env = {name: base[name] for name in INHERITED if name in base}
    env.update(extra)
    return env
