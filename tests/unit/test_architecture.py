"""The map in docs/architecture.md stays true: layers, package cycles, sizes, the docs.

Read from the source with ``ast`` (no import runs): every ``from service.X ...`` and
``import service.X`` in ``service/``, lazy and ``TYPE_CHECKING`` imports included, since
those are dependencies too. A *part* is a package (``service/kernel/``) or a top-level
module (``service/app.py``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"

# The layer table of docs/architecture.md: a part imports only from its own layer or
# the layers before it.
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("domain", "errors", "units", "clock"),
    1: ("policy", "contract", "settings", "store", "devices", "supervisor", "adapters", "ollama",
        "importers",
        "simgpu", "demo_runtime", "real_runtimes"),
    2: ("scheduler",),
    3: ("live", "replay"),
    4: ("memory", "maintenance", "health", "swapstate"),
    5: ("kernel",),
    6: ("proxy",),
    7: ("api",),
    8: ("app", "server", "handover", "cli", "gpucheck", "ui"),
}  # fmt: skip
LAYER_OF = {part: layer for layer, parts in LAYERS.items() for part in parts}
# The pure scheduler sees values only.
SCHEDULER_MAY_IMPORT = {"domain", "errors", "policy", "units"}
TOP_LEVEL_MODULES_MAX = 8
MODULE_LINES_MAX = 500
FUNCTION_LINES_MAX = 80


def part_of(path: Path) -> str:
    relative = path.relative_to(SERVICE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported_parts(tree: ast.AST) -> set[tuple[str, int]]:
    """The parts of ``service`` a module imports, with the line of each import."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = node.module.split(".")
            if names[0] != "service":
                continue
            if len(names) > 1:
                found.add((names[1], node.lineno))
            else:  # from service import x
                found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[0] == "service" and len(names) > 1:
                    found.add((names[1], node.lineno))
    return found - {("__version__", line) for _, line in found}


def modules() -> list[Path]:
    return sorted(path for path in SERVICE.rglob("*.py") if "__pycache__" not in path.parts)


def edges() -> dict[str, set[tuple[str, str]]]:
    """part -> {(imported part, "file:line")} for imports across parts."""
    graph: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in modules():
        source = part_of(path)
        if source == "__init__":
            continue
        for target, line in imported_parts(ast.parse(path.read_text())):
            if target != source:
                graph[source].add((target, f"{path.relative_to(ROOT)}:{line}"))
    return graph


def parts_on_disk() -> set[str]:
    return {part_of(path) for path in modules()} - {"__init__"}


def test_every_part_of_service_has_a_layer() -> None:
    assert parts_on_disk() - set(LAYER_OF) == set(), "add it to LAYERS and the docs' table"
    assert set(LAYER_OF) - parts_on_disk() == set(), "a layer names a part that is gone"


def test_no_part_imports_from_a_later_layer() -> None:
    wrong = [
        f"{where}: {source} (L{LAYER_OF[source]}) imports {target} (L{LAYER_OF[target]})"
        for source, targets in edges().items()
        for target, where in targets
        if LAYER_OF[target] > LAYER_OF[source]
    ]
    assert wrong == []


def test_the_parts_import_graph_has_no_cycle() -> None:
    graph = {source: {target for target, _ in targets} for source, targets in edges().items()}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in path:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(node)

    done: set[str] = set()
    for node in sorted(graph):
        if node not in done:
            visit(node, [node])
    assert cycles == []


def test_the_scheduler_imports_values_only_and_the_proxy_never_the_kernel() -> None:
    graph = edges()
    assert {target for target, _ in graph["scheduler"]} <= SCHEDULER_MAY_IMPORT
    assert [where for target, where in graph["proxy"] if target == "kernel"] == []


def test_the_top_level_holds_only_the_vocabulary_and_the_composition_root() -> None:
    top = sorted(path.stem for path in SERVICE.glob("*.py") if path.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MODULES_MAX, top


def test_every_package_init_lists_its_modules() -> None:
    missing = []
    for init in sorted(SERVICE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for module in sorted(init.parent.glob("*.py")):
            if module.name != "__init__.py" and not re.search(rf"\b{module.name}\b", doc):
                missing.append(str(module.relative_to(ROOT)))
    assert missing == [], "name each module in its package's __init__ docstring"


def test_every_part_is_on_the_map_in_the_docs() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = {path.parent.name for path in SERVICE.glob("*/__init__.py")}
    unnamed = sorted(name for name in packages if f"{name}/" not in text)
    top = sorted(
        path.name for path in SERVICE.glob("*.py") if path.stem != "__init__"
        if path.name not in text
    )  # fmt: skip
    assert unnamed == [] and top == []


def bench_modules() -> list[Path]:
    return sorted(
        path for path in (ROOT / "bench").rglob("*.py") if "__pycache__" not in path.parts
    )


@pytest.mark.parametrize(
    "path", [*modules(), *bench_modules()], ids=lambda path: str(path.relative_to(ROOT))
)
def test_modules_and_functions_stay_readable_in_one_sitting(path: Path) -> None:
    text = path.read_text()
    assert text.count("\n") <= MODULE_LINES_MAX, f"{path.name}: split it by concept"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > FUNCTION_LINES_MAX
    ]
    assert long == []


def test_code_cites_the_projects_own_docs_never_a_document_outside_it() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [
            *modules(),
            *sorted((ROOT / "bench").rglob("*.py")),
            *sorted((ROOT / "tests").rglob("*.py")),
        ]
        if path.name != "test_architecture.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bDESIGN\b", line)
    ]
    assert outside == []


