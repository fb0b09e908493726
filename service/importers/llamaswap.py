"""llama-swap's ``config.yaml`` as a vramd policy (``vramd import llama-swap PATH``).

How the settings carry over (anything else becomes a ``# llama-swap: ...`` comment that
says why it has no equivalent):

| llama-swap | vramd |
|---|---|
| ``models.<id>`` | service ``slug(id)`` serving model ``<id>`` |
| ``cmd`` (macros, comment lines, ``\\`` continuations) | ``command`` argv; ``${PORT}`` kept |
| ``proxy`` with a fixed port | that port in ``cmd`` becomes ``${PORT}`` |
| ``aliases`` | more ``models`` names |
| ``env: ["K=V"]`` | ``env: {K: V}`` |
| ``checkEndpoint`` | ``health`` |
| ``ttl`` / ``globalTTL`` (seconds, 0 = never) | ``idle_ttl`` / ``defaults.idle_ttl`` |
| ``useModelName`` | ``upstream_model`` |
| ``concurrencyLimit`` | ``max_concurrency`` |
| ``healthCheckTimeout`` | ``defaults.startup_timeout`` |
| ``apiKeys`` | ``server.api_keys`` |
| no group, or a ``swap: true`` group | ``on-demand``, priority 100 |
| ``swap: false`` group | ``warm``, priority 200 |
| ``persistent: true`` group | ``pinned`` (``on-demand`` at 300 if it also swaps) |
| ``hooks.on_startup.preload`` | ``preload: true`` (an on-demand service becomes warm) |

llama-swap knows nothing of memory, so each service gets a placeholder
``memory.estimate`` marked TODO, and a ``kind`` guessed from its command.

Why one module of more than 500 lines: the mapping above is one table read top to
bottom, and each row's code sits next to the comment it leaves in the output; split by
row, a reader would follow one llama-swap key through several files to see what became
of it. Its helpers (command-line parsing, slugs, YAML output) are private to it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from service.errors import PolicyError
from service.importers import ImportFailed, comment, flow_list, scalar
from service.policy import load_policy
from service.units import format_duration

ESTIMATE = "4GiB"
ESTIMATE_NOTE = "TODO: set from the model size; vramd learns the real peak"
PRIORITY_SWAP, PRIORITY_TOGETHER, PRIORITY_PERSISTENT = 100, 200, 300

TOP_LEVEL_NOTES = {
    "logLevel": "set VRAMD_LOG_LEVEL for vramd serve",
    "logTimeFormat": "vramd's log format is fixed",
    "logToStdout": "vramd keeps each runtime's output: GET /api/services/NAME/logs",
    "metricsMaxInMemory": "vramd keeps events and samples in SQLite",
    "captureBuffer": "vramd does not capture request bodies",
    "sendLoadingState": "vramd marks cold starts with the X-Vramd-Cold-Start header",
    "includeAliasesInList": "vramd lists every model name in /v1/models",
    "startPort": "vramd gives each instance a free loopback port as ${PORT}",
    "peers": "vramd runs local runtimes only",
    "matrix": "vramd runs whatever fits in the device budget; residency and priority "
    "decide what is evicted",
}
MODEL_NOTES = {
    "cmdStop": "vramd stops the process group: SIGTERM, then SIGKILL after stop_timeout",
    "name": "vramd lists model names only",
    "description": "vramd lists model names only",
    "metadata": "vramd lists model names only",
    "filters": "vramd forwards request bodies unchanged",
    "sendLoadingState": "vramd marks cold starts with the X-Vramd-Cold-Start header",
    "timeouts": "vramd has startup_timeout and queue.timeout",
    "unlisted": "vramd lists every model name in /v1/models",
}
MODEL_KEYS = {
    "cmd",
    "proxy",
    "aliases",
    "env",
    "checkEndpoint",
    "ttl",
    "useModelName",
    "concurrencyLimit",
    "macros",
} | set(MODEL_NOTES)
TOP_LEVEL_KEYS = {
    "healthCheckTimeout",
    "globalTTL",
    "macros",
    "apiKeys",
    "models",
    "groups",
    "hooks",
} | set(TOP_LEVEL_NOTES)

_MACRO_RE = re.compile(r"\$\{([^}]*)\}")
_PROXY_RE = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[^\]]*\]|[^:/]+)(?::(?P<port>[^/]+))?(?P<path>/.*)?$"
)
_LOOPBACK = {"localhost", "127.0.0.1", "[::1]", "0.0.0.0"}


@dataclass
class Placement:
    residency: str
    priority: int
    why: str


@dataclass
class ServiceOut:
    name: str
    notes: list[str] = field(default_factory=list)
    # key -> (value, trailing comment), in the order they are written
    fields: dict[str, tuple[Any, str | None]] = field(default_factory=dict)

    def set(self, key: str, value: Any, note: str | None = None) -> None:
        self.fields[key] = (value, note)


def convert(
    text: str, *, source: str = "config.yaml", environ: Mapping[str, str] | None = None
) -> str:
    """The policy YAML for a llama-swap config; ``ImportFailed`` if it cannot be read.

    ``environ`` resolves llama-swap's ``${env.NAME}`` macros (default: this process's).
    """
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ImportFailed(f"not valid YAML: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("models"), dict):
        raise ImportFailed("not a llama-swap config: it has no 'models:' mapping")
    converter = _Converter(config, os.environ if environ is None else environ)
    output = converter.render(source)
    try:
        load_policy(output)
    except PolicyError as exc:  # a bug here, not in the input: say so plainly
        problems = "; ".join(str(issue) for issue in exc.issues)
        raise ImportFailed(f"the converted policy does not validate: {problems}") from None
    return output


def no_equivalent(key: str, value: Any, why: str) -> str:
    return f"llama-swap: {key}: {_show(value)} has no vramd equivalent ({why})"


def _show(value: Any, limit: int = 60) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict | list):
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    else:
        text = json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slug(model_id: str) -> str:
    """A service name (``[a-z0-9][a-z0-9_.-]{0,62}``) for a llama-swap model id."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", model_id.lower())
    name = re.sub(r"-{2,}", "-", name).lstrip("_.-")[:63].rstrip("-")
    return name or "model"


