# gpuaccept: `make run` runs the suite on this machine, `make test` runs lint, types and tests.
# Both create .venv first. Where python3 already has torch (an NGC PyTorch container), the venv
# sees the system site-packages and a constraints file pins the installed torch, so nothing
# replaces it; elsewhere torch==$(TORCH_VERSION) is installed into the venv.

PY ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
EXTRAS ?= dev
ARGS ?= --profile quick
BIN := $(VENV)/bin

.PHONY: help venv run test lint typecheck unit docs docs-gen docs-serve bench clean

help:
	@echo "make run   [ARGS='--profile standard']  set up .venv and run the suite on this machine"
	@echo "make test                               set up .venv, then ruff, mypy, the docs site and pytest"
	@echo "make docs                               build the documentation site into site/ (mkdocs --strict)"
	@echo "make docs-gen                           regenerate docs/reference/cli.md, docs/checks/*.md and the like"
	@echo "make bench [BENCH_DEVICE=cuda]          benchmarks (see bench/RESULTS.md)"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@set -e; \
	if $(PY) -c 'import torch' >/dev/null 2>&1; then \
	  echo "using the torch already installed for $(PY)"; \
	  $(PY) -m venv --system-site-packages $(VENV); \
	  $(PY) -m pip freeze 2>/dev/null | grep -iE '^(torch|triton|nvidia-)' > $(VENV)/constraints.txt || true; \
	else \
	  $(PY) -m venv $(VENV); \
	  $(BIN)/pip install -q torch==$(TORCH_VERSION); \
	  $(BIN)/python -m pip freeze | grep -iE '^(torch|triton|nvidia-)' > $(VENV)/constraints.txt || true; \
	fi; \
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[$(EXTRAS)]'; \
	touch $@

run: venv
	$(BIN)/gpuaccept run $(ARGS)

lint: venv
	$(BIN)/ruff check src tests bench

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q

# the generated pages must be current (python -m gpuaccept.docsgen --check), and the site must build without a warning
docs: venv
	$(BIN)/python -m gpuaccept.docsgen docs --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-gen: venv
	$(BIN)/python -m gpuaccept.docsgen docs

docs-serve: venv
	$(BIN)/mkdocs serve

test: lint typecheck docs unit

BENCH_DEVICE ?= cpu
bench: venv
	$(BIN)/python bench/bench_compute.py --device $(BENCH_DEVICE)
	$(BIN)/python bench/bench_memory.py --device $(BENCH_DEVICE)
	$(BIN)/python bench/bench_startup.py --device $(BENCH_DEVICE)
	$(BIN)/python bench/bench_healthcheck.py --device $(BENCH_DEVICE)
	$(BIN)/python bench/bench_nbody.py --device $(BENCH_DEVICE)
	$(BIN)/python bench/bench_stress.py --device $(BENCH_DEVICE)

clean:
	rm -rf $(VENV) site gpuaccept-reports .pytest_cache .mypy_cache .ruff_cache
