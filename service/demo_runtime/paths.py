"""Which function answers which POST path, and how ``--native-routes`` changes that.

``ROUTES`` are the inference routes (they count toward ``--crash-after`` and the other
misbehaviour flags); ``UTILITY_ROUTES`` answer once the runtime has loaded but do no
inference (llama.cpp's tokenizer, Anthropic's token count). With ``--native-routes`` the
TEI and whisper.cpp paths answer and the OpenAI paths they stand for do not, so a request
that reaches the runtime at all proves which path vramd's route map chose.
"""

from __future__ import annotations

from collections.abc import Callable

from service.demo_runtime import messages, native, responses, routes
from service.demo_runtime.options import Options
from service.demo_runtime.replies import Reply

Route = Callable[[dict[str, object], Options], Reply]

ROUTES: dict[str, Route] = {
    "/v1/chat/completions": routes.chat_completions,
    "/v1/completions": routes.completions,
    "/v1/responses": responses.create,
    "/v1/messages": messages.create,
    "/v1/embeddings": routes.embeddings,
    "/v1/images/generations": routes.images,
    "/v1/images/edits": routes.image_edits,
    "/v1/audio/transcriptions": routes.transcriptions,
    "/v1/audio/translations": routes.transcriptions,
    "/v1/audio/speech": routes.speech,
    "/v1/rerank": routes.rerank,
}
NATIVE_ROUTES: dict[str, Route] = {"/rerank": native.rerank, "/inference": native.inference}
REPLACED_BY_NATIVE = frozenset({"/v1/rerank", "/v1/audio/transcriptions"})
UTILITY_ROUTES: dict[str, Route] = {
    "/tokenize": native.tokenize,
    "/v1/messages/count_tokens": messages.count_tokens,
}
ANTHROPIC_PREFIX = "/v1/messages"  # errors under it have Anthropic's shape


def inference_routes(opts: Options) -> dict[str, Route]:
    if not opts.native_routes:
        return ROUTES
    kept = {path: route for path, route in ROUTES.items() if path not in REPLACED_BY_NATIVE}
    return {**kept, **NATIVE_ROUTES}


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")
