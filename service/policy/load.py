"""``load_policy``: policy text in, a validated ``Policy`` out, or every problem at once."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from service.domain import Residency
from service.errors import PolicyError, PolicyIssue
from service.policy.clients import CLIENT_NAME_PATTERN, DEFAULT_CLIENT, key_digest
from service.policy.placeholders import CAP_PLACEHOLDERS, PLACEHOLDERS, placeholders_in
from service.policy.protect import DEFAULT_PROTECT_S, NEVER
from service.policy.runtime_names import SLEEP_ADAPTERS, STATE_ADAPTERS, saves_to_state_dir
from service.policy.schema import (
    NAME_PATTERN,
    Defaults,
    DeviceConfig,
    Maintenance,
    Policy,
    ServerConfig,
    Service,
    Window,
)
from service.policy.yamlpos import (
    PathKey,
    Positions,
    YamlSyntaxError,
    format_path,
    load_with_positions,
)
from service.units import format_size

# Keys of ``defaults`` that are mappings and merge key by key into a service's own.
_MERGED_MAPPINGS = ("queue", "restart", "env")


def load_policy(text: str) -> Policy:
    """Validate a whole policy file; raise ``PolicyError`` with every issue found.

    The steps: parse the YAML keeping each key's line and column (``service.policy.yamlpos``), merge
    ``defaults`` into the services that do not set a key themselves, validate with the
    ``schema`` models, run the checks that span fields and sections, and raise one
    ``PolicyError`` listing every issue, each naming its key path and line:
    ``services.chat.memory.cap (line 14, col 12): ...``. A valid file then gets its
    residency-dependent defaults (idle TTL, protect) filled in.
    """
    try:
        data, positions, issues = load_with_positions(text)
    except YamlSyntaxError as exc:
        raise PolicyError([exc.issue]) from None
    if not isinstance(data, dict):
        raise PolicyError([PolicyIssue("", "the policy must be a YAML mapping (version: 1, ...)")])
    data = copy.deepcopy(data)
    issues += _merge_defaults(data, positions)
    policy: Policy | None = None
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        issues += _pydantic_issues(exc, data, positions)
    issues += _check_names(data, positions)
    services = data.get("services")
    written = set(services) if isinstance(services, dict) else set()
    issues += _cross_checks(policy or _partial_policy(data), positions, written)
    if issues:
        raise PolicyError(_sorted_unique(issues))
    assert policy is not None
    _resolve_idle_ttls(policy)
    _resolve_protect(policy)
    return policy


def _merge_defaults(data: dict[str, Any], positions: Positions) -> list[PolicyIssue]:
    """Copy each valid ``defaults`` key into services that do not set it themselves."""
    raw_defaults = data.get("defaults")
    services = data.get("services")
    if not isinstance(raw_defaults, dict) or not isinstance(services, dict):
        return []
    try:
        Defaults.model_validate(raw_defaults)
        bad_keys: set[str] = set()
    except ValidationError as exc:
        # Errors are reported at defaults.* by the full validation; merge only the rest.
        bad_keys = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        for key, value in raw_defaults.items():
            if key in bad_keys or key == "idle_ttl":
                continue
            if key == "protect" and service.get("residency") == Residency.PINNED.value:
                continue  # pinned services are never evicted: nothing to protect
            target, source = ("services", name, key), ("defaults", key)
            if key not in service:
                service[key] = copy.deepcopy(value)
                positions.alias(target, source)
            elif key in _MERGED_MAPPINGS and isinstance(value, dict):
                own = service[key]
                if isinstance(own, dict):
                    for sub_key, sub_value in value.items():
                        if sub_key not in own:
                            own[sub_key] = copy.deepcopy(sub_value)
                            positions.alias((*target, sub_key), (*source, sub_key))
    return []


def _pydantic_issues(
    exc: ValidationError, data: dict[str, Any], positions: Positions
) -> list[PolicyIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        path = _data_path(err["loc"], data)
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
            pos = positions.of_key(path)
        elif err["type"] == "missing":
            message = "required key is missing"
            # The line of the mapping's own key (``chat:``), not of its first child.
            pos = positions.keys.get(path[:-1]) or positions.of_key(path)
        else:
            pos = positions.of_value(path)
            if err["type"] in {"string_type", "list_type", "dict_type", "int_type", "bool_type"}:
                message += f", got {type(err['input']).__name__} {err['input']!r}"
        issues.append(_issue(path, message, pos))
    return issues


def _data_path(loc: tuple[int | str, ...], data: Any) -> PathKey:
    """The part of a pydantic error location that names real keys in the data.

    Pydantic adds union-branch and validator names (``list[...]``, ``literal[...]``) to
    locations; walking the data keeps only what an operator wrote.
    """
    path: list[str | int] = []
    node = data
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]
            path.append(part)
        elif isinstance(node, dict | list) and not _is_branch_name(part):
            path.append(part)  # a missing key: name it
            node = None
    return tuple(path)


def _is_branch_name(part: int | str) -> bool:
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"})


# Service and window keys that no cross-field check reads.
_UNCHECKED_ACROSS = frozenset(
    {
        "priority",
        "idle_ttl",
        "max_concurrency",
        "queue",
        "startup_timeout",
        "stop_timeout",
        "restart",
        "metrics",
        "upstream_model",
        "cwd",
        "duration",
        "timezone",
        "cron",
    }
)


def _partial_policy(data: dict[str, Any]) -> Policy:
    """The parts of an invalid file that do validate, so cross-field checks still run.

    Reporting every problem at once means the model-uniqueness, cap and window checks
    must not wait for an unrelated typo elsewhere to be fixed.
    """

    def valid(model: type[BaseModel], raw: Any) -> Any:
        if isinstance(raw, dict):  # unknown keys are reported already; look past them
            raw = {key: value for key, value in raw.items() if key in model.model_fields}
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            # Keys no cross-field check reads can be left out (already reported) and the
            # rest checked; an error in a key a check reads would give false errors.
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
            if not isinstance(raw, dict) or not bad <= _UNCHECKED_ACROSS:
                return None
        try:
            return model.model_validate({k: v for k, v in raw.items() if k not in bad})
        except ValidationError:
            return None

    services = data.get("services")
    maintenance = data.get("maintenance")
    raw_windows = maintenance.get("windows") if isinstance(maintenance, dict) else None
    partial = Policy.model_construct(
        version=1,
        server=valid(ServerConfig, data.get("server") or {}) or ServerConfig(),
        device=valid(DeviceConfig, data.get("device") or {}) or DeviceConfig(),
        services={
            name: svc
            for name, raw in (services.items() if isinstance(services, dict) else [])
            if (svc := valid(Service, raw)) is not None
        },
        maintenance=Maintenance.model_construct(
            windows=[valid(Window, raw) for raw in raw_windows]
            if isinstance(raw_windows, list)
            else []
        ),
    )
    return partial


def _check_names(data: dict[str, Any], positions: Positions) -> list[PolicyIssue]:
    """Service and client names are dict keys, which pydantic does not pattern-check."""
    server = data.get("server")
    clients = server.get("clients") if isinstance(server, dict) else None
    named = [
        ("services", data.get("services"), NAME_PATTERN, "service name must match "
         "[a-z0-9][a-z0-9_.-]{0,62} (lowercase, no slashes)"),
        ("server.clients", clients, CLIENT_NAME_PATTERN, "client name must be 1-64 letters, "
         "digits, '_', '.', '@' or '-', starting with a letter or digit"),
    ]  # fmt: skip
    issues = []
    for where, names, pattern, message in named:
        for name in names if isinstance(names, dict) else ():
            if not isinstance(name, str) or not re.match(pattern, name):
                path = (*where.split("."), name)
                issues.append(_issue(path, message, positions.of_key(path)))
    return issues


def _cross_checks(policy: Policy, positions: Positions, written: set[str]) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []

    def add(path: PathKey, message: str, *, key: bool = False) -> None:
        pos = positions.of_key(path) if key else positions.of_value(path)
        issues.append(_issue(path, message, pos))

    owners: dict[str, str] = {}
    for name, service in policy.services.items():
        base: PathKey = ("services", name)
        for i, model in enumerate(service.models):
            if model in owners:
                add((*base, "models", i), f"model {model!r} is already served by {owners[model]!r}")
            else:
                owners[model] = name
        for model, fields in service.set_params.items():
            if model not in service.models:
                add(
                    (*base, "set_params", model),
                    f"{model!r} is not one of this service's models {service.models}",
                    key=True,
                )
            if "model" in fields:
                add(
                    (*base, "set_params", model, "model"),
                    "the model name cannot be set here; use upstream_model",
                    key=True,
                )
        cap, estimate = service.memory.cap, service.memory.estimate
        if cap is not None and cap < estimate:
            add((*base, "memory", "cap"), f"must be >= estimate ({format_size(estimate)})")
        if service.sleep and not _supports_sleep(service):
            add(
                (*base, "sleep"),
                "sleep mode needs a runtime that has one: set adapter: vllm (vLLM started "
                "with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1)",
            )
        if service.preload and service.residency is not Residency.WARM:
            add(
                (*base, "preload"),
                f"preload applies only to warm services, not {service.residency}",
            )
        if service.residency is Residency.PINNED and service.protect is not None:
            add(
                (*base, "protect"),
                "a pinned service is never evicted, so protect does not apply; remove it",
                key=True,
            )
        _placement_checks(policy, service, base, add)
        _placeholder_checks(name, service, base, add)
        _state_checks(service, base, add)
    _client_checks(policy, add)
    ollama = policy.server.ollama
    if ollama is not None and ollama.port == policy.server.port:
        add(("server", "ollama", "port"), f"must differ from server.port ({ollama.port})")
    budget, headroom = policy.device.budget, policy.device.headroom
    if budget is not None and headroom >= budget:
        add(("device", "headroom"), f"must be below device.budget ({format_size(budget)})")
    _window_checks(policy, add, written)
    return issues


def _client_checks(policy: Policy, add: Callable[..., None]) -> None:
    """Every key opens one client: no digest twice, and ``default`` is ``api_keys``'."""
    server = policy.server
    seen: dict[str, str] = {key_digest(key): "server.api_keys" for key in server.api_keys}
    if server.api_keys and DEFAULT_CLIENT in server.clients:
        add(
            ("server", "clients", DEFAULT_CLIENT),
            f"{DEFAULT_CLIENT!r} is the client of server.api_keys; name this one otherwise",
            key=True,
        )
    for name, client in server.clients.items():
        other = seen.setdefault(client.digest, f"server.clients.{name}")
        if other != f"server.clients.{name}":
            add(("server", "clients", name), f"its key is also {other}'s key", key=True)


