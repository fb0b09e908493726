"""Routes at runtimes' own paths, which vramd reaches through ``/upstream`` and route maps."""

from __future__ import annotations

import io
import wave
from typing import Any

from service.demo_runtime.options import Options
from service.demo_runtime.replies import Reply, json_reply
from service.demo_runtime.routes import relevance, transcript
from service.demo_runtime.state import CONTEXT_TOKENS, Runtime
from service.demo_runtime.text import require, token_id

BOS_TOKEN = 1


def _slot(index: int, opts: Options, busy: bool = False, held: int = 0) -> dict[str, object]:
    slot: dict[str, object] = {
        "id": index,
        "id_task": -1,
        "n_ctx": CONTEXT_TOKENS // opts.parallel,  # llama.cpp splits its context across slots
        "speculative": False,
        "is_processing": busy,
    }
    if busy or held:
        # Busy: prompt and generated tokens its requests hold. Idle: its cached prompt, as
        # llama-server reports the slot's previous task.
        slot["n_prompt_tokens"] = held
    return slot


def slots(runtime: Runtime) -> Reply:
    """One entry per ``--parallel`` slot: busy while requests run in it, holding their
    tokens; idle ones that cache a prompt say how many tokens it has.

    llama.cpp's server answers ``GET /slots``, ``GET /props`` and ``POST /tokenize``; clients
    and web UIs call them through vramd's ``/upstream/{service}/{path}`` pass-through. With
    ``--native-routes`` the demo also answers where other runtimes do their work, so a test
    can prove that a service's ``routes:`` map sent a request there: text-embeddings-
    inference reranks at ``POST /rerank``, whisper.cpp's server transcribes at
    ``POST /inference``. ``/debug/echo`` answers any method with what it received, so a
    pass-through test can see that method, query and body arrived unchanged.

    None of these answers holds anything from the environment or the command line beyond
    the model name.
    """
    opts = runtime.opts
    return json_reply([_slot(view.id, opts, view.busy, view.held) for view in runtime.slots.view()])


def props(runtime: Runtime) -> Reply:
    opts = runtime.opts
    settings = {**_slot(0, opts), "params": {"n_predict": -1, "temperature": 0.8}}
    return json_reply(
        {
            "default_generation_settings": settings,
            "total_slots": opts.parallel,
            "model_path": f"{opts.models[0]}.gguf",
            "chat_template": "{{ messages }}",
            "modalities": {"vision": False, "audio": False},
            "build_info": "demo-runtime",
            "is_sleeping": runtime.sleeping,
        }
    )


def tokenize(payload: dict[str, object], opts: Options) -> Reply:
    """One token per word, as llama.cpp answers: ids, or ``{id, piece}`` with ``with_pieces``."""
    words = require(payload, "content", str).split()
    pieces = [word if index == 0 else " " + word for index, word in enumerate(words)]
    tokens: list[Any] = [token_id(word) for word in words]
    if payload.get("add_special") is True:
        tokens, pieces = [BOS_TOKEN, *tokens], ["<s>", *pieces]
    if payload.get("with_pieces") is True:
        tokens = [{"id": tid, "piece": piece} for tid, piece in zip(tokens, pieces, strict=True)]
    return json_reply({"tokens": tokens})


def rerank(payload: dict[str, object], opts: Options) -> Reply:
    """text-embeddings-inference's rerank: a list of ``{index, score}``, best first."""
    query = require(payload, "query", str)
    texts = require(payload, "texts", list)
    query_words = set(query.lower().split())
    scores = [(index, relevance(query_words, str(text))) for index, text in enumerate(texts)]
    scores.sort(key=lambda pair: pair[1], reverse=True)
    results: list[dict[str, object]] = [{"index": index, "score": s} for index, s in scores]
    if payload.get("return_text") is True:
        for result, (index, _) in zip(results, scores, strict=True):
            result["text"] = str(texts[index])
    return json_reply(results)


def inference(payload: dict[str, object], opts: Options) -> Reply:
    """whisper.cpp's server: json (the default), text or verbose_json, as it answers them."""
    audio = require(payload, "file", bytes)
    text = transcript(audio)
    kind = payload.get("response_format", "json")
    if kind == "text":
        return Reply(body=text.encode(), content_type="text/plain; charset=utf-8")
    if kind != "verbose_json":
        return json_reply({"text": text})  # whisper.cpp answers json for formats it lacks
    duration = _duration(audio)
    segment = {"id": 0, "text": text, "start": 0.0, "end": duration, "tokens": []}
    return json_reply(
        {
            "task": "transcribe",
            "language": payload.get("language") or "en",
            "duration": duration,
            "text": text,
            "segments": [segment],
        }
    )


def _duration(audio: bytes) -> float:
    try:
        with wave.open(io.BytesIO(audio)) as sound:
            frames, rate = sound.getnframes(), sound.getframerate()
    except (wave.Error, EOFError):
        return 0.0  # not a WAV file: the demo transcribes it anyway
    return round(frames / rate, 3) if rate else 0.0


def echo(method: str, target: str, content_type: str | None, body: bytes) -> Reply:
    path, _, query = target.partition("?")
    return json_reply(
        {
            "method": method,
            "path": path,
            "query": query,
            "body": body.decode("utf-8", "replace"),
            "headers": {"content-type": content_type},
        }
    )
