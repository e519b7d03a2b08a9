# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo crash-table chaos partition-soak bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

# The console on http://127.0.0.1:8000/, two supervised workers and the refund-desk agent,
# on the embedded SQLite database under var/ (Ctrl-C stops everything).
demo: install
	$(PY) manage.py demo $(DEMO_ARGS)

# Regenerate the README's crash-safety table from a real run of the crash matrix (on SQLite;
# the same matrix on PostgreSQL writes test-output/crash-matrix-postgres.md).
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

# Benchmarks against this disk's own fsync ceiling (prints a table; see README "Performance").
bench: install
	$(PY) manage.py bench $(BENCH_ARGS)
