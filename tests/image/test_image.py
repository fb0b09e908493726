"""The image, run as a container and checked from outside (``make test-image``).

``make test-image`` builds ``localhost/vramd:latest`` and ``localhost/vramd-runtimes:latest``
(``deploy/image/build --runtimes``) and then runs these: each starts the image with the
engine the machine has (tests/support/container.py), publishes the daemon's port on
loopback, mounts a policy read-only at /etc/vramd/vramd.yaml and a host folder as the
/var/lib/vramd volume, and talks to it over HTTP as a user's app would. ``make test``
never runs them (marker ``image``); without a built image or an engine they skip.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from support.container import Container, Engine, Mount, container_engine
from support.deployment import ImageFacts, from_dockerfile
from support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IMAGE", "localhost/vramd:latest")
RUNTIMES_IMAGE = os.environ.get("RUNTIMES_IMAGE", "localhost/vramd-runtimes:latest")
POLICY = "/etc/vramd/vramd.yaml"
DATA = "/var/lib/vramd"
API_KEY = "sk-image-test-apps"
ADMIN_KEY = "adm-image-test-ops"
HEALTHY_WITHIN_S = 30.0
# The runtimes image's llama-server, by name, on the tiny model it ships for smoke tests.
LLAMA_SERVER = [
    "llama-server",
    "--model",
    "/opt/runtimes/models/chat.gguf",
    "--host",
    "127.0.0.1",
    "--port",
    "${PORT}",
    "--alias",
    "${MODEL}",
    "--ctx-size",
    "256",
    "--threads",
    "2",
]


def compose_grace_s() -> float:
    """docker-compose.yml's stop_grace_period: what a stop may take before SIGKILL."""
    grace = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["vramd"][
        "stop_grace_period"
    ]
    return float(grace[:-1]) * (60 if grace.endswith("m") else 1)


@pytest.fixture(scope="module")
def engine() -> Engine:
    found = container_engine()
    if found is None:
        pytest.skip("no container engine: neither a Docker engine nor buildah (make image)")
    try:
        found.image_config(IMAGE)
    except RuntimeError:
        pytest.skip(f"{IMAGE} is not built here: make image")
    return found


def demo_policy(path: Path) -> Path:
    """config/demo.yaml with keys (the daemon listens on 0.0.0.0 in the container) and
    no database path of its own (the image's VRAMD_DB puts it in the volume)."""
    policy = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    policy["server"].pop("database", None)
    policy["server"]["api_keys"] = [API_KEY]
    policy["server"]["admin_keys"] = [ADMIN_KEY]
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    path.chmod(0o644)
    return path


def volume(tmp_path: Path, uid: int) -> Path:
    """A host folder for /var/lib/vramd, owned by the image's user as a fresh named
    volume would be (a bind mount keeps the host's ownership)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    try:
        os.chown(data, uid, uid)
    except PermissionError:  # not root (docker's group): open it to everyone instead
        data.chmod(0o777)
    return data


def image_uid(engine: Engine, image: str) -> int:
    """The uid of the image's USER, from the image's own /etc/passwd."""
    user: str = engine.image_config(image)["User"]
    return int(user) if user.isdigit() else engine.user_id(image, user)


class Daemon:
    """The containerised daemon, as its users reach it: the published port and keys."""

    def __init__(self, box: Container, port: int) -> None:
        self.box = box
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, key: str = ADMIN_KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(self.url + path, headers=headers, timeout=30)

    def post(self, path: str, body: dict[str, Any], key: str = API_KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=120)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not within {timeout:.0f} s; container log:\n{self.box.logs()}")
            if self.box.wait(0) is not None:
                pytest.fail(f"the container exited while waiting for {what}:\n{self.box.logs()}")
            time.sleep(0.2)

    def daemon_process(self) -> psutil.Process:
        """``vramd serve``: the entrypoint's child (under tini), or the entrypoint."""
        main = self.box.main_process()
        for process in main.children():
            if "serve" in process.cmdline():
                return process
        assert "serve" in main.cmdline(), f"no vramd serve in {main.cmdline()}"
        return main

    def runtimes(self) -> list[psutil.Process]:
        return self.daemon_process().children(recursive=True)


