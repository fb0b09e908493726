"""The policy file (DESIGN section 3): schema, validation with YAML positions, placeholders.

``load_policy(text)`` is the only way a policy enters vramd. It parses the YAML keeping
positions, merges ``defaults`` into services, validates the whole file with pydantic, runs
the cross-field checks, and raises one ``PolicyError`` listing *every* problem, each
naming its key path and line: ``services.chat.memory.cap (line 14, col 12): ...``.

Extensions to the contract (the contract's form keeps working):
- ``server.max_json_body`` / ``server.max_upload_body``: the request body limits of
  DESIGN section 9 (defaults 4MiB and 64MiB).
- ``server.request_timeout`` (10m) / ``server.stream_idle_timeout`` (5m): when a runtime
  that accepted a request but does not answer gets a 504 ``runtime_timeout``.
- ``defaults`` also accepts ``restart``, ``priority``, ``health``, ``env`` and ``gpus``.
- ``${PYTHON}``: the interpreter running vramd, so a policy can start Python runtimes
  (such as the demo runtime) from the daemon's own virtual environment.
"""

from __future__ import annotations

import copy
import math
import re
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from service.domain import OnCap, Residency, ServiceKind
from service.errors import PolicyError, PolicyIssue
from service.units import DURATION_HINT, SIZE_HINT, format_size, parse_duration, parse_size
from service.yamlpos import PathKey, Positions, YamlSyntaxError, format_path, load_with_positions

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_WINDOW_S = 31 * 86400.0  # a maintenance window longer than a month is a mistake
PLACEHOLDERS = frozenset(
    {"PORT", "SERVICE", "MODEL", "GPU", "CAP_BYTES", "CAP_MIB", "CAP_FRACTION", "PYTHON"}
)
CAP_PLACEHOLDERS = frozenset({"CAP_BYTES", "CAP_MIB", "CAP_FRACTION"})
_PLACEHOLDER_RE = re.compile(r"\$\{([^}]*)\}")

Size = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}], "description": SIZE_HINT}
    ),
]
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}],
            "description": DURATION_HINT,
        }
    ),
]

NEVER: Literal["never"] = "never"
ProtectValue = float | Literal["never"]


def parse_protect(value: object) -> ProtectValue:
    """``never`` or a duration (DESIGN section 4's ``protect``)."""
    if isinstance(value, str) and value.strip().lower() == "never":
        return NEVER
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or never") from None


# How long an idle instance keeps its memory against lower priorities, by residency,
# when a service does not say (DESIGN section 4; the choice is explained in
# docs/benchmarks.md). Pinned services are never evicted, so they have no entry.
DEFAULT_PROTECT_S: dict[Residency, float] = {
    Residency.WARM: 600.0,
    Residency.ON_DEMAND: 60.0,
    Residency.WINDOW_ONLY: 0.0,
}
Protect = Annotated[
    float | Literal["never"],
    BeforeValidator(parse_protect),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string"},
            ],
            "description": f"{DURATION_HINT}, or never",
        }
    ),
]
Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN)]
ModelName = Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f]+$")]
GpuIndex = Annotated[StrictInt, Field(ge=0, le=63)]


