"""Bad input, generated and hand-picked: the daemon answers 4xx, never a 500.

Three layers:

- Property tests (hypothesis) of the pure parsers: sizes and durations, and the policy
  parser fed arbitrary text and mutations of a valid policy. Anything may be refused,
  but only with ``ValueError`` / ``PolicyError``; nothing else may escape.
- Requests generated from the daemon's own ``/openapi.json`` against a live
  ``vramd serve``: every admin and OpenAI operation, with path, query and body values
  drawn from the schema's types and from a vocabulary of hostile values. The property:
  no 500, a 5xx only with a code the contract lists (a runtime's failure, not the
  daemon's), and every error in the OpenAI shape. This stands in for schemathesis: a
  page of code over hypothesis, no second framework.
- Hand-picked cases the issue names: oversize bodies, malformed JSON, wrong content
  types, invalid UTF-8, a ``model`` of every JSON type, very long and path-like model
  names, service names with path separators in admin URLs.

The regression tests at the end pin the bugs these generators found (numbers past
SQLite's or a float's range, unschedulable windows, YAML that recursed, held control
characters or scalars that could not be constructed); each was a 500 or a crash.
"""

from __future__ import annotations

import copy
import json
import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.daemon import Daemon, policy_yaml, running_daemon
from support.faults import demo_service, no_leftovers

from service.errors import PolicyError
from service.policy import Policy, load_policy
from service.units import format_duration, format_size, parse_duration, parse_size

SERVER_ERROR_CODES = {
    "insufficient_capacity",
    "queue_timeout",
    "window_closed",
    "runtime_failed",
    "runtime_timeout",
}
PROPERTY = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- units ----------------------------------------------------------------------------------

NUMBERS = st.from_regex(r"\A\s?[0-9]{1,18}(\.[0-9]{1,6})?\s?\Z") | st.from_regex(
    r"\A[0-9]{300,400}\Z"
)
SIZE_TEXT = st.builds(
    "{}{}".format,
    NUMBERS,
    st.sampled_from(["", "b", "B", "KiB", "MiB", "GiB", "TiB", "KB", "mb", "GB", "x", "iB"]),
)
DURATION_TEXT = st.lists(
    st.builds("{}{}".format, NUMBERS, st.sampled_from(["", "ms", "s", "m", "h", "d", "y"])),
    min_size=1,
    max_size=3,
).map("".join)
ANY_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    SIZE_TEXT,
    DURATION_TEXT,
)


@PROPERTY
@given(ANY_SCALAR)
def test_parse_size_returns_whole_bytes_or_value_error(value: object) -> None:
    try:
        size = parse_size(value)
    except ValueError as exc:
        assert str(exc)  # says what was expected
    else:
        assert isinstance(size, int) and size >= 0


@PROPERTY
@given(ANY_SCALAR)
def test_parse_duration_returns_finite_seconds_or_value_error(value: object) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(seconds, float) and math.isfinite(seconds) and seconds >= 0


@PROPERTY
@given(st.integers(0, 2**60))
def test_formatted_sizes_parse_back_within_rounding(n_bytes: int) -> None:
    parsed = parse_size(format_size(n_bytes))
    assert abs(parsed - n_bytes) <= max(1, n_bytes * 0.05)


@PROPERTY
@given(st.floats(0, 10**7, allow_nan=False))
def test_formatted_durations_parse_back_within_rounding(seconds: float) -> None:
    assert abs(parse_duration(format_duration(seconds)) - seconds) < 1.0


# --- the policy parser ------------------------------------------------------------------

