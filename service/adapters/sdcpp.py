"""stable-diffusion.cpp's ``sd-server``.

Readiness: it loads every model (diffusion model, text encoders, VAE) before it binds its
port and has no ``/health`` route, so the first answer from ``GET /v1/models`` (a fixed
``sd-cpp-local`` entry) means ready.

Metrics: none that vramd reads (``/metrics`` is 404 in the build docs/runtimes.md
verified; older builds served JSON there behind ``--metrics``): leave ``metrics:`` unset.

Out of memory: the ggml backend lines plus sd.cpp's own
``<model> alloc params backend buffer failed`` and ``vae: failed to allocate the compute
buffer`` — the usual failure at large image sizes without ``--vae-tiling``. Generation
runs per request, so these appear in request logs long after a successful start.
"""

from __future__ import annotations

from service.adapters.base import GGML_OOM_PATTERNS, BaseAdapter

SD_CPP = BaseAdapter(
    name="sd.cpp",
    health_path="/v1/models",
    oom_patterns=GGML_OOM_PATTERNS,
)
