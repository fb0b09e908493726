"""The policy's pydantic models: the shape of every section, and per-field validation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

from service.domain import OnCap, Residency, ServiceKind, Yielding
from service.policy.clients import AdminKeyEntry, Client, Key
from service.policy.cron import check_cron, check_timezone
from service.policy.protect import Protect
from service.policy.routes import check_route_map, route_table
from service.policy.runtime_names import canonical_name, guess_name
from service.units import DURATION_HINT, SIZE_HINT, parse_duration, parse_size

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_WINDOW_S = 31 * 86400.0  # a maintenance window longer than a month is a mistake

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
Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN)]
ModelName = Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f]+$")]
GpuIndex = Annotated[StrictInt, Field(ge=0, le=63)]


def _url_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be a URL path starting with '/', got {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class OllamaConfig(_Strict):
    """An Ollama-compatible listener beside the main one (same host, keys and scheduler)."""

    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 11434


class ServerConfig(_Strict):
    host: StrictStr = "127.0.0.1"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 8400
    database: StrictStr = "data/vramd.db"
    # The client "default": may use every model (docs/policy.md, "Clients and keys").
    api_keys: list[Key] = []
    # A plain key opens every scope; {key_sha256, scopes: [read, operate, apply]} fewer.
    admin_keys: list[AdminKeyEntry] = []
    # Names are dict keys, which pydantic does not pattern-check: load.py checks them.
    clients: dict[StrictStr, Client] = {}
    max_json_body: Size = 4 * 1024**2
    max_upload_body: Size = 64 * 1024**2
    # How long a runtime may take to start answering a request (504 runtime_timeout
    # after), and the longest silence allowed once a (streamed) answer has started.
    request_timeout: Annotated[Duration, Field(gt=0)] = 600.0
    stream_idle_timeout: Annotated[Duration, Field(gt=0)] = 300.0
    # Off unless set; read when the daemon starts (a change needs a restart).
    ollama: OllamaConfig | None = None
    # On SIGTERM, leave every ready runtime running for the next daemon to adopt instead
    # of stopping it (docs/operations.md, "Restarts and upgrades"); also --keep-runtimes.
    keep_runtimes_on_exit: StrictBool = False

    @property
    def client_names(self) -> tuple[str, ...]:
        """The clients keys name: ``default`` (``api_keys``) and each of ``clients``."""
        return (*(["default"] if self.api_keys else []), *self.clients)

    @property
    def keyed(self) -> bool:
        """Whether ``/v1`` needs a key: ``api_keys`` or any client is set."""
        return bool(self.api_keys or self.clients)


class DeviceConfig(_Strict):
    backend: Literal["auto", "nvml", "amdsmi", "host"] = "auto"
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
    # A span: N instance's share of its need and cap per device, in the order of the
    # devices chosen (lowest index first); None: even. Checked against span in load.py.
    split: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Field(min_length=2)] | None = None

    @field_validator("split")
    @classmethod
    def _sums_to_one(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(f"shares must add up to 1 (these add up to {sum(value):g})")
        return value


class StateConfig(_Strict):
    """Keep a llama.cpp runtime's prompt cache across the stops vramd chooses
    (docs/policy.md, "State across swaps"); ``disk`` bounds the bytes kept on disk."""

    disk: Annotated[Size, Field(gt=0)] = 4 * 1024**3


# How a service's queue picks the next request: in turn by client (deficit round robin
# weighted by share), or first come first served (docs/policy.md, "Fair queues").
Fairness = Literal["fair", "fifo"]


class Defaults(_Strict):
    startup_timeout: Annotated[Duration, Field(gt=0)] = 120.0
    stop_timeout: Duration = 15.0
    idle_ttl: Duration = 900.0
    max_concurrency: Annotated[StrictInt, Field(ge=1, le=10_000)] = 4
    queue: QueueConfig = QueueConfig()
    fairness: Fairness = "fair"
    yielding: Yielding = Yielding.AUTO
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


class Service(_Strict):
    kind: ServiceKind
    models: Annotated[list[ModelName], Field(min_length=1)]
    command: Annotated[list[StrictStr], Field(min_length=1)]
    env: dict[StrictStr, StrictStr] = {}
    cwd: StrictStr | None = None
    health: StrictStr = "/health"
    metrics: StrictStr | None = None
    upstream_model: StrictStr | None = None
    # Client route -> runtime path, over the kind's routes and the adapter's defaults;
    # null: the service does not serve that route (service.routes).
    routes: dict[StrictStr, StrictStr | None] = {}
    # Request fields set (over the client's) for requests naming one of its models: one
    # loaded runtime, several configurations by name (llama-swap's setParamsByID).
    set_params: dict[ModelName, dict[StrictStr, Any]] = {}
    # Which runtime this is (health path, metrics, out-of-memory lines); guessed from
    # the command when unset. One of: llama.cpp, llama-cpp-python, vllm, whisper.cpp,
    # sd.cpp, tei, piper, openai.
    adapter: StrictStr | None = None
    # vLLM sleep mode (server started with --enable-sleep-mode, VLLM_SERVER_DEV_MODE=1):
    # evict by putting it to sleep (weights to host memory) and wake it for a request.
    sleep: StrictBool = False
    # Save the slots' prompt cache before every stop vramd chooses and restore it after
    # the next start (llama.cpp only; the command needs --slot-save-path ${STATE_DIR}).
    state: StateConfig | None = None
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
    fairness: Fairness = "fair"
    # How readily it yields early when idle and protected (docs/policy.md, "Yielding").
    yielding: Yielding = Yielding.AUTO
    gpus: list[GpuIndex] | None = None
    # One instance on this many devices at once (tensor or layer split): docs/policy.md,
    # "Multi-GPU placement".
    span: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    startup_timeout: Annotated[Duration, Field(gt=0)] = 120.0
    stop_timeout: Duration = 15.0
    restart: RestartConfig = RestartConfig()

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str | None) -> str | None:
        if value is not None:
            canonical_name(value)  # ValueError naming the known runtimes
        return value

    @field_validator("health", "metrics")
    @classmethod
    def _is_path(cls, value: str | None) -> str | None:
        return None if value is None else _url_path(value)

    @field_validator("routes")
    @classmethod
    def _known_routes(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        return check_route_map(value)

    @property
    def adapter_name(self) -> str:
        """The runtime's adapter name: the policy's ``adapter``, else guessed from argv."""
        return canonical_name(self.adapter) if self.adapter else guess_name(self.command)

    @property
    def shares(self) -> tuple[float, ...]:
        """Each device's share of the instance's need and cap, in device order."""
        split = self.memory.split
        return tuple(split) if split is not None else (1.0 / self.span,) * self.span

    def route_table(self) -> Mapping[str, str]:
        """Every client route this service serves -> the path its runtime answers it at."""
        return route_table(self.kind, self.adapter_name, self.routes, self.command)

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
        check_timezone(value)
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


def policy_json_schema() -> dict[str, Any]:
    """JSON Schema of the policy file, for editors (``vramd schema``)."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "vramd policy"
    return schema