VALID: dict[str, Any] = {
    "version": 1,
    "server": {"host": "127.0.0.1", "port": 8400, "max_json_body": "4MiB", "api_keys": []},
    "device": {"backend": "host", "budget": "8GiB", "headroom": "1GiB", "sample_interval": "1s"},
    "defaults": {"idle_ttl": "15m", "queue": {"max": 64, "timeout": "120s"}},
    "services": {
        "chat": {
            "kind": "chat",
            "models": ["qwen", "default"],
            "command": ["llama-server", "--port", "${PORT}", "-c", "8192"],
            "env": {"A": "${GPU}"},
            "memory": {"estimate": "6GiB", "cap": "7GiB", "on_cap": "restart"},
            "residency": "pinned",
            "priority": 100,
            "idle_ttl": 0,
            "max_concurrency": 4,
            "queue": {"max": 16, "timeout": "60s"},
            "restart": {"max_retries": 5, "backoff": "2s", "max_backoff": "120s"},
        },
        "embed": {
            "kind": "embedding",
            "models": ["bge"],
            "command": ["tei", "--port", "${PORT}"],
            "memory": {"estimate": "1GiB"},
        },
    },
    "maintenance": {
        "windows": [
            {
                "name": "nightly",
                "cron": "30 3 * * *",
                "duration": "1h",
                "timezone": "UTC",
                "restart": "flagged",
                "allow": [],
            }
        ]
    },
}
HOSTILE_TEXT = st.sampled_from(
    [
        "",
        " ",
        "${PORT}",
        "${NOPE}",
        "${",
        "../../etc/passwd",
        "a/b",
        "UTC",
        "Mars/Olympus",
        "../zoneinfo",
        "* * * * *",
        "*/0 * * * *",
        "60 24 32 13 8",
        "5-0 * * * mon-sun",
        "0 0 31 2 *",
        "@daily",
        "1h30m",
        "-1s",
        "1e400",
        "9" * 40,
        "1.5",
        "6GiB",
        "-6GiB",
        "0",
        "nan",
        ".inf",
        "\x00",
        "é" * 70,
        "on-demand",
        "window-only",
        "all",
        "flagged",
    ]
)
LEAF = st.one_of(ANY_SCALAR, HOSTILE_TEXT)
JSONISH = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(LEAF, inner, max_size=3)
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


PATHS = list(_paths(VALID))[1:]


@st.composite
def mutated_policies(draw: st.DrawFn) -> str:
    """The valid policy with one to three places replaced, removed or added to."""
    doc = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                parent[path[-1]] = draw(JSONISH)
            elif action == "delete" and isinstance(parent, dict):
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[draw(LEAF)] = draw(JSONISH)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced the way there
    return yaml.safe_dump(doc, allow_unicode=True)


def _loads_or_policy_error(text: str) -> Policy | None:
    try:
        return load_policy(text)
    except PolicyError as exc:
        assert exc.issues
        for issue in exc.issues:
            described = issue.as_dict()
            assert isinstance(described["message"], str) and described["message"]
            assert described["line"] is None or isinstance(described["line"], int)
        return None


def test_the_valid_policy_used_for_mutations_is_valid() -> None:
    assert _loads_or_policy_error(yaml.safe_dump(VALID)) is not None


@PROPERTY
@given(mutated_policies())
def test_a_mutated_policy_loads_or_is_a_policy_error(text: str) -> None:
    _loads_or_policy_error(text)


# Arbitrary text, and text made of YAML's own punctuation, tags and anchors, which
# reaches deeper into the parser than random characters do.
_YAML_TEXT = st.text(max_size=300) | st.lists(
    st.sampled_from(
        [
            "a",
            ": ",
            "- ",
            "\n",
            "  ",
            "[",
            "]",
            "{",
            "}",
            ",",
            "&x ",
            "*x",
            "!!int ",
            "!!str ",
            "!!binary ",
            "!!timestamp ",
            "<<: ",
            "=",
            "? ",
            "|",
            ">",
            "'",
            '"',
            "#",
            "%YAML 1.1\n",
            "---\n",
            "...\n",
            "\x00",
            "\x1b",
            "\ufeff",
            "9" * 400,
            "1e400",
            ".inf",
            "~",
        ]
    ),
    max_size=40,
).map("".join)


YAML_TEXT = _YAML_TEXT


@PROPERTY
@given(YAML_TEXT | st.builds("version: 1\n{}".format, YAML_TEXT))
def test_arbitrary_text_loads_or_is_a_policy_error(text: str) -> None:
    _loads_or_policy_error(text)


# --- the live daemon: generated requests ------------------------------------------------


def _services(workdir: Path) -> dict[str, Any]:
    return {
        "chat": demo_service(workdir, ["m-chat"], residency="pinned"),
        "embed": demo_service(workdir, ["m-embed"], kind="embedding"),
        "image": demo_service(workdir, ["m-image"], kind="diffusion"),
        "speech": demo_service(workdir, ["m-whisper"], kind="speech"),
    }


