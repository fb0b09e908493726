"""llama-swap's ``${name}`` macros: global and per-model definitions, expanded in order.

``${PORT}`` is left for vramd (it has the same placeholder); ``${MODEL_ID}`` becomes the
model's id; ``${env.NAME}`` is read from the environment at import time, and a missing
variable leaves ``UNSET-NAME`` and a TODO comment rather than failing the import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from service.importers import ImportFailed

_MACRO_RE = re.compile(r"\$\{([^}]*)\}")


class Macros:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def define(
        self, raw: Any, inherited: Mapping[str, str], where: str, notes: list[str]
    ) -> dict[str, str]:
        """Macro values in order; each may use those defined before it."""
        macros = dict(inherited)
        if not isinstance(raw, dict):
            return macros
        for name, value in raw.items():
            text = json.dumps(value) if isinstance(value, bool) else str(value).strip()
            macros[str(name)] = self.expand(text, macros, None, f"{where}.{name}", notes)
        return macros

    def expand(
        self,
        text: str,
        macros: Mapping[str, str],
        model_id: str | None,
        where: str,
        notes: list[str],
    ) -> str:
        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "PORT" or (name == "MODEL_ID" and model_id is None):
                return match.group(0)  # ${PORT} is vramd's too; MODEL_ID waits for a model
            if name == "MODEL_ID":
                return str(model_id)
            if name.startswith("env."):
                return self._env(name[4:], where, notes)
            if name in macros:
                return macros[name]
            raise ImportFailed(f"{where} uses ${{{name}}}, which no macro defines")

        for _ in range(5):  # a macro's value may hold ${MODEL_ID}, resolved on the next pass
            expanded = _MACRO_RE.sub(substitute, text)
            if expanded == text:
                break
            text = expanded
        return text

    def _env(self, variable: str, where: str, notes: list[str]) -> str:
        if variable in self.environ:
            note = f"llama-swap: {where} uses ${{env.{variable}}}, expanded at import time"
            if note not in notes:
                notes.append(note)
            return self.environ[variable]
        notes.append(f"TODO {where}: ${{env.{variable}}} is not set here; replace UNSET-{variable}")
        return f"UNSET-{variable}"
