# ampscope: `make demo` runs the product, `make test` runs every test. Both start from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The dev/test install pins torch to the CPU build that lies on this machine's disk; users bring
# their own torch (pyproject.toml never pins it).
TORCH  ?= torch==2.13.0
PORT   ?= 8765
# pytest-xdist processes. The suite waits more than it computes (servers, Chromium, sockets), so
# more processes than cores pay (4 against 2 on the 2-core reference machine). The fast tier
# mostly computes, and each process collects it for ~6 s: 3 took 61-62 s against 66-68 s for 4
# and 67 s for 2 (alternating runs, 2026-12-06).
WORKERS ?= 4
FAST_WORKERS ?= 3
# pytest rewrites every test module's asserts at import and keeps the result as bytecode; with
# PYTHONDONTWRITEBYTECODE set (as on this machine) it redid that in each process of each run
# (a collection took 17 s of CPU, 9.5 s with the cache).
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/pytest --dist loadfile --durations=25
FAST   := not (browser or multiprocess or compile or frameworks or slow)
# The web has no build step: tsc only checks web/js's JSDoc types (tsconfig.json: noEmit), and
# node runs the unit tests of its pure modules. Both need Node >= 20; tsc also npm.
TSC       := npx --no-install tsc -p .
NODE_TEST := node --test --test-reporter=dot tests/web/js/*.test.mjs

.PHONY: demo test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setuptools announces every editable install with a boxed "be careful with folders named like
# your package" note (an InformationOnly warning, not a problem): filtered so `make demo` is quiet.
# The demo needs the server and torch (with numpy, without which every `import torch` warns
# "Failed to initialize NumPy"); the tests add their toolchain and the frameworks.
$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet "$(TORCH)" numpy -e ".[server]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet "$(TORCH)" -e ".[server,dev,integrations-test]"
	touch $@

# TypeScript, exactly as package-lock.json pins it (the web's only dependency, a dev tool).
node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "make: the web's checks need Node.js >= 20 with npm" >&2; exit 1; }
	npm ci --no-audit --no-fund --silent
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python examples/demo.py --port $(PORT)

test: $(VENV)/.installed-test node_modules/.installed
	bash scripts/ensure-system.sh
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy client_hook server tests examples bench
	$(TSC)
	$(NODE_TEST)
	$(PYTEST) -n $(WORKERS)

# Before every commit: everything but the browser, multi-process, compile, framework and slow
# tiers, on both databases.
test-fast: $(VENV)/.installed-test
	$(NODE_TEST)
	$(PYTEST) -n $(FAST_WORKERS) -m "$(FAST)"

lint: $(VENV)/.installed-test node_modules/.installed
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy client_hook server tests examples bench
	$(TSC)

bench: $(VENV)/.installed-test
	$(BIN)/python bench/hook_overhead.py

clean:
	rm -rf $(VENV) node_modules .ampscope test-artifacts .pytest_cache .mypy_cache .ruff_cache
