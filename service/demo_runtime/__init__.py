"""A stand-in OpenAI-compatible model runtime: what the demo policy and the tests run.

vramd supervises runtimes such as llama.cpp's ``llama-server`` or vLLM as child processes.
This package is one it can run anywhere, without a GPU or model weights, while still
behaving like the real thing where vramd can see it: it listens at once but answers
``/health`` with 503 until it has "loaded", it holds real, touched memory (so host memory
probes measure it), it serves the OpenAI routes of every kind, OpenAI's Responses API and
Anthropic's Messages API as the official clients expect them, llama.cpp's own routes
(``/slots``, ``/props``, ``/tokenize``, and with ``--slot-save-path`` the slot actions
``POST /slots/{id}?action=save|restore|erase``), per-slot prompt caches with llama-server's
``timings`` in chat and completions answers, and Prometheus metrics, and, with
``--native-routes``, the paths where text-embeddings-inference and whisper.cpp answer.
Flags make it misbehave on cue, so races and failures in tests are deterministic rather
than hoped for.

Run it as ``python -m service.demo_runtime --port P [flags]`` (the flags are listed in
``options``, and by ``--help``). It imports only the standard library and
``service.units`` so that it starts in a few tens of milliseconds (``service.simgpu``,
also standard library only, when it holds simulated GPU memory). Its parts::

    options.py   the command line: every flag, parsed into one frozen Options
    memory.py    real, touched memory, and forked helpers that hold their own
    gpu.py       device memory on simulated GPUs (--gpu-memory, GET /debug/gpu;
                 service.simgpu)
    state.py     Runtime: what the handler threads share (readiness, counters, leaks,
                 sleep, slots), and the llama.cpp-style metrics drawn from it
    slots.py     llama.cpp's slots: each one's cached prompt, the slot a request takes
                 (longest common prefix), and the ``timings`` answers carry
    slot_actions.py  POST /slots/{id}?action=save|restore|erase (--slot-save-path),
                 state files, and --slot-restore's misbehaviour
    replies.py   Reply and ApiError: an answer, or an error in OpenAI's (or Anthropic's) shape
    bodies.py    request bodies: JSON, multipart/form-data
    text.py      the deterministic reply text, word counts, token ids and prompts as
                 tokens, the fields routes share
    routes.py    the OpenAI routes: chat, completions, embeddings, images, audio, rerank
    responses.py OpenAI's Responses API, JSON and its named-event stream
    messages.py  Anthropic's Messages API and its token count, JSON and stream
    native.py    runtimes' own paths: llama.cpp /slots /props /tokenize, TEI /rerank,
                 whisper.cpp /inference, and /debug/echo
    paths.py     which function answers which path, and what --native-routes changes
    media.py     the tiny PNG and WAV files those routes answer with
    server.py    the HTTP server and its handler: reading, misbehaving, replying, streaming
    log.py       whole lines to stdout and stderr, as a supervisor tails them
    process.py   main: fail at start, or listen, load, and wait for a signal
    __main__.py  ``python -m service.demo_runtime``: process.main
"""

from service.demo_runtime.bodies import parse_multipart, parse_payload
from service.demo_runtime.media import tiny_png, tiny_wav
from service.demo_runtime.options import Options, parse_args
from service.demo_runtime.paths import ROUTES
from service.demo_runtime.process import main
from service.demo_runtime.text import reply_pieces

__all__ = [
    "ROUTES",
    "Options",
    "main",
    "parse_args",
    "parse_multipart",
    "parse_payload",
    "reply_pieces",
    "tiny_png",
    "tiny_wav",
]