LIMITS = "server:\n  max_json_body: 64KiB\n  max_upload_body: 256KiB\n"
MODELS = ["m-chat", "m-embed", "m-image", "m-whisper"]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon the generated requests may do anything to (load, unload, apply...)."""
    workdir = tmp_path_factory.mktemp("fuzzed")
    text = policy_yaml(_services(workdir), extra=LIMITS)
    with no_leftovers(workdir), running_daemon(text, workdir, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        yield daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon for the hand-picked cases, which expect its services unchanged."""
    workdir = tmp_path_factory.mktemp("bad-input")
    text = policy_yaml(_services(workdir), extra=LIMITS)
    with no_leftovers(workdir), running_daemon(text, workdir, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("chat")["state"] == "ready")
        yield daemon


NAMES = st.one_of(
    st.sampled_from(["chat", "embed", "nope", "nightly"]),
    HOSTILE_TEXT,
    st.text(max_size=40),
    st.sampled_from(["..", "../chat", "chat/../chat", "a/b", "%2e%2e", "chat\\..", "chat\x00"]),
)


def _parameter(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    types = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
    options: list[st.SearchStrategy[str]] = [st.text(max_size=20)]
    if "integer" in types:
        options.append(st.integers().map(str))
        options.append(st.integers(-(10**30), 10**30).map(str))
    if "number" in types:
        options.append(st.floats().map(str))
    if "boolean" in types:
        options.append(st.sampled_from(["true", "false", "1", "0", "yes", "maybe"]))
    if "string" in types:
        options.append(NAMES)
    return st.one_of(options)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
MODEL_VALUES = st.sampled_from(MODELS) | NAMES | JSON_VALUES
INFERENCE_BODIES = st.fixed_dictionaries(
    {"model": MODEL_VALUES},
    optional={
        "messages": JSON_VALUES | st.just([{"role": "user", "content": "hi"}]),
        "prompt": JSON_VALUES,
        "input": JSON_VALUES,
        "query": JSON_VALUES,
        "documents": JSON_VALUES,
        "stream": st.booleans() | JSON_VALUES,
        "max_tokens": JSON_VALUES,
        "n": JSON_VALUES,
        "size": JSON_VALUES,
    },
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.api+json",
        "",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "multipart/form-data; boundary=b0undary",
        "application/json; charset=utf-16",
        "image/png",
    ]
)


def _multipart(fields: dict[str, bytes]) -> bytes:
    """A multipart/form-data body (boundary ``b0undary``); ``file`` is sent as a file."""
    parts = [
        b'--b0undary\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n'
        % (name.encode(), b'; filename="clip.wav"' if name == "file" else b"", value)
        for name, value in fields.items()
    ]
    return b"".join(parts) + b"--b0undary--\r\n"


@st.composite
def inference_request(draw: st.DrawFn) -> tuple[bytes, str]:
    shape = draw(st.sampled_from(["json", "json", "json", "multipart", "bytes", "not-object"]))
    if shape == "json":
        body = json.dumps(draw(INFERENCE_BODIES)).encode()
        return body, draw(st.sampled_from(["application/json", ""]) | CONTENT_TYPES)
    if shape == "multipart":
        model = draw(st.sampled_from([m.encode() for m in MODELS]) | st.binary(max_size=20))
        fields = {"model": model, "file": draw(st.binary(max_size=200))}
        if draw(st.booleans()):
            fields["prompt"] = b"a cat"
        return _multipart(fields), "multipart/form-data; boundary=b0undary"
    if shape == "bytes":
        return draw(st.binary(max_size=200)), draw(CONTENT_TYPES)
    return json.dumps(draw(JSON_VALUES)).encode(), "application/json"


OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
WINDOW_STARTS = st.one_of(
    st.just("now"),
    st.datetimes().map(datetime.isoformat),
    # Fixed offsets up to +-23:59: no dependency on the system's time zone database.
    st.datetimes(timezones=OFFSETS).map(datetime.isoformat),
    st.datetimes(datetime(2020, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC)).map(
        datetime.isoformat
    ),
    st.text(max_size=20),
    JSON_VALUES,
)
WINDOW_DURATIONS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(-10, 10**5),
    DURATION_TEXT,
    HOSTILE_TEXT,
    st.sampled_from(["1s", "1h", "0s", "31d", "30d"]),
)