def guess_kind(argv: list[str]) -> tuple[str, str | None]:
    """What a runtime serves, from its command line; the reason when not plain chat."""
    program = os.path.basename(argv[0]).lower() if argv else ""
    flags = {arg.split("=")[0].lower() for arg in argv}
    if flags & {"--embedding", "--embeddings"}:
        return "embedding", "guessed from --embedding"
    if flags & {"--reranking", "--rerank"}:
        return "rerank", "guessed from --reranking"
    for word in ("whisper", "kokoro", "piper", "tts"):
        if word in program:
            return "speech", f"guessed from {program}"
    if program in ("sd", "sd-server") or "stable-diffusion" in program:
        return "diffusion", f"guessed from {program}"
    return "chat", None


def split_command(cmd: str) -> list[str]:
    """llama-swap's reading of ``cmd``: drop ``#`` lines, join ``\\`` continuations, split."""
    lines = []
    for line in cmd.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        lines.append(stripped[:-1] + " " if stripped.endswith("\\") else line)
    try:
        return shlex.split("\n".join(lines))
    except ValueError as exc:
        raise ImportFailed(f"cannot split the command {cmd.strip()!r}: {exc}") from None


def seconds(value: float) -> int | str:
    return 0 if value == 0 else format_duration(value)


class _Converter:
    def __init__(self, config: dict[str, Any], environ: Mapping[str, str]) -> None:
        self.config = config
        self.environ = environ
        self.top_notes: list[str] = []
        self.group_notes: list[str] = []
        self.used_names: set[str] = set()
        self.used_models: dict[str, str] = {}
        self.macros = self._macros(config.get("macros"), {}, "macros", self.top_notes)
        self.placements = self._placements()

    # ----------------------------------------------------------- macros

    def _macros(
        self, raw: Any, inherited: dict[str, str], where: str, notes: list[str]
    ) -> dict[str, str]:
        """Macro values in order; each may use those defined before it."""
        macros = dict(inherited)
        if not isinstance(raw, dict):
            return macros
        for name, value in raw.items():
            text = json.dumps(value) if isinstance(value, bool) else str(value).strip()
            macros[str(name)] = self._expand(text, macros, None, f"{where}.{name}", notes)
        return macros

    def _expand(
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

    # ----------------------------------------------------------- groups

    def _placements(self) -> dict[str, Placement]:
        groups = self.config.get("groups") or {}
        models = self.config["models"]
        placements: dict[str, Placement] = {}
        if not isinstance(groups, dict):
            self.group_notes.append(no_equivalent("groups", groups, "not a mapping"))
            return placements
        for name, group in groups.items():
            if not isinstance(group, dict):
                self.group_notes.append(no_equivalent(f"groups.{name}", group, "not a mapping"))
                continue
            swap = group.get("swap", True) is not False
            exclusive = group.get("exclusive", True) is not False
            persistent = group.get("persistent", False) is True
            if persistent:
                residency = "on-demand" if swap else "pinned"
                priority = PRIORITY_PERSISTENT
            elif swap:
                residency, priority = "on-demand", PRIORITY_SWAP
            else:
                residency, priority = "warm", PRIORITY_TOGETHER
            members = [str(m) for m in group.get("members") or []]
            why = f"llama-swap group {name}"
            self.group_notes.append(
                f"llama-swap group {name} (swap: {str(swap).lower()}, exclusive: "
                f"{str(exclusive).lower()}, persistent: {str(persistent).lower()}): "
                f"{', '.join(members) or 'no members'} -> {residency}, priority {priority}"
            )
            if swap and len(members) > 1:
                self.group_notes.append(
                    no_equivalent(
                        f"groups.{name}.swap",
                        True,
                        "vramd runs members side by side while they fit; equal on-demand "
                        "priorities evict each other when memory is short",
                    )
                )
            if exclusive and len(groups) > 1:
                self.group_notes.append(
                    no_equivalent(
                        f"groups.{name}.exclusive",
                        True,
                        "vramd unloads other services only when memory is short",
                    )
                )
            if persistent and not swap:
                self.group_notes.append(
                    f"llama-swap: groups.{name}.persistent: true -> pinned, which vramd also "
                    "loads at start (residency: warm with priority 1000 loads on first request)"
                )
            for key in set(group) - {"swap", "exclusive", "persistent", "members"}:
                self.group_notes.append(
                    no_equivalent(f"groups.{name}.{key}", group[key], "not a llama-swap key")
                )
            for member in members:
                if member not in models:
                    self.group_notes.append(
                        f"llama-swap: group {name} names unknown model {member}"
                    )
                elif member in placements:
                    self.group_notes.append(
                        f"llama-swap: {member} is in more than one group; kept in the first"
                    )
                else:
                    placements[member] = Placement(residency, priority, why)
        return placements

    # --------------------------------------------------------- services

    def services(self) -> list[ServiceOut]:
        preload = self._preload()
        out = []
        for model_id, raw in self.config["models"].items():
            service = self._service(str(model_id), raw, preload)
            if service is not None:
                out.append(service)
        for model_id in sorted(preload - set(map(str, self.config["models"]))):
            self.top_notes.append(f"llama-swap: hooks.on_startup.preload names unknown {model_id}")
        return out

    def _preload(self) -> set[str]:
        hooks = self.config.get("hooks") or {}
        if not isinstance(hooks, dict):
            return set()
        preload: set[str] = set()
        for hook, actions in hooks.items():
            if hook != "on_startup" or not isinstance(actions, dict):
                self.top_notes.append(no_equivalent(f"hooks.{hook}", actions, "only preload is"))
                continue
            for action, value in actions.items():
                if action == "preload" and isinstance(value, list):
                    preload |= {str(v) for v in value}
                else:
                    self.top_notes.append(
                        no_equivalent(f"hooks.on_startup.{action}", value, "only preload is")
                    )
        return preload

    def _service(self, model_id: str, raw: Any, preload: set[str]) -> ServiceOut | None:
        where = f"models.{model_id}"
        if not isinstance(raw, dict) or not isinstance(raw.get("cmd"), str):
            self.top_notes.append(f"llama-swap: {where} has no cmd string; left out")
            return None
        name = self._unique_name(slug(model_id))
        service = ServiceOut(name)
        notes = service.notes
        macros = self._macros(raw.get("macros"), self.macros, f"{where}.macros", notes)
        # llama-swap expands macros in the text, then splits it: a macro may hold flags.
        argv = split_command(self._expand(raw["cmd"], macros, model_id, f"{where}.cmd", notes))
        if not argv:
            self.top_notes.append(f"llama-swap: {where}.cmd is empty; left out")
            return None
        argv = self._proxy(raw.get("proxy"), argv, macros, model_id, notes)
        kind, kind_note = guess_kind(argv)
        service.set("kind", kind, kind_note)
        service.set("models", self._model_names(model_id, raw.get("aliases"), notes))
        service.set("command", argv)
        env = self._env_list(raw.get("env"), macros, model_id, where, notes)
        if env:
            service.set("env", env)
        self._health(raw.get("checkEndpoint"), macros, model_id, service)
        if raw.get("useModelName"):
            service.set("upstream_model", str(raw["useModelName"]), "llama-swap: useModelName")
        service.set("memory", {"estimate": ESTIMATE})
        self._residency(model_id, raw, preload, service)
        limit = raw.get("concurrencyLimit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            service.set("max_concurrency", limit, "llama-swap: concurrencyLimit")
        for key in raw:
            if key in MODEL_NOTES:
                notes.append(no_equivalent(key, raw[key], MODEL_NOTES[key]))
            elif key not in MODEL_KEYS:
                notes.append(no_equivalent(key, raw[key], "not a llama-swap model key"))
        return service

    def _unique_name(self, base: str) -> str:
        name, n = base, 2
        while name in self.used_names:
            suffix = f"-{n}"
            name, n = base[: 63 - len(suffix)] + suffix, n + 1
        self.used_names.add(name)
        return name

    def _model_names(self, model_id: str, aliases: Any, notes: list[str]) -> list[str]:
        names = []
        for entry in [model_id, *(aliases if isinstance(aliases, list) else [])]:
            # Newer llama-swap writes aliases as {id, name, unlisted}; older as strings.
            alias = entry.get("id") if isinstance(entry, dict) else entry
            if isinstance(entry, dict) and entry.get("unlisted"):
                notes.append(no_equivalent("aliases.unlisted", True, MODEL_NOTES["unlisted"]))
            text = "-".join(str(alias).split())[:256]
            if text != str(alias):
                notes.append(f"llama-swap: model name {alias!r} written as {text!r}")
            if not text or text in self.used_models:
                notes.append(f"llama-swap: model name {text!r} is already used; left out")
                continue
            self.used_models[text] = model_id
            names.append(text)
        return names

    def _proxy(
        self,
        proxy: Any,
        argv: list[str],
        macros: Mapping[str, str],
        model_id: str,
        notes: list[str],
    ) -> list[str]:
        if proxy is None:
            return argv
        url = self._expand(str(proxy), macros, model_id, "proxy", notes)
        match = _PROXY_RE.match(url)
        if match is None:
            notes.append(no_equivalent("proxy", url, "vramd proxies to http://127.0.0.1:${PORT}"))
            return argv
        host, port, path = match["host"], match["port"], match["path"]
        if host not in _LOOPBACK:
            notes.append(no_equivalent("proxy", url, "vramd runs the runtime on this machine"))
        if path and path != "/":
            notes.append(no_equivalent("proxy", url, "vramd proxies to the runtime's root"))
        if port is None or port == "${PORT}" or not port.isdigit():
            return argv
        replaced = [_with_port(arg, port) for arg in argv]
        if replaced == argv:
            notes.append(
                f"TODO llama-swap: proxy: {url} is a fixed port that cmd does not show; "
                "vramd proxies to ${PORT}: make the runtime listen there"
            )
        else:
            notes.append(
                f"llama-swap: proxy: {url} is a fixed port; vramd gives each instance a free "
                f"port, so {port} in cmd became ${{PORT}}"
            )
        return replaced

    def _env_list(
        self, raw: Any, macros: Mapping[str, str], model_id: str, where: str, notes: list[str]
    ) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in raw if isinstance(raw, list) else []:
            key, sep, value = str(item).partition("=")
            if not sep or not key.strip():
                notes.append(no_equivalent("env", item, "not NAME=value"))
                continue
            env[key.strip()] = self._expand(value, macros, model_id, f"{where}.env", notes)
        if raw is not None and not isinstance(raw, list):
            notes.append(no_equivalent("env", raw, "llama-swap env is a list of NAME=value"))
        return env

    def _health(
        self, raw: Any, macros: Mapping[str, str], model_id: str, service: ServiceOut
    ) -> None:
        if raw is None:
            return
        path = self._expand(str(raw).strip(), macros, model_id, "checkEndpoint", service.notes)
        if path.lower() == "none":
            service.notes.append(
                no_equivalent(
                    "checkEndpoint",
                    path,
                    "vramd waits for health (default /health) to answer 2xx; set a path "
                    "the runtime answers",
                )
            )
        elif path != "/health":
            service.set("health", path if path.startswith("/") else "/" + path)

    def _residency(
        self, model_id: str, raw: dict[str, Any], preload: set[str], service: ServiceOut
    ) -> None:
        placement = self.placements.get(
            model_id, Placement("on-demand", PRIORITY_SWAP, "llama-swap: one model at a time")
        )
        residency, why = placement.residency, placement.why
        preloaded = model_id in preload
        if preloaded and residency == "on-demand":
            residency, why = "warm", f"{why}; warm so that it can preload"
        service.set("residency", residency, why)
        if preloaded and residency == "warm":
            service.set("preload", True, "llama-swap: hooks.on_startup.preload")
        service.set("priority", placement.priority)
        ttl = raw.get("ttl", -1)
        if not isinstance(ttl, int | float) or isinstance(ttl, bool):
            service.notes.append(no_equivalent("ttl", ttl, "not a number of seconds"))
            return
        own = ttl >= 0
        effective = ttl if own else self._global_ttl()
        key, value = ("ttl", ttl) if own else ("globalTTL", self.config.get("globalTTL"))
        if residency == "pinned" and effective > 0:
            service.notes.append(
                no_equivalent(key, value, "pinned services never unload when idle")
            )
        elif (residency == "on-demand" and own) or (residency == "warm" and effective > 0):
            service.set("idle_ttl", seconds(effective), f"llama-swap: {key}: {value}")

    def _global_ttl(self) -> float:
        value = self.config.get("globalTTL", 0)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        return float(value) if ok else 0.0

    # --------------------------------------------------------- top level

    def _top_level(self) -> tuple[list[str], list[str]]:
        """The ``server`` and ``defaults`` lines; notes for keys with no equivalent."""
        server: list[str] = []
        keys = []
        for key in self.config.get("apiKeys") or []:
            text = str(key)
            if "${" in text:
                self.top_notes.append(
                    f"TODO llama-swap: apiKeys entry {text} comes from the environment; "
                    "put the key in server.api_keys"
                )
            elif len(text) < 8:
                self.top_notes.append("llama-swap: an apiKeys entry is shorter than 8; left out")
            else:
                keys.append(text)
        if keys:
            server = ["server:", f"  api_keys: {flow_list(keys, column=12)}"]
        defaults = ["defaults:"]
        global_ttl = self.config.get("globalTTL")
        note = f"llama-swap: globalTTL: {global_ttl}" if global_ttl is not None else None
        defaults.append(
            _line(2, "idle_ttl", seconds(self._global_ttl()), note or "llama-swap never unloads")
        )
        timeout = self.config.get("healthCheckTimeout")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            defaults.append(
                _line(
                    2,
                    "startup_timeout",
                    seconds(max(15, timeout)),
                    f"llama-swap: healthCheckTimeout: {timeout}",
                )
            )
        for key, value in self.config.items():
            if key in TOP_LEVEL_NOTES:
                self.top_notes.append(no_equivalent(key, value, TOP_LEVEL_NOTES[key]))
            elif key not in TOP_LEVEL_KEYS:
                self.top_notes.append(no_equivalent(key, value, "not a llama-swap key"))
        return server, defaults

    def render(self, source: str) -> str:
        services = self.services()
        server, defaults = self._top_level()
        lines = [
            f"# vramd policy converted from llama-swap {comment(source)} by "
            "`vramd import llama-swap`.",
            "# Review it before use, then check it with `vramd check FILE`:",
            "# - memory.estimate is a placeholder (llama-swap has no memory figures); vramd",
            "#   uses it until it has measured a service, then learns the real peak.",
            "# - kind is guessed from each command: chat unless it says otherwise.",
            "# - llama-swap runs one model at a time unless groups say otherwise; vramd runs",
            "#   what fits in the device budget and evicts by residency and priority.",
            "version: 1",
            *(f"# {comment(note)}" for note in self.top_notes),
            *server,
            "device:",
            "  backend: auto   # nvml when a GPU answers, else the host's memory",
            "  headroom: 1GiB  # never handed out: load-time spikes live here",
            *defaults,
            *(f"# {comment(note)}" for note in self.group_notes),
            "services:" if services else "services: {}",
        ]
        for service in services:
            lines.append(f"  {service.name}:")
            lines += [f"    # {comment(note)}" for note in service.notes]
            for key, (value, note) in service.fields.items():
                lines += _field(key, value, note)
        return "\n".join(lines) + "\n"


def _with_port(arg: str, port: str) -> str:
    """``8999``, ``--port=8999``, ``host:8999`` and docker's ``8999:8080`` -> ``${PORT}``."""
    if arg == port:
        return "${PORT}"
    if re.search(rf"[=:]{port}$", arg):
        return arg[: -len(port)] + "${PORT}"
    if re.match(rf"^{port}:\d+$", arg):
        return "${PORT}" + arg[len(port) :]
    return arg


def _line(indent: int, key: str, value: Any, note: str | None = None) -> str:
    text = f"{' ' * indent}{key}: {scalar(value)}"
    return f"{text}  # {comment(note)}" if note else text


def _field(key: str, value: Any, note: str | None) -> list[str]:
    if key in ("models", "command"):
        text = f"    {key}: {flow_list(value, column=6 + len(key))}"
        return [f"{text}  # {comment(note)}" if note else text]
    if key == "env":
        return ["    env:", *(_line(6, k, v) for k, v in value.items())]
    if key == "memory":
        return ["    memory:", _line(6, "estimate", value["estimate"], ESTIMATE_NOTE)]
    return [_line(4, key, value, note)]
