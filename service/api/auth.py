"""Bearer keys for ``/v1`` and ``/api``, as FastAPI dependencies (docs/api.md, "Authentication").

``server.api_keys`` open ``/v1``; ``server.admin_keys`` open ``/api``. The two sets are
separate on purpose: a key handed to an app cannot unload models or rewrite the policy,
and an operator's key is not spread into app configs. An empty list means no check,
which ``create_app`` allows only on a loopback address.

Keys are kept and compared as SHA-256 digests with ``hmac.compare_digest``: the digests
have one length, so a comparison's time says nothing about the key, and no plain key is
held by this module. Neither a key nor the ``Authorization`` header is ever logged.

The app factory puts an ``AuthConfig`` on ``app.state.auth`` (replacing it when a new
policy changes the keys) and calls ``install_auth`` once, which answers 401 with
``WWW-Authenticate: Bearer``. Without an ``AuthConfig`` every guarded route fails
closed (500), rather than open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import Response

from service.api.errors import rejection_response
from service.errors import Unauthorized
from service.policy import ServerConfig
from service.proxy.dialects import Dialect, dialect_for


def _digests(keys: Iterable[str]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(key.encode()).digest() for key in keys)


@dataclass(frozen=True)
class AuthConfig:
    """The keys that open ``/v1`` and ``/api``; empty means that part is open."""

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    _api: tuple[bytes, ...] = field(init=False, repr=False, compare=False)
    _admin: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_api", _digests(self.api_keys))
        object.__setattr__(self, "_admin", _digests(self.admin_keys))

    @classmethod
    def from_server(cls, server: ServerConfig) -> AuthConfig:
        return cls(api_keys=tuple(server.api_keys), admin_keys=tuple(server.admin_keys))

    def api_allows(self, authorization: str | None) -> bool:
        return _allows(self._api, authorization)

    def admin_allows(self, authorization: str | None) -> bool:
        return _allows(self._admin, authorization)


def _allows(digests: tuple[bytes, ...], authorization: str | None) -> bool:
    if not digests:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return False
    # Starlette decodes header bytes as latin-1; this gets the client's bytes back.
    presented = hashlib.sha256(token.encode("latin-1")).digest()
    matched = False
    for digest in digests:  # every key, not any(): no early exit to time
        matched |= hmac.compare_digest(digest, presented)
    return matched


def get_auth(request: Request) -> AuthConfig:
    config = getattr(request.app.state, "auth", None)
    if not isinstance(config, AuthConfig):
        raise RuntimeError("app.state.auth is not set: the app factory must set an AuthConfig")
    return config


# Async so that FastAPI runs them on the event loop, not in its thread pool.
async def require_api_key(request: Request) -> None:
    """Dependency for ``/v1``: a valid ``Authorization: Bearer`` API key, if keys are set."""
    auth = get_auth(request)
    if auth.api_allows(request.headers.get("authorization")):
        return
    # Anthropic's clients send their key as ``x-api-key`` (ANTHROPIC_API_KEY).
    api_key = request.headers.get("x-api-key")
    if api_key is None or not auth.api_allows("Bearer " + api_key):
        raise Unauthorized(
            "missing or invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key')"
        )


async def require_admin_key(request: Request) -> None:
    """Dependency for ``/api``: a valid admin key, if admin keys are set."""
    if not get_auth(request).admin_allows(request.headers.get("authorization")):
        raise Unauthorized("missing or invalid admin key: send 'Authorization: Bearer <key>'")


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