WINDOW_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "name": NAMES | st.from_regex(r"\A[a-z0-9][a-z0-9_.-]{0,10}\Z"),
        "start": WINDOW_STARTS,
        "duration": WINDOW_DURATIONS,
        "restart": st.sampled_from(["flagged", "all", "none", "nope"])
        | st.lists(NAMES, max_size=3)
        | JSON_VALUES,
        "allow": st.lists(NAMES, max_size=3) | JSON_VALUES,
        "extra": JSON_VALUES,
    },
)
POLICY_BODIES = st.one_of(
    YAML_TEXT.map(str.encode),
    st.binary(max_size=200),
    mutated_policies().map(str.encode),
)


@st.composite
def request_for(draw: st.DrawFn, operation: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    method, template, spec = operation
    path = template
    params: dict[str, str] = {}
    for parameter in spec.get("parameters", []):
        value = draw(_parameter(parameter.get("schema", {})))
        if parameter["in"] == "path":
            path = path.replace("{" + parameter["name"] + "}", quote(value, safe="") or "%20")
        elif parameter["in"] == "query" and draw(st.booleans()):
            params[parameter["name"]] = value
    if draw(st.integers(0, 9)) == 0:
        params[draw(st.text(min_size=1, max_size=8))] = draw(st.text(max_size=8))
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    content, content_type = b"", ""
    if method == "POST":
        if template.startswith("/v1/"):
            content, content_type = draw(inference_request())
        elif template == "/api/maintenance":
            content = json.dumps(draw(WINDOW_BODIES)).encode()
            content_type = draw(st.just("application/json") | CONTENT_TYPES)
        elif template == "/api/policy":
            content, content_type = draw(POLICY_BODIES), "application/yaml"
    headers = {"content-type": content_type} if content_type else {}
    return {"method": method, "url": path, "params": params, "content": content, "headers": headers}


def assert_no_daemon_failure(response: httpx.Response) -> None:
    """No 500; a 5xx only as a contract code; every error in the OpenAI shape, or in
    Anthropic's on the Messages routes."""
    status = response.status_code
    context = f"{response.request.method} {response.request.url} -> {status} {response.text[:300]}"
    assert status != 500 and status < 600, context
    if status < 400 or response.request.method == "HEAD":  # HEAD answers carry no body
        return
    if response.request.url.path.startswith("/v1/messages"):
        body = response.json()
        assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), context
        assert body["error"]["type"] != "api_error" or status >= 500, context
        return
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"not an OpenAI-shaped error: {context}") from None
    assert {"message", "type", "code"} <= set(error), context
    if status >= 500:
        assert error["code"] in SERVER_ERROR_CODES, context


def _operations(daemon: Daemon, prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
    schema = daemon.get("/openapi.json").json()
    operations = [
        (method.upper(), path, spec)
        for path, methods in schema["paths"].items()
        for method, spec in methods.items()
        if path.startswith(prefix) and path != "/api/events/stream"  # SSE never ends
    ]
    assert operations, f"no {prefix} operations in /openapi.json"
    return operations


@pytest.mark.parametrize("prefix", ["/api/", "/v1/", "/upstream/"])
def test_generated_requests_never_get_a_500(fuzzed: Daemon, prefix: str) -> None:
    operations = _operations(fuzzed, prefix)

    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.sampled_from(range(len(operations))).flatmap(lambda i: request_for(operations[i])))
    def run(request: dict[str, Any]) -> None:
        with httpx.Client(base_url=fuzzed.url, timeout=60) as client:
            assert_no_daemon_failure(client.request(**request))

    run()
    assert fuzzed.get("/healthz").status_code == 200


# --- the live daemon: hand-picked cases -------------------------------------------------


def post(daemon: Daemon, path: str, content: bytes, content_type: str | None) -> httpx.Response:
    headers = {"content-type": content_type} if content_type is not None else {}
    response = httpx.post(f"{daemon.url}{path}", content=content, headers=headers, timeout=30)
    assert_no_daemon_failure(response)
    return response


