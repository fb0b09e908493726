"""The policy file contract (docs/policy.md): validation, defaults, placeholders, diffs.

Invalid policies live in ``tests/policies/invalid/``, one mistake each (or several in the
"all at once" case), with ``# expect: <path> (line N): <message fragment>`` header lines;
the parametrized test below holds ``load_policy`` to exactly those issues.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.domain import OnCap, Residency, ServiceKind
from service.errors import PolicyError, PolicyIssue
from service.policy import (
    PLACEHOLDERS,
    Policy,
    diff_policies,
    expand_placeholders,
    load_policy,
    placeholders_in,
    policy_json_schema,
)

GiB, MiB = 1024**3, 1024**2
POLICIES = Path(__file__).parents[1] / "policies"
INVALID = sorted((POLICIES / "invalid").glob("*.yaml"))
VALID = sorted((POLICIES / "valid").glob("*.yaml"))
CONFIGS = sorted((Path(__file__).parents[2] / "config").glob("*.yaml"))

# "(policy)" stands for the empty path of a whole-file problem, as PolicyIssue prints it.
_EXPECT_RE = re.compile(r"^# expect: (?P<path>\S+)(?: \(line (?P<line>\d+)\))?: (?P<fragment>.+)$")


@dataclass(frozen=True)
class Expected:
    path: str
    line: int | None
    fragment: str


def expectations(text: str) -> list[Expected]:
    found = []
    for line in text.splitlines():
        if not line.startswith("# expect"):
            continue
        match = _EXPECT_RE.match(line)
        assert match, f"malformed expect line: {line!r}"
        path = "" if match["path"] == "(policy)" else match["path"]
        number = int(match["line"]) if match["line"] else None
        found.append(Expected(path, number, match["fragment"]))
    return found


def issues_of(text: str) -> list[PolicyIssue]:
    with pytest.raises(PolicyError) as excinfo:
        load_policy(text)
    return excinfo.value.issues


def policy_text(body: str) -> str:
    return "version: 1\n" + textwrap.dedent(body)


def one_service(**keys: str) -> str:
    """A valid single-service policy; ``keys`` add or replace lines of the service."""
    fields = {
        "kind": "chat",
        "models": "[qwen2.5-7b]",
        "command": '[llama-server, --port, "${PORT}", -m, /models/qwen.gguf]',
        "memory": "{estimate: 6GiB, cap: 7GiB}",
        **keys,
    }
    lines = "".join(f"    {key}: {value}\n" for key, value in fields.items())
    return f"version: 1\nservices:\n  chat:\n{lines}"


# --- invalid files ------------------------------------------------------------------


def test_there_are_enough_invalid_cases() -> None:
    assert len(INVALID) >= 18
    for path in INVALID:
        assert expectations(path.read_text()), f"{path.name} has no '# expect:' line"


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_policy_reports_exactly_the_expected_issues(path: Path) -> None:
    text = path.read_text()
    expected = expectations(text)
    issues = issues_of(text)
    report = "\n".join(str(issue) for issue in issues)

    assert len(issues) == len(expected), f"{path.name} reported:\n{report}"
    for want in expected:
        at = [i for i in issues if i.path == want.path and i.line == want.line]
        assert at, f"no issue at {want.path!r} line {want.line}; reported:\n{report}"
        assert any(want.fragment in i.message for i in at), (
            f"{want.path} (line {want.line}) lacks {want.fragment!r}; reported:\n{report}"
        )


def test_issues_come_sorted_by_position() -> None:
    issues = issues_of((POLICIES / "invalid" / "many_errors_at_once.yaml").read_text())
    lines = [issue.line or 0 for issue in issues]
    assert lines == sorted(lines)


def test_issue_columns_point_at_the_offending_text() -> None:
    text = one_service(memory="{estimate: 6GiB, cap: 5GiB}", priority="1001")
    by_path = {issue.path: issue for issue in issues_of(text)}
    # A bad priority is no reason to hide the cap check: no cross-field check reads it.
    assert set(by_path) == {"services.chat.priority", "services.chat.memory.cap"}
    cap = by_path["services.chat.memory.cap"]
    assert text.splitlines()[cap.line - 1][cap.col - 1 :].startswith("5GiB")
    priority = by_path["services.chat.priority"]
    assert (priority.line, priority.col) == (8, 15)
    assert text.splitlines()[7][priority.col - 1 :] == "1001"


def test_a_type_error_hides_no_cross_field_check_elsewhere() -> None:
    text = policy_text(
        """\
        server: {port: "8400"}
        services:
          chat:
            kind: chat
            models: [default]
            command: [llama-server]
            memory: {estimate: 6GiB, cap: 5GiB}
          coder:
            kind: chat
            models: [default]
            command: [llama-server]
            memory: {estimate: 6GiB}
        """
    )
    assert {(i.path, i.line) for i in issues_of(text)} == {
        ("server.port", 2),
        ("services.chat.memory.cap", 8),
        ("services.coder.models[0]", 11),
    }


# --- valid files and config/ --------------------------------------------------------


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_validates(path: Path) -> None:
    policy = load_policy(path.read_text())
    assert policy.services, f"{path.name} defines no services"


def test_config_folder_is_not_empty() -> None:
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "vramd.example.yaml"}


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_policy_loads(path: Path) -> None:
    assert isinstance(load_policy(path.read_text()), Policy)


def load_valid(name: str) -> Policy:
    return load_policy((POLICIES / "valid" / name).read_text())


def test_minimal_policy_takes_every_default() -> None:
    policy = load_valid("minimal.yaml")
    assert policy.version == 1
    assert policy.services == {}
    assert policy.maintenance.windows == []
    assert (policy.server.host, policy.server.port) == ("127.0.0.1", 8400)
    assert policy.server.api_keys == policy.server.admin_keys == []
    assert (policy.device.backend, policy.device.gpus) == ("auto", "all")
    assert policy.device.budget is None
    assert policy.device.headroom == GiB
    assert policy.defaults.idle_ttl == 15 * 60
    assert (policy.defaults.queue.max, policy.defaults.queue.timeout) == (64, 120.0)


def test_an_empty_document_is_not_a_policy() -> None:
    [issue] = issues_of("# nothing here\n")
    assert issue.path == ""
    assert "must be a YAML mapping" in issue.message


def test_defaults_fill_in_what_a_service_leaves_out() -> None:
    plain = load_valid("defaults_merged.yaml").services["plain"]
    assert plain.startup_timeout == 45
    assert plain.stop_timeout == 5
    assert plain.max_concurrency == 2
    assert plain.priority == 150
    assert (plain.queue.max, plain.queue.timeout) == (10, 90)
    assert (plain.restart.max_retries, plain.restart.backoff, plain.restart.max_backoff) == (
        2,
        1,
        30,
    )
    assert plain.env == {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "4"}


def test_a_service_value_wins_and_mappings_merge_key_by_key() -> None:
    tuned = load_valid("defaults_merged.yaml").services["tuned"]
    assert tuned.max_concurrency == 8
    assert tuned.priority == 600
    assert tuned.startup_timeout == 120
    assert tuned.stop_timeout == 5  # not set by the service: from defaults
    # queue sets only max; timeout comes from defaults, not the built-in 120s.
    assert (tuned.queue.max, tuned.queue.timeout) == (100, 90)
    assert (tuned.restart.max_retries, tuned.restart.backoff, tuned.restart.max_backoff) == (
        2,
        0.5,
        30,
    )
    assert tuned.env == {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "16", "EXTRA": "yes"}


def test_defaults_do_not_leak_between_services() -> None:
    services = load_valid("defaults_merged.yaml").services
    assert "EXTRA" not in services["plain"].env
    assert services["plain"].queue.max == 10


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ("pinned", 0.0),  # pinned never unloads, even with an idle_ttl of its own
        ("tuned", 0.0),  # warm without its own idle_ttl: only pressure evicts it
        ("keeper", 2 * 3600.0),  # warm with its own idle_ttl
        ("plain", 20 * 60.0),  # on-demand (the default residency): defaults.idle_ttl
        ("lazy", 90.0),  # on-demand with its own
        ("batch", 20 * 60.0),  # window-only: defaults.idle_ttl
    ],
)
def test_idle_ttl_resolution(service: str, expected: float) -> None:
    assert load_valid("defaults_merged.yaml").services[service].idle_ttl == expected


@pytest.mark.parametrize(
    ("residency", "own", "expected"),
    [
        ("pinned", None, 0.0),
        ("pinned", "5m", 0.0),
        ("warm", None, 0.0),
        ("warm", "5m", 300.0),
        ("on-demand", None, 900.0),
        ("on-demand", "5m", 300.0),
        ("on-demand", "0", 0.0),
        ("window-only", None, 900.0),
    ],
)
def test_idle_ttl_per_residency_with_builtin_default(
    residency: str, own: str | None, expected: float
) -> None:
    keys = {"residency": residency} | ({"idle_ttl": own} if own else {})
    assert load_policy(one_service(**keys)).services["chat"].idle_ttl == expected


def test_an_error_in_defaults_is_reported_once_at_defaults() -> None:
    text = policy_text(
        """\
        defaults:
          max_concurrency: 0
          stop_timeout: 5s
        services:
          a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
          b: {kind: chat, models: [b], command: [x], memory: {estimate: 1GiB}}
          c: {kind: chat, models: [c], command: [x], memory: {estimate: 1GiB}}
        """
    )
    [issue] = issues_of(text)
    assert (issue.path, issue.line) == ("defaults.max_concurrency", 3)
    assert "greater than or equal to 1" in issue.message


def test_an_unknown_key_in_defaults_is_reported_once() -> None:
    text = policy_text(
        """\
        defaults:
          idle_tll: 10m
        services:
          a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
          b: {kind: chat, models: [b], command: [x], memory: {estimate: 1GiB}}
        """
    )
    assert [(i.path, i.line, i.message) for i in issues_of(text)] == [
        ("defaults.idle_tll", 3, "unknown key")
    ]


def test_the_valid_part_of_defaults_still_merges() -> None:
    # With one bad default, the others must still reach the services: otherwise a
    # service would fail on a key it only has through defaults and add noise.
    text = policy_text(
        """\
        defaults:
          queue: {max: lots}
          health: /ready
        services:
          a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
        """
    )
    assert [(i.path, i.line) for i in issues_of(text)] == [("defaults.queue.max", 3)]


def test_a_cross_field_error_from_a_default_points_at_the_defaults_line() -> None:
    text = policy_text(
        """\
        device: {gpus: [0]}
        defaults:
          gpus: [3]
        services:
          a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
        """
    )
    [issue] = issues_of(text)
    assert (issue.path, issue.line) == ("services.a.gpus[0]", 4)
    assert "GPU 3 is not in device.gpus [0]" in issue.message


def test_yaml_anchors_and_merge_keys() -> None:
    services = load_valid("anchors_and_merge_keys.yaml").services
    chat, coder, embed = services["chat"], services["coder"], services["embed"]
    assert coder.kind is ServiceKind.CHAT
    assert coder.command == chat.command == embed.command
    assert coder.models == ["qwen2.5-coder-7b"]
    assert (coder.memory.estimate, coder.memory.cap) == (6 * GiB, 8 * GiB)
    assert coder.memory.on_cap is OnCap.RESTART
    assert (coder.priority, chat.priority) == (200, 100)
    assert coder.residency is Residency.ON_DEMAND
    assert (embed.queue.max, embed.queue.timeout) == (16, 60)
    assert services["coder-large"].memory == coder.memory


def test_every_placeholder_is_accepted() -> None:
    service = load_valid("every_placeholder.yaml").services["vllm"]
    used = {
        name
        for text in [*service.command, *service.env.values(), service.health]
        for name in placeholders_in(text)
    }
    assert used == PLACEHOLDERS


def test_sizes_and_durations_in_every_spelling() -> None:
    policy = load_valid("sizes_and_durations.yaml")
    assert policy.server.max_json_body == 1_000_000
    assert policy.server.max_upload_body == 104857600
    assert policy.device.budget == 1536 * MiB
    assert policy.device.headroom == 128 * MiB
    assert policy.device.sample_interval == 0.5
    tiny = policy.services["tiny"]
    assert tiny.startup_timeout == 5400
    assert tiny.stop_timeout == 0
    assert tiny.idle_ttl == 900
    assert (tiny.memory.estimate, tiny.memory.cap) == (6 * 1000**3, 6 * GiB)
    assert (tiny.queue.max, tiny.queue.timeout) == (0, 2.5)


def test_service_for_model() -> None:
    policy = load_valid("defaults_merged.yaml")
    assert policy.service_for_model("whisper-1") == "lazy"
    assert policy.service_for_model("nope") is None


# --- placeholders -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${PORT}", "8401"),
        ("--port=${PORT}", "--port=8401"),
        ("${SERVICE}:${PORT}", "chat:8401"),
        ("${CAP_MIB}${CAP_MIB}", "71687168"),
        ("/models/${MODEL}.gguf", "/models/qwen.gguf"),
        ("no placeholders", "no placeholders"),
        ("${UNKNOWN}", "${UNKNOWN}"),  # left as written
        ("$PORT", "$PORT"),  # only the ${...} form is a placeholder
        ("${PORT", "${PORT"),
        ("${}", "${}"),
        ("${NESTED}", "${PORT}"),  # one pass: a value is never expanded again
    ],
)
def test_expand_placeholders(text: str, expected: str) -> None:
    values = {
        "PORT": "8401",
        "SERVICE": "chat",
        "MODEL": "qwen",
        "CAP_MIB": "7168",
        "NESTED": "${PORT}",
    }
    assert expand_placeholders(text, values) == expected


def test_placeholders_in() -> None:
    assert placeholders_in("-m ${MODEL} --port ${PORT} $HOME ${}") == ["MODEL", "PORT", ""]


# --- diffs --------------------------------------------------------------------------


BASE = """\
version: 1
device: {headroom: 1GiB}
services:
  chat:
    kind: chat
    models: [qwen2.5-7b]
    command: [llama-server, --port, "${PORT}"]
    memory: {estimate: 6GiB, cap: 7GiB}
  embed:
    kind: embedding
    models: [nomic]
    command: [llama-server, --port, "${PORT}", --embedding]
    memory: {estimate: 600MiB}