@contextmanager
def running(
    engine: Engine, tmp_path: Path, data: Path, image: str = IMAGE, policy: Path | None = None
) -> Iterator[Daemon]:
    port = free_port()
    mounts = [
        Mount(policy or demo_policy(tmp_path / "vramd.yaml"), POLICY, read_only=True),
        Mount(data, DATA),
    ]
    with engine.run(image, port=port, mounts=mounts, workdir=tmp_path) as box:
        daemon = Daemon(box, port)
        daemon.wait_until(daemon.healthy, HEALTHY_WITHIN_S, "/healthz answering")
        yield daemon


def stop(daemon: Daemon) -> int | None:
    """SIGTERM to the container's main process, as `docker stop` sends it."""
    daemon.box.main_process().terminate()
    return daemon.box.wait(compose_grace_s())


# --- the daemon image ------------------------------------------------------------------------


def test_the_built_image_is_what_the_dockerfile_and_the_deployment_files_describe(
    engine: Engine,
) -> None:
    """tests/process/test_deploy.py holds compose, the unit and the DaemonSet to the
    Dockerfile; this holds the built image to it (settings, user id, volumes, port,
    entrypoint)."""
    built = ImageFacts.from_config(engine.image_config(IMAGE), uid=image_uid(engine, IMAGE))
    assert built == from_dockerfile()


def test_the_daemon_answers_healthz_within_30_s_as_the_unprivileged_vramd_user(
    engine: Engine, tmp_path: Path
) -> None:
    uid = image_uid(engine, IMAGE)
    assert uid != 0
    with running(engine, tmp_path, volume(tmp_path, uid)) as daemon:
        process = daemon.daemon_process()
        assert process.uids().real == uid
        passwd = Path(f"/proc/{process.pid}/root/etc/passwd").read_text()
        assert f"vramd:x:{uid}:" in passwd
        # The image's HEALTHCHECK command, run inside the container, passes.
        check = engine.image_config(IMAGE)["Healthcheck"]["Test"]
        assert check[0] == "CMD"
        done = daemon.box.exec(check[1:])
        assert done.returncode == 0, done.stderr


def test_the_mounted_demo_policy_serves_a_chat_and_an_embedding_with_keys(
    engine: Engine, tmp_path: Path
) -> None:
    with running(engine, tmp_path, volume(tmp_path, image_uid(engine, IMAGE))) as daemon:
        chat = {"model": "demo-chat", "messages": [{"role": "user", "content": "hello"}]}
        assert daemon.post("/v1/chat/completions", chat, key="wrong-key").status_code == 401
        answer = daemon.post("/v1/chat/completions", chat)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        vectors = daemon.post("/v1/embeddings", {"model": "demo-embed", "input": ["a", "b"]})
        assert vectors.status_code == 200, vectors.text
        assert len(vectors.json()["data"]) == 2
        # The admin API takes the admin key, not the app key.
        assert daemon.get("/api/services", key=API_KEY).status_code in (401, 403)
        assert daemon.get("/api/services").status_code == 200


def test_the_database_in_the_volume_survives_a_second_container(
    engine: Engine, tmp_path: Path
) -> None:
    data = volume(tmp_path, image_uid(engine, IMAGE))
    with running(engine, tmp_path, data) as first:
        chat = {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}]}
        assert first.post("/v1/chat/completions", chat).status_code == 200
        history = first.get("/api/policy/history").json()["versions"]
        first.wait_until(
            lambda: (
                any(e["kind"] == "request" for e in first.get("/api/events").json()["events"])
                or len(first.get("/api/events").json()["events"]) > 3
            ),
            30,
            "events written",
        )
        events = first.get("/api/events").json()["events"]
        stop(first)
    assert (data / "vramd.db").is_file(), sorted(p.name for p in data.iterdir())
    with running(engine, tmp_path, data) as second:
        kept = second.get("/api/policy/history").json()["versions"]
        assert [v["sha256"] for v in history] == [v["sha256"] for v in kept[: len(history)]]
        # The same policy again is not a new version.
        assert len(kept) == len(history)
        ids = {e["id"] for e in second.get("/api/events?limit=5000").json()["events"]}
        assert {e["id"] for e in events} <= ids
        stop(second)


