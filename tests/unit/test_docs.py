"""The documentation is checked against the code, so it stays true.

- every key of the policy's JSON Schema is documented in docs/policy.md by its full path
  (``services.<name>.memory.cap``), and every key path its tables list exists;
- every complete example policy (a ```yaml block starting with ``version: 1``) in docs/
  and README.md validates with the daemon's own loader;
- docs/api.md names exactly the routes of the app, written as `` `METHOD /path` ``;
- every ``VRAMD_*`` variable (the settings classes, and any name the code reads) is
  documented in docs/operations.md, and every one documented there exists;
- every ``vramd`` command is named in the docs, and docs/cli.md names each command's
  options in that command's section.

Nothing here starts a daemon or a process: the app is built without running its lifespan.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from service import cli
from service.api.ollama import create_ollama_app
from service.app import create_app
from service.errors import PolicyError
from service.policy import load_policy, policy_json_schema
from service.settings import ClientSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
POLICY_DOC = DOCS / "policy.md"
API_DOC = DOCS / "api.md"
OPERATIONS_DOC = DOCS / "operations.md"
CLI_DOC = DOCS / "cli.md"

TOP_LEVEL_KEYS = ("version", "server", "device", "defaults", "services", "maintenance")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

_FENCE = re.compile(r"^```[\w-]*[ \t]*\n.*?^```[ \t]*$", re.DOTALL | re.MULTILINE)
_YAML_BLOCK = re.compile(r"^```ya?ml[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_PATH_PARAM = re.compile(r"\{[^}]*\}")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """Markdown without its fenced code blocks (inline code spans are kept)."""
    return _FENCE.sub("", text)


def table_keys(text: str) -> list[str]:
    """The code span that starts each table row: ``| `server.host` | ...`` → server.host."""
    keys = []
    for line in prose(text).splitlines():
        match = re.match(r"^\|\s*`([^`]+)`", line)
        if match:
            keys.append(match.group(1))
    return keys


# --------------------------------------------------------------------------- policy keys


def schema_key_paths(schema: dict[str, Any]) -> set[str]:
    """Every property of the schema as a dotted path.

    ``$ref`` is followed into ``$defs``, ``anyOf``/``oneOf``/``allOf`` branches keep the
    path, a mapping's values add ``.<name>`` and a list's items add ``[]``:
    ``services.<name>.queue.max``, ``maintenance.windows[].cron``.
    """
    defs = schema.get("$defs", {})
    paths: set[str] = set()

    def walk(node: Any, prefix: str, seen: frozenset[str]) -> None:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name not in seen:
                walk(defs[name], prefix, seen | {name})
        for combinator in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(combinator, ()):
                walk(branch, prefix, seen)
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            walk(sub, path, seen)
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            walk(values, f"{prefix}.<name>", seen)
        items = node.get("items")
        if isinstance(items, dict):
            walk(items, f"{prefix}[]", seen)

    walk(schema, "", frozenset())
    return paths


def test_the_schema_walk_reaches_nested_keys() -> None:
    paths = schema_key_paths(policy_json_schema())
    # Through $ref, additionalProperties, items and anyOf (Size is int | str, cap is nullable).
    assert {
        "version",
        "server.max_json_body",
        "defaults.queue.timeout",
        "services.<name>.memory.cap",
        "services.<name>.restart.max_backoff",
        "maintenance.windows[].allow",
    } <= paths


def test_every_policy_key_is_documented() -> None:
    text = read(POLICY_DOC)
    missing = sorted(
        path for path in schema_key_paths(policy_json_schema()) if f"`{path}`" not in text
    )
    assert not missing, (
        "policy keys missing from docs/policy.md (add a table row whose first cell is the "
        f"key's full path in backticks): {missing}"
    )


def test_every_key_in_the_policy_tables_exists() -> None:
    real = schema_key_paths(policy_json_schema())
    listed = [
        key
        for key in table_keys(read(POLICY_DOC))
        if re.fullmatch(r"[a-z_]+(?:\.<name>|\[\]|\.[a-z_]+)*", key)
        and key.split(".")[0].split("[")[0] in TOP_LEVEL_KEYS
    ]
    assert len(listed) > 40, "docs/policy.md should list the keys in tables"
    stale = sorted(set(listed) - real)
    assert not stale, f"docs/policy.md documents keys the schema does not have: {stale}"


# ---------------------------------------------------------------------- example policies


def example_policies() -> list[tuple[str, str]]:
    examples = []
    for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for number, match in enumerate(_YAML_BLOCK.finditer(read(path)), start=1):
            block = match.group(1)
            if block.lstrip().startswith("version: 1"):
                examples.append((f"{path.relative_to(ROOT)} yaml block {number}", block))
    return examples


EXAMPLES = example_policies()


def test_the_docs_have_complete_example_policies() -> None:
    in_policy_doc = [name for name, _ in EXAMPLES if name.startswith("docs/policy.md")]
    assert len(in_policy_doc) >= 3


@pytest.mark.parametrize(("where", "text"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_policy_validates(where: str, text: str) -> None:
    try:
        load_policy(text)
    except PolicyError as exc:
        pytest.fail(f"{where} is not a valid policy:\n{exc}")


# -------------------------------------------------------------------------------- routes


def normalise(path: str) -> str:
    """``/api/incidents/{incident_id}`` and ``/api/incidents/{id}`` → ``/api/incidents/{}``."""
    return _PATH_PARAM.sub("{}", path.split("?", 1)[0])


def walk_routes(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for route in routes:
        # FastAPI 0.16x keeps included routers as one lazy entry each.
        candidates = getattr(route, "effective_candidates", None)
        if callable(candidates):
            yield from walk_routes(candidates(), prefix)
            continue
        path = getattr(route, "path", None)
        if path is None:
            continue
        sub_routes = getattr(route, "routes", None)
        if route.__class__.__name__ == "Mount":
            if sub_routes:
                yield from walk_routes(sub_routes, prefix + path)
            else:  # a mounted ASGI app (static files, an exporter): documented as GET
                yield "GET", prefix + path
            continue
        for method in sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"}):
            yield method, prefix + path


def app_routes() -> set[tuple[str, str]]:
    """The routes of the app and of its Ollama listener (``server.ollama``)."""
    app = create_app(Settings(config=ROOT / "config" / "demo.yaml"))
    framework = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    routes = [*walk_routes(app.routes), *walk_routes(create_ollama_app(app).routes)]
    return {(method, normalise(path)) for method, path in routes if path not in framework}


def documented_routes() -> set[tuple[str, str]]:
    found = set()
    for span in _CODE_SPAN.findall(prose(read(API_DOC))):
        match = re.fullmatch(rf"({'|'.join(HTTP_METHODS)}) (/\S*)", span.strip())
        if match:
            found.add((match.group(1), normalise(match.group(2))))
    return found


def test_every_route_of_the_app_is_documented() -> None:
    routes = app_routes()
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/api/status") in routes
    missing = sorted(routes - documented_routes())
    assert not missing, f"routes missing from docs/api.md (write them as `METHOD /path`): {missing}"


def test_every_documented_route_exists() -> None:
    routes = app_routes()
    unknown = sorted(documented_routes() - routes)
    assert not unknown, f"docs/api.md names routes the app does not have: {unknown}"


# ------------------------------------------------------------------------------ settings


def settings_variables() -> set[str]:
    names = set()
    for cls in (Settings, ClientSettings):
        prefix = str(cls.model_config.get("env_prefix", ""))
        names |= {f"{prefix}{field}".upper() for field in cls.model_fields}
    return names


def variables_in_code() -> set[str]:
    """``VRAMD_*`` names the code mentions, including ones read outside the settings."""
    names: set[str] = set()
    for path in (ROOT / "service").rglob("*.py"):
        names |= set(re.findall(r"\bVRAMD_[A-Z][A-Z0-9_]*\b", read(path)))
    return names


def test_every_setting_is_documented() -> None:
    text = read(OPERATIONS_DOC)
    wanted = settings_variables() | variables_in_code()
    assert {"VRAMD_CONFIG", "VRAMD_URL", "VRAMD_CREEP_MIN_REQUESTS"} <= wanted
    missing = sorted(name for name in wanted if f"`{name}`" not in text)
    assert not missing, f"settings missing from docs/operations.md: {missing}"


def test_every_documented_setting_exists() -> None:
    listed = {key for key in table_keys(read(OPERATIONS_DOC)) if key.startswith("VRAMD_")}
    stale = sorted(listed - settings_variables() - variables_in_code())
    assert not stale, f"docs/operations.md documents settings that do not exist: {stale}"


# ----------------------------------------------------------------------------------- CLI


def cli_commands() -> list[tuple[str, Any]]:
    """``("vramd windows add", command)`` for every command and group of the CLI."""
    found: list[tuple[str, Any]] = []

    def walk(group: Any, prefix: str) -> None:
        for name, command in sorted(group.commands.items()):
            path = f"{prefix} {name}"
            found.append((path, command))
            if hasattr(command, "commands"):
                walk(command, path)

    walk(typer.main.get_command(cli.app), "vramd")
    return found


def options_of(command: Any) -> list[str]:
    return [
        opt
        for param in command.params
        if getattr(param, "param_type_name", None) == "option"
        for opt in param.opts
        if opt != "--help"
    ]


def cli_sections() -> dict[str, str]:
    """docs/cli.md's ``### `vramd windows add NAME` `` sections by command path."""
    sections: dict[str, str] = {}
    parts = re.split(r"^### ", read(CLI_DOC), flags=re.MULTILINE)
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        span = _CODE_SPAN.search(heading)
        if span is None:
            continue
        words = []
        for word in span.group(1).split():
            if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
                break  # NAME, PATH, [ID], --options: arguments, not the command
            words.append(word)
        sections[" ".join(words)] = body
    return sections


