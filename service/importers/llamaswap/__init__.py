"""llama-swap's ``config.yaml`` as a vramd policy (``vramd import llama-swap PATH``).

How the settings carry over (anything else becomes a ``# llama-swap: ...`` comment that
says why it has no equivalent):

| llama-swap | vramd |
|---|---|
| ``models.<id>`` | service ``slug(id)`` serving model ``<id>`` |
| ``cmd`` (macros, comment lines, ``\\`` continuations) | ``command`` argv; ``${PORT}`` kept |
| ``proxy`` with a fixed port | that port in ``cmd`` becomes ``${PORT}`` |
| ``aliases``, ``filters.setParamsByID`` ids | more ``models``; the ids' fields: ``set_params`` |
| ``filters.setParams`` | ``set_params`` for every model name |
| ``env: ["K=V"]`` | ``env: {K: V}`` |
| ``checkEndpoint`` | ``health`` |
| ``capabilities`` (``reranker``, ``embeddings``, ``out: [image]``, ...) | ``kind`` |
| whisper-server | ``routes: {/v1/audio/transcriptions: /inference}`` |
| ``ttl`` / ``globalTTL`` (seconds, 0 = never) | ``idle_ttl`` / ``defaults.idle_ttl`` |
| ``unloadTimeout`` (per model / global) | ``stop_timeout`` / ``defaults.stop_timeout`` |
| ``useModelName`` | ``upstream_model`` |
| ``concurrencyLimit`` | ``max_concurrency`` |
| ``healthCheckTimeout`` | ``defaults.startup_timeout`` |
| ``apiKeys`` | ``server.api_keys`` |
| no group, or a ``swap: true`` group | ``on-demand``, priority 100 |
| ``swap: false`` group | ``warm``, priority 200 |
| ``persistent: true`` group | ``pinned``, 300 (swapping: ``on-demand``, ``protect: never``) |
| ``matrix`` ``evict_costs`` | ``on-demand``, priority 100, 200, ... in cost order |
| ``routing.scheduler`` fifo ``priority`` | + 0..99 on the priority, in the same order |
| ``hooks.on_startup.preload`` | ``preload: true`` (an on-demand service becomes warm) |

Groups and the matrix are read from ``routing.router.settings`` (the current format,
``routing.router.use`` picking one) or from the older top-level ``groups`` / ``matrix``.
llama-swap knows nothing of memory, so each service gets a placeholder
``memory.estimate`` marked TODO.

Its parts::

    convert.py     convert: the converter, one config in, the policy text out
    keys.py        the llama-swap keys it knows, and why those with no equivalent have none
    kinds.py       kind_of: capabilities, else the command, to a service ``kind``
    routing.py     Routing, Placement: groups, matrix and scheduler as residency and priority
    matrix_dsl.py  expand_sets: the matrix's set expressions, to the combinations they allow
    macros.py      Macros: ``${...}`` definitions, expanded in order
    output.py      ServiceOut, render: the policy text, one service block and the whole file
    text.py        small pure helpers: slug, guess_kind, split_command, comment text
"""

from __future__ import annotations

from service.importers.llamaswap.convert import convert
from service.importers.llamaswap.text import guess_kind, slug, split_command

__all__ = ["convert", "guess_kind", "slug", "split_command"]