def _url_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be a URL path starting with '/', got {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ServerConfig(_Strict):
    host: StrictStr = "127.0.0.1"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 8400
    database: StrictStr = "data/vramd.db"
    api_keys: list[Annotated[StrictStr, Field(min_length=8)]] = []
    admin_keys: list[Annotated[StrictStr, Field(min_length=8)]] = []
    max_json_body: Size = 4 * 1024**2
    max_upload_body: Size = 64 * 1024**2
    # How long a runtime may take to start answering a request (504 runtime_timeout
    # after), and the longest silence allowed once a (streamed) answer has started.
    request_timeout: Annotated[Duration, Field(gt=0)] = 600.0
    stream_idle_timeout: Annotated[Duration, Field(gt=0)] = 300.0


class DeviceConfig(_Strict):
    backend: Literal["auto", "nvml", "host"] = "auto"
    gpus: Literal["all"] | list[GpuIndex] = "all"
    budget: Size | None = None
    headroom: Size = 1024**3
    sample_interval: Annotated[Duration, Field(gt=0)] = 1.0


class QueueConfig(_Strict):
    max: Annotated[StrictInt, Field(ge=0, le=100_000)] = 64
    timeout: Annotated[Duration, Field(gt=0)] = 120.0


class RestartConfig(_Strict):
    max_retries: Annotated[StrictInt, Field(ge=0, le=1000)] = 5
    backoff: Annotated[Duration, Field(gt=0)] = 2.0
    max_backoff: Annotated[Duration, Field(gt=0)] = 120.0


class MemoryConfig(_Strict):
    estimate: Size
    cap: Size | None = None
    on_cap: OnCap = OnCap.RESTART


class Defaults(_Strict):
    startup_timeout: Annotated[Duration, Field(gt=0)] = 120.0
    stop_timeout: Duration = 15.0
    idle_ttl: Duration = 900.0
    max_concurrency: Annotated[StrictInt, Field(ge=1, le=10_000)] = 4
    queue: QueueConfig = QueueConfig()
    restart: RestartConfig = RestartConfig()
    priority: Annotated[StrictInt, Field(ge=0, le=1000)] = 100
    health: StrictStr = "/health"
    env: dict[StrictStr, StrictStr] = {}
    gpus: list[GpuIndex] | None = None
    # Unset: each residency's own default (DEFAULT_PROTECT_S).
    protect: Protect | None = None

    # Checked here too, so a bad default is reported once at defaults.health rather
    # than once per service it is merged into.
    @field_validator("health")
    @classmethod
    def _is_path(cls, value: str) -> str:
        return _url_path(value)


# Keys of ``defaults`` that are mappings and merge key by key into a service's own.
_MERGED_MAPPINGS = ("queue", "restart", "env")


class Service(_Strict):
    kind: ServiceKind
    models: Annotated[list[ModelName], Field(min_length=1)]
    command: Annotated[list[StrictStr], Field(min_length=1)]
    env: dict[StrictStr, StrictStr] = {}
    cwd: StrictStr | None = None
    health: StrictStr = "/health"
    metrics: StrictStr | None = None
    upstream_model: StrictStr | None = None
    # Which runtime this is (health path, metrics, out-of-memory lines); guessed from
    # the command when unset. One of: llama.cpp, llama-cpp-python, vllm, whisper.cpp,
    # sd.cpp, tei, openai.
    adapter: StrictStr | None = None
    # vLLM sleep mode (server started with --enable-sleep-mode, VLLM_SERVER_DEV_MODE=1):
    # evict by putting it to sleep (weights to host memory) and wake it for a request.
    sleep: StrictBool = False
    memory: MemoryConfig
    residency: Residency = Residency.ON_DEMAND
    preload: StrictBool = False
    priority: Annotated[StrictInt, Field(ge=0, le=1000)] = 100
    # None until resolved: load_policy fills in the effective TTL per residency.
    idle_ttl: Duration | None = None
    # None until resolved: load_policy fills in the residency's default (pinned: never).
    protect: Protect | None = None
    max_concurrency: Annotated[StrictInt, Field(ge=1, le=10_000)] = 4
    queue: QueueConfig = QueueConfig()
    gpus: list[GpuIndex] | None = None
    startup_timeout: Annotated[Duration, Field(gt=0)] = 120.0
    stop_timeout: Duration = 15.0
    restart: RestartConfig = RestartConfig()

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str | None) -> str | None:
        if value is not None:
            from service.adapters import adapter_named

            adapter_named(value)  # ValueError naming the known runtimes
        return value

    @field_validator("health", "metrics")
    @classmethod
    def _is_path(cls, value: str | None) -> str | None:
        return None if value is None else _url_path(value)

    @property
    def expected_peak_floor(self) -> int:
        """The estimate, capped: what admission uses before the service is measured."""
        return min(self.memory.estimate, self.memory.cap or self.memory.estimate)