def _placement_checks(
    policy: Policy, service: Service, base: PathKey, add: Callable[..., None]
) -> None:
    """A span's shares and devices: one share per device, enough devices allowed."""
    split = service.memory.split
    if split is not None and len(split) != service.span:
        add(
            (*base, "memory", "split"),
            f"has {len(split)} shares but span is {service.span}: one share per device",
        )
    allowed = service.gpus or (policy.device.gpus if isinstance(policy.device.gpus, list) else None)
    if allowed is not None and service.span > len(set(allowed)):
        where = "gpus" if service.gpus else "device.gpus"
        add(
            (*base, "span"),
            f"span {service.span} needs {service.span} devices, but {where} allows "
            f"{len(set(allowed))}: {sorted(set(allowed))}",
        )
    if isinstance(policy.device.gpus, list) and service.gpus:
        for i, gpu in enumerate(service.gpus):
            if gpu not in policy.device.gpus:
                add((*base, "gpus", i), f"GPU {gpu} is not in device.gpus {policy.device.gpus}")


def _placeholder_checks(
    name: str, service: Service, base: PathKey, add: Callable[..., None]
) -> None:
    """Every ${NAME} in the command, env and health path is known (and has its cap)."""
    templated: list[tuple[PathKey, str]] = [
        ((*base, "command", i), arg) for i, arg in enumerate(service.command)
    ]
    templated += [((*base, "env", key), value) for key, value in service.env.items()]
    templated.append(((*base, "health"), service.health))
    for path, text in templated:
        for name_used in placeholders_in(text):
            if name_used not in PLACEHOLDERS:
                known = ", ".join(f"${{{p}}}" for p in sorted(PLACEHOLDERS))
                add(path, f"unknown placeholder ${{{name_used}}}; known: {known}")
            elif name_used in CAP_PLACEHOLDERS and service.memory.cap is None:
                add(path, f"${{{name_used}}} needs services.{name}.memory.cap to be set")


