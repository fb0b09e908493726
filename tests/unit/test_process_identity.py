"""A service's process identity (``policy.process_identity``) changes exactly when
applying the change would restart the service: what a daemon compares before adopting a
runtime another daemon left, and what the policy diff restarts for, are one rule."""

from __future__ import annotations

from typing import Any

import pytest

from service.policy import diff_policies, load_policy, process_identity

BASE: dict[str, Any] = {
    "kind": "chat",
    "models": ["m", "m2"],
    "command": ["llama-server", "--port", "${PORT}", "-m", "${MODEL}", "--mem", "${CAP_MIB}"],
    "memory": {"estimate": "1GiB", "cap": "2GiB"},
    "priority": 100,
}


def policy(**changes: Any) -> Any:
    import json

    service = {**BASE, **changes}
    lines = ["version: 1", "device: {backend: host}", "services:", f"  chat: {json.dumps(service)}"]
    return load_policy("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("changes", "restarts"),
    [
        ({"priority": 300}, False),
        ({"idle_ttl": "30m"}, False),
        ({"queue": {"max": 3}}, False),
        ({"command": [*BASE["command"], "--threads", "4"]}, True),
        ({"env": {"HF_HOME": "/x"}}, True),
        ({"cwd": "/tmp"}, True),
        ({"memory": {"estimate": "1GiB", "cap": "3GiB"}}, True),  # ${CAP_MIB} carries it
        ({"memory": {"estimate": "2GiB", "cap": "2GiB"}}, False),  # the estimate is not
        ({"models": ["other", "m2"]}, True),  # ${MODEL} is the first model
        ({"models": ["m", "other"]}, False),
    ],
)
def test_identity_changes_exactly_when_the_diff_restarts(
    changes: dict[str, Any], restarts: bool
) -> None:
    old, new = policy(), policy(**changes)
    diff = diff_policies(old, new)
    assert [c.restart for c in diff.changed] == [restarts]
    changed = process_identity(old.services["chat"]) != process_identity(new.services["chat"])
    assert changed is restarts


def test_identity_is_stable_across_loads_of_the_same_text() -> None:
    assert process_identity(policy().services["chat"]) == process_identity(
        policy().services["chat"]
    )
