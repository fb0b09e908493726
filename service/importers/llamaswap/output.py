"""The policy text the llama-swap importer writes: one service block, and the whole file.

Policy YAML is written by hand rather than dumped, because every decision carries a
comment next to the line it is about (``service.importers`` explains why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from service.importers import comment, flow_list, scalar

ESTIMATE = "4GiB"
ESTIMATE_NOTE = "TODO: set from the model size; vramd learns the real peak"
HEADER = (
    "# Review it before use, then check it with `vramd check FILE`:",
    "# - memory.estimate is a placeholder (llama-swap has no memory figures); vramd",
    "#   uses it until it has measured a service, then learns the real peak.",
    "# - kind is guessed from each command (or llama-swap's capabilities): chat unless",
    "#   it says otherwise.",
    "# - llama-swap runs one model at a time unless its routing says otherwise; vramd",
    "#   runs what fits in the device budget and evicts by residency and priority.",
)


@dataclass
class ServiceOut:
    name: str
    notes: list[str] = field(default_factory=list)
    # key -> (value, trailing comment), in the order they are written
    fields: dict[str, tuple[Any, str | None]] = field(default_factory=dict)

    def set(self, key: str, value: Any, note: str | None = None) -> None:
        self.fields[key] = (value, note)

    def lines(self) -> list[str]:
        out = [f"  {self.name}:", *(f"    # {comment(note)}" for note in self.notes)]
        for key, (value, note) in self.fields.items():
            out += _field(key, value, note)
        return out


def render(
    source: str,
    *,
    top_notes: list[str],
    server: list[str],
    defaults: list[str],
    routing_notes: list[str],
    services: list[ServiceOut],
) -> str:
    lines = [
        f"# vramd policy converted from llama-swap {comment(source)} by `vramd import llama-swap`.",
        *HEADER,
        "version: 1",
        *(f"# {comment(note)}" for note in top_notes),
        *server,
        "device:",
        "  backend: auto   # nvml when a GPU answers, else the host's memory",
        "  headroom: 1GiB  # never handed out: load-time spikes live here",
        *defaults,
        *(f"# {comment(note)}" for note in routing_notes),
        "services:" if services else "services: {}",
    ]
    for service in services:
        lines += service.lines()
    return "\n".join(lines) + "\n"


def line(indent: int, key: str, value: Any, note: str | None = None) -> str:
    text = f"{' ' * indent}{key}: {scalar(value)}"
    return f"{text}  # {comment(note)}" if note else text


def _flow(value: Any) -> str:
    """One YAML flow mapping or list on one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def _field(key: str, value: Any, note: str | None) -> list[str]:
    if key in ("models", "command"):
        text = f"    {key}: {flow_list(value, column=6 + len(key))}"
        return [f"{text}  # {comment(note)}" if note else text]
    if key in ("env", "routes"):
        head = f"    {key}:" + (f"  # {comment(note)}" if note else "")
        return [head, *(line(6, k, v) for k, v in value.items())]
    if key == "set_params":  # model name -> its fields, one flow mapping per name
        head = f"    {key}:" + (f"  # {comment(note)}" if note else "")
        flows = (_flow(v) for v in value.values())
        return [head, *(f"      {scalar(k)}: {flow}" for k, flow in zip(value, flows, strict=True))]
    if key == "memory":
        return ["    memory:", line(6, "estimate", value["estimate"], ESTIMATE_NOTE)]
    return [line(4, key, value, note)]