def _state_checks(service: Service, base: PathKey, add: Callable[..., None]) -> None:
    """``state`` needs a runtime that can save its slots, told to save them in
    ``${STATE_DIR}`` (docs/policy.md, "State across swaps")."""
    if service.state is None:
        return
    if service.adapter_name not in STATE_ADAPTERS:
        add(
            (*base, "state"),
            f"saving state needs llama.cpp's slot API (llama-server, adapter: llama.cpp); "
            f"this service runs {service.adapter_name}: remove state",
            key=True,
        )
    elif not saves_to_state_dir(service.command, service.env):
        add(
            (*base, "command"),
            "state needs llama-server to save its slots where vramd keeps them: add "
            '--slot-save-path, "${STATE_DIR}" to the command',
            key=True,
        )


def _supports_sleep(service: Service) -> bool:
    return service.adapter_name in SLEEP_ADAPTERS


def _window_checks(policy: Policy, add: Callable[..., None], written: set[str]) -> None:
    """``written``: every service name in the file, valid or not. An invalid service is
    missing from a partial ``policy`` but its errors are reported already; naming it in a
    window is not a second mistake."""
    seen: set[str] = set()
    for i, window in enumerate(policy.maintenance.windows):
        if window is None:  # invalid on its own; already reported
            continue
        base: PathKey = ("maintenance", "windows", i)
        if window.name in seen:
            add((*base, "name"), f"window name {window.name!r} is used twice")
        seen.add(window.name)
        for j, allowed in enumerate(window.allow):
            service = policy.services.get(allowed)
            if service is None:
                if allowed not in written:
                    add((*base, "allow", j), f"no service named {allowed!r}")
            elif service.residency is not Residency.WINDOW_ONLY:
                add((*base, "allow", j), f"{allowed!r} is {service.residency}, not window-only")
        if isinstance(window.restart, list):
            for j, target in enumerate(window.restart):
                if target not in written:
                    add((*base, "restart", j), f"no service named {target!r}")


def _resolve_idle_ttls(policy: Policy) -> None:
    """Fill in each service's effective idle TTL (docs/policy.md, "Residency ...").

    pinned: never unloads. warm: only when the service sets idle_ttl itself. on-demand
    and window-only: their own idle_ttl, else ``defaults.idle_ttl``.
    """
    for service in policy.services.values():
        if service.residency is Residency.PINNED:
            service.idle_ttl = 0.0
        elif service.idle_ttl is None:
            warm = service.residency is Residency.WARM
            service.idle_ttl = 0.0 if warm else policy.defaults.idle_ttl


def _resolve_protect(policy: Policy) -> None:
    """Fill in each service's effective ``protect`` (pinned: never; it is not evicted)."""
    for service in policy.services.values():
        if service.residency is Residency.PINNED:
            service.protect = NEVER
        elif service.protect is None:
            service.protect = DEFAULT_PROTECT_S[service.residency]


def _issue(path: PathKey, message: str, pos: tuple[int, int] | None) -> PolicyIssue:
    line, col = pos if pos else (None, None)
    return PolicyIssue(format_path(path), message, line, col)


def _sorted_unique(issues: list[PolicyIssue]) -> list[PolicyIssue]:
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.line or 0, i.col or 0, i.path))
