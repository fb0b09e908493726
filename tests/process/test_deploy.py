"""The deployment files say what docs/deployment.md promises.

docker-compose.yml and the Dockerfile are checked structurally (there is no Docker
engine in CI), and with ``docker compose config`` where the compose plugin is installed;
the systemd unit is parsed, and checked with ``systemd-analyze verify`` where available.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from support.deployment import dockerfile_instructions, from_dockerfile

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DAEMONSET = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
IMAGE = "localhost/vramd:latest"  # what make image tags
UNIT = REPO / "deploy" / "vramd.service"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def vramd_service() -> dict[str, Any]:
    service: dict[str, Any] = compose()["services"]["vramd"]
    return service


def unit() -> configparser.ConfigParser:
    # strict=False: systemd allows repeated keys (Environment=), which configparser
    # then keeps the last of; interpolation off for $MAINPID.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def unit_values(section: str, key: str) -> list[str]:
    """Every value of a key that may repeat (configparser keeps only the last)."""
    values, current = [], None
    for line in UNIT.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]")
        elif current == section and stripped.startswith(f"{key}="):
            values.append(stripped.split("=", 1)[1])
    return values


# --- docker compose ----------------------------------------------------------------------


def test_compose_reserves_the_nvidia_gpus() -> None:
    devices = vramd_service()["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_compose_publishes_the_port_on_loopback_only() -> None:
    ports = vramd_service()["ports"]
    assert ports, "the port is published"
    for port in ports:
        assert str(port).startswith("127.0.0.1:"), f"{port} would be reachable from outside"


def test_compose_shares_the_host_pid_namespace_for_nvml() -> None:
    assert vramd_service()["pid"] == "host"


def test_compose_keeps_config_and_data_in_volumes() -> None:
    service = vramd_service()
    targets = {str(volume).split(":")[1] for volume in service["volumes"]}
    assert "/etc/vramd/vramd.yaml" in targets
    assert "/var/lib/vramd" in targets
    assert "vramd-data" in compose()["volumes"]
    environment = service["environment"]
    assert environment["VRAMD_DB"].startswith("/var/lib/vramd/")


def test_compose_gives_the_daemon_time_to_stop_its_runtimes() -> None:
    grace = vramd_service()["stop_grace_period"]
    match = re.fullmatch(r"(\d+)([sm])", grace)
    assert match, grace
    seconds = int(match[1]) * (60 if match[2] == "m" else 1)
    assert seconds >= 60, "Docker's default 10 s SIGKILLs runtimes mid-stop"


def test_docker_compose_config_accepts_the_file() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    done = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"pid": "host"' in done.stdout


# --- Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_is_multi_stage() -> None:
    stages = [args for word, args in dockerfile_instructions() if word == "FROM"]
    assert len(stages) >= 2
    assert any(" AS " in stage.upper() for stage in stages)
    assert any(
        word == "COPY" and "--from=build" in args for word, args in dockerfile_instructions()
    )


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [args for word, args in dockerfile_instructions() if word == "USER"]
    assert users, "no USER instruction: the daemon would run as root"
    assert users[-1] not in ("root", "0", "0:0")


def test_dockerfile_health_checks_healthz() -> None:
    checks = [args for word, args in dockerfile_instructions() if word == "HEALTHCHECK"]
    assert len(checks) == 1
    assert "/healthz" in checks[0]


def test_dockerfile_declares_config_and_data_volumes() -> None:
    volumes = " ".join(args for word, args in dockerfile_instructions() if word == "VOLUME")
    assert "/etc/vramd" in volumes and "/var/lib/vramd" in volumes


# --- systemd ------------------------------------------------------------------------------


def test_unit_restarts_on_failure_and_lets_vramd_stop_its_runtimes() -> None:
    service = unit()["Service"]
    assert service["Restart"] == "on-failure"
    # process: a crash or restart of the daemon leaves its runtimes for the next one.
    assert service["KillMode"] == "process"
    assert (service["Type"], service["NotifyAccess"]) == ("notify", "all")
    stop = re.fullmatch(r"(\d+)s?", service["TimeoutStopSec"])
    assert stop and int(stop[1]) >= 60, "longer than a runtime's stop timeout + settle"


def test_unit_keeps_sqlite_in_its_state_directory() -> None:
    service = unit()["Service"]
    assert service["StateDirectory"] == "vramd"
    environment = dict(value.split("=", 1) for value in unit_values("Service", "Environment"))
    assert environment["VRAMD_DB"] == "/var/lib/vramd/vramd.db"


def test_unit_reload_hands_over_to_a_new_daemon_with_sigusr2() -> None:
    service = unit()["Service"]
    assert service["ExecReload"] == "/bin/kill -USR2 $MAINPID"
    assert service["ExecStart"].startswith("/opt/vramd/bin/vramd serve --config /etc/vramd/")


def test_unit_runs_as_a_dedicated_user_and_keeps_gpu_devices_visible() -> None:
    service = unit()["Service"]
    assert service["User"] == "vramd"
    assert "PrivateDevices" not in service, "it would hide /dev/nvidia*"
    assert int(service["LimitNOFILE"]) >= 4096
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify insists that ExecStart exists: point it at a stand-in for /opt/vramd/bin/vramd.
    stand_in = tmp_path / "vramd"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    copy = tmp_path / "vramd.service"
    copy.write_text(UNIT.read_text().replace("/opt/vramd/bin/vramd", str(stand_in)))
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # Unknown keys and bad values are warnings (exit 0) naming the file; outside a booted
    # systemd (containers, CI) verify may also fail on the host's own units: not ours.
    problems = [line for line in (done.stdout + done.stderr).splitlines() if copy.name in line]
    assert not problems, "\n".join(problems)


# --- each file agrees with the image --------------------------------------------------------


def daemonset_pod() -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    return pod


def test_compose_runs_the_image_make_image_builds_with_its_settings_port_and_volumes() -> None:
    image = from_dockerfile()
    service = vramd_service()
    assert service["image"] == IMAGE
    # It may restate the image's settings beside its mounts, never change them.
    assert service["environment"].items() <= image.env.items()
    (port,) = service["ports"]
    assert int(str(port).rsplit(":", 1)[1]) == image.port
    for mount in service["volumes"]:
        target = PurePosixPath(str(mount).split(":")[1])
        if str(target).startswith(("/etc/vramd", "/var/lib/vramd")):
            assert any(target.is_relative_to(v) for v in image.volumes), target
    assert image.env["VRAMD_CONFIG"] in {str(m).split(":")[1] for m in service["volumes"]}


def test_daemonset_runs_the_images_user_with_its_settings_and_volumes() -> None:
    image = from_dockerfile()
    pod = daemonset_pod()
    (init,) = pod["initContainers"]
    (vramd,) = pod["containers"]
    assert vramd["image"].rsplit("/", 1)[1] == init["image"].rsplit("/", 1)[1] == "vramd:latest"
    assert {e["name"]: e["value"] for e in vramd["env"]}.items() <= image.env.items()
    context = vramd["securityContext"]
    assert context["runAsUser"] == context["runAsGroup"] == image.uid
    assert init["command"] == ["chown", f"{image.uid}:{image.uid}", "/var/lib/vramd"]
    mounts = {m["mountPath"] for m in vramd["volumeMounts"]}
    assert image.volumes <= mounts
    assert [p["containerPort"] for p in vramd["ports"]] == [image.port]
    # No command: the image's entrypoint (tini) and CMD run.
    assert "command" not in vramd and "args" not in vramd


def test_unit_keeps_the_database_where_the_image_does() -> None:
    environment = dict(value.split("=", 1) for value in unit_values("Service", "Environment"))
    assert environment["VRAMD_DB"] == from_dockerfile().env["VRAMD_DB"]


def test_the_image_starts_vramd_under_tini_as_the_vramd_user() -> None:
    image = from_dockerfile()
    assert image.user == "vramd"
    assert image.entrypoint[0] == "tini" and "-s" in image.entrypoint
    assert image.cmd[:2] == ("vramd", "serve")
