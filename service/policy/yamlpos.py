"""YAML to plain Python, remembering where every key and value stood in the text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from service.errors import PolicyIssue

PathKey = tuple[str | int, ...]
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class Positions:
    values: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    keys: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def of_value(self, path: PathKey) -> tuple[int, int] | None:
        """Position of the value at ``path``, or of its nearest existing ancestor."""
        return self._nearest(self.values, path)

    def of_key(self, path: PathKey) -> tuple[int, int] | None:
        """Position of the key at ``path`` (falls back to the value, then an ancestor)."""
        return self.keys.get(path) or self._nearest(self.values, path)

    def alias(self, target: PathKey, source: PathKey) -> None:
        """Make everything under ``target`` point at where ``source`` was written.

        Used when a value is copied from ``defaults`` into a service: an error in the
        copy is then reported at the line the operator actually wrote.
        """
        n = len(source)
        for table in (self.values, self.keys):
            for path, pos in list(table.items()):
                if path[:n] == source:
                    table.setdefault(target + path[n:], pos)

    @staticmethod
    def _nearest(table: dict[PathKey, tuple[int, int]], path: PathKey) -> tuple[int, int] | None:
        for end in range(len(path), -1, -1):
            pos = table.get(path[:end])
            if pos is not None:
                return pos
        return None


def format_path(path: PathKey) -> str:
    """``("maintenance", "windows", 0, "cron")`` -> ``maintenance.windows[0].cron``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


class YamlSyntaxError(Exception):
    def __init__(self, issue: PolicyIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


def load_with_positions(text: str) -> tuple[Any, Positions, list[PolicyIssue]]:
    """Parse ``text``; return (data, positions, issues found while parsing).

    Raises ``YamlSyntaxError`` when the text is not YAML at all.

    Policy errors must name the YAML line and column of the offending key (docs/policy.md,
    "Error messages"), but PyYAML's ``safe_load`` throws positions away. This module composes
    the node tree itself and returns the data together with a ``Positions`` map from key paths
    such as ``("services", "chat", "memory", "cap")`` to 1-based ``(line, col)`` of the value
    and of the key. Duplicate keys, which ``safe_load`` silently collapses, are reported as
    errors.
    """
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # e.g. a control character: the reader refuses the text
        raise YamlSyntaxError(PolicyIssue("", f"invalid YAML: {exc}")) from exc
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = exc.problem or exc.context or "invalid YAML"
        raise YamlSyntaxError(PolicyIssue("", f"invalid YAML: {problem}", line, col)) from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(PolicyIssue("", f"invalid YAML: {exc}")) from exc
    except RecursionError:
        raise YamlSyntaxError(
            PolicyIssue("", f"the YAML nests deeper than {MAX_DEPTH} levels or refers to itself")
        ) from None
    finally:
        loader.dispose()
    positions = Positions()
    issues: list[PolicyIssue] = []
    if node is None:
        return None, positions, issues
    try:
        data = _convert(loader, node, (), positions, issues, {})
    except RecursionError:
        raise YamlSyntaxError(
            PolicyIssue("", f"the YAML nests deeper than {MAX_DEPTH} levels or refers to itself")
        ) from None
    return data, positions, issues


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


MAX_DEPTH = 64  # a policy is a few levels deep; more is a mistake or an alias loop


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: PathKey) -> Any:
    """A scalar's value; one YAML can parse but not build (``!!int x``) is an issue."""
    try:
        return loader.construct_object(node, deep=True)
    except (
        yaml.YAMLError,
        ValueError,
        TypeError,
        AttributeError,
        OverflowError,
        LookupError,  # an empty !!int / !!bool: PyYAML indexes '' or looks it up
    ) as exc:
        line, col = _mark(node)
        detail = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntaxError(
            PolicyIssue(format_path(path), f"invalid YAML value: {detail}", line, col)
        ) from None


def _convert(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: PathKey,
    positions: Positions,
    issues: list[PolicyIssue],
    first_own: dict[int, int],
) -> Any:
    if len(path) > MAX_DEPTH:
        raise RecursionError
    positions.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        # flatten_mapping resolves merge keys (<<: *anchor) in place, putting the merged
        # pairs first; the mapping's own keys follow and override them, which is no
        # duplicate. ``first_own`` remembers where they start for a node seen again
        # through an alias, when it is already flattened.
        if id(node) not in first_own:
            own = sum(1 for key_node, _ in node.value if key_node.tag != _MERGE_TAG)
            try:
                loader.flatten_mapping(node)
            except yaml.YAMLError as exc:  # a merge key (<<) of something not a mapping
                line, col = _mark(node)
                raise YamlSyntaxError(
                    PolicyIssue(format_path(path), f"invalid YAML: {exc}", line, col)
                ) from None
            first_own[id(node)] = len(node.value) - own
        result: dict[Any, Any] = {}
        own_keys: set[Any] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = _construct(loader, key_node, path)
            if not isinstance(key, str | int) or isinstance(key, bool):
                line, col = _mark(key_node)
                issues.append(
                    PolicyIssue(format_path(path), f"keys must be strings, got {key!r}", line, col)
                )
                continue
            child = (*path, key)
            if index >= first_own[id(node)]:
                if key in own_keys:
                    line, col = _mark(key_node)
                    issues.append(PolicyIssue(format_path(child), "duplicate key", line, col))
                own_keys.add(key)
            positions.keys[child] = _mark(key_node)
            result[key] = _convert(loader, value_node, child, positions, issues, first_own)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _convert(loader, item, (*path, i), positions, issues, first_own)
            for i, item in enumerate(node.value)
        ]
    return _construct(loader, node, path)
