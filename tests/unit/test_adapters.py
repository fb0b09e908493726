"""Runtime adapters: Prometheus parsing, per-runtime metrics, health, OOM lines, lookup.

Metrics pages, health bodies and logs under ``fixtures/adapters/`` are shaped after what
the real runtimes print (llama-server before and after the KV gauges were removed, vLLM's
V0 and V1 engines, TEI, whisper-server, sd-server); the vLLM sleep helpers run against
``httpx.MockTransport``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from service.adapters import (
    ADAPTERS,
    LLAMA_CPP,
    LLAMA_CPP_PYTHON,
    OPENAI,
    PIPER,
    SD_CPP,
    TEI,
    VLLM,
    WHISPER_CPP,
    Adapter,
    RuntimeMetrics,
    adapter_named,
    find_oom,
    guess_adapter,
    parse_prometheus,
    parse_samples,
)
from service.adapters import vllm as vllm_sleep
from service.policy.runtime_names import ADAPTER_NAMES, ALIASES, SLEEP_ADAPTERS

FIXTURES = Path(__file__).parents[1] / "fixtures" / "adapters"
KNOWN = ("llama.cpp", "llama-cpp-python", "vllm", "whisper.cpp", "sd.cpp", "tei", "piper", "openai")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parse_prometheus ------------------------------------------------------------------


def test_parse_skips_comments_and_garbage_but_keeps_good_lines() -> None:
    text = "\n".join(
        [
            "# HELP up Whether the target is up.",
            "# TYPE up gauge",
            "up 1",
            "this is not a metric line",
            "metric_without_value",
            "bad_labels{job=unquoted} 1",
            'unterminated{job="a} 1',
            'missing_close{job="a" 1',
            "1starts_with_digit 3",
            "too_many_fields 1 2 3",
            "value_not_a_number abc",
            "timestamp_not_a_number 1 soon",
            'glued_value{a="b"}1',
            "",
            "   ",
            "# EOF",
            "requests_total 42",
        ]
    )
    assert parse_prometheus(text) == {"up": 1.0, "requests_total": 42.0}


def test_parse_sums_label_sets_and_keeps_each_series_with_sorted_labels() -> None:
    text = (
        'http_requests_total{method="post",code="200"} 1027\n'
        'http_requests_total{code="400",method="post"} 3\n'
        'http_requests_total{ code = "500" , method="get", } 2\n'
    )
    assert parse_prometheus(text) == {
        "http_requests_total": 1032.0,
        'http_requests_total{code="200",method="post"}': 1027.0,
        'http_requests_total{code="400",method="post"}': 3.0,
        'http_requests_total{code="500",method="get"}': 2.0,
    }


def test_parse_label_values_with_escapes_commas_and_braces() -> None:
    text = r'msg{text="a \"quoted\", {braced} \\ path\nnext",z="1"} 7' + "\n"
    (sample,) = parse_samples(text)
    assert sample.labels == (("text", 'a "quoted", {braced} \\ path\nnext'), ("z", "1"))
    # The key re-escapes, so it round-trips through the parser.
    assert parse_prometheus(f"{sample.key} 7") == parse_prometheus(text)


def test_parse_special_and_exponent_values_timestamps_and_exemplars() -> None:
    text = "\n".join(
        [
            "a_nan NaN",
            "b_inf +Inf",
            "c_neg_inf -Inf",
            "d_exp 1.23457e+06",
            "e_small -2E-3",
            "f_with_timestamp 4 1700000000000",
            'g_bucket{le="0.5"} 12 # {trace_id="abc123"} 0.41 1700000000.123',
            "h_int 0012",
        ]
    )
    raw = parse_prometheus(text)
    assert math.isnan(raw["a_nan"])
    assert raw["b_inf"] == math.inf
    assert raw["c_neg_inf"] == -math.inf
    assert raw["d_exp"] == 1234570.0
    assert raw["e_small"] == -0.002
    assert raw["f_with_timestamp"] == 4.0
    assert raw['g_bucket{le="0.5"}'] == 12.0
    assert raw["h_int"] == 12.0


def test_parse_repeated_series_keeps_the_last_value_without_double_counting() -> None:
    raw = parse_prometheus('x{a="1"} 5\nx{a="2"} 1\nx{a="1"} 7\n')
    assert raw == {"x": 8.0, 'x{a="1"}': 7.0, 'x{a="2"}': 1.0}


def test_parse_unlabelled_and_labelled_samples_of_one_name_add_up() -> None:
    assert parse_prometheus('mixed 2\nmixed{k="v"} 3\n') == {"mixed": 5.0, 'mixed{k="v"}': 3.0}


def test_parse_never_raises_on_random_input() -> None:
    rng = random.Random(20240229)
    alphabet = 'abc_:{}="\\,# \t\n0123456789.eE+-NaInf'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        result = parse_prometheus(text)
        assert all(isinstance(value, float) for value in result.values())
    assert parse_prometheus("\x00\xff\u2028 weird \r\n\r\n") == {}


def test_parse_a_whole_vllm_page_with_histograms() -> None:
    raw = parse_prometheus(fixture("vllm_metrics_v1.txt"))
    bucket = 'engine="0",le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"'  # labels sorted
    assert raw[f"vllm:time_to_first_token_seconds_bucket{{{bucket}}}"] == 49.0
    assert raw["vllm:time_to_first_token_seconds_count"] == 49.0
    assert raw["vllm:request_success_total"] == 49.0
    assert raw["python_gc_objects_collected_total"] == 13894.0 + 4215.0 + 1103.0
    assert raw["process_resident_memory_bytes"] == 4127657984.0


# --- parse_metrics per runtime --------------------------------------------------------


def test_llamacpp_metrics_from_a_build_with_kv_cache_gauges() -> None:
    metrics = LLAMA_CPP.parse_metrics(fixture("llamacpp_metrics_b4800.txt"))
    assert metrics.kv_cache_usage_ratio == pytest.approx(0.412354)
    assert metrics.kv_cache_tokens == 3378
    assert metrics.requests_running == 2
    assert metrics.requests_waiting == 1
    assert metrics.raw["llamacpp:prompt_tokens_total"] == 1234570.0
    assert metrics.raw["llamacpp:tokens_predicted_total"] == 348691.0


def test_llamacpp_metrics_from_a_current_build_without_kv_cache_gauges() -> None:
    metrics = LLAMA_CPP.parse_metrics(fixture("llamacpp_metrics_current.txt"))
    assert metrics.kv_cache_usage_ratio is None
    assert metrics.kv_cache_tokens is None
    assert metrics.requests_running == 1
    assert metrics.requests_waiting == 0
    assert metrics.raw["llamacpp:n_tokens_max"] == 6144.0


def test_vllm_v1_metrics_with_kv_tokens_from_cache_config() -> None:
    metrics = VLLM.parse_metrics(fixture("vllm_metrics_v1.txt"))
    assert metrics.kv_cache_usage_ratio == 0.2734375
    assert metrics.kv_cache_tokens == math.ceil(0.2734375 * 27466 * 16)
    assert metrics.requests_running == 3
    assert metrics.requests_waiting == 2


def test_vllm_v0_metrics_use_the_old_gauge_name() -> None:
    metrics = VLLM.parse_metrics(fixture("vllm_metrics_v0.txt"))
    assert metrics.kv_cache_usage_ratio == pytest.approx(0.06730259422418013)
    assert metrics.kv_cache_tokens == math.ceil(0.06730259422418013 * 2043 * 16)
    assert metrics.requests_running == 4
    assert metrics.requests_waiting == 0
    assert metrics.raw["vllm:num_requests_swapped"] == 0.0


def test_vllm_prefers_the_new_gauge_when_both_are_exported() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.9\n'
        'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
    )
    assert VLLM.parse_metrics(text).kv_cache_usage_ratio == 0.25


def test_vllm_data_parallel_engines_average_usage_and_sum_requests() -> None:
    text = "\n".join(
        f'vllm:{name}{{model_name="m",engine="{engine}"}} {value}'
        for engine, usage, running, waiting in (("0", 0.2, 3, 1), ("1", 0.6, 5, 0))
        for name, value in (
            ("kv_cache_usage_perc", usage),
            ("num_requests_running", running),
            ("num_requests_waiting", waiting),
        )
    )
    metrics = VLLM.parse_metrics(text)
    assert metrics.kv_cache_usage_ratio == pytest.approx(0.4)
    assert metrics.requests_running == 8
    assert metrics.requests_waiting == 1
    assert metrics.kv_cache_tokens is None  # no cache_config_info on the page


@pytest.mark.parametrize(
    ("value", "expected"),
    [("NaN", None), ("+Inf", None), ("1.7", 1.0), ("-0.1", 0.0), ("0.5", 0.5)],
)
def test_kv_usage_is_a_ratio_or_none(value: str, expected: float | None) -> None:
    metrics = VLLM.parse_metrics(f'vllm:kv_cache_usage_perc{{model_name="m"}} {value}\n')
    assert metrics.kv_cache_usage_ratio == expected


def test_tei_metrics_read_the_queue_only() -> None:
    metrics = TEI.parse_metrics(fixture("tei_metrics.txt"))
    assert metrics.requests_waiting == 3
    assert metrics.requests_running is None
    assert metrics.kv_cache_usage_ratio is None
    assert metrics.raw["te_request_count"] == 1300.0


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("vllm_metrics_v1.txt", (0.2734375, None, 3, 2)),
        ("llamacpp_metrics_b4800.txt", (0.412354, 3378, 2, 1)),
        ("tei_metrics.txt", (None, None, None, 3)),
    ],
)
def test_generic_adapter_reads_any_known_runtime(
    page: str, expected: tuple[float | None, int | None, int | None, int | None]
) -> None:
    metrics = OPENAI.parse_metrics(fixture(page))
    got = (
        metrics.kv_cache_usage_ratio,
        metrics.kv_cache_tokens,
        metrics.requests_running,
        metrics.requests_waiting,
    )
    assert got == pytest.approx(expected)


def test_generic_adapter_reads_sglang_names() -> None:
    text = (
        'sglang:token_usage{model_name="m"} 0.31\n'
        'sglang:num_running_reqs{model_name="m"} 6\n'
        'sglang:num_queue_reqs{model_name="m"} 2\n'
    )
    metrics = OPENAI.parse_metrics(text)
    assert metrics.kv_cache_usage_ratio == pytest.approx(0.31)
    assert (metrics.requests_running, metrics.requests_waiting) == (6, 2)


@pytest.mark.parametrize("adapter", [LLAMA_CPP_PYTHON, WHISPER_CPP, SD_CPP], ids=lambda a: a.name)
def test_runtimes_without_metrics_still_parse_whatever_they_are_given(adapter: Adapter) -> None:
    assert adapter.parse_metrics("") == RuntimeMetrics()
    metrics = adapter.parse_metrics("some_gauge 3\n")
    assert metrics.requests_running is None
    assert dict(metrics.raw) == {"some_gauge": 3.0}


def test_runtime_metrics_is_immutable_and_hashable() -> None:
    metrics = VLLM.parse_metrics(fixture("vllm_metrics_v0.txt"))
    with pytest.raises(TypeError):
        metrics.raw["x"] = 1.0  # type: ignore[index]
    assert hash(metrics) == hash(VLLM.parse_metrics(fixture("vllm_metrics_v0.txt")))


# --- health ----------------------------------------------------------------------------

LOADING = (FIXTURES / "llamacpp_health_loading.json").read_bytes()
OK = (FIXTURES / "llamacpp_health_ok.json").read_bytes()
WHISPER_LOADING = (FIXTURES / "whispercpp_health_loading.json").read_bytes()
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


@pytest.mark.parametrize(
    ("adapter", "status", "body", "ready"),
    [
        (LLAMA_CPP, 503, LOADING, False),
        (LLAMA_CPP, 200, OK, True),
        (LLAMA_CPP, 503, b'{"status":"loading model"}', False),  # early-2024 builds
        (LLAMA_CPP, 200, b'{"status":"loading model"}', False),
        (LLAMA_CPP, 200, b'{"status":"error"}', False),
        (LLAMA_CPP, 200, LOADING, False),
        (LLAMA_CPP, 200, b'{"status":"ok","slots_idle":1,"slots_processing":0}', True),
        (LLAMA_CPP, 200, b"OK", True),
        (LLAMA_CPP, 200, b"", True),
        (LLAMA_CPP, 500, b'{"status":"error"}', False),
        (WHISPER_CPP, 503, WHISPER_LOADING, False),
        (WHISPER_CPP, 200, OK, True),
        (LLAMA_CPP_PYTHON, 200, MODELS, True),
        (LLAMA_CPP_PYTHON, 404, b'{"detail":"Not Found"}', False),
        (VLLM, 200, b"", True),
        (VLLM, 503, b"", False),
        (SD_CPP, 200, b'{"data":[{"id":"sd-cpp-local","object":"model"}]}', True),
        (TEI, 200, b"", True),
        (TEI, 503, b'{"error":"unhealthy","error_type":"unhealthy"}', False),
        (OPENAI, 204, b"", True),
        (OPENAI, 302, b"", False),
    ],
)
def test_health_ok(adapter: Adapter, status: int, body: bytes, ready: bool) -> None:
    assert adapter.health_ok(status, body) is ready


def test_health_paths() -> None:
    assert {name: a.health_path for name, a in ADAPTERS.items()} == {
        "llama.cpp": "/health",
        "llama-cpp-python": "/v1/models",  # it has no /health
        "vllm": "/health",
        "whisper.cpp": "/health",
        "sd.cpp": "/v1/models",
        "tei": "/health",
        "piper": "/voices",  # it has no /health
        "openai": "/v1/models",
    }


# --- registry --------------------------------------------------------------------------


def test_every_adapter_is_registered_under_its_name() -> None:
    assert tuple(ADAPTERS) == KNOWN
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter_named(name) is adapter
        assert adapter.health_path.startswith("/")
        assert adapter.oom_patterns, name


def test_the_policys_names_are_the_registrys() -> None:
    # The policy checks adapter: and sleep: with service.policy.runtime_names, which imports
    # no adapter (and is the one list of runtimes with a sleep mode); the two registries
    # must not drift apart.
    assert tuple(ADAPTERS) == ADAPTER_NAMES
    assert {"vllm"} == SLEEP_ADAPTERS
    assert set(ALIASES.values()) <= set(ADAPTER_NAMES)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("VLLM", "vllm"), (" llamacpp ", "llama.cpp"), ("Whisper-Server", "whisper.cpp"),
     ("stable-diffusion.cpp", "sd.cpp"), ("text-embeddings-inference", "tei"),
     ("generic", "openai")],
)  # fmt: skip
def test_adapter_named_accepts_case_and_aliases(name: str, expected: str) -> None:
    assert adapter_named(name).name == expected


def test_adapter_named_unknown_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'ollama'") as excinfo:
        adapter_named("ollama")
    for name in KNOWN:
        assert name in str(excinfo.value)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["llama-server", "--port", "${PORT}", "-m", "/models/q.gguf"], "llama.cpp"),
        (["/opt/llama.cpp/build/bin/llama-server", "-m", "/m/whisper-server.gguf"], "llama.cpp"),
        (["C:\\llama\\llama-server.exe", "-m", "q.gguf"], "llama.cpp"),
        (["/src/llama.cpp/build/bin/server", "-m", "q.gguf"], "llama.cpp"),
        (["python", "-m", "llama_cpp.server", "--model", "/m/q.gguf"], "llama-cpp-python"),
        (["/venv/bin/python3.11", "-u", "-m", "llama_cpp.server"], "llama-cpp-python"),
        (["${PYTHON}", "-mllama_cpp.server", "--port", "${PORT}"], "llama-cpp-python"),
        (["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "${PORT}"], "vllm"),
        (["/venv/bin/vllm", "serve", "m", "--enable-sleep-mode"], "vllm"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
        (["python", "-X", "dev", "/venv/bin/vllm", "serve", "m"], "vllm"),
        (["env", "VLLM_SERVER_DEV_MODE=1", "vllm", "serve", "m"], "vllm"),
        (["uv", "run", "--with", "vllm", "python", "-m", "vllm.entrypoints.cli.main"], "vllm"),
        (["whisper-server", "-m", "/models/ggml-base.en.bin", "--port", "${PORT}"], "whisper.cpp"),
        (["/opt/whisper.cpp/build/bin/server", "-m", "ggml-base.bin"], "whisper.cpp"),
        (["sd-server", "-m", "/models/sdxl.safetensors", "--listen-port", "${PORT}"], "sd.cpp"),
        (["/opt/stable-diffusion.cpp/build/bin/sd", "-m", "sd.safetensors"], "sd.cpp"),
        (["nice", "-n", "10", "sd-server", "-m", "x"], "sd.cpp"),
        (["text-embeddings-router", "--model-id", "BAAI/bge-m3", "--port", "${PORT}"], "tei"),
        (["taskset", "-c", "0-7", "text-embeddings-router", "--port", "1"], "tei"),
        (["sd", "-m", "model.safetensors"], "openai"),  # sd alone: too ambiguous
        (["python", "-m", "uvicorn", "kokoro_fastapi:app"], "openai"),
        (["python", "-c", "import vllm"], "openai"),
        (["python", "/srv/tts/server.py", "--port", "${PORT}"], "openai"),
        (["/opt/piper/bin/python", "-m", "piper.http_server", "--model", "v.onnx"], "piper"),
        (["koboldcpp", "--model", "/models/llama-server.gguf"], "openai"),
        (["env", "FOO=1"], "openai"),
        (["python"], "openai"),
        ([], "openai"),
    ],
)
def test_guess_adapter(argv: list[str], expected: str) -> None:
    assert guess_adapter(argv).name == expected


# --- out-of-memory patterns ------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "log", "first_oom_line"),
    [
        (
            LLAMA_CPP,
            "llamacpp_oom_load.log",
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 18508.35 MiB on device 0: "
            "cudaMalloc failed: out of memory",
        ),
        (
            LLAMA_CPP,
            "llamacpp_oom_kv_cache.log",
            "llama_kv_cache_init: failed to allocate buffer for kv cache",
        ),
        (LLAMA_CPP, "llamacpp_oom_request.log", "CUDA error: out of memory"),
        (
            LLAMA_CPP_PYTHON,
            "llamacpp_python_oom.log",
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 7605.33 MiB on device 0: "
            "cudaMalloc failed: out of memory",
        ),
        (
            # A real llama-server (make real-runtimes) out of host memory: its KV cache
            # under prlimit --as. The first line is the CPU backend's own.
            LLAMA_CPP,
            "llamacpp_oom_host.log",
            "0.00.644.406 E ggml_aligned_malloc: insufficient memory (attempted to allocate "
            "4096.00 MB)",
        ),
        (
            WHISPER_CPP,
            "whispercpp_oom.log",
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 251.66 MiB on device 0: "
            "cudaMalloc failed: out of memory",
        ),
        (
            SD_CPP,
            "sdcpp_oom.log",
            "[ERROR] ggml_backend_cuda_buffer_type_alloc_buffer: allocating 6658.00 MiB on "
            "device 0: cudaMalloc failed: out of memory",
        ),
        (
            PIPER,
            "piper_oom_session.log",
            "EP Error /onnxruntime_src/onnxruntime/core/platform/posix/env.cc:327 "
            "onnxruntime::{anonymous}::PosixThread::PosixThread(const char*, int, unsigned "
            "int (*)(int, Eigen::ThreadPoolInterface*), Eigen::ThreadPoolInterface*, const "
            "onnxruntime::ThreadOptions&) pthread_create failed, error code: 12 error msg: "
            "Cannot allocate memory",
        ),
        (
            TEI,
            "tei_oom.log",
            "2025-01-14T10:22:33.104452Z ERROR text_embeddings_backend: backends/src/lib.rs:388: "
            "Could not start Candle backend: Could not start backend: "
            'DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")',
        ),
    ],
)
def test_find_oom_in_recorded_logs(adapter: Adapter, log: str, first_oom_line: str) -> None:
    assert find_oom(adapter, fixture(log)) == first_oom_line
    assert find_oom(OPENAI, fixture(log)) == first_oom_line  # the generic set covers all


@pytest.mark.parametrize(
    ("log", "needle"),
    [
        ("vllm_oom_request.log", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
        ("vllm_oom_startup.log", "ValueError: Free memory on device (14.61/23.53 GiB)"),
        ("vllm_oom_cache_blocks.log", "No available memory for the cache blocks"),
        # vLLM 0.32's CPU build: the KV cache that the host cannot give, and the one that
        # is larger than the NUMA node (VLLM_CPU_KVCACHE_SPACE=40 on 24 GiB)
        ("vllm_cpu_oom_host.log", "DefaultCPUAllocator: can't allocate memory"),
        ("vllm_cpu_oom_kv_space.log", "less than requested memory for kv (40.0 GiB)"),
    ],
)
def test_find_oom_in_vllm_logs(log: str, needle: str) -> None:
    line = find_oom(VLLM, fixture(log))
    assert line is not None and needle in line


@pytest.mark.parametrize(
    ("adapter", "log"),
    [
        (LLAMA_CPP, "llamacpp_ready.log"),
        (LLAMA_CPP_PYTHON, "llamacpp_python_bad_path.log"),
        (VLLM, "vllm_ready.log"),
        (WHISPER_CPP, "whispercpp_ready.log"),
        (SD_CPP, "sdcpp_ready.log"),
        (TEI, "tei_ready.log"),
    ],
)
def test_no_oom_in_healthy_logs(adapter: Adapter, log: str) -> None:
    assert find_oom(adapter, fixture(log)) is None
    assert find_oom(OPENAI, fixture(log)) is None


OOM_LINES: dict[str, tuple[list[str], list[str]]] = {
    # adapter: (lines that are out-of-memory, lines that are not)
    "llama.cpp": (
        [
            # a real llama-server out of host memory under vramd (make test-real)
            "0.00.127.041 E llama_init_from_model: failed to initialize the context: "
            "std::bad_alloc",
            "0.00.644.406 E ggml_aligned_malloc: insufficient memory (attempted to allocate "
            "4096.00 MB)",
            "alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624",
            "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
            "ggml_gallocr_reserve_n: failed to allocate CUDA_Host buffer of size 2147483648",
            "graph_reserve: failed to allocate compute buffers",
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1.0 MiB on device 1: "
            "hipMalloc failed: out of memory",
            "ROCm error: out of memory",
            "ggml_vulkan: Device memory allocation of size 4294967296 failed. "
            "vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
            "ggml_metal_graph_compute: command buffer 0 failed with status 5 error: "
            "Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
            '{"error":{"code":500,"message":"CUDA error: out of memory","type":"server_error"}}',
        ],
        [
            "decode: failed to find a memory slot for batch of size 512",
            "CUDA error: an illegal memory access was encountered",
            "llama_context:      CUDA0 compute buffer size =   304.00 MiB",
            "srv  send_error: task id = 87, error: Input prompt is too big compared to KV size.",
            "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not "
            "within the file bounds",
        ],
    ),
    "whisper.cpp": (
        [
            "whisper_sched_graph_init: failed to allocate the compute buffer",
            "whisper_model_load: failed to allocate memory for the model",
            "whisper_kv_cache_init: failed to allocate memory for the kv cache",
        ],
        [
            "whisper_init_state: compute buffer (decode) =   96.35 MB",
            "error: failed to open 'jfk.wav' as WAV file",
        ],
    ),
    "sd.cpp": (
        [
            "[ERROR] ggml_extend.hpp:1641 - vae: failed to allocate the compute buffer",
            "[ERROR] ggml_extend.hpp:1190 - unet alloc params backend buffer failed, "
            "num_tensors = 1680",
            "[ERROR] ggml_extend.hpp:1702 - clip alloc runtime params backend buffer failed, "
            "num_tensors = 196",
        ],
        [
            "[INFO ] ggml_extend.hpp:1648 - vae compute buffer size: 480.00 MB(VRAM)",
            "[ERROR] stable-diffusion.cpp:2090 - decode_first_stage failed for latent 1",
        ],
    ),
    "vllm": (
        [
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
            "RuntimeError: CUDA error: out of memory",
            "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB.",
            "ValueError: To serve at least one request with the models's max seq len (262144), "
            "(24.0 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(3.18 GiB).",
            "ValueError: The model's max seq len (32768) is larger than the maximum number of "
            "tokens that can be stored in KV cache (7344).",
            '{"object":"error","message":"CUDA out of memory. Tried to allocate 2.32 GiB",'
            '"type":"InternalServerError","param":null,"code":500}',
        ],
        [
            "INFO 09-03 [loggers.py:123] Running: 3 reqs, GPU KV cache usage: 97.3%",
            "INFO [gpu_worker.py:104] Sleep mode freed 20.41 GiB memory, 0.89 GiB memory is "
            "still in use.",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "WARNING [scheduler.py:1754] Sequence group 12 is preempted by "
            "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.",
        ],
    ),
    "tei": (
        [
            "Error: Could not create backend: torch.OutOfMemoryError: CUDA out of memory.",
            'DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")',
        ],
        ["Error: Could not download model artifacts"],
    ),
    "llama-cpp-python": (
        ["MemoryError", "cudaMalloc failed: out of memory"],
        ["ValueError: Failed to create llama_context"],
    ),
    "piper": (
        # piper under prlimit --as: importing, creating its session, loading the voice
        [
            "object type name: MemoryError",
            "onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument: [ONNXRuntimeError] "
            ": 2 : INVALID_ARGUMENT : Failed to load model with error: std::bad_alloc",
        ],
        ["WARNING:piper.voice:Missing phoneme from id map: q"],
    ),
    "openai": (
        [
            "2025-01-01 12:00:00.1 [E:onnxruntime:, sequential_executor.cc:516 ExecuteKernel] "
            "Non-zero status code returned while running Conv node. Name:'/conv1/Conv' Status "
            "Message: BFCArena::AllocateRawInternal Failed to allocate memory for requested "
            "buffer of size 268435456",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB.",
            "cudaMalloc failed: out of memory",
        ],
        ["Tip: to avoid running out of memory, lower --batch-size"],
    ),
}


def _oom_cases(positive: bool) -> Iterator[tuple[str, str]]:
    for name, (yes, no) in OOM_LINES.items():
        for line in yes if positive else no:
            yield name, line


@pytest.mark.parametrize(("name", "line"), list(_oom_cases(True)))
def test_oom_lines_match(name: str, line: str) -> None:
    assert find_oom(ADAPTERS[name], f"before\n{line}\nafter") == line


@pytest.mark.parametrize(("name", "line"), list(_oom_cases(False)))
def test_non_oom_lines_do_not_match(name: str, line: str) -> None:
    assert find_oom(ADAPTERS[name], line) is None


# --- vLLM sleep mode -------------------------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


@asynccontextmanager
async def vllm_client(handler: Handler) -> AsyncIterator[tuple[httpx.AsyncClient, list[str]]]:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}?{request.url.query.decode()}")
        return handler(request)

    transport = httpx.MockTransport(record)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:41811") as c:
        yield c, seen


def sleep_mode_server() -> Handler:
    """A vLLM started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path in ("/sleep", "/wake_up"):
            return httpx.Response(200)
        return httpx.Response(404, json={"detail": "Not Found"})

    return handle


