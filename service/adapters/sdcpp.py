"""stable-diffusion.cpp's ``sd-server``.

Readiness: it loads every model (diffusion model, text encoders, VAE) before it binds its
port and has no ``/health`` route, so the first answer from ``GET /v1/models`` (a fixed
``sd-cpp-local`` entry) means ready.

Metrics: none that vramd reads (``/metrics`` is 404 in the build docs/runtimes.md
verified; older builds served JSON there behind ``--metrics``): leave ``metrics:`` unset.

Out of memory: the ggml backend lines (first ``ggml_aligned_malloc: insufficient memory``
on the CPU backend), then sd.cpp's own ``<part> alloc params backend buffer failed`` at load
and ``<part>: failed to allocate the compute buffer`` per request, ``<part>`` being ``unet``,
``vae`` (large images without ``--vae-tiling``) and so on. A load that fails exits 1; a
request that fails answers 500 ``generate_image returned no results`` and the server stays
up, so these lines appear in request logs long after a successful start.

Shutdown: no SIGTERM handler; the process dies of the signal (-15) at once, mid-image too.
"""

from __future__ import annotations

from service.adapters.base import GGML_OOM_PATTERNS, BaseAdapter

SD_CPP = BaseAdapter(
    name="sd.cpp",
    health_path="/v1/models",
    oom_patterns=GGML_OOM_PATTERNS,
)
