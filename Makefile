# Two entry points, each doing all set-up on a fresh machine:
#   make demo   trains and scores the embedded demo (no download); each run starts afresh in outputs/demo
#   make test   runs lint and the test suite
# torch is pinned first so pip never pulls a different (CUDA) build; override with TORCH_SPEC=... for GPU wheels.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,viz]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python train_translation.py configs/demo.yaml --overwrite_output_dir true

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -ra

.PHONY: install demo test
