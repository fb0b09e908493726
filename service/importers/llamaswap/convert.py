"""The converter: one llama-swap config in, the policy text with its comments out.

It walks the config once, top-level keys and then each model's, and every key it meets
is either written as the vramd setting it means (with ``# llama-swap: KEY`` beside it) or
left as a comment that says why it has no equivalent; ``routing`` owns the routing keys.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from service.errors import PolicyError
from service.importers import ImportFailed, flow_list
from service.importers.llamaswap.keys import (
    MODEL_KEYS,
    MODEL_NOTES,
    TOP_LEVEL_KEYS,
    TOP_LEVEL_NOTES,
)
from service.importers.llamaswap.kinds import kind_of
from service.importers.llamaswap.macros import Macros
from service.importers.llamaswap.output import ESTIMATE, ServiceOut, line, render
from service.importers.llamaswap.routing import Routing
from service.importers.llamaswap.text import (
    is_number,
    no_equivalent,
    seconds,
    show,
    slug,
    split_command,
    with_port,
)
from service.policy import load_policy
from service.policy.routes import adapter_routes
from service.policy.runtime_names import guess_name

_PROXY_RE = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[^\]]*\]|[^:/]+)(?::(?P<port>[^/]+))?(?P<path>/.*)?$"
)
_LOOPBACK = {"localhost", "127.0.0.1", "[::1]", "0.0.0.0"}


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
    output = _Converter(config, os.environ if environ is None else environ).render(source)
    try:
        load_policy(output)
    except PolicyError as exc:  # a bug here, not in the input: say so plainly
        problems = "; ".join(str(issue) for issue in exc.issues)
        raise ImportFailed(f"the converted policy does not validate: {problems}") from None
    return output


class _Converter:
    def __init__(self, config: dict[str, Any], environ: Mapping[str, str]) -> None:
        self.config = config
        self.top_notes: list[str] = []
        self.used_names: set[str] = set()
        self.used_models: dict[str, str] = {}
        self.macros = Macros(environ)
        self.global_macros = self.macros.define(config.get("macros"), {}, "macros", self.top_notes)
        if self.global_macros:
            self.top_notes.append(
                f"llama-swap: macros: {', '.join(self.global_macros)} are expanded into each "
                "command (vramd has ${PORT} and a few more placeholders, no macros)"
            )
        self.routing = Routing(config)

    def render(self, source: str) -> str:
        services = self.services()
        server, defaults = self._top_level()
        return render(
            source,
            top_notes=self.top_notes,
            server=server,
            defaults=defaults,
            routing_notes=self.routing.notes,
            services=services,
        )

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
        if raw.get("disabled") is True:
            self.top_notes.append(
                f"llama-swap: {where} has disabled: true (llama-swap never starts it); left out"
            )
            return None
        name = self._unique_name(slug(model_id))
        service = ServiceOut(name)
        notes = service.notes
        macros = self.macros.define(raw.get("macros"), self.global_macros, f"{where}.macros", notes)
        # llama-swap expands macros in the text, then splits it: a macro may hold flags.
        cmd = self.macros.expand(raw["cmd"], macros, model_id, f"{where}.cmd", notes)
        argv = split_command(cmd)
        if not argv:
            self.top_notes.append(f"llama-swap: {where}.cmd is empty; left out")
            return None
        argv = self._proxy(raw.get("proxy"), argv, macros, model_id, notes)
        kind, kind_note = kind_of(argv, raw.get("capabilities"), notes)
        service.set("kind", kind, kind_note)
        base, by_id = self._filters(model_id, raw.get("filters"), macros, notes)
        extra = [name for name in by_id if name != model_id]
        names = self._model_names(model_id, raw.get("aliases"), extra, notes)
        service.set("models", names, "llama-swap: aliases, setParamsByID ids" if extra else None)
        params = {name: {**base, **by_id.get(name, {})} for name in names}
        params = {name: fields for name, fields in params.items() if fields}
        if params:
            service.set("set_params", params, "llama-swap: filters.setParams, setParamsByID")
        service.set("command", argv)
        env = self._env_list(raw.get("env"), macros, model_id, where, notes)
        if env:
            service.set("env", env)
        self._health(raw.get("checkEndpoint"), macros, model_id, service)
        self._routes(kind, argv, service)
        if raw.get("useModelName"):
            service.set("upstream_model", str(raw["useModelName"]), "llama-swap: useModelName")
        service.set("memory", {"estimate": ESTIMATE})
        self._residency(model_id, raw, preload, service)
        limit = raw.get("concurrencyLimit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            service.set("max_concurrency", limit, "llama-swap: concurrencyLimit")
        self._unload_timeout(raw.get("unloadTimeout"), service)
        if raw.get("disabled") is False:
            notes.append("llama-swap: disabled: false (the default: it is served)")
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

    def _model_names(
        self, model_id: str, aliases: Any, extra: list[str], notes: list[str]
    ) -> list[str]:
        names = []
        for entry in [model_id, *(aliases if isinstance(aliases, list) else []), *extra]:
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

    def _filters(
        self, model_id: str, raw: Any, macros: Mapping[str, str], notes: list[str]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Request filters: the fields ``setParams`` sets for every name of the model, and
        those ``setParamsByID`` sets per name (each id also becomes a model name)."""
        if raw is None:
            return {}, {}
        if not isinstance(raw, dict):
            notes.append(no_equivalent("filters", raw, "not a mapping"))
            return {}, {}
        rest = {k: v for k, v in raw.items() if k not in ("setParams", "setParamsByID")}
        if rest:
            notes.append(
                no_equivalent(
                    "filters", rest, "vramd forwards the other fields unchanged", limit=150
                )
            )
        base = self._params("filters.setParams", raw.get("setParams"), notes)
        by_id = raw.get("setParamsByID")
        if by_id is None:
            return base, {}
        if not isinstance(by_id, dict):
            notes.append(no_equivalent("filters.setParamsByID", by_id, "not a mapping"))
            return base, {}
        named = {}
        for key, params in by_id.items():
            where = f"models.{model_id}.filters.setParamsByID"
            name = self.macros.expand(str(key), macros, model_id, where, notes)
            named[name] = self._params(f"filters.setParamsByID.{name}", params, notes)
        return base, named

    @staticmethod
    def _params(where: str, params: Any, notes: list[str]) -> dict[str, Any]:
        if params is None:
            return {}
        if not isinstance(params, dict):
            notes.append(no_equivalent(where, params, "not a mapping of request fields"))
            return {}
        if "model" in params:
            notes.append(
                f"llama-swap: {where}.model: {show(params['model'])} left out (a request's "
                "model names the service; upstream_model renames it for the runtime)"
            )
        return {str(k): v for k, v in params.items() if k != "model"}

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
        url = self.macros.expand(str(proxy), macros, model_id, "proxy", notes)
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
        replaced = [with_port(arg, port) for arg in argv]
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
            env[key.strip()] = self.macros.expand(value, macros, model_id, f"{where}.env", notes)
        if raw is not None and not isinstance(raw, list):
            notes.append(no_equivalent("env", raw, "llama-swap env is a list of NAME=value"))
        return env

    def _health(
        self, raw: Any, macros: Mapping[str, str], model_id: str, service: ServiceOut
    ) -> None:
        if raw is None:
            return
        path = self.macros.expand(
            str(raw).strip(), macros, model_id, "checkEndpoint", service.notes
        )
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

    def _routes(self, kind: str, argv: list[str], service: ServiceOut) -> None:
        """whisper.cpp's server transcribes at ``/inference``, not at the OpenAI path."""
        if kind != "speech" or guess_name(argv) != "whisper.cpp":
            return
        routes = adapter_routes("whisper.cpp", argv)
        path = routes["/v1/audio/transcriptions"]
        why = f"whisper-server transcribes at {path} (llama-swap passes the path through)"
        service.set("routes", routes, why)

    def _residency(
        self, model_id: str, raw: dict[str, Any], preload: set[str], service: ServiceOut
    ) -> None:
        placement = self.routing.placement(model_id)
        service.notes.extend(placement.notes)
        residency, why = placement.residency, placement.why
        preloaded = model_id in preload
        if preloaded and residency == "on-demand":
            residency, why = "warm", f"{why}; warm so that it can preload"
        service.set("residency", residency, why)
        if preloaded and residency == "warm":
            service.set("preload", True, "llama-swap: hooks.on_startup.preload")
        service.set("priority", placement.priority, placement.priority_why)
        if placement.protect is not None and residency == "on-demand":
            service.set("protect", placement.protect, "llama-swap: persistent group")
        ttl = raw.get("ttl", -1)
        if not is_number(ttl):
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

    def _unload_timeout(self, value: Any, service: ServiceOut) -> None:
        if value is None:
            return
        if is_number(value) and value > 0:
            service.set("stop_timeout", seconds(value), f"llama-swap: unloadTimeout: {value}")
        elif value == 0:
            service.notes.append(
                "llama-swap: unloadTimeout: 0 means the global one (defaults.stop_timeout)"
            )
        else:
            service.notes.append(no_equivalent("unloadTimeout", value, "not a number of seconds"))

    def _global_ttl(self) -> float:
        value = self.config.get("globalTTL", 0)
        return float(value) if is_number(value) and value >= 0 else 0.0

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
            server = ["server:", f"  api_keys: {flow_list(keys, column=12)}  # llama-swap: apiKeys"]
        defaults = ["defaults:"]
        global_ttl = self.config.get("globalTTL")
        note = f"llama-swap: globalTTL: {global_ttl}" if global_ttl is not None else None
        defaults.append(
            line(2, "idle_ttl", seconds(self._global_ttl()), note or "llama-swap never unloads")
        )
        timeout = self.config.get("healthCheckTimeout")
        if is_number(timeout):
            defaults.append(
                line(
                    2,
                    "startup_timeout",
                    seconds(max(15, timeout)),
                    f"llama-swap: healthCheckTimeout: {timeout}",
                )
            )
        unload = self.config.get("unloadTimeout")
        if is_number(unload) and unload > 0:
            defaults.append(
                line(
                    2,
                    "stop_timeout",
                    seconds(unload),
                    f"llama-swap: unloadTimeout: {unload} (grace before a forced stop)",
                )
            )
        elif unload is not None:
            self.top_notes.append(no_equivalent("unloadTimeout", unload, "not a positive number"))
        for key, value in self.config.items():
            if key in TOP_LEVEL_NOTES:
                self.top_notes.append(no_equivalent(key, value, TOP_LEVEL_NOTES[key]))
            elif key not in TOP_LEVEL_KEYS:
                self.top_notes.append(no_equivalent(key, value, "not a llama-swap key"))
        return server, defaults
