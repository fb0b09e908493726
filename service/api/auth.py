"""Keys for ``/v1`` and ``/api``, as FastAPI dependencies (docs/api.md, "Authentication")."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from service.api.errors import rejection_response
from service.errors import InsufficientScope, ModelNotAllowed, Unauthorized
from service.policy import ServerConfig
from service.policy.clients import (
    ALL_SCOPES,
    ANONYMOUS,
    CLIENT_NAME_PATTERN,
    DEFAULT_CLIENT,
    AdminKey,
    Scope,
    may_use,
)
from service.proxy.dialects import Dialect, dialect_for

T = TypeVar("T")
_CLIENT_NAME = re.compile(CLIENT_NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a client request: a configured client, or an unkeyed caller on loopback."""

    name: str
    models: tuple[str, ...] | None = None  # patterns it may use; None: every model
    keyed: bool = False  # named by its key (access and fairness) or by itself (fairness)

    def may_use(self, model: str) -> bool:
        return may_use(self.models, model)

    def check(self, model: str) -> None:
        """ModelNotAllowed (403) unless this caller may use ``model``."""
        if not self.may_use(model):
            raise ModelNotAllowed(
                f"client {self.name!r} may not use model {model!r} "
                f"(server.clients.{self.name}.models: {', '.join(self.models or ())})"
            )

    def check_service(self, service: str, models: Iterable[str]) -> None:
        """``/upstream/{service}``: allowed when the caller may use one of its models."""
        models = list(models)
        if not any(self.may_use(model) for model in models):
            raise ModelNotAllowed(
                f"client {self.name!r} may not use service {service!r} "
                f"(none of its models {', '.join(models)} is in server.clients.{self.name}.models)"
            )

    def named(self, *claims: object) -> Caller:
        """An unkeyed caller under the first name it gave (``X-Vramd-Client``, then the
        OpenAI ``user`` field) that is a valid client name; a keyed one is its key's."""
        if self.keyed:
            return self
        for claimed in claims:
            if isinstance(claimed, str) and _CLIENT_NAME.match(claimed):
                return Caller(claimed)
        return self