def module_constants(paths: list[Path]) -> dict[tuple[str, str], list[str]]:
    """(NAME, value as written) -> where, for every module-level UPPER_CASE literal."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id.isupper() and len(target.id) > 1:
                found[(target.id, ast.unparse(value))].append(str(path.relative_to(ROOT)))
    return found


def test_the_simulator_and_the_bench_import_the_daemons_constants_never_copy_them() -> None:
    replay = SERVICE / "replay"
    daemon = module_constants([p for p in modules() if replay not in p.parents])
    copies = module_constants([*sorted(replay.glob("*.py")), *bench_modules()])
    assert {key: where for key, where in copies.items() if key in daemon} == {}


MODULE_DOCSTRINGS_MAX_LINES = 1300


def test_module_docstrings_stay_short_the_story_lives_in_the_docs() -> None:
    lines = sum(
        len((ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").splitlines())
        for path in modules()
    )
    assert lines <= MODULE_DOCSTRINGS_MAX_LINES, "tell it in docs/architecture.md"


UNTYPED_DICTS_MAX = 80  # dict[str, Any] in service/: JSON whose shape is truly open


def test_untyped_dicts_stay_few_contracts_are_typed() -> None:
    count = sum(path.read_text().count("dict[str, Any]") for path in modules())
    assert count <= UNTYPED_DICTS_MAX, "type it: a model in service/contract, or dict[str, object]"


# Each part of a service's live record (service/live/runtimes.py) and the one module that
# writes it; app.py seeds counters and learned figures from SQLite before anything runs.
PART_WRITERS = {
    "placement": {"kernel/effects.py"},
    "measured": {"memory/sampling.py"},
    "health": {"memory/doctor.py"},
}
SEEDER = "app.py"
MUTATORS = {"add", "discard", "clear", "update", "pop", "append", "extend", "setdefault"}


def part_written(node: ast.AST) -> str | None:
    """``placement`` for ``x.placement.f = ...``, ``x.placement.f += ...``,
    ``x.placement.f[k] = ...`` and ``x.placement.f.add(...)``; else None."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MUTATORS
    ):
        targets = [node.func.value]
    for target in targets:
        while isinstance(target, ast.Subscript):
            target = target.value
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Attribute)
            and target.value.attr in PART_WRITERS
        ):
            return target.value.attr
    return None


def test_each_part_of_a_services_live_record_has_one_writer() -> None:
    wrong = []
    for path in modules():
        where = str(path.relative_to(SERVICE))
        for node in ast.walk(ast.parse(path.read_text())):
            part = part_written(node)
            if part is not None and where not in PART_WRITERS[part] | {SEEDER}:
                wrong.append(f"{where}:{node.lineno} writes {part}")
    assert wrong == []


def test_the_writer_check_sees_every_kind_of_write() -> None:
    code = "rt.placement.device = 1\nrt.health.flags.add('x')\nrt.measured.device_bytes[0] = 1"
    found = [part_written(node) for node in ast.walk(ast.parse(code))]
    assert {"placement", "health", "measured"} <= set(found)


WALL_CLOCK = re.compile(r"monotonic\(\) - |perf_counter\(\) - |\btook\b|\belapsed\b")


def test_every_wall_clock_assertion_is_marked_timing() -> None:
    """A test that asserts how long something took is run alone (marker ``timing``):
    a machine busy with other tests would make it fail for no fault of the code."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        module_marked = re.search(r"pytestmark\s*=.*timing", text) is not None
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            marked = module_marked or any("timing" in ast.unparse(d) for d in node.decorator_list)
            for check in ast.walk(node):
                if isinstance(check, ast.Assert) and not marked:
                    test = ast.unparse(check.test)
                    if WALL_CLOCK.search(test) and "<" in test:
                        unmarked.append(f"{path.relative_to(ROOT)}:{check.lineno}")
    assert unmarked == []


def test_the_orchestrator_tells_the_effects_it_never_writes_into_them() -> None:
    tree = ast.parse((SERVICE / "kernel" / "orchestrator.py").read_text())
    writes = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if "_effects." in ast.unparse(target)
    ]
    assert writes == []