def code_of(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def loads(daemon: Daemon) -> dict[str, int]:
    return {s["name"]: s["loads"] for s in daemon.get("/api/services").json()}


def test_oversize_bodies_are_413_before_they_are_read(daemon: Daemon) -> None:
    big = b'{"model": "m-chat", "pad": "' + b"x" * (64 * 1024) + b'"}'
    response = post(daemon, "/v1/chat/completions", big, "application/json")
    assert response.status_code == 413 and code_of(response) == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        for _ in range(40):
            yield b"x" * 4096

    chunked = httpx.post(f"{daemon.url}/v1/embeddings", content=chunks(), timeout=30)
    assert chunked.status_code == 413, chunked.text
    # Upload routes have their own, larger limit.
    upload = _multipart({"model": b"m-whisper", "file": b"\0" * (100 * 1024)})
    fits = post(
        daemon, "/v1/audio/transcriptions", upload, "multipart/form-data; boundary=b0undary"
    )
    assert fits.status_code == 200, fits.text
    too_big = _multipart({"model": b"m-whisper", "file": b"\0" * (300 * 1024)})
    refused = post(
        daemon, "/v1/audio/transcriptions", too_big, "multipart/form-data; boundary=b0undary"
    )
    assert refused.status_code == 413
    # A declared length over the limit is refused without waiting for the bytes.
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: vramd\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % 10**10
        )
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 413 "), head


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"model": "m-chat"',
        b"[" * 50_000,
        b'{"model": "m-chat",}',
        b"{'model': 'm-chat'}",
        b'{"model": "m-chat"} trailing',
        b"\xef\xbb\xbf{}",
        b"null",
    ],
    ids=[
        "empty",
        "open",
        "unclosed",
        "deep",
        "trailing-comma",
        "quotes",
        "trailing",
        "bom",
        "null",
    ],
)
def test_malformed_json_is_400(daemon: Daemon, body: bytes) -> None:
    response = post(daemon, "/v1/chat/completions", body, "application/json")
    assert response.status_code == 400 and code_of(response) == "invalid_request"


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/xml", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data", 400),  # no boundary
        ("multipart/form-data; boundary=zzz", 400),  # the body is not that form
    ],
)
def test_wrong_content_types_are_refused(daemon: Daemon, content_type: str, status: int) -> None:
    body = json.dumps({"model": "m-chat", "messages": []}).encode()
    assert post(daemon, "/v1/chat/completions", body, content_type).status_code == status


def test_invalid_utf8_is_400_wherever_it_is(daemon: Daemon) -> None:
    in_json = post(daemon, "/v1/chat/completions", b'{"model": "m-\xff\xfe"}', "application/json")
    assert in_json.status_code == 400
    form = _multipart({"model": b"m-\xff", "file": b"RIFF"})
    in_form = post(
        daemon, "/v1/audio/transcriptions", form, "multipart/form-data; boundary=b0undary"
    )
    assert in_form.status_code == 400
    policy = post(daemon, "/api/policy", b"version: 1\n\xff\xfe", "application/yaml")
    assert policy.status_code == 400
    for path in ("/api/services/%FF%FE", "/api/services/%C0%AF/load", "/v1/models/%ED%A0%80"):
        response = httpx.request(
            "POST" if path.endswith("load") else "GET", f"{daemon.url}{path}", timeout=30
        )
        assert_no_daemon_failure(response)
        assert response.status_code == 404


@pytest.mark.parametrize(
    "model",
    [None, True, False, 0, 1.5, -1, [], ["m-chat"], {}, {"name": "m-chat"}, ""],
    ids=repr,
)
def test_a_model_that_is_not_a_non_empty_string_is_400(daemon: Daemon, model: object) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    response = post(daemon, "/v1/chat/completions", body.encode(), "application/json")
    assert response.status_code == 400 and code_of(response) == "invalid_request"
    missing = post(daemon, "/v1/chat/completions", b'{"messages": []}', "application/json")
    assert missing.status_code == 400


def test_very_long_model_names_are_404(daemon: Daemon) -> None:
    for length in (257, 10_000, 60_000):
        body = json.dumps({"model": "m" * length, "messages": []}).encode()
        response = post(daemon, "/v1/chat/completions", body, "application/json")
        assert response.status_code == 404 and code_of(response) == "model_not_found"
    in_url = httpx.get(f"{daemon.url}/v1/models/{'m' * 8000}", timeout=30)
    assert in_url.status_code == 404