OPEN = Caller(ANONYMOUS)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class AuthConfig:
    """The keys that open ``/v1`` and ``/api``; empty means that part is open.

    A client key (``server.api_keys``: the client ``default``; ``server.clients``: a name, the
    models it may use) opens ``/v1``, ``/upstream`` and the Ollama listener, and says who is
    asking: a ``Caller``. An admin key opens ``/api`` with its scopes. The sets are separate
    on purpose: a key handed to an app cannot unload models or rewrite the policy. No keys
    means no check, which the daemon allows only on a loopback address; a caller is then
    named by ``X-Vramd-Client`` or the OpenAI ``user`` field, for fair queues only.

    Keys are held and compared as SHA-256 digests with ``hmac.compare_digest``, every digest
    each time, so a comparison's time says nothing about the key. Neither a key nor the
    ``Authorization`` header is ever logged. The app factory puts an ``AuthConfig`` on
    ``app.state.auth`` (replaced on every apply, so a removed key fails at once); without one
    every guarded route fails closed (500).
    """

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    admin_keys: tuple[str | AdminKey, ...] = field(default=(), repr=False)
    # (key digest in hex, caller) for each of server.clients.
    clients: tuple[tuple[str, Caller], ...] = field(default=(), repr=False)
    _callers: tuple[tuple[bytes, Caller], ...] = field(init=False, repr=False, compare=False)
    _admins: tuple[tuple[bytes, frozenset[Scope], str], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        default = Caller(DEFAULT_CLIENT, keyed=True)
        callers = [(_digest(key), default) for key in self.api_keys]
        callers += [(bytes.fromhex(digest), caller) for digest, caller in self.clients]
        admins = []
        for i, entry in enumerate(self.admin_keys):
            if isinstance(entry, AdminKey):
                name = entry.name or f"admin_keys[{i}]"
                admins.append((bytes.fromhex(entry.digest), frozenset(entry.scopes), name))
            else:
                admins.append((_digest(entry), ALL_SCOPES, f"admin_keys[{i}]"))
        object.__setattr__(self, "_callers", tuple(callers))
        object.__setattr__(self, "_admins", tuple(admins))

    @classmethod
    def from_server(cls, server: ServerConfig) -> AuthConfig:
        clients = tuple(
            (client.digest, Caller(name, _patterns(client.models), keyed=True))
            for name, client in server.clients.items()
        )
        return cls(
            api_keys=tuple(server.api_keys),
            admin_keys=tuple(server.admin_keys),
            clients=clients,
        )

    @property
    def client_names(self) -> tuple[str, ...]:
        """Every configured client, ``default`` first when ``api_keys`` are set."""
        return tuple(dict.fromkeys(caller.name for _, caller in self._callers))

    def caller(self, authorization: str | None) -> Caller | None:
        """The client a bearer key belongs to; ``OPEN`` without keys; None: refused."""
        if not self._callers:
            return OPEN
        return _match(self._callers, authorization)

    def admin_scopes(self, authorization: str | None) -> tuple[frozenset[Scope], str] | None:
        """The scopes and name of an admin key; every scope without keys; None: refused."""
        if not self._admins:
            return ALL_SCOPES, "open"
        return _match([(d, (scopes, name)) for d, scopes, name in self._admins], authorization)

    def api_allows(self, authorization: str | None) -> bool:
        return self.caller(authorization) is not None

    def admin_allows(self, authorization: str | None) -> bool:
        return self.admin_scopes(authorization) is not None


def _patterns(models: list[str] | None) -> tuple[str, ...] | None:
    return tuple(models) if models is not None else None


def _match(entries: Iterable[tuple[bytes, T]], authorization: str | None) -> T | None:
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    # Starlette decodes header bytes as latin-1; this gets the client's bytes back.
    presented = hashlib.sha256(token.encode("latin-1")).digest()
    found: T | None = None
    for digest, value in entries:  # every key, no early exit to time
        if hmac.compare_digest(digest, presented):
            found = value
    return found


def get_auth(request: Request) -> AuthConfig:
    config = getattr(request.app.state, "auth", None)
    if not isinstance(config, AuthConfig):
        raise RuntimeError("app.state.auth is not set: the app factory must set an AuthConfig")
    return config


# Async so that FastAPI runs them on the event loop, not in its thread pool.
async def require_api_key(request: Request) -> Caller:
    """The caller of a client route: its key's client, if keys are set (else 401)."""
    auth = get_auth(request)
    caller = auth.caller(request.headers.get("authorization"))
    if caller is None:
        # Anthropic's clients send their key as ``x-api-key`` (ANTHROPIC_API_KEY).
        api_key = request.headers.get("x-api-key")
        caller = auth.caller("Bearer " + api_key) if api_key is not None else None
    if caller is None:
        raise Unauthorized(
            "missing or invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key')"
        )
    return caller


def scope_for(method: str, path: str) -> Scope:
    """The scope an admin route needs: reads need ``read``, a policy change ``apply``,
    every other change ``operate`` (docs/api.md, "Authentication")."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return Scope.READ
    if path == "/api/policy" or path.startswith("/api/policy/"):
        return Scope.APPLY
    return Scope.OPERATE


async def require_admin_key(request: Request) -> None:
    """Dependency for ``/api``: an admin key with the route's scope, if admin keys are set."""
    found = get_auth(request).admin_scopes(request.headers.get("authorization"))
    if found is None:
        raise Unauthorized("missing or invalid admin key: send 'Authorization: Bearer <key>'")
    scopes, name = found
    needed = scope_for(request.method, request.url.path)
    if needed not in scopes:
        have = ", ".join(sorted(scopes))
        raise InsufficientScope(
            f"admin key {name!r} has the scopes {have}; "
            f"{request.method} {request.url.path} needs {needed!r}"
        )


def install_auth(
    app: FastAPI,
    config: AuthConfig | None = None,
    dialect_of: Callable[[str], Dialect] = dialect_for,
) -> None:
    """Answer ``Unauthorized`` with the challenge header RFC 6750 asks for.

    Registered after ``install_error_handlers``; Starlette picks the handler of the
    closest class, so this one wins over the generic ``RequestRejected`` handler.
    """

    async def on_unauthorized(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Unauthorized)
        reply = rejection_response(exc, dialect_of(request.url.path))
        reply.headers["WWW-Authenticate"] = 'Bearer realm="vramd"'
        return reply

    app.add_exception_handler(Unauthorized, on_unauthorized)
    if config is not None:
        app.state.auth = config