def test_sigterm_to_the_main_process_ends_every_runtime_and_the_daemon_in_the_grace_period(
    engine: Engine, tmp_path: Path
) -> None:
    with running(engine, tmp_path, volume(tmp_path, image_uid(engine, IMAGE))) as daemon:
        vectors = daemon.post("/v1/embeddings", {"model": "demo-embed", "input": "x"})
        assert vectors.status_code == 200
        daemon.wait_until(lambda: len(daemon.runtimes()) >= 2, 30, "chat and embed running")
        runtimes = daemon.runtimes()
        status = stop(daemon)
        assert status is not None, f"still running after {compose_grace_s():.0f} s"
        # tini passes on the daemon's status: 0, or 143 where it re-raised SIGTERM.
        assert status in (0, 143), daemon.box.logs()
        alive = [p for p in runtimes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline() for p in alive]


def test_a_hand_over_in_the_container_is_refused_and_the_daemon_keeps_serving(
    engine: Engine, tmp_path: Path
) -> None:
    """A hand-over under tini would end the container with the old daemon: SIGUSR2 and
    ``vramd serve --replace`` (through exec) are both refused, saying why."""
    with running(engine, tmp_path, volume(tmp_path, image_uid(engine, IMAGE))) as daemon:
        process = daemon.daemon_process()
        process.send_signal(signal.SIGUSR2)
        daemon.wait_until(lambda: "SIGUSR2 ignored" in daemon.box.logs(), 10, "the refusal")
        assert "under tini" in daemon.box.logs()
        replace = daemon.box.exec(["vramd", "serve", "--replace", "--host", "0.0.0.0"])
        assert replace.returncode != 0
        assert "under tini" in replace.stdout + replace.stderr, replace
        assert process.is_running() and daemon.daemon_process().pid == process.pid
        chat = {"model": "demo-chat", "messages": [{"role": "user", "content": "still?"}]}
        assert daemon.post("/v1/chat/completions", chat).status_code == 200


# --- the image with llama-server ---------------------------------------------------------------


def test_the_runtimes_image_serves_a_real_chat_through_llama_server(
    engine: Engine, tmp_path: Path
) -> None:
    try:
        engine.image_config(RUNTIMES_IMAGE)
    except RuntimeError:
        pytest.skip(f"{RUNTIMES_IMAGE} is not built here: make image-runtimes")
    policy = tmp_path / "llama.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "server": {"api_keys": [API_KEY], "admin_keys": [ADMIN_KEY]},
                "device": {"backend": "host", "budget": "2GiB", "headroom": "128MiB"},
                "services": {
                    "chat": {
                        "kind": "chat",
                        "adapter": "llama.cpp",
                        "models": ["tiny-llama"],
                        # Found on PATH (/opt/runtimes/bin), as docs/deployment.md says.
                        "command": LLAMA_SERVER,
                        "memory": {"estimate": "300MiB"},
                        "startup_timeout": "120s",
                    }
                },
            }
        )
    )
    policy.chmod(0o644)
    data = volume(tmp_path, image_uid(engine, RUNTIMES_IMAGE))
    with running(engine, tmp_path, data, image=RUNTIMES_IMAGE, policy=policy) as daemon:
        chat = {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        }
        answer = daemon.post("/v1/chat/completions", chat)
        assert answer.status_code == 200, answer.text + daemon.box.logs()
        body = answer.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] > 0
        (runtime,) = daemon.runtimes()
        assert Path(f"/proc/{runtime.pid}/root/opt/runtimes/bin/llama-server").is_file()
        assert runtime.cmdline()[0].endswith("llama-server")
        assert stop(daemon) in (0, 143)
