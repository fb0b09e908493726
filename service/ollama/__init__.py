"""Ollama's API in terms of the OpenAI routes vramd serves: pure translation, no I/O.

The Ollama listener (``server.ollama``, docs/api.md) answers Ollama clients on the
same scheduler as ``/v1``. It uses this package to turn each request into an OpenAI one
and each answer (or SSE chunk) back into Ollama's JSON (or NDJSON lines):

    requests.py  chat_request, generate_request, embed_request, embeddings_request
                 → Translated(route, body, stream, ignored, load_only, unload_only)
    answers.py   Timing; chat_answer, generate_answer, embed_answer, embeddings_answer,
                 idle_answer (load/unload), error_line
    streams.py   ChatStream: event(chunk) → lines, finish() → the done line
    relay.py     OllamaAnswer: the proxy's Translator, one runtime answer to Ollama's
    meta.py      ModelView; tags, ps, show, version; MANAGEMENT_ROUTES
    fields.py    the field checks and option mapping the requests share

Nothing here awaits, reads live state or opens a socket; the listener does that.
"""

from service.ollama.answers import (
    Timing,
    chat_answer,
    embed_answer,
    embeddings_answer,
    error_line,
    generate_answer,
    idle_answer,
    rfc3339,
)
from service.ollama.meta import (
    MANAGEMENT_MESSAGE,
    MANAGEMENT_ROUTES,
    OLLAMA_VERSION,
    ModelView,
    ps,
    show,
    tags,
    version,
)
from service.ollama.requests import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    EMBEDDINGS_ROUTE,
    Translated,
    chat_request,
    embed_request,
    embeddings_request,
    generate_request,
)
from service.ollama.streams import ChatStream

__all__ = [
    "CHAT_ROUTE",
    "COMPLETIONS_ROUTE",
    "EMBEDDINGS_ROUTE",
    "MANAGEMENT_MESSAGE",
    "MANAGEMENT_ROUTES",
    "OLLAMA_VERSION",
    "ChatStream",
    "ModelView",
    "Timing",
    "Translated",
    "chat_answer",
    "chat_request",
    "embed_answer",
    "embed_request",
    "embeddings_answer",
    "embeddings_request",
    "error_line",
    "generate_answer",
    "generate_request",
    "idle_answer",
    "ps",
    "rfc3339",
    "show",
    "tags",
    "version",
]
