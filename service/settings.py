"""Typed daemon settings: ``VRAMD_*`` environment variables, overridden by CLI flags.

Built where they are needed (the CLI, ``create_app``), never as a module-level instance,
so tests construct exactly the settings they mean. Host, port and database fall back to
the policy's ``server`` section, then to the built-in defaults: CLI flag > environment >
policy file > default.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from service.policy import Policy

DEFAULT_URL = "http://127.0.0.1:8400"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VRAMD_", extra="ignore")

    config: Path = Path("config/vramd.yaml")
    db: Path | None = None
    host: str | None = None
    port: int | None = None
    log_level: str = "info"
    # Seconds the daemon waits for a stopped instance's memory to be released.
    settle_timeout: float = 10.0
    # The watchdog reports the event loop as blocked after this long without a beat.
    watchdog_stall_s: float = 10.0
    # /healthz fails when memory samples are this late (or 5 sample intervals, if more).
    liveness_grace_s: float = 15.0
    # Creep detection's warm-up, 20 requests and 60 s after ready (docs/operations.md,
    # ``creeping``).
    creep_min_requests: int = 20
    creep_min_age_s: float = 60.0
    # How many samples after warm-up creep detection needs before it may judge.
    creep_min_samples: int = 30
    # On SIGTERM, leave ready runtimes running for the next daemon (``--keep-runtimes``;
    # the policy's ``server.keep_runtimes_on_exit`` does the same).
    keep_runtimes: bool = False
    # Taking over from a running daemon (``--replace``): set by ``vramd serve``.
    replacing: bool = False


class ClientSettings(BaseSettings):
    """What the client commands (``vramd ps`` ...) need to reach a daemon."""

    model_config = SettingsConfigDict(env_prefix="VRAMD_", extra="ignore")

    url: str = DEFAULT_URL
    admin_key: str | None = None


@dataclass(frozen=True)
class ServerAddress:
    host: str
    port: int
    database: Path


def server_address(settings: Settings, policy: Policy) -> ServerAddress:
    """Where to listen and which database to use, by the precedence in the docstring."""
    return ServerAddress(
        host=settings.host or policy.server.host,
        port=settings.port or policy.server.port,
        database=settings.db or Path(policy.server.database),
    )


def refuse_unsafe_bind(host: str, policy: Policy) -> str | None:
    """A message when listening on ``host`` would expose an unauthenticated API."""
    if _is_loopback(host) or (policy.server.keyed and policy.server.admin_keys):
        return None
    return (
        f"refusing to listen on {host}: it is reachable from other machines, and "
        "client keys (server.api_keys or server.clients) and server.admin_keys must both "
        "be set in the policy first "
        "(or listen on 127.0.0.1)"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