class Window(_Strict):
    name: Name
    cron: StrictStr
    duration: Annotated[Duration, Field(gt=0, le=MAX_WINDOW_S)]
    timezone: StrictStr = "UTC"
    restart: Literal["flagged", "all", "none"] | list[StrictStr] = "flagged"
    allow: list[StrictStr] = []

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        check_cron(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (use an IANA name such as UTC)"
            ) from None
        return value


class Maintenance(_Strict):
    windows: list[Window] = []

    @field_validator("windows", mode="before")
    @classmethod
    def _empty_list(cls, value: Any) -> Any:
        return [] if value is None else value


class Policy(_Strict):
    version: Literal[1]
    server: ServerConfig = ServerConfig()
    device: DeviceConfig = DeviceConfig()
    defaults: Defaults = Defaults()
    services: dict[StrictStr, Service] = {}
    maintenance: Maintenance = Maintenance()

    @field_validator("services", "maintenance", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        # "services:" with nothing under it is YAML null: an empty section, not an error.
        if value is None:
            return {}
        return value

    def service_for_model(self, model: str) -> str | None:
        for name, service in self.services.items():
            if model in service.models:
                return name
        return None


def check_cron(expression: str) -> None:
    """Raise ``ValueError`` unless ``expression`` is a valid five-field cron line."""
    from service.maintenance import cron_trigger

    try:
        cron_trigger(expression)
    except ValueError as exc:
        message = str(exc)
        if message.startswith("cron must have"):
            raise
        raise ValueError(f"invalid cron {expression!r}: {message}") from None


def placeholders_in(text: str) -> list[str]:
    return _PLACEHOLDER_RE.findall(text)


def expand_placeholders(text: str, values: Mapping[str, str]) -> str:
    """Substitute ``${NAME}`` from ``values``; unknown names are left as written."""
    return _PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def load_policy(text: str) -> Policy:
    """Validate a whole policy file; raise ``PolicyError`` with every issue found."""
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

    def valid(model: type[_Strict], raw: Any) -> Any:
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
    """Service names are dict keys, which pydantic does not pattern-check."""
    services = data.get("services")
    if not isinstance(services, dict):
        return []
    return [
        _issue(
            ("services", name),
            "service name must match [a-z0-9][a-z0-9_.-]{0,62} (lowercase, no slashes)",
            positions.of_key(("services", name)),
        )
        for name in services
        if not isinstance(name, str) or not re.match(NAME_PATTERN, name)
    ]


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
        if isinstance(policy.device.gpus, list) and service.gpus:
            for i, gpu in enumerate(service.gpus):
                if gpu not in policy.device.gpus:
                    add((*base, "gpus", i), f"GPU {gpu} is not in device.gpus {policy.device.gpus}")
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
                elif name_used in CAP_PLACEHOLDERS and cap is None:
                    add(path, f"${{{name_used}}} needs services.{name}.memory.cap to be set")
    budget, headroom = policy.device.budget, policy.device.headroom
    if budget is not None and headroom >= budget:
        add(("device", "headroom"), f"must be below device.budget ({format_size(budget)})")
    _window_checks(policy, add, written)
    return issues


def _supports_sleep(service: Service) -> bool:
    from service.adapters import adapter_named, guess_adapter

    adapter = adapter_named(service.adapter) if service.adapter else guess_adapter(service.command)
    return adapter.supports_sleep


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
    """Fill in each service's effective idle TTL (DESIGN section 4's table).

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


def protect_seconds(value: float | str | None, residency: Residency) -> float:
    """``protect`` as seconds: ``math.inf`` for never, the residency default for None."""
    if value == NEVER or residency is Residency.PINNED:
        return math.inf
    if value is None:
        return DEFAULT_PROTECT_S[residency]
    return float(value)


def _issue(path: PathKey, message: str, pos: tuple[int, int] | None) -> PolicyIssue:
    line, col = pos if pos else (None, None)
    return PolicyIssue(format_path(path), message, line, col)


def _sorted_unique(issues: list[PolicyIssue]) -> list[PolicyIssue]:
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.line or 0, i.col or 0, i.path))


def policy_json_schema() -> dict[str, Any]:
    """JSON Schema of the policy file, for editors (``vramd schema``)."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "vramd policy"
    return schema


# Fields whose change alters the process a service runs: applying such a change restarts
# the service at once, drained (DESIGN section 4). Everything else takes effect in place.
RESTART_FIELDS = frozenset({"kind", "command", "env", "cwd", "health", "gpus"})


class ServiceChange(BaseModel):
    name: str
    fields: dict[str, tuple[Any, Any]]
    restart: bool


class PolicyDiff(BaseModel):
    """What applying ``new`` over ``old`` changes, for ``vramd apply`` and the API."""

    added: list[str] = []
    removed: list[str] = []
    changed: list[ServiceChange] = []
    windows_added: list[str] = []
    windows_removed: list[str] = []
    windows_changed: list[str] = []
    settings_changed: list[str] = []

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.added,
                self.removed,
                self.changed,
                self.windows_added,
                self.windows_removed,
                self.windows_changed,
                self.settings_changed,
            )
        )

    def lines(self) -> list[str]:
        """The diff as plain lines: ``+ svc``, ``- svc``, ``~ svc.field: old -> new``."""
        out = [f"+ service {name}" for name in self.added]
        out += [f"- service {name}" for name in self.removed]
        for change in self.changed:
            note = " (restarts, drained)" if change.restart else ""
            out.append(f"~ service {change.name}{note}")
            out += [f"    {key}: {old!r} -> {new!r}" for key, (old, new) in change.fields.items()]
        out += [f"+ window {name}" for name in self.windows_added]
        out += [f"- window {name}" for name in self.windows_removed]
        out += [f"~ window {name}" for name in self.windows_changed]
        out += [f"~ {key}" for key in self.settings_changed]
        return out or ["no changes"]


