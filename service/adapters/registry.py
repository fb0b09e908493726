"""Finding the adapter for a service: by the name a policy gives, or from its command line.

The names, their aliases and the guess from a command line are values the policy needs
too, so they live in ``service.policy.runtime_names``; this module maps each name to the
adapter that carries that runtime's knowledge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from service.adapters.base import Adapter
from service.adapters.generic import OPENAI
from service.adapters.llamacpp import LLAMA_CPP
from service.adapters.llamacpp_python import LLAMA_CPP_PYTHON
from service.adapters.piper import PIPER
from service.adapters.sdcpp import SD_CPP
from service.adapters.tei import TEI
from service.adapters.vllm import VLLM
from service.adapters.whispercpp import WHISPER_CPP
from service.policy.runtime_names import canonical_name, guess_name

ADAPTERS: Mapping[str, Adapter] = MappingProxyType(
    {
        adapter.name: adapter
        for adapter in (LLAMA_CPP, LLAMA_CPP_PYTHON, VLLM, WHISPER_CPP, SD_CPP, TEI, PIPER, OPENAI)
    }
)


def adapter_named(name: str) -> Adapter:
    """The adapter called ``name`` (case-insensitive, aliases accepted).

    Raises ``ValueError`` naming the known runtimes, so a policy error can show it as is.
    """
    return ADAPTERS[canonical_name(name)]


def guess_adapter(command: Sequence[str]) -> Adapter:
    """The adapter for a service's argv; the generic OpenAI one when nothing matches."""
    return ADAPTERS[guess_name(command)]
