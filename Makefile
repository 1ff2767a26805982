# Every target builds its own virtual environment, so a fresh machine with Python 3.11+ needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo docs test lint typecheck unit long bench clean chromium node-clients

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(VENV)/.runtime $@

demo: $(VENV)/.runtime
	$(BIN)/python examples/research_team.py

# The docs site alone: built strictly (a broken link or a missing API name fails it, as in the
# tests), then served at http://127.0.0.1:8000 with a rebuild on each change, until Ctrl+C.
# No test runs: `unit` checks the site and runs every code block.
docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve --strict --dev-addr 127.0.0.1:8000

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.dev
	$(BIN)/pyright
	# The public API must be fully typed as a user's type checker sees it installed (pyright
	# cannot see through an editable install, so this checks a plain install of the tree).
	rm -rf $(VENV)/verifytypes
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --target $(VENV)/verifytypes .
	cd $(VENV)/verifytypes && for package in orchestrator stores; do \
		PYTHONPATH=. ../bin/pyright --pythonpath ../bin/python --verifytypes $$package \
		--ignoreexternal --outputjson > ../verifytypes-$$package.json \
		|| { PYTHONPATH=. ../bin/pyright --pythonpath ../bin/python --verifytypes $$package \
		--ignoreexternal; exit 1; }; done

# Under coverage with branches: the report fails below the floor in pyproject.toml. The
# PostgreSQL tests run against a throwaway server the script starts (installing Debian's
# postgresql package if it is missing) and stops; they are required, never skipped. The
# viewer's browser tests need Debian's chromium, installed here if missing. The protocol
# adapters' tests run the official clients in Node.js: Debian's nodejs if missing, and the npm
# packages pinned in tests/apps/node (the only step that reaches the npm registry).
# The Ray tests (marker `ray`) run apart, inside a private network namespace with only the
# loopback up (scripts/in_netns.sh): Ray binds to the external interface even when told
# 127.0.0.1, and no test may reach outside 127.0.0.0/8. The first run deselects them.
# The first run spreads the tests over two worker processes (pytest-xdist, taking the next test
# as each is free): most tests wait on servers, subprocesses and a browser as much as they
# compute, and under coverage one process took 19-23 minutes. pytest-cov gathers the workers'
# coverage; the report at the end holds both runs and fails below the floor.
unit: $(VENV)/.dev chromium node-clients
	ORCHESTRATOR_TEST_POSTGRES=required scripts/with_postgres.sh \
		$(BIN)/python -m pytest -n 2 --dist worksteal --cov --cov-report= --cov-fail-under=0
	scripts/in_netns.sh $(BIN)/python -m pytest -m ray \
		--cov --cov-append --cov-report= --cov-fail-under=0
	$(BIN)/python -m coverage report

test: lint typecheck unit

# The long stress runs (1,000 kills per store backend), deselected from `unit`.
long: $(VENV)/.dev
	ORCHESTRATOR_TEST_POSTGRES=required scripts/with_postgres.sh \
		$(BIN)/python -m pytest -m long -s tests/stress

# PostgreSQL with its durable defaults (fsync on); where it cannot be started, the benchmarks
# run without it and its rows say so.
bench: $(VENV)/.dev
	scripts/with_postgres.sh --durable --optional $(BIN)/python -m benchmarks

chromium:
	scripts/ensure_chromium.sh

node-clients:
	scripts/ensure_node_clients.sh

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache .hypothesis .cache/node-clients tests/apps/node/node_modules
