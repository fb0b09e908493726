"""Who may use the box: clients with keys scoped to models, and admin keys with scopes.

A client (``server.clients``) is a name, its key (as a SHA-256 digest, or plain), the
models it may use (names or shell patterns) and its weight in fair queues; keys in
``server.api_keys`` are the client ``default``, which may use every model. An admin key
is a plain key (every scope) or a mapping naming its scopes (docs/policy.md, "Clients
and keys").
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Annotated, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    model_validator,
)

DEFAULT_CLIENT = "default"
ANONYMOUS = "anonymous"  # a caller no key names and that did not name itself
CLIENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

ClientName = Annotated[StrictStr, Field(pattern=CLIENT_NAME_PATTERN)]
Key = Annotated[StrictStr, Field(min_length=8)]
ModelPattern = Annotated[
    StrictStr, Field(min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f]+$")
]


class Scope(enum.StrEnum):
    """What an admin key may do on ``/api``."""

    READ = "read"  # ps, events, explain, usage, policy and history
    OPERATE = "operate"  # load, unload, restart, maintenance windows
    APPLY = "apply"  # policy apply and rollback


ALL_SCOPES = frozenset(Scope)


def key_digest(key: str) -> str:
    """The SHA-256 of a key in hex: what ``key_sha256`` holds."""
    return hashlib.sha256(key.encode()).hexdigest()


class _Keyed(BaseModel):
    """A key given as its digest (``key_sha256``) or, with a warning, plainly (``key``)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    key_sha256: StrictStr | None = Field(default=None, repr=False)
    key: Key | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _one_key(self) -> Self:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("set exactly one of key_sha256 (preferred) or key")
        if self.key_sha256 is not None and not _DIGEST.match(self.key_sha256):
            raise ValueError(
                "key_sha256 must be the key's SHA-256 as 64 lowercase hex digits "
                "(printf %s KEY | sha256sum)"
            )
        return self

    @property
    def digest(self) -> str:
        if self.key_sha256 is not None:
            return self.key_sha256
        assert self.key is not None
        return key_digest(self.key)


class Client(_Keyed):
    """One client of ``/v1`` (and the Ollama listener, and ``/upstream``)."""

    # Model names or shell patterns (``chat-*``); None: every model, present and future.
    models: list[ModelPattern] | None = None
    # The most of its requests one service holds at once, in flight or waiting.
    max_concurrency: Annotated[StrictInt, Field(ge=1, le=10_000)] | None = None
    # Its weight in fair queues: a client of share 2 is served twice as often as one of 1.
    share: Annotated[float, Field(ge=0.01, le=1000)] = 1.0

    def may_use(self, model: str) -> bool:
        return may_use(self.models, model)


class AdminKey(_Keyed):
    """An admin key with the scopes it opens; a plain string in ``admin_keys`` opens all."""

    name: ClientName | None = None
    scopes: Annotated[list[Scope], Field(min_length=1)] = [Scope.READ]


def _admin_form(value: object) -> str:
    # A mapping when validated, an ``AdminKey`` when serialized (diffs, model_dump).
    return "admin_key[plain]" if isinstance(value, str) else "admin_key[scoped]"


# An entry of ``server.admin_keys``: a plain key (every scope) or a mapping. Tagged, so an
# error names the one form the entry was written in, not both. (Branch names with "[" are
# left out of error paths by the loader.)
AdminKeyEntry = Annotated[
    Annotated[Key, Tag("admin_key[plain]")] | Annotated[AdminKey, Tag("admin_key[scoped]")],
    Discriminator(_admin_form),
]


def key_warnings(clients: dict[str, Client], admin_keys: list[str | AdminKey]) -> list[str]:
    """Keys written plainly in the policy file (``vramd check`` warns: use digests)."""
    plain = [f"server.clients.{name}" for name, c in clients.items() if c.key is not None]
    plain += [
        f"server.admin_keys[{i}]"
        for i, k in enumerate(admin_keys)
        if isinstance(k, AdminKey) and k.key is not None
    ]
    return [
        f"{where}: key is written plainly; store its SHA-256 as key_sha256 instead "
        "(printf %s KEY | sha256sum), so the policy file and its stored versions never hold it"
        for where in plain
    ]


def unmatched_patterns(clients: dict[str, Client], models: list[str]) -> list[str]:
    """Model patterns of a client that match no model of the policy (likely a typo)."""
    return [
        f"server.clients.{name}.models: {pattern!r} matches no model of this policy"
        for name, client in clients.items()
        for pattern in client.models or ()
        if not any(fnmatchcase(model, pattern) for model in models)
    ]


def may_use(patterns: Sequence[str] | None, model: str) -> bool:
    """Whether a client's model patterns allow ``model`` (None: everything)."""
    return patterns is None or any(fnmatchcase(model, pattern) for pattern in patterns)


__all__ = [
    "ALL_SCOPES",
    "ANONYMOUS",
    "CLIENT_NAME_PATTERN",
    "DEFAULT_CLIENT",
    "AdminKey",
    "AdminKeyEntry",
    "Client",
    "ClientName",
    "Scope",
    "key_digest",
    "key_warnings",
    "may_use",
    "unmatched_patterns",
]