maintenance:
  windows:
    - {name: nightly, cron: "30 3 * * *", duration: 1h}
"""


def edited(*replacements: tuple[str, str]) -> Policy:
    text = BASE
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return load_policy(text)


def test_diff_from_nothing_adds_everything() -> None:
    diff = diff_policies(None, load_policy(BASE))
    assert diff.added == ["chat", "embed"]
    assert diff.windows_added == ["nightly"]
    assert diff.removed == diff.settings_changed == []
    assert diff.lines() == ["+ service chat", "+ service embed", "+ window nightly"]


def test_diff_of_the_same_policy_is_empty() -> None:
    diff = diff_policies(load_policy(BASE), load_policy(BASE))
    assert diff.empty
    assert diff.lines() == ["no changes"]


def test_diff_added_and_removed_services() -> None:
    new = edited(("  embed:", "  embedder:"))
    diff = diff_policies(load_policy(BASE), new)
    assert (diff.added, diff.removed, diff.changed) == (["embedder"], ["embed"], [])
    assert not diff.empty
    assert diff.lines() == ["+ service embedder", "- service embed"]


def test_a_priority_change_applies_in_place() -> None:
    new = edited(
        (
            "    memory: {estimate: 6GiB, cap: 7GiB}",
            "    memory: {estimate: 6GiB, cap: 7GiB}\n    priority: 300",
        )
    )
    [change] = diff_policies(load_policy(BASE), new).changed
    assert change.name == "chat"
    assert change.fields == {"priority": (100, 300)}
    assert change.restart is False
    assert diff_policies(load_policy(BASE), new).lines() == [
        "~ service chat",
        "    priority: 100 -> 300",
    ]


def test_a_command_change_restarts() -> None:
    new = edited(
        ('[llama-server, --port, "${PORT}"]', '[llama-server, --port, "${PORT}", -c, "8192"]')
    )
    diff = diff_policies(load_policy(BASE), new)
    [change] = diff.changed
    assert list(change.fields) == ["command"]
    assert change.restart is True
    assert diff.lines()[0] == "~ service chat (restarts, drained)"


def test_an_env_change_restarts() -> None:
    new = edited(
        ("    memory: {estimate: 600MiB}", '    memory: {estimate: 600MiB}\n    env: {A: "1"}')
    )
    [change] = diff_policies(load_policy(BASE), new).changed
    assert change.fields == {"env": ({}, {"A": "1"})}
    assert change.restart is True


def test_a_cap_change_restarts_only_when_the_command_uses_the_cap() -> None:
    bigger_cap = ("cap: 7GiB", "cap: 8GiB")
    [change] = diff_policies(load_policy(BASE), edited(bigger_cap)).changed
    assert change.fields == {"memory.cap": (7 * GiB, 8 * GiB)}
    assert change.restart is False

    uses_cap = (
        '[llama-server, --port, "${PORT}"]',
        '[llama-server, --port, "${PORT}", --mib, "${CAP_MIB}"]',
    )
    [change] = diff_policies(edited(uses_cap), edited(uses_cap, bigger_cap)).changed
    assert change.fields == {"memory.cap": (7 * GiB, 8 * GiB)}
    assert change.restart is True


def test_a_cap_used_in_env_also_restarts() -> None:
    cap_env = ("cap: 7GiB}", 'cap: 7GiB}\n    env: {MAX_BYTES: "${CAP_BYTES}"}')
    old = edited(cap_env)
    new = edited(cap_env, ("cap: 7GiB", "cap: 9GiB"))
    [change] = diff_policies(old, new).changed
    assert change.restart is True


def test_an_estimate_change_applies_in_place() -> None:
    [change] = diff_policies(
        load_policy(BASE), edited(("estimate: 6GiB", "estimate: 5GiB"))
    ).changed
    assert change.fields == {"memory.estimate": (6 * GiB, 5 * GiB)}
    assert change.restart is False


def test_window_changes() -> None:
    old = load_policy(BASE)
    renamed = edited(("name: nightly", "name: weekly"))
    diff = diff_policies(old, renamed)
    assert (diff.windows_added, diff.windows_removed) == (["weekly"], ["nightly"])
    assert diff.lines() == ["+ window weekly", "- window nightly"]

    longer = edited(("duration: 1h", "duration: 2h"))
    diff = diff_policies(old, longer)
    assert diff.windows_changed == ["nightly"]
    assert diff.lines() == ["~ window nightly"]


def test_settings_changes() -> None:
    diff = diff_policies(load_policy(BASE), edited(("headroom: 1GiB", "headroom: 2GiB")))
    assert diff.settings_changed == ["device.headroom"]
    assert diff.changed == []
    assert diff.lines() == ["~ device.headroom"]


def test_diff_lines_list_every_kind_of_change_in_order() -> None:
    new = edited(
        ("  embed:", "  embedder:"),
        ("cap: 7GiB}", "cap: 7GiB}\n    priority: 5"),
        ("name: nightly", "name: weekly"),
        ("headroom: 1GiB", "headroom: 2GiB"),
    )
    old = edited(("  embed:", "  zz-old:"))
    assert diff_policies(old, new).lines() == [
        "+ service embedder",
        "- service zz-old",
        "~ service chat",
        "    priority: 100 -> 5",
        "+ window weekly",
        "- window nightly",
        "~ device.headroom",
    ]


# --- JSON Schema --------------------------------------------------------------------


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def accepts_type(node: dict[str, Any], json_type: str) -> bool:
    branches = node.get("anyOf", [node])
    return any(branch.get("type") == json_type for branch in branches)


def test_json_schema_shape() -> None:
    schema = policy_json_schema()
    json.loads(json.dumps(schema))  # plain JSON all the way down
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {
        "version",
        "server",
        "device",
        "defaults",
        "services",
        "maintenance",
    }
    assert schema["required"] == ["version"]
    assert schema["additionalProperties"] is False  # unknown keys are errors
    assert refs(schema), "expected $refs into $defs"
    for ref in refs(schema):
        assert ref.startswith("#/$defs/")
        assert ref.removeprefix("#/$defs/") in schema["$defs"], ref


def test_json_schema_describes_a_service() -> None:
    schema = policy_json_schema()
    service = resolve(schema, schema["properties"]["services"]["additionalProperties"])
    assert service["additionalProperties"] is False
    assert set(service["required"]) == {"kind", "models", "command", "memory"}
    kind = resolve(schema, service["properties"]["kind"])
    assert set(kind["enum"]) == {"chat", "embedding", "diffusion", "speech", "rerank"}
    residency = resolve(schema, service["properties"]["residency"])
    assert set(residency["enum"]) == {"pinned", "warm", "on-demand", "window-only"}


def test_json_schema_accepts_sizes_and_durations_as_strings() -> None:
    schema = policy_json_schema()
    service = resolve(schema, schema["$defs"]["Service"])
    memory = resolve(schema, service["properties"]["memory"])
    estimate = memory["properties"]["estimate"]
    assert accepts_type(estimate, "string") and accepts_type(estimate, "integer")
    assert "6GiB" in estimate["description"]
    startup = service["properties"]["startup_timeout"]
    assert accepts_type(startup, "string") and accepts_type(startup, "number")
    headroom = resolve(schema, schema["$defs"]["DeviceConfig"])["properties"]["headroom"]
    assert accepts_type(headroom, "string")


# --- PolicyIssue and PolicyError ------------------------------------------------------


@pytest.mark.parametrize(
    ("issue", "text"),
    [
        (
            PolicyIssue("services.chat.memory.cap", "must be >= estimate (6GiB)", 14, 12),
            "services.chat.memory.cap (line 14, col 12): must be >= estimate (6GiB)",
        ),
        (PolicyIssue("server.port", "too big", 3), "server.port (line 3): too big"),
        (PolicyIssue("version", "required key is missing"), "version: required key is missing"),
        (
            PolicyIssue("", "invalid YAML: oops", 2, 1),
            "(policy) (line 2, col 1): invalid YAML: oops",
        ),
    ],
)
def test_policy_issue_str(issue: PolicyIssue, text: str) -> None:
    assert str(issue) == text
    assert repr(issue) == f"PolicyIssue({text})"


def test_policy_issue_as_dict() -> None:
    issue = PolicyIssue("server.port", "too big", 3, 9)
    assert issue.as_dict() == {"path": "server.port", "line": 3, "col": 9, "message": "too big"}


def test_policy_error_lists_every_issue() -> None:
    text = (POLICIES / "invalid" / "many_errors_at_once.yaml").read_text()
    with pytest.raises(PolicyError) as excinfo:
        load_policy(text)
    assert str(excinfo.value).splitlines() == [str(i) for i in excinfo.value.issues]
    assert len(excinfo.value.issues) == len(expectations(text))


# --- protect (docs/policy.md) --------------------------------------------------------


@pytest.mark.parametrize(
    ("residency", "own", "expected"),
    [
        ("warm", None, 600.0),
        ("on-demand", None, 60.0),
        ("window-only", None, 0.0),
        ("pinned", None, "never"),  # never evicted: nothing to protect
        ("warm", "30s", 30.0),
        ("on-demand", "1h", 3600.0),
        ("on-demand", "0", 0.0),
        ("warm", "never", "never"),
        ("on-demand", "NEVER", "never"),
    ],
)
def test_protect_per_residency_with_builtin_default(
    residency: str, own: str | None, expected: float | str
) -> None:
    keys = {"residency": residency} | ({"protect": own} if own else {})
    assert load_policy(one_service(**keys)).services["chat"].protect == expected


def test_defaults_protect_applies_to_every_service_but_pinned_ones() -> None:
    policy = load_policy(
        policy_text(
            """\
            defaults:
              protect: 45s
            services:
              a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
              w: {kind: chat, models: [w], command: [x], memory: {estimate: 1GiB},
                  residency: warm}
              own: {kind: chat, models: [o], command: [x], memory: {estimate: 1GiB},
                    protect: never}
              pin: {kind: chat, models: [p], command: [x], memory: {estimate: 1GiB},
                    residency: pinned}
            """
        )
    )
    protect = {name: svc.protect for name, svc in policy.services.items()}
    assert protect == {"a": 45.0, "w": 45.0, "own": "never", "pin": "never"}


def test_protect_reaches_the_scheduler_rules_in_seconds() -> None:
    import math

    from service.scheduler import rules_from_policy

    policy = load_policy(
        policy_text(
            """\
            services:
              a: {kind: chat, models: [a], command: [x], memory: {estimate: 1GiB}}
              n: {kind: chat, models: [n], command: [x], memory: {estimate: 1GiB},
                  residency: warm, protect: never}
            """
        )
    )
    rules, _ = rules_from_policy(policy)
    assert rules["a"].protection_s == 60.0
    assert math.isinf(rules["n"].protection_s)


def test_a_protect_change_applies_in_place() -> None:
    old = load_policy(one_service(residency="warm"))
    new = load_policy(one_service(residency="warm", protect="1m"))
    (change,) = diff_policies(old, new).changed
    assert change.fields == {"protect": (600.0, 60.0)} and change.restart is False


# --- import edges ----------------------------------------------------------------------

# What the policy and the pure scheduler may reach inside service/ at run time: values
# only (docs/architecture.md). No maintenance jobs, adapters, processes or kernel.
VALUE_MODULES = ("domain", "errors", "units")
_IMPORT_PROBE = """
import pathlib, sys
import service.policy, service.scheduler
for path in sys.argv[1:]:
    service.policy.load_policy(pathlib.Path(path).read_text())
