# Two commands on a fresh machine: `make book` and `make test`. Each builds .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
# CPU measurements run on one thread: stable on a shared machine, and every stamp records it.
export OMP_NUM_THREADS ?= 1

.PHONY: book test lab bench env clean

$(READY): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(READY)

# The HTML book, every notebook executed (cached by jupyter-cache), warnings as errors.
book: $(READY)
	KVLAB_STATIC=1 $(BIN)/jupyter-book build . -W --keep-going
	@echo "open _build/html/index.html"

# All tests: kvlab against its oracles, then every notebook executed in a fresh kernel and the book
# built from those executed notebooks with warnings as errors.
test: $(READY)
	$(BIN)/python -m pytest -n 2 --dist loadfile -q

lab: $(READY)
	$(BIN)/jupyter lab notebooks

bench: $(READY)
	$(BIN)/python -m kvlab bench

env: $(READY)
	$(BIN)/python -m kvlab env

clean:
	rm -rf _build .pytest_cache .hypothesis .jupyter_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
