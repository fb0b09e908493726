"""``vramd import llama-swap``: llama-swap configs become policies that validate."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cli import vramd_process
from support.daemon import REPO_ROOT

from service.importers import ImportFailed
from service.importers.llamaswap import convert, slug
from service.policy import Policy, load_policy

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "llamaswap"
ENV = {"LLAMA_HOME": "/opt/llama.cpp", "HOME": "/home/ops"}


def converted(name: str) -> tuple[str, Policy]:
    text = convert((FIXTURES / name).read_text(), source=name, environ=ENV)
    return text, load_policy(text)


CURRENT = ["routing_groups.yaml", "routing_matrix.yaml", "full.yaml"]


@pytest.mark.parametrize("name", ["basic.yaml", "groups.yaml", "matrix.yaml", *CURRENT])
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


def test_command_prints_a_policy_that_vramd_check_accepts(tmp_path: Path) -> None:
    fixture = FIXTURES / "basic.yaml"
    result = vramd_process("import", "llama-swap", str(fixture))
    assert result.returncode == 0, result.stderr
    assert result.stdout == convert(fixture.read_text(), source="basic.yaml")
    policy_file = tmp_path / "vramd.yaml"
    policy_file.write_text(result.stdout)
    checked = vramd_process("check", str(policy_file))
    assert checked.returncode == 0, checked.stderr
    assert "valid policy, 4 services" in checked.stdout


def test_command_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    missing = vramd_process("import", "llama-swap", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"vramd: {tmp_path / 'nope.yaml'}: cannot read")
    not_llamaswap = tmp_path / "other.yaml"
    not_llamaswap.write_text("version: 1\nservices: {}\n")
    result = vramd_process("import", "llama-swap", str(not_llamaswap))
    assert result.returncode == 1
    assert result.stderr == (
        f"vramd: {not_llamaswap}: not a llama-swap config: it has no 'models:' mapping\n"
    )


# ---------------------------------------------------------------- current format


def block(text: str, service: str) -> str:
    """The lines of one service in the policy text."""
    lines = text.split("\nservices:\n", 1)[1].splitlines()
    start = lines.index(f"  {service}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^  \S", lines[i])), len(lines)
    )
    return "\n".join(lines[start:end])


def placed(policy: Policy) -> dict[str, tuple[str, int]]:
    return {name: (svc.residency.value, svc.priority) for name, svc in policy.services.items()}


def test_routing_groups_swap_exclusive_persistent_become_residency_and_priority() -> None:
    text, policy = converted("routing_groups.yaml")
    assert {name: (res, prio // 100 * 100) for name, (res, prio) in placed(policy).items()} == {
        "qwen3-32b": ("on-demand", 100),  # big: swap, exclusive
        "mistral-small": ("on-demand", 100),
        "qwen3-embed": ("warm", 200),  # retrieval: swap: false, exclusive: false
        "qwen3-rerank": ("warm", 200),
        "whisper": ("pinned", 300),  # voice: persistent, no swap
        "kokoro": ("on-demand", 300),  # speakers: persistent and swap
        "phi-4-mini": ("on-demand", 100),  # in no group: llama-swap's (default) group
    }
    # persistent + swap: members replace each other, lower priorities never evict them
    assert policy.services["kokoro"].protect == "never"
    assert "protect: never  # llama-swap: persistent group" in block(text, "kokoro")
    settings = "routing.router.settings.groups"
    assert f"# llama-swap: {settings}.big (swap: true, exclusive: true, persistent: false" in text
    assert f"{settings}.big.exclusive: true has no vramd equivalent (a member's load" in text
    assert f"{settings}.retrieval.exclusive: false (loading a member leaves" in text
    assert f"{settings}.voice.persistent: true -> pinned" in text
    assert f"{settings}.speakers.persistent: true with swap: true -> on-demand" in text
    assert "phi-4-mini in no group: llama-swap's (default) group" in text
    assert "# llama-swap: routing.router.use: group" in text
    assert "not a llama-swap key" not in text  # routing: is read, not dropped


def test_routing_groups_and_top_level_groups_read_the_same() -> None:
    _, current = converted("routing_groups.yaml")
    config = yaml.safe_load((FIXTURES / "routing_groups.yaml").read_text())
    config["groups"] = config["routing"]["router"]["settings"].pop("groups")
    del config["routing"]["router"]
    legacy = load_policy(convert(yaml.safe_dump(config), environ=ENV))
    assert placed(legacy) == placed(current)


def test_both_group_forms_use_the_routing_one_and_say_so() -> None:
    config = (
        "models:\n"
        "  a: {cmd: 'a --port ${PORT}'}\n"
        "groups:\n"
        "  old: {swap: false, members: [a]}\n"
        "routing:\n"
        "  router:\n"
        "    settings:\n"
        "      groups:\n"
        "        new: {persistent: true, swap: false, members: [a]}\n"
    )  # fmt: skip
    text = convert(config, environ={})
    assert load_policy(text).services["a"].residency.value == "pinned"
    assert "both groups and routing.router.settings.groups are set, which llama-swap" in text


def test_matrix_sets_are_comments_and_evict_costs_priorities_in_cost_order() -> None:
    text, policy = converted("routing_matrix.yaml")
    assert {svc.residency.value for svc in policy.services.values()} == {"on-demand"}
    # evict_costs (by var or model id; default 1): 1 -> 100, 30 -> 200, 50 -> 300, then
    # the fifo offsets inside each band (voxtral 2 -> +20, default 0 -> +10, tiny -1 -> +0)
    assert {name: prio for name, (_, prio) in placed(policy).items()} == {
        "gemma-3-27b": 110,
        "qwen3-30b": 110,
        "flux-schnell": 110,
        "tiny": 100,
        "bge-rerank": 210,  # r: 30
        "llama-70b": 210,  # llama-70b: 30, a model id instead of a var
        "voxtral": 320,  # v: 50
    }
    where = "routing.router.settings.matrix"
    assert f"{where}.evict_costs (higher: evicted later) -> priority in the same order: " in text
    assert "1 -> 100, 30 -> 200, 50 -> 300" in text
    assert "priority: 320  # llama-swap: evict_costs v: 50; fifo priority 2 (+20)" in text
    # each set expanded (+ref inlined) into the combinations llama-swap lets run together
    assert (
        f"# llama-swap: {where}.sets.talk: +llms & v allows "
        "[gemma-3-27b, voxtral] | [qwen3-30b, voxtral] loaded together"
    ) in text
    assert f"{where}.sets.search: (g | q) & v & r allows [bge-rerank, gemma-3-27b, voxtral]" in text
    assert f"{where}.vars: g=gemma-3-27b, q=qwen3-30b, v=voxtral" in text
    # per service: which models may share the GPU with it, or that it ran alone
    assert "matrix sets talk, search: it may run beside bge-rerank, gemma-3-27b, qwen3-30b" in (
        block(text, "voxtral")
    )
    assert "matrix set alone: it runs alone" in block(text, "llama-70b")
    assert "tiny is in no matrix set, so llama-swap runs it alone" in block(text, "tiny")


def test_matrix_set_that_cannot_be_read_is_left_out_with_a_comment() -> None:
    config = (
        "models:\n"
        "  a: {cmd: 'a --port ${PORT}'}\n"
        "routing:\n"
        "  router:\n"
        "    use: matrix\n"
        "    settings:\n"
        "      matrix:\n"
        "        sets: {s: 'a & (nope'}\n"
        "        evict_costs: {ghost: 3}\n"
    )  # fmt: skip
    text = convert(config, environ={})
    assert load_policy(text).services["a"].priority == 100
    assert "matrix.sets cannot be read (nope is neither a var nor a model id); left out" in text
    assert "matrix.evict_costs.ghost: 3 has no vramd equivalent (not a positive cost" in text


def test_scheduler_fifo_priorities_keep_their_order_within_each_placement() -> None:
    text, policy = converted("routing_groups.yaml")
    config = yaml.safe_load((FIXTURES / "routing_groups.yaml").read_text())
    fifo = config["routing"]["scheduler"]["settings"]["fifo"]["priority"]
    prio = {name: svc.priority for name, svc in policy.services.items()}
    assert prio["qwen3-32b"] > prio["mistral-small"] > prio["phi-4-mini"]  # 10 > 3 > 0
    assert prio["qwen3-embed"] > prio["qwen3-rerank"]  # 5 > 1
    for a in prio:  # the same placement band: vramd's order is llama-swap's
        for b in prio:
            if prio[a] // 100 == prio[b] // 100 and fifo.get(a, 0) > fifo.get(b, 0):
                assert prio[a] > prio[b], (a, b)
    assert all(0 <= p <= 1000 for p in prio.values())
    assert (
        "# llama-swap: routing.scheduler.settings.fifo.priority: higher is served first "
        "(default 0) -> added to each service's priority in the same order: "
        "0 -> +0, 1 -> +10, 3 -> +20, 5 -> +30, 10 -> +40"
    ) in text
    assert "priority: 140  # llama-swap: fifo priority 10 (+40)" in block(text, "qwen3-32b")


def test_many_fifo_priorities_stay_ordered_inside_one_band() -> None:
    models = "".join(f"  m{i}: {{cmd: 'x --port ${{PORT}}'}}\n" for i in range(30))
    priorities = "".join(f"          m{i}: {i * 7 - 50}\n" for i in range(30))
    config = (
        f"models:\n{models}routing:\n  scheduler:\n    settings:\n      fifo:\n"
        f"        priority:\n{priorities}"
    )
    policy = load_policy(convert(config, environ={}))
    ordered = [policy.services[f"m{i}"].priority for i in range(30)]
    assert ordered == sorted(set(ordered)) and ordered[0] >= 100 and ordered[-1] < 200


def test_unload_timeout_global_and_per_model_become_stop_timeout() -> None:
    text, policy = converted("routing_groups.yaml")
    assert policy.defaults.stop_timeout == 20
    assert "stop_timeout: 20s  # llama-swap: unloadTimeout: 20 (grace before a forced" in text
    assert policy.services["qwen3-32b"].stop_timeout == 45  # its own
    assert "stop_timeout: 45s  # llama-swap: unloadTimeout: 45" in block(text, "qwen3-32b")
    # 0 is llama-swap's "use the global one": the service takes defaults.stop_timeout
    assert policy.services["mistral-small"].stop_timeout == 20
    assert "unloadTimeout: 0 means the global one" in block(text, "mistral-small")
    assert policy.services["phi-4-mini"].stop_timeout == 20


def test_capabilities_reranker_becomes_kind_rerank_and_others_their_kinds() -> None:
    text, policy = converted("routing_groups.yaml")
    rerank = policy.services["qwen3-rerank"]
    assert rerank.kind.value == "rerank"  # its command (text-embeddings-router) says nothing
    assert "kind: rerank  # llama-swap: capabilities.reranker: true" in text
    assert "capabilities.context: 8192 has no vramd equivalent" in block(text, "qwen3-rerank")
    assert policy.services["qwen3-embed"].kind.value == "embedding"
    assert "kind: embedding  # llama-swap: capabilities.embeddings: true" in text
    assert policy.services["whisper"].kind.value == "speech"  # in: [audio], out: [text]
    config = (
        "models:\n"
        "  img: {cmd: 'x --port ${PORT}', capabilities: {out: [image]}}\n"
        "  tts: {cmd: 'y --port ${PORT}', capabilities: {in: [text], out: [audio]}}\n"
        "  emb: {cmd: 'llama-server --port ${PORT}', capabilities: {reranker: true}}\n"
    )  # fmt: skip
    kinds = {n: s.kind.value for n, s in load_policy(convert(config, environ={})).services.items()}
    assert kinds == {"img": "diffusion", "tts": "speech", "emb": "rerank"}


def test_set_params_by_id_names_are_served_with_their_fields() -> None:
    text, policy = converted("routing_groups.yaml")
    qwen = policy.services["qwen3-32b"]
    assert qwen.models == ["qwen3-32b", "qwen3-32b:fast"]
    assert "models: [qwen3-32b, qwen3-32b:fast]  # llama-swap: aliases, setParamsByID ids" in text
    # each id sets its own fields; the model's own id is one of them
    assert qwen.set_params == {
        "qwen3-32b": {"chat_template_kwargs": {"enable_thinking": True}},
        "qwen3-32b:fast": {"chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.6},
    }


def test_set_params_apply_to_every_name_and_by_id_fields_win() -> None:
    config = (
        "models:\n"
        "  m:\n"
        "    cmd: llama-server --port ${PORT}\n"
        "    aliases: [m-alias]\n"
        "    filters:\n"
        "      stripParams: top_k\n"
        "      setParams: {temperature: 0.2, top_p: 0.9, model: other}\n"
        "      setParamsByID: {m-hot: {temperature: 1.0}}\n"
    )
    text = convert(config, environ={})
    spec = load_policy(text).services["m"]
    assert spec.models == ["m", "m-alias", "m-hot"]
    assert spec.set_params == {
        "m": {"temperature": 0.2, "top_p": 0.9},
        "m-alias": {"temperature": 0.2, "top_p": 0.9},
        "m-hot": {"temperature": 1.0, "top_p": 0.9},
    }
    assert "filters.setParams.model: other left out" in text
    assert "# llama-swap: filters: {stripParams: top_k}" in text


def test_whisper_server_gets_the_inference_route() -> None:
    # Needs the policy's routes key (client route -> runtime path) from main.
    text, policy = converted("routing_groups.yaml")
    assert policy.services["whisper"].routes == {"/v1/audio/transcriptions": "/inference"}
    assert "routes:  # whisper-server transcribes at /inference (llama-swap passes" in text
    assert "routes" not in block(text, "kokoro")  # other speech servers keep the OpenAI path


# A key written as a vramd setting without a comment of its own: the field it becomes.
MAPPED = {"cmd": "command", "macros": "command", "aliases": "models", "env": "env"}
MAPPED |= {"checkEndpoint": "health", "models": "services"}


def key_paths(config: dict[str, Any]) -> Iterator[tuple[str, ...]]:
    """Every key of a llama-swap config down to the settings (not into free-form values)."""
    for key, value in config.items():
        yield (key,)
        if key == "models":
            for model_id, model in value.items():
                for model_key, setting in model.items():
                    yield ("models", model_id, model_key)
                    if model_key in ("capabilities", "filters"):
                        yield from (("models", model_id, model_key, sub) for sub in setting)
        elif key in ("routing", "hooks"):
            yield from _nested((key,), value)


def _nested(path: tuple[str, ...], value: Any) -> Iterator[tuple[str, ...]]:
    if not isinstance(value, dict) or path[-1] in ("priority", "vars", "sets", "evict_costs"):
        return
    for key, inner in value.items():
        yield (*path, key)
        yield from _nested((*path, key), inner)


def comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)


def test_every_key_of_a_current_config_is_mapped_or_commented() -> None:
    text, policy = converted("full.yaml")
    config = yaml.safe_load((FIXTURES / "full.yaml").read_text())
    services = {svc.models[0]: name for name, svc in policy.services.items()}
    paths = list(key_paths(config))
    assert len(paths) > 60  # the walk reaches the nested keys
    missing = []
    for path in paths:
        key = path[-1]
        if path[0] == "models" and len(path) > 2 and path[1] not in services:
            scope = text  # a model left out says so at the top
            key = path[1]
        elif path[0] == "models" and len(path) > 2:
            scope = block(text, services[path[1]])
            if len(path) == 3 and key in MAPPED and f"    {MAPPED[key]}:" in scope:
                continue
        else:
            scope = text
            if path == ("models",) and "\nservices:\n" in text:
                continue
        if not re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", comments(scope)):
            missing.append(".".join(path))
    assert missing == []


def test_current_format_command_output_passes_vramd_check(tmp_path: Path) -> None:
    fixture = FIXTURES / "full.yaml"
    result = vramd_process("import", "llama-swap", str(fixture))
    assert result.returncode == 0, result.stderr
    policy_file = tmp_path / "vramd.yaml"
    policy_file.write_text(result.stdout)
    checked = vramd_process("check", str(policy_file))
    assert checked.returncode == 0, checked.stderr
    assert "valid policy, 2 services" in checked.stdout


# --- any config: a policy or a clear refusal, never a crash ----------------------------

_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 100)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = st.sampled_from(
    [
        "routing",
        "groups",
        "matrix",
        "unloadTimeout",
        "capabilities",
        "filters",
        "ttl",
        "aliases",
        "macros",
        "hooks",
        "env",
        "proxy",
        "checkEndpoint",
        "concurrencyLimit",
        "useModelName",
        "cmdStop",
        "disabled",
        "metadata",
        "globalTTL",
        "apiKeys",
    ]
)


@st.composite
def mutated_configs(draw: st.DrawFn) -> str:
    """full.yaml with keys anywhere replaced by arbitrary values, or added."""
    config = yaml.safe_load((FIXTURES / "full.yaml").read_text())
    for _ in range(draw(st.integers(1, 4))):
        target = config
        if draw(st.booleans()) and isinstance(config.get("models"), dict) and config["models"]:
            target = config["models"][draw(st.sampled_from(sorted(config["models"])))]
        if isinstance(target, dict):
            target[draw(_KEYS)] = draw(_ANY)
    return yaml.safe_dump(config)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_any_config_converts_to_a_valid_policy_or_a_clear_refusal(text: str) -> None:
    try:
        output = convert(text, environ={})
    except ImportFailed as exc:
        assert "does not validate" not in str(exc), f"the importer wrote a bad policy: {exc}"
        return
    load_policy(output)