print(" ".join(sorted(sys.modules)))
"""


def test_loading_a_policy_imports_only_values() -> None:
    # A fresh interpreter: this one has imported the whole daemon already. Loading every
    # shipped policy also runs the validators and cross-field checks (sleep, cron).
    argv = [sys.executable, "-c", _IMPORT_PROBE, *map(str, CONFIGS)]
    probe = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    modules = set(probe.stdout.split())
    ours = {name for name in modules if name.startswith("service.")}
    allowed = {f"service.{name}" for name in VALUE_MODULES}
    beyond = {
        name
        for name in ours - allowed
        if not name.startswith(("service.policy", "service.scheduler"))
    }
    assert not beyond, f"the policy reaches live code: {sorted(beyond)}"
    assert not {"httpx", "apscheduler.schedulers", "sqlalchemy", "fastapi"} & modules


@pytest.mark.parametrize(
    ("memory", "span"),
    [
        ("    memory: {estimate: 6GiB, cap: 7GiB}\n    span: 2", (1, 2)),
        ("    memory: {estimate: 6GiB, cap: 7GiB, split: [0.7, 0.3]}\n    span: 2", None),
    ],
)
def test_a_span_or_split_change_restarts_the_service(
    memory: str, span: tuple[int, int] | None
) -> None:
    """A new span or split is a new placement: the instance must start again on it."""
    before = edited(
        ("    memory: {estimate: 6GiB, cap: 7GiB}", memory.replace(", split: [0.7, 0.3]", ""))
    )
    after = edited(("    memory: {estimate: 6GiB, cap: 7GiB}", memory))
    base = load_policy(BASE) if span else before
    [change] = diff_policies(base, after).changed
    assert change.restart is True
    assert after.services["chat"].shares == ((0.5, 0.5) if span else (0.7, 0.3))


# --- protect: never ------------------------------------------------------------------


def test_starvation_warnings_name_what_a_protect_never_outranks_on_its_devices() -> None:
    from service.policy import starvation_warnings

    def svc(name: str, residency: str, priority: int, extra: str = "") -> str:
        return (
            f"  {name}:\n    kind: chat\n    models: [{name}]\n    command: [x]\n"
            f"    memory: {{estimate: 1GiB}}\n    residency: {residency}\n"
            f"    priority: {priority}\n{extra}"
        )

    text = "version: 1\nservices:\n" + "".join(
        [
            svc("chat", "warm", 300, "    protect: never\n    gpus: [0]\n"),
            svc("peer", "warm", 300, "    gpus: [0]\n"),  # equal: warm keeps it out too
            svc("coder", "on-demand", 200, "    gpus: [0, 1]\n"),
            svc("other-gpu", "on-demand", 100, "    gpus: [1]\n"),  # never shares a device
            svc("base", "pinned", 100),  # never evicted anyway
            svc("img", "on-demand", 150, "    protect: never\n"),
            svc("top", "on-demand", 400),  # above img: not kept out
        ]
    )
    warnings = starvation_warnings(load_policy(text))
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "services.chat.protect is never: chat (warm, priority 300) never yields its "
        "memory to coder, img, peer while it is loaded, so they can starve"
    )
    assert warnings[1].startswith(
        "services.img.protect is never: img (on-demand, priority 150) never yields its "
        "memory to other-gpu while it is loaded, so it can starve"
    )
