"""The policy file (docs/policy.md): schema, validation with YAML positions, placeholders.

``load_policy(text)`` is the only way a policy enters vramd. It parses the YAML keeping
positions, merges ``defaults`` into services, validates the whole file with pydantic, runs
the cross-field checks, and raises one ``PolicyError`` listing *every* problem, each
naming its key path and line: ``services.chat.memory.cap (line 14, col 12): ...``.

Extensions to the contract (the contract's form keeps working):
- ``server.max_json_body`` / ``server.max_upload_body``: the request body limits of
  docs/api.md (defaults 4MiB and 64MiB).
- ``server.request_timeout`` (10m) / ``server.stream_idle_timeout`` (5m): when a runtime
  that accepted a request but does not answer gets a 504 ``runtime_timeout``.
- ``defaults`` also accepts ``restart``, ``priority``, ``health``, ``env`` and ``gpus``.
- ``${PYTHON}``: the interpreter running vramd, so a policy can start Python runtimes
  (such as the demo runtime) from the daemon's own virtual environment.

The package is values only: it imports no process, job or HTTP code, so the pure
scheduler and the bench can use it; the maintenance jobs and the adapter registry use its
cron and runtime-name modules (tests/unit/test_policy.py holds the import edges). Its parts::

    schema.py        the pydantic models (Policy, Service, Window, ...) and field checks
    clients.py       clients, their keys and models, and admin keys with scopes
    load.py          load_policy: YAML text -> Policy, line-numbered errors, cross checks
    diff.py          diff_policies, PolicyDiff: what applying a policy changes
    protect.py       protect values: never or a duration, and the residency defaults
    starvation.py    the lower priorities a ``protect: never`` can starve (vramd check)
    placeholders.py  ${PORT}, ${CAP_MIB}, ...: the known names and their expansion
    yamlpos.py       YAML to plain Python, remembering the line and column of every key
    cron.py          cron lines and time zones: checked, and asked for their next firing
    routes.py        which client routes each kind of service answers, and where
    runtime_names.py the runtimes vramd knows by name, and which one a command line runs
"""

from service.policy.cron import check_cron
from service.policy.diff import (
    RESTART_FIELDS,
    PolicyDiff,
    ServiceChange,
    diff_policies,
    process_identity,
)
from service.policy.load import load_policy
from service.policy.placeholders import (
    CAP_PLACEHOLDERS,
    PLACEHOLDERS,
    expand_placeholders,
    placeholders_in,
)
from service.policy.protect import (
    DEFAULT_PROTECT_S,
    NEVER,
    Protect,
    ProtectValue,
    parse_protect,
    protect_seconds,
)
from service.policy.schema import (
    MAX_WINDOW_S,
    NAME_PATTERN,
    Defaults,
    DeviceConfig,
    Duration,
    GpuIndex,
    Maintenance,
    MemoryConfig,
    ModelName,
    Name,
    Policy,
    QueueConfig,
    RestartConfig,
    ServerConfig,
    Service,
    Size,
    Window,
    policy_json_schema,
)
from service.policy.starvation import starvation_warnings

__all__ = [
    "CAP_PLACEHOLDERS",
    "DEFAULT_PROTECT_S",
    "MAX_WINDOW_S",
    "NAME_PATTERN",
    "NEVER",
    "PLACEHOLDERS",
    "RESTART_FIELDS",
    "Defaults",
    "DeviceConfig",
    "Duration",
    "GpuIndex",
    "Maintenance",
    "MemoryConfig",
    "ModelName",
    "Name",
    "Policy",
    "PolicyDiff",
    "Protect",
    "ProtectValue",
    "QueueConfig",
    "RestartConfig",
    "ServerConfig",
    "Service",
    "ServiceChange",
    "Size",
    "Window",
    "check_cron",
    "diff_policies",
    "expand_placeholders",
    "load_policy",
    "parse_protect",
    "placeholders_in",
    "policy_json_schema",
    "process_identity",
    "protect_seconds",
    "starvation_warnings",
]
