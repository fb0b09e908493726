"""The tiny random-weight llama GGUF the llama-server benchmarks load: the one
``make real-runtimes`` serves (``service.real_runtimes.gguf_models``), so a benchmark and
the real-runtime checks time the same file. Needs ``gguf``.
"""

from service.real_runtimes.gguf_models import N_CTX, write_tiny_llama

__all__ = ["N_CTX", "write_tiny_llama"]