def test_every_cli_command_is_documented() -> None:
    commands = cli_commands()
    assert {"vramd serve", "vramd ps", "vramd windows add", "vramd db upgrade"} <= {
        path for path, _ in commands
    }
    docs = "\n".join(read(path) for path in (CLI_DOC, OPERATIONS_DOC, API_DOC))
    missing = [path for path, _ in commands if not re.search(re.escape(path) + r"(?![\w-])", docs)]
    assert not missing, f"commands missing from the docs: {missing}"


def test_every_cli_option_is_documented_in_its_section() -> None:
    sections = cli_sections()
    problems = []
    for path, command in cli_commands():
        options = options_of(command)
        is_group = hasattr(command, "commands")
        if is_group and not options:
            continue  # a bare group (vramd db, vramd import): its commands have sections
        section = sections.get(path)
        if section is None:
            problems.append(f"{path}: no '### `{path} ...`' section in docs/cli.md")
            continue
        problems += [f"{path}: {opt}" for opt in options if f"`{opt}`" not in section]
    assert not problems, f"docs/cli.md does not document: {problems}"


def make_targets(prefix: str) -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(rf"^({prefix}[\w-]*):", text, re.M))


def test_the_readme_lists_every_benchmark_target_once_and_no_other_doc_lists_them() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Benchmarks") :]
    table = table[: table.index("\n## ")]
    rows = re.findall(r"^\| `make ([\w-]+)` \|", table, re.M)
    assert sorted(rows) == sorted(make_targets("bench")), "README's benchmark table"
    lists = [  # a section may show its own target; two in a row make a second list
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "docs").glob("*.md"))
        for number, (line, after) in enumerate(itertools.pairwise(path.read_text().splitlines()), 1)
        if line.startswith("make bench") and after.startswith("make bench")
    ]
    assert lists == [], "the README's table is the one list of benchmark targets"


def test_every_field_of_a_services_answer_is_documented() -> None:
    """``GET /api/services`` (what ``vramd ps`` and the dashboard read): every field of
    ``ServiceStatus`` is in docs/api.md's example or its table."""
    from service.contract import ServiceStatus

    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("### `GET /api/services`") :]
    section = section[: section.index("\n### ", 1)]
    named = set(re.findall(r'"(\w+)":', section)) | set(re.findall(r"`(\w+)`", section))
    assert set(ServiceStatus.model_fields) - named == set()


def test_openapi_carries_the_schemas_of_the_admin_answers(tmp_path: Path) -> None:
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(config=ROOT / "config" / "demo.yaml", db=tmp_path / "v.db"))
    schemas = app.openapi()["components"]["schemas"]
    answers = {"StatusAnswer", "ServiceStatus", "EventRecord", "WindowList", "ApplyAnswer"}
    assert answers <= set(schemas)
    ok = app.openapi()["paths"]["/api/services/{name}"]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ServiceStatus"
    }
