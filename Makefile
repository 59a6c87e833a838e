# vcbench: every target sets itself up; `make test` and `make demo` work from a fresh clone.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch and torchvision come as a matched pair (lpips imports torchvision); on machines with
# a local wheel cache pip takes them from there.
.DEFAULT_GOAL := help

.PHONY: help setup test demo lint
help:
	@echo "make setup   create .venv and install vcbench with its dev tools"
	@echo "make test    run the test suite (CPU; GPU tests skip)"
	@echo "make demo    the main job on the embedded tiny default, on CPU"
	@echo "make lint    ruff"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check vcbench tests

DEMO := results/demo
demo: setup
	$(BIN)/vcbench analyze expcast --out $(DEMO)/expcast
	$(BIN)/vcbench analyze token-order --out $(DEMO)/token-order
	$(BIN)/vcbench analyze kernel-error --out $(DEMO)/kernel-error
	@echo "demo results in $(DEMO)"

.PHONY: bench
bench: setup  ## GPU: kernel timings at the Wan2.2 and LongCat shapes
	$(BIN)/vcbench timeit --shape wan22-720p --out results/bench-wan22
	$(BIN)/vcbench timeit --shape longcat-480p --out results/bench-longcat
