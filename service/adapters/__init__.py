"""Per-runtime knowledge: readiness, metrics, out-of-memory lines, clean exits, sleep.

One module per runtime, each holding one adapter instance; ``base`` defines the
``Adapter`` Protocol and ``RuntimeMetrics``, ``prometheus`` the metrics parser they share,
and ``registry`` finds an adapter by name or from a command line::

    base.py             Adapter, BaseAdapter, RuntimeMetrics, find_oom, OOM pattern sets
    prometheus.py       parse_prometheus, parse_samples, MetricSamples
    llamacpp.py         llama.cpp llama-server            "llama.cpp"
    llamacpp_python.py  python -m llama_cpp.server        "llama-cpp-python"
    vllm.py             vllm serve, + sleep/wake helpers  "vllm"
    whispercpp.py       whisper.cpp whisper-server        "whisper.cpp"
    sdcpp.py            stable-diffusion.cpp sd-server    "sd.cpp"
    tei.py              text-embeddings-router            "tei"
    piper.py            python -m piper.http_server       "piper"
    generic.py          any OpenAI-compatible server      "openai"
    registry.py         adapter_named, guess_adapter

Adapters do no I/O; the vLLM sleep helpers take the caller's ``httpx.AsyncClient``. The
names alone, and the guess from a command line, are ``service.policy.runtime_names``: values
the policy reads without importing this package.
"""

from service.adapters.base import Adapter, BaseAdapter, RuntimeMetrics, find_oom
from service.adapters.generic import OPENAI
from service.adapters.llamacpp import LLAMA_CPP
from service.adapters.llamacpp_python import LLAMA_CPP_PYTHON
from service.adapters.piper import PIPER
from service.adapters.prometheus import Sample, parse_prometheus, parse_samples
from service.adapters.registry import ADAPTERS, adapter_named, guess_adapter
from service.adapters.sdcpp import SD_CPP
from service.adapters.tei import TEI
from service.adapters.vllm import VLLM
from service.adapters.whispercpp import WHISPER_CPP

__all__ = [
    "ADAPTERS",
    "LLAMA_CPP",
    "LLAMA_CPP_PYTHON",
    "OPENAI",
    "PIPER",
    "SD_CPP",
    "TEI",
    "VLLM",
    "WHISPER_CPP",
    "Adapter",
    "BaseAdapter",
    "RuntimeMetrics",
    "Sample",
    "adapter_named",
    "find_oom",
    "guess_adapter",
    "parse_prometheus",
    "parse_samples",
]
