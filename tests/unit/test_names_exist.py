"""Prose names only what exists: every module, attribute and file a docstring or a doc
names by its path is there (so a rename cannot leave the prose behind)."""

import ast
import importlib
import re
from pathlib import Path

import pytest

from service.policy.schema import MemoryConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
TOP = ("service", "bench", "tests", "docs", "config", "deploy", "migrations")
# Files a user makes, or a run writes, that the docs name on purpose.
NOT_IN_THE_REPOSITORY = {"config/vramd.yaml"}
PACKAGES = {p.name for p in (ROOT / "service").iterdir() if (p / "__init__.py").exists()}
# service.x.y or service.x.y.name, in backquotes or not
DOTTED = re.compile(r"\bservice(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# memory.diagnosis, kernel.views.status_view: a service package's module, in backquotes
RELATIVE = re.compile(r"``?([a-z_]+(?:\.[A-Za-z_][A-Za-z0-9_]*)+)``?")
# a file path inside the repository, e.g. service/kernel/views.py, docs/api.md
PATH = re.compile(r"(?<![\w./$-])((?:[\w-]+/)+[\w.-]+\.(?:py|md|yaml|yml|toml|json|jsonl|sh))\b")
LINK = re.compile(r"\[[^\]]*\]\(https?://[^)]*\)")


def docstrings() -> list[tuple[str, str]]:
    found = []
    for path in sorted([*(ROOT / "service").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    found.append((str(path.relative_to(ROOT)), doc))
    return found


def prose() -> list[tuple[str, str]]:
    docs = ((str(p.relative_to(ROOT)), LINK.sub("", p.read_text())) for p in DOCS)
    return [*docstrings(), *docs]


def resolves(dotted: str) -> bool:
    parts = dotted.rstrip(".").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def exists(path: str) -> bool:
    if path in NOT_IN_THE_REPOSITORY or path.startswith("bench/out/"):
        return True
    if path.split("/", 1)[0] in TOP:
        return (ROOT / path).exists()
    if path.split("/", 1)[0] in PACKAGES:  # docs name service's modules relative to it
        return (ROOT / "service" / path).exists()
    return True  # not a path in the repository (``24gib/home-box.yaml`` names a case)


def test_every_dotted_service_name_in_prose_exists() -> None:
    names = {(where, name) for where, text in prose() for name in DOTTED.findall(text)}
    placeholders = {(where, name) for where, name in names if name.split(".")[-1].isupper()}
    missing = sorted(f"{w}: {n}" for w, n in names - placeholders if not resolves(n))
    assert missing == []


def test_every_module_a_docstring_names_by_its_package_exists() -> None:
    # ``memory.cap`` in prose is the policy key, not a module of service.memory
    keys = {f"memory.{key}" for key in MemoryConfig.model_fields}
    names = {(where, name) for where, text in docstrings() for name in RELATIVE.findall(text)}
    ours = {(w, n) for w, n in names if n.split(".")[0] in PACKAGES and n not in keys}
    missing = sorted(f"{w}: {n}" for w, n in ours if not resolves(f"service.{n}"))
    assert missing == []


def test_every_file_path_in_prose_exists() -> None:
    paths = {(where, path) for where, text in prose() for path in PATH.findall(text)}
    patterns = {(w, p) for w, p in paths if "<" in p or "*" in p}
    missing = sorted(f"{w}: {p}" for w, p in paths - patterns if not exists(p))
    assert missing == []


@pytest.mark.parametrize("name", ["service.kernel.views", "service.errors.ErrorCode"])
def test_a_name_that_exists_resolves(name: str) -> None:
    assert resolves(name)


def test_a_name_that_does_not_exist_is_caught() -> None:
    assert not resolves("service.memory.diagnostics")
    assert not exists("docs/style.md")
    assert not exists("kernel/diagnostics.py")
