"""What the image provides, read from the Dockerfile or from a built image, in one shape.

``make test`` holds the compose file, the unit and the DaemonSet to ``from_dockerfile()``
(tests/process/test_deploy.py); ``make test-image`` holds the built image to the same
facts (tests/image/test_image.py), so all of them agree with what was built.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


@dataclass(frozen=True)
class ImageFacts:
    env: dict[str, str]  # VRAMD_* only: the settings the image gives the daemon
    user: str
    uid: int
    volumes: frozenset[str]
    port: int
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @classmethod
    def from_config(cls, config: dict[str, Any], uid: int) -> ImageFacts:
        """From a built image's config (docker inspect's Config, buildah's Docker.config)."""
        env = dict(item.split("=", 1) for item in config.get("Env") or [])
        (port,) = (int(p.split("/")[0]) for p in config.get("ExposedPorts") or {})
        return cls(
            env={k: v for k, v in env.items() if k.startswith("VRAMD_")},
            user=config["User"],
            uid=uid,
            volumes=frozenset(config.get("Volumes") or {}),
            port=port,
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
        )


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def from_dockerfile(path: Path = DOCKERFILE) -> ImageFacts:
    """The final stage's facts, as the Dockerfile states them."""
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    final = instructions[last_from:]
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    facts: dict[str, Any] = {}
    for word, rest in final:
        if word == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
        elif word == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(rest))
        elif word == "USER":
            facts["user"] = rest
        elif word == "VOLUME":
            facts["volumes"] = frozenset(_json_list(rest))
        elif word == "EXPOSE":
            facts["port"] = int(rest.split("/")[0])
        elif word == "ENTRYPOINT":
            facts["entrypoint"] = tuple(_json_list(rest))
        elif word == "CMD":
            facts["cmd"] = tuple(_json_list(rest))
    return ImageFacts(
        env={k: v for k, v in env.items() if k.startswith("VRAMD_")},
        uid=int(args["VRAMD_UID"]),
        **facts,
    )


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list), text
    return [str(item) for item in value]