async def test_sleep_and_wake_up_round_trip() -> None:
    async with vllm_client(sleep_mode_server()) as (client, seen):
        assert await vllm_sleep.sleep(client) is True
        assert await vllm_sleep.wake_up(client) is True
    assert seen == ["POST /sleep?level=1", "POST /wake_up?"]


async def test_sleep_level_two_and_partial_wake_up() -> None:
    async with vllm_client(sleep_mode_server()) as (client, seen):
        assert await vllm_sleep.sleep(client, level=2) is True
        assert await vllm_sleep.wake_up(client, tags=["weights"]) is True
        assert await vllm_sleep.wake_up(client, tags=["kv_cache"]) is True
    assert seen == [
        "POST /sleep?level=2",
        "POST /wake_up?tags=weights",
        "POST /wake_up?tags=kv_cache",
    ]


async def test_sleep_level_must_be_one_or_two() -> None:
    async with vllm_client(sleep_mode_server()) as (client, seen):
        with pytest.raises(ValueError, match="level must be 1 or 2"):
            await vllm_sleep.sleep(client, level=3)
    assert seen == []


async def test_without_dev_mode_the_routes_are_404() -> None:
    def not_dev_mode(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    async with vllm_client(not_dev_mode) as (client, _):
        assert await vllm_sleep.sleep(client) is False
        assert await vllm_sleep.wake_up(client) is False


async def test_server_errors_are_false_not_raised() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="Internal Server Error")

    async with vllm_client(broken) as (client, _):
        assert await vllm_sleep.sleep(client) is False
        assert await vllm_sleep.wake_up(client) is False