def diff_policies(old: Policy | None, new: Policy) -> PolicyDiff:
    old_services = old.services if old else {}
    diff = PolicyDiff(
        added=sorted(set(new.services) - set(old_services)),
        removed=sorted(set(old_services) - set(new.services)),
    )
    for name in sorted(set(new.services) & set(old_services)):
        before = old_services[name].model_dump(mode="json")
        after = new.services[name].model_dump(mode="json")
        fields = _changed_fields(before, after)
        if fields:
            top = {key.split(".")[0] for key in fields}
            cap_in_args = any(
                p in CAP_PLACEHOLDERS
                for text in [*new.services[name].command, *new.services[name].env.values()]
                for p in placeholders_in(text)
            )
            restart = bool(top & RESTART_FIELDS) or ("memory.cap" in fields and cap_in_args)
            diff.changed.append(ServiceChange(name=name, fields=fields, restart=restart))
    old_windows = {w.name: w for w in old.maintenance.windows} if old else {}
    new_windows = {w.name: w for w in new.maintenance.windows}
    diff.windows_added = sorted(set(new_windows) - set(old_windows))
    diff.windows_removed = sorted(set(old_windows) - set(new_windows))
    diff.windows_changed = sorted(
        name
        for name in set(new_windows) & set(old_windows)
        if new_windows[name] != old_windows[name]
    )
    if old is not None:
        for section in ("server", "device", "defaults"):
            fields = _changed_fields(
                getattr(old, section).model_dump(mode="json"),
                getattr(new, section).model_dump(mode="json"),
            )
            diff.settings_changed += [f"{section}.{key}" for key in fields]
    return diff


def _changed_fields(
    before: dict[str, Any], after: dict[str, Any], prefix: str = ""
) -> dict[str, tuple[Any, Any]]:
    changes: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key != "env":
            changes.update(_changed_fields(a, b, f"{prefix}{key}."))
        elif a != b:
            changes[f"{prefix}{key}"] = (a, b)
    return changes
