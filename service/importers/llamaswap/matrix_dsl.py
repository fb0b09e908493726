"""llama-swap's matrix set expressions, expanded to the model combinations they allow.

A set is written ``"(g | q) & v"``: ``&`` runs models together, ``|`` offers
alternatives, parentheses group, ``+name`` inlines another set, and ``&`` binds tighter
than ``|``. Identifiers are matrix ``vars`` or model ids. The importer only needs the
expansion, ``[{g, v}, {q, v}]``, to say in a comment which models llama-swap lets run
side by side; vramd itself has no such constraint (it runs whatever fits).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Combination = frozenset[str]

_TOKEN_RE = re.compile(r"\s*(?:(?P<op>[&|()])|\+(?P<ref>[\w.-]+)|(?P<ident>[\w.-]+))")


class DslError(ValueError):
    """A set expression llama-swap would refuse too."""


def expand_sets(
    sets: Mapping[str, str], resolve: Callable[[str], str | None]
) -> dict[str, list[Combination]]:
    """Each set's combinations of model ids, in definition order; ``DslError`` if unreadable.

    ``resolve`` turns an identifier (a var or a model id) into a model id, or None.
    """
    done: dict[str, list[Combination]] = {}

    def expand(name: str, stack: tuple[str, ...]) -> list[Combination]:
        if name in done:
            return done[name]
        if name in stack:
            raise DslError(f"set {name} refers to itself through {' -> '.join(stack)}")
        if name not in sets:
            raise DslError(f"+{name} names no set")
        parser = _Parser(str(sets[name]), resolve, lambda ref: expand(ref, (*stack, name)))
        done[name] = parser.parse()
        return done[name]

    for name in sets:
        expand(name, ())
    return {name: done[name] for name in sets}


class _Parser:
    def __init__(
        self,
        text: str,
        resolve: Callable[[str], str | None],
        inline: Callable[[str], list[Combination]],
    ) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.resolve = resolve
        self.inline = inline

    def parse(self) -> list[Combination]:
        if not self.tokens:
            raise DslError("empty expression")
        result = self._or()
        if self.pos != len(self.tokens):
            raise DslError(f"unexpected {self.tokens[self.pos][1]!r}")
        return _unique(result)

    def _or(self) -> list[Combination]:
        result = self._and()
        while self._take("|"):
            result = result + self._and()
        return result

    def _and(self) -> list[Combination]:
        result = self._atom()
        while self._take("&"):
            right = self._atom()
            result = [left | other for left in result for other in right]
        return result

    def _atom(self) -> list[Combination]:
        if self.pos >= len(self.tokens):
            raise DslError("the expression ends too early")
        kind, value = self.tokens[self.pos]
        self.pos += 1
        if kind == "ident":
            model = self.resolve(value)
            if model is None:
                raise DslError(f"{value} is neither a var nor a model id")
            return [frozenset({model})]
        if kind == "ref":
            return self.inline(value)
        if value == "(":
            inner = self._or()
            if not self._take(")"):
                raise DslError("a ( is not closed")
            return inner
        raise DslError(f"unexpected {value!r}")

    def _take(self, op: str) -> bool:
        if self.pos < len(self.tokens) and self.tokens[self.pos] == ("op", op):
            self.pos += 1
            return True
        return False


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        match = _TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            raise DslError(f"unexpected {text[pos:].strip()[:1]!r} at position {pos}")
        kind = match.lastgroup or "op"
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def _unique(combinations: list[Combination]) -> list[Combination]:
    seen: list[Combination] = []
    for combination in combinations:
        if combination not in seen:
            seen.append(combination)
    return seen