async def test_connection_errors_are_false_not_raised() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with vllm_client(refused) as (client, _):
        assert await vllm_sleep.sleep(client) is False
        assert await vllm_sleep.wake_up(client) is False


async def test_timeouts_are_false_not_raised() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with vllm_client(slow) as (client, _):
        assert await vllm_sleep.sleep(client) is False
        assert await vllm_sleep.wake_up(client) is False


# --- piper: OpenAI's speech request in piper's own shape ----------------------------------


def test_piper_speaks_openais_input_at_the_speed_asked() -> None:
    from service.adapters.piper import speech_request

    openai_body = {"model": "tts", "input": "Hello.", "voice": "alloy", "speed": 2.0,
                   "response_format": "wav"}  # fmt: skip
    assert speech_request(openai_body) == {
        "text": "Hello.",
        "length_scale": 0.5,
        "speaker": "alloy",
    }
    assert speech_request({"input": "Hi"}) == {"text": "Hi"}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "Hi", "response_format": "mp3"}, "response_format 'mp3'"),
        ({"input": "  "}, "'input'"),
        ({"voice": "alloy"}, "'input'"),
        ({"input": "Hi", "speed": 0}, "'speed'"),
        ({"input": "Hi", "speed": "fast"}, "'speed'"),
    ],
)
def test_piper_refuses_what_it_cannot_speak_naming_it(body: dict[str, object], named: str) -> None:
    from service.adapters.piper import speech_request

    with pytest.raises(ValueError, match=named):
        speech_request(body)