@pytest.mark.parametrize(
    "model",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "m-chat/../m-chat",
        "./m-chat",
        "C:\\models\\m-chat.gguf",
        "file:///etc/passwd",
        "%2e%2e%2fm-chat",
        "m-chat\x00.gguf",
        "~/.ssh/id_rsa",
    ],
)
def test_path_like_model_names_are_opaque_and_unknown(daemon: Daemon, model: str) -> None:
    before = loads(daemon)
    body = json.dumps({"model": model, "input": "x", "messages": []}).encode()
    for route in ("/v1/chat/completions", "/v1/embeddings"):
        response = post(daemon, route, body, "application/json")
        assert response.status_code == 404 and code_of(response) == "model_not_found"
    assert httpx.get(f"{daemon.url}/v1/models/{quote(model, safe='')}").status_code == 404
    assert loads(daemon) == before, "nothing was loaded for it"


@pytest.mark.parametrize(
    "name",
    [
        "..%2Fchat",
        "chat%2F..%2Fchat",
        "%2E%2E",
        "a%2Fb",
        "%2Fchat",
        "chat%5C..",
        "chat%00",
        "..%5Cchat",
        "%252e%252e",
        "chat%20",
    ],
)
def test_service_names_with_path_separators_in_admin_urls(daemon: Daemon, name: str) -> None:
    before = daemon.service("chat")
    for method, suffix in [
        ("GET", ""),
        ("POST", "/load"),
        ("POST", "/unload"),
        ("POST", "/restart"),
        ("GET", "/logs"),
        ("GET", "/memory"),
    ]:
        response = httpx.request(method, f"{daemon.url}/api/services/{name}{suffix}", timeout=30)
        assert_no_daemon_failure(response)
        assert response.status_code in (404, 405), response.text
    for method, path in [
        ("POST", f"/api/maintenance/{name}/run"),
        ("DELETE", f"/api/maintenance/{name}"),
    ]:
        response = httpx.request(method, f"{daemon.url}{path}", timeout=30)
        assert_no_daemon_failure(response)
        assert response.status_code in (404, 405)
    after = daemon.service("chat")
    assert (after["state"], after["pid"], after["loads"]) == (
        before["state"],
        before["pid"],
        before["loads"],
    )


# --- regressions: bugs the generators found ----------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/api/events?since={10**20}"),
        ("GET", f"/api/incidents/{10**20}"),
        ("POST", f"/api/policy/rollback/{10**20}"),
    ],
)
def test_huge_ids_are_not_a_500(daemon: Daemon, method: str, path: str) -> None:
    response = httpx.request(method, f"{daemon.url}{path}", timeout=30)
    assert_no_daemon_failure(response)


@pytest.mark.parametrize(
    "window",
    [
        {"duration": 1e308},
        {"duration": "1s", "start": "0001-01-01T00:00:00+14:00"},
        {"duration": 10**12},
    ],
    ids=["huge-duration", "year-1", "overflowing-end"],
)
def test_an_unschedulable_window_is_refused_and_cannot_stop_the_daemon(
    tmp_path: Path, window: dict[str, Any]
) -> None:
    with (
        no_leftovers(tmp_path),
        running_daemon(policy_yaml({}), tmp_path, in_thread=True) as daemon,
    ):
        response = httpx.post(
            f"{daemon.url}/api/maintenance", json={"name": "w", **window}, timeout=30
        )
        assert_no_daemon_failure(response)
        assert response.status_code == 400
    with no_leftovers(tmp_path), running_daemon(policy_yaml({}), tmp_path, in_thread=True) as again:
        assert again.get("/api/maintenance").status_code == 200


def assert_policy_error(
    daemon: Daemon, text: str, path: str, line: int | None, fragment: str
) -> None:
    """``text`` is refused with one issue, at ``path`` (and ``line``), that says
    ``fragment``: by the loader as a ``PolicyError`` and by the daemon's API as the same
    issues in a 422 ``invalid_policy``, after which the daemon's policy is as it was."""
    with pytest.raises(PolicyError) as refused:
        load_policy(text)
    issues = refused.value.issues
    assert [(issue.path, issue.line) for issue in issues] == [(path, line)]
    assert fragment in issues[0].message
    before = daemon.get("/api/policy").json()
    services = loads(daemon)
    response = daemon.post("/api/policy", content=text.encode())
    assert_no_daemon_failure(response)
    assert response.status_code == 422
    assert code_of(response) == "invalid_policy"
    assert response.json()["errors"] == [issue.as_dict() for issue in issues]
    assert daemon.get("/api/policy").json() == before
    assert loads(daemon) == services


