"""A hand-over (SIGUSR2) needs the runtimes and the new daemon to outlive the old one: under
a container's init, which exits with its one child and ends the container, it cannot."""

from __future__ import annotations

import pytest

from service.handover import CONTAINER_INITS, hand_over_blocked


@pytest.mark.parametrize("init", sorted(CONTAINER_INITS))
def test_a_daemon_under_a_container_init_refuses_to_hand_over_naming_the_init(init: str) -> None:
    assert init in hand_over_blocked(pid=42, parent_name=init)


def test_a_daemon_that_is_pid_1_refuses_to_hand_over() -> None:
    assert "pid 1" in hand_over_blocked(pid=1, parent_name="")


@pytest.mark.parametrize("parent", ["systemd", "bash", "python3", ""])
def test_a_daemon_under_systemd_or_a_shell_may_hand_over(parent: str) -> None:
    assert hand_over_blocked(pid=4242, parent_name=parent) == ""
