"""``${NAME}`` placeholders in a service's command, env and health path.

vramd fills them in when it launches a process (``supervisor.launch.launch_args``); the
policy loader only checks that each name is known and that the ``CAP_*`` ones have a
``memory.cap`` to take their value from. ``diff_policies`` reads them too: a cap change
restarts a service whose arguments carry the cap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PLACEHOLDERS = frozenset(
    {
        "PORT",
        "SERVICE",
        "MODEL",
        "GPU",
        "CAP_BYTES",
        "CAP_MIB",
        "CAP_FRACTION",
        "PYTHON",
        "STATE_DIR",
    }
)
CAP_PLACEHOLDERS = frozenset({"CAP_BYTES", "CAP_MIB", "CAP_FRACTION"})
_PLACEHOLDER_RE = re.compile(r"\$\{([^}]*)\}")


def placeholders_in(text: str) -> list[str]:
    return _PLACEHOLDER_RE.findall(text)


def expand_placeholders(text: str, values: Mapping[str, str]) -> str:
    """Substitute ``${NAME}`` from ``values``; unknown names are left as written."""
    return _PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)
