"""``vramd import llama-swap``: llama-swap configs become policies that validate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import REPO_ROOT

from service.importers import ImportFailed
from service.importers.llamaswap import convert, slug
from service.policy import Policy, load_policy

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "llamaswap"
ENV = {"LLAMA_HOME": "/opt/llama.cpp", "HOME": "/home/ops"}


def converted(name: str) -> tuple[str, Policy]:
    text = convert((FIXTURES / name).read_text(), source=name, environ=ENV)
    return text, load_policy(text)


@pytest.mark.parametrize("name", ["basic.yaml", "groups.yaml", "matrix.yaml"])
def test_every_fixture_converts_to_a_valid_policy(name: str) -> None:
    text, policy = converted(name)
    assert policy.services
    for service in policy.services.values():
        assert "${PORT}" in " ".join(service.command)
        assert service.memory.estimate == 4 * 1024**3
    placeholders = [line for line in text.splitlines() if "estimate: 4GiB" in line]
    assert len(placeholders) == len(policy.services)
    assert all("# TODO: set from the model size" in line for line in placeholders)


def test_models_aliases_ttl_and_per_model_settings() -> None:
    text, policy = converted("basic.yaml")
    coder = policy.services["qwen2.5-coder-7b"]
    assert coder.models == ["qwen2.5-coder-7b", "gpt-4o-mini", "coder"]
    # macros expanded before splitting; the comment line of the block is gone
    assert coder.command == [
        "/opt/llama.cpp/build/bin/llama-server",
        "--port",
        "${PORT}",
        "-m",
        "/models/Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf",
        "--ctx-size",
        "8192",
        "-ngl",
        "99",
        "--flash-attn",
    ]
    assert coder.idle_ttl == 300
    # hooks.on_startup.preload: preloading needs a warm service
    assert (coder.residency.value, coder.preload) == ("warm", True)

    embed = policy.services["nomic-embed-text-v1.5"]
    assert embed.kind.value == "embedding"
    assert (embed.residency.value, embed.priority) == ("on-demand", 100)
    assert embed.idle_ttl == 0  # llama-swap's default: never unload
    assert "# llama-swap: unlisted: true has no vramd equivalent" in text

    small = policy.services["llama-3.2-1b-instruct"]
    assert small.models == ["Llama-3.2-1B-Instruct"]
    assert "/models/Llama 3.2 1B Instruct Q4_K_M.gguf" in small.command  # quoted in cmd
    assert small.env == {"CUDA_VISIBLE_DEVICES": "0", "LLAMA_ARG_THREADS": "8"}
    assert small.upstream_model == "llama3.2:1b"
    assert small.max_concurrency == 2
    assert "# llama-swap: filters: {stripParams: 'temperature, top_p, top_k'}" in text

    assert policy.defaults.startup_timeout == 300
    assert "# llama-swap: logLevel: info has no vramd equivalent" in text
    assert "# llama-swap: startPort: 10001 has no vramd equivalent" in text


def test_a_fixed_proxy_port_becomes_port_placeholder() -> None:
    text, policy = converted("basic.yaml")
    nemo = policy.services["mistral-nemo"]
    assert nemo.command[:6] == [
        "/opt/llama.cpp/build/bin/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "${PORT}",
        "-m",
    ]
    assert "9503" not in " ".join(nemo.command)
    assert "proxy: http://127.0.0.1:9503 is a fixed port" in text
    assert nemo.health == "/v1/models"
    assert "# llama-swap: cmdStop: pkill -f Mistral-Nemo has no vramd equivalent" in text


def test_groups_become_residency_and_priority() -> None:
    text, policy = converted("groups.yaml")
    placed = {name: (svc.residency.value, svc.priority) for name, svc in policy.services.items()}
    assert placed == {
        "qwen-qwen3-30b-a3b": ("on-demand", 100),  # swap: true
        "gemma-3-12b": ("on-demand", 100),
        "docker-coder": ("on-demand", 100),
        "bge-m3": ("warm", 200),  # swap: false: these run together
        "bge-reranker-v2-m3": ("warm", 200),
        "whisper-large-v3": ("pinned", 300),  # persistent: true
    }
    assert "groups.chat.exclusive: true has no vramd equivalent" in text
    assert "groups.chat.swap: true has no vramd equivalent" in text
    # TTLs: a model's own (0 = never), else globalTTL; warm services need it written out
    assert policy.services["qwen-qwen3-30b-a3b"].idle_ttl == 0
    assert policy.services["gemma-3-12b"].idle_ttl == 900
    assert policy.services["bge-m3"].idle_ttl == 900
    assert policy.services["bge-reranker-v2-m3"].idle_ttl == 3600
    assert "# llama-swap: globalTTL: 900 has no vramd equivalent (pinned services" in text
    # healthCheckTimeout below llama-swap's minimum of 15 s counts as 15 s
    assert policy.defaults.startup_timeout == 15


def test_ids_aliases_env_macros_and_model_id() -> None:
    text, policy = converted("groups.yaml")
    qwen = policy.services["qwen-qwen3-30b-a3b"]
    assert qwen.models == ["Qwen/Qwen3-30B-A3B", "qwen3", "qwen3-hidden"]  # {id: ...} aliases
    assert qwen.command[:5] == [
        "/opt/llama.cpp/bin/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "${PORT}",
    ]
    assert "uses ${env.LLAMA_HOME}, expanded at import time" in text
    docker = policy.services["docker-coder"]
    assert docker.command[:8] == [
        "docker", "run", "--name", "docker-coder", "--init", "--rm", "-p", "${PORT}:8080"
    ]  # fmt: skip
    whisper = policy.services["whisper-large-v3"]
    assert whisper.kind.value == "speech"
    assert whisper.health == "/health"
    assert "# llama-swap: checkEndpoint: none has no vramd equivalent" in text
    assert policy.services["bge-reranker-v2-m3"].kind.value == "rerank"
    assert policy.services["bge-m3"].env == {"CUDA_VISIBLE_DEVICES": "1"}


def test_newer_keys_matrix_peers_and_api_keys() -> None:
    text, policy = converted("matrix.yaml")
    assert policy.server.api_keys == ["sk-local-0123456789"]
    assert "apiKeys entry ${env.EXTRA_API_KEY} comes from the environment" in text
    gpt = policy.services["gpt-oss-20b"]
    assert gpt.command[-4:] == ["--ctx-size", "131072", "--temp", "1.0"]  # model macros win
    assert gpt.idle_ttl == 600
    assert policy.services["sd-turbo"].kind.value == "diffusion"
    assert policy.services["sd-turbo"].health == "/"
    for key in ("matrix", "peers", "sendLoadingState", "captureBuffer", "metadata", "timeouts"):
        assert f"# llama-swap: {key}: " in text, key
    assert "setting_nobody_knows: 1 has no vramd equivalent (not a llama-swap model key)" in text


def test_unset_environment_macro_leaves_a_todo() -> None:
    config = (
        "models:\n"
        "  m:\n"
        "    cmd: ${env.MODELS}/llama-server --port ${PORT}\n"
    )  # fmt: skip
    text = convert(config, environ={})
    assert load_policy(text).services["m"].command[0] == "UNSET-MODELS/llama-server"
    assert "TODO models.m.cmd: ${env.MODELS} is not set here" in text


def test_service_names_are_slugs_and_unique() -> None:
    assert slug("Qwen/Qwen2.5-72B-Instruct:Q4_K_M") == "qwen-qwen2.5-72b-instruct-q4_k_m"
    assert slug("__weird__") == "weird__"
    assert slug("???") == "model"
    config = (
        "models:\n"
        "  A/B: {cmd: 'x --port ${PORT}'}\n"
        "  a-b: {cmd: 'y --port ${PORT}'}\n"
    )  # fmt: skip
    policy = load_policy(convert(config, environ={}))
    assert {name: svc.models for name, svc in policy.services.items()} == {
        "a-b": ["A/B"],
        "a-b-2": ["a-b"],
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("models: [unclosed", "not valid YAML"),
        ("healthCheckTimeout: 10\n", "no 'models:' mapping"),
        ("models:\n  m: {cmd: 'x --port ${PORT} ${nope}'}\n", "${nope}, which no macro defines"),
        ("models:\n  m: {cmd: 'x \"unbalanced'}\n", "cannot split the command"),
    ],
)
def test_unusable_input_fails_clearly(config: str, message: str) -> None:
    with pytest.raises(ImportFailed, match=message.replace("$", r"\$").replace("{", r"\{")):
        convert(config, environ={})


def vramd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMD_")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )


def test_command_prints_a_policy_that_vramd_check_accepts(tmp_path: Path) -> None:
    fixture = FIXTURES / "basic.yaml"
    result = vramd("import", "llama-swap", str(fixture))
    assert result.returncode == 0, result.stderr
    assert result.stdout == convert(fixture.read_text(), source="basic.yaml")
    policy_file = tmp_path / "vramd.yaml"
    policy_file.write_text(result.stdout)
    checked = vramd("check", str(policy_file))
    assert checked.returncode == 0, checked.stderr
    assert "valid policy, 4 services" in checked.stdout


def test_command_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    missing = vramd("import", "llama-swap", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"vramd: {tmp_path / 'nope.yaml'}: cannot read")
    not_llamaswap = tmp_path / "other.yaml"
    not_llamaswap.write_text("version: 1\nservices: {}\n")
    result = vramd("import", "llama-swap", str(not_llamaswap))
    assert result.returncode == 1
    assert result.stderr == (
        f"vramd: {not_llamaswap}: not a llama-swap config: it has no 'models:' mapping\n"
    )
