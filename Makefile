# Two entry points, each doing all set-up on a fresh machine:
#   make demo   trains and scores the embedded demo (no download); each run starts afresh in outputs/demo
#   make test   runs lint and the test suite (the numerics tests also under two other CPU capabilities)
# torch is pinned first so pip never pulls a different (CUDA) build; override with TORCH_SPEC=... for GPU wheels.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[train,dev,viz]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python train_translation.py configs/demo.yaml --overwrite_output_dir true

# The float64 oracle tests again under the CPU kernels torch picks on other machines: a pass must not depend on them.
NUMERICS_TESTS := tests/test_positions.py tests/test_xl_memory.py tests/test_lm_memory.py tests/test_kernels.py \
	tests/test_loss.py tests/test_window.py tests/test_length_scaling.py tests/test_fused_attention.py \
	tests/test_triton_shaw.py tests/test_scheme_toy.py tests/test_generation_limits.py tests/test_key_dropout.py

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -ra
	for capability in default avx2; do \
		ATEN_CPU_CAPABILITY=$$capability $(BIN)/python -m pytest -q -m "not slow" $(NUMERICS_TESTS) || exit 1; \
	done

.PHONY: install demo test
