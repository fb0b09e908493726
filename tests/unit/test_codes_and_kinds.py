"""ErrorCode and EventKind: each spelled once in service/, and each as docs/api.md gives it."""

import ast
import re
from pathlib import Path

from service.domain import EventKind
from service.errors import ErrorCode, QueueFull, RequestRejected, RuntimeFailed, WindowClosed

ROOT = Path(__file__).resolve().parents[2]
# The demo runtime is a runtime of its own: it speaks the runtimes' APIs, not vramd's.
OWN_PROGRAMS = {"demo_runtime"}
# Words too common to count (any JSON body has an "error" key).
COMMON = {ErrorCode.ERROR}


def documented() -> dict[str, str]:
    text = (ROOT / "docs" / "api.md").read_text()
    table = text[text.index("| `code` | status | when |") :].split("\n\n", 1)[0]
    return dict(re.findall(r"^\| `([a-z_]+)` \| (\d+)", table, re.M))


def test_every_code_is_documented_with_its_status_and_every_documented_code_exists() -> None:
    ours = {code.value: str(code.status) for code in ErrorCode if code not in COMMON}
    assert documented() == ours


def test_no_code_is_spelled_out_in_more_than_two_modules() -> None:
    spelled: dict[str, set[str]] = {code.value: set() for code in ErrorCode if code not in COMMON}
    for path in sorted((ROOT / "service").rglob("*.py")):
        if OWN_PROGRAMS & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in spelled:
                spelled[node.value].add(str(path.relative_to(ROOT)))
    assert {code: where for code, where in spelled.items() if len(where) > 2} == {}


def test_a_rejection_is_made_from_its_code_with_the_status_and_retry_after() -> None:
    error = RequestRejected.of(ErrorCode.WINDOW_CLOSED, "closed", retry_after=30.0)
    assert isinstance(error, WindowClosed)
    assert (error.status, error.error_type, error.retry_after) == (503, "server_error", 30.0)
    assert isinstance(RequestRejected.of(ErrorCode.QUEUE_FULL, "full"), QueueFull)
    assert QueueFull("full").status == 429


def test_a_code_without_an_exception_of_its_own_is_a_runtime_failure() -> None:
    assert isinstance(RequestRejected.of(ErrorCode.NOT_FOUND, "gone"), RuntimeFailed)


def test_the_frameworks_statuses_map_to_codes_and_any_other_to_error() -> None:
    assert ErrorCode.of_status(404) is ErrorCode.NOT_FOUND
    assert ErrorCode.of_status(422) is ErrorCode.INVALID_REQUEST
    assert ErrorCode.of_status(418) is ErrorCode.ERROR


def test_every_event_kind_is_documented_and_every_documented_kind_exists() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    listing = text[text.index("\nKinds: ") : text.index("### `GET /api/usage`")]
    # The kinds are the code spans that open the list or follow a comma or "and".
    named = set(re.findall(r"(?:Kinds: |,\s+|and\s+)`([a-z-]+)`", listing))
    assert named == {kind.value for kind in EventKind}