_NESTED = "the YAML nests deeper than 64 levels or refers to itself"


@pytest.mark.parametrize(
    ("text", "path", "line", "fragment"),
    [
        ("a: &a [*a]\n", "", None, _NESTED),
        ("version: 1\nx: " + "[" * 5000 + "]" * 5000 + "\n", "", None, _NESTED),
    ],
    ids=["alias-cycle", "deep-nesting"],
)
def test_recursive_yaml_is_a_policy_error(
    daemon: Daemon, text: str, path: str, line: int | None, fragment: str
) -> None:
    assert_policy_error(daemon, text, path, line, fragment)


# The YAML reader reports these by character offset, not line: the issue has no line.
@pytest.mark.parametrize(
    ("text", "path", "line", "fragment"),
    [
        ("\x08", "", None, "unacceptable character #x0008"),
        ("version: 1\nservices: {}\x00\n", "", None, "unacceptable character #x0000"),
        ("a: \x1b[31m\n", "", None, "unacceptable character #x001b"),
    ],
)
def test_control_characters_are_a_policy_error(
    daemon: Daemon, text: str, path: str, line: int | None, fragment: str
) -> None:
    assert_policy_error(daemon, text, path, line, fragment)


@pytest.mark.parametrize(
    ("text", "path", "line", "fragment"),
    [
        ("=", "", 1, "could not determine a constructor"),
        ("version: 1\nservices:\n  a: =\n", "services.a", 3, "could not determine a constructor"),
        ("!!binary x", "", 1, "failed to decode base64"),
        ("a: !!int x", "a", 1, "invalid literal for int()"),
        ("a: !!timestamp nope", "a", 1, "invalid YAML value"),
    ],
)
def test_unconstructible_scalars_are_a_policy_error(
    daemon: Daemon, text: str, path: str, line: int | None, fragment: str
) -> None:
    assert_policy_error(daemon, text, path, line, fragment)


@pytest.mark.parametrize(
    ("extra", "path", "line", "fragment"),
    [
        (
            "memory: {estimate: 1GiB}\n    idle_ttl: " + "9" * 400,
            "services.a.idle_ttl",
            8,
            "is too long (at most ten years)",
        ),
        (
            "memory: {estimate: " + "9" * 400 + "KiB}",
            "services.a.memory.estimate",
            7,
            "is too large",
        ),
    ],
    ids=["duration", "size"],
)
def test_numbers_past_float_range_are_policy_errors(
    daemon: Daemon, extra: str, path: str, line: int, fragment: str
) -> None:
    service = (
        "version: 1\nservices:\n  a:\n    kind: embedding\n    models: [m]\n    command: [x]\n"
    )
    assert_policy_error(daemon, f"{service}    {extra}\n", path, line, fragment)


def test_a_duration_of_too_many_digits_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_duration("9" * 400)


def test_numbers_past_sqlite_range_are_policy_errors(daemon: Daemon, tmp_path: Path) -> None:
    spec = demo_service(tmp_path, ["m"], queue={"max": 10**30, "timeout": "1s"})
    text = policy_yaml({"a": spec})
    assert_policy_error(daemon, text, "services.a.queue.max", 15, "less than or equal to")


@pytest.mark.parametrize(
    ("text", "path", "line"),
    [
        ("!!int", "", 1),
        ("a: !!float", "a", 1),
        ("!!bool", "", 1),
        ("version: 1\nservices: !!int\n", "services", 2),
        ("a: [!!int ]", "a[0]", 1),
    ],
)
def test_empty_tagged_scalars_are_a_policy_error(
    daemon: Daemon, text: str, path: str, line: int
) -> None:
    assert_policy_error(daemon, text, path, line, "invalid YAML value")


def test_an_upstream_path_left_with_a_control_character_is_not_a_500(daemon: Daemon) -> None:
    """``chat%2F`` keeps the raw path from matching the service's prefix, so only the
    decoded path (with a 0x1F in it) is left to forward: it is encoded again."""
    response = httpx.request("DELETE", f"{daemon.url}/upstream/chat%2F/%1F", timeout=30)
    assert_no_daemon_failure(response)
