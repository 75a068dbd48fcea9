# Two entry points, each doing all set-up on a fresh machine:
#   make demo   trains and scores the embedded demo (no download); each run starts afresh in outputs/demo
#   make test   runs lint and the test suite but the tests marked slow (the numerics tests also under two other CPU
#               capabilities), spread over the machine's cores by pytest-xdist (PYTEST_WORKERS=0 runs it in one process);
#               CI runs it
# and a third for the tests marked slow (the experiments' scripts end to end, fine-tuning a converted Marian model,
# more multi-process runs, long inductor compiles, Triton's compile for a GPU), to run before a change to what they
# cover lands and before GPU time is spent on an experiment:
#   make test-slow
# torch is pinned first so pip never pulls a different (CUDA) build; TORCH_SPEC is pip's arguments for it, e.g.
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" for a CUDA build.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PYTEST_WORKERS ?= logical
NUMERICS_CAPABILITIES ?= default avx2
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[train,dev,viz]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python train_translation.py configs/demo.yaml --overwrite_output_dir true

# one worker per logical core, at most 8 (each holds its own torch); worksteal evens out the long end-to-end tests
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 8 --dist worksteal

# Lint, the suite but the slow tests (its 20 slowest listed at the end, for CI's time), then the tests marked numerics
# (pyproject.toml's markers say which) again under the CPU kernels torch picks on other machines (those of this
# machine ran in the suite): a pass must not depend on them. One pytest-xdist worker per capability runs every numerics
# test (--dist each; a failure names its worker, the capability).
test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(PYTEST) -ra --durations=20 -m "not slow"
	native=$$($(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"); \
	workers=""; \
	for capability in $(NUMERICS_CAPABILITIES); do \
		if [ "$$capability" = "$$native" ]; then echo "numerics under $$capability: run above"; continue; fi; \
		workers="$$workers --tx popen//id=$$capability//env:ATEN_CPU_CAPABILITY=$$capability"; \
	done; \
	if [ -n "$$workers" ]; then $(BIN)/python -m pytest -q -m "numerics and not slow" --dist each $$workers; fi

test-slow: $(VENV)/.installed
	$(PYTEST) -ra --durations=20 -m slow

.PHONY: install demo test test-slow
