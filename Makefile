# ampscope: `make demo` runs the product, `make test` runs every test. Both start from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The dev/test install pins torch to the CPU build that lies on this machine's disk; users bring
# their own torch (pyproject.toml never pins it).
TORCH  ?= torch==2.13.0
PORT   ?= 8765

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setuptools announces every editable install with a boxed "be careful with folders named like
# your package" note (an InformationOnly warning, not a problem): filtered so `make demo` is quiet.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet "$(TORCH)" -e ".[server,dev]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py --port $(PORT)

test: $(VENV)/.installed
	bash scripts/ensure-system.sh
	$(BIN)/ruff check .
	$(BIN)/mypy client_hook server tests examples bench
	$(BIN)/pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy client_hook server tests examples bench

bench: $(VENV)/.installed
	$(BIN)/python bench/hook_overhead.py

clean:
	rm -rf $(VENV) .ampscope test-artifacts .pytest_cache .mypy_cache .ruff_cache
