# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Test processes: one per CPU (pytest-xdist). Tests that hold a machine-wide resource (CPUs
# claimed by workers, network namespaces) share one process ("machine" group), in turn.
PYTEST_JOBS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_JOBS) --dist loadgroup

.PHONY: install test test-quick check docs lint demo crash-table chaos partition-soak bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The static checks: lint, the import contracts (pyproject.toml [tool.importlinter]) and the
# type checker.
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

lint: check

# Every test: both engines (PostgreSQL must be running), the browser, real processes.
test: check
	$(PY) -m pytest $(PYTEST_PARALLEL)

# The SQLite unit and contract tests, for a contributor without PostgreSQL: a few minutes.
test-quick: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	RUNTIME_TEST_ENGINES=sqlite $(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow" -q

# The documentation site on http://127.0.0.1:8001/ (Ctrl-C stops it).
docs: install
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

# The console on http://127.0.0.1:8000/, two supervised workers and the refund-desk agent,
# on the embedded SQLite database under var/ (Ctrl-C stops everything).
demo: install
	$(PY) manage.py demo $(DEMO_ARGS)

# Regenerate the crash-safety table from a real run of the crash matrix (on SQLite; the same
# matrix on PostgreSQL writes test-output/crash-matrix-postgres.md).
crash-table: install
	$(PY) -m pytest tests/runtime/test_crash_matrix.py -q
	@cat test-output/crash-matrix.md

# The long chaos soak (the suite runs a short one).
chaos: install
	$(PY) manage.py chaos --workers 3 --runs 200 --seconds 60 --seed $${SEED:-1}

# The long partition soak: three hosts (network namespaces; needs root) against a PostgreSQL
# server of its own, with partitions, pauses, skewed clocks, kills and server restarts.
partition-soak: install
	$(PY) manage.py chaos --hosts 3 --runs 300 --seconds 180 --tool-seconds 0.5 --seed $${SEED:-1}

clean:
	rm -rf $(VENV) var/*.sqlite3* .pytest_cache

# Benchmarks against this disk's own fsync ceiling (prints a table; see docs/performance.md).
bench: install
	$(PY) manage.py bench $(BENCH_ARGS)
