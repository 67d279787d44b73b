# The two commands of README.md: `make demo` (the main job) and `make test` (everything CI runs).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default (SQLite + local-process provider): `boxwright serve`, the
# coordinator with the run viewer page at /, whose built-in demo agent works offline (PORT= picks the
# port, 0 any). `boxwright demo` is the terminal demo.
demo: $(STAMP)
	$(BIN)/boxwright doctor
	$(BIN)/boxwright serve $(if $(PORT),--port $(PORT))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check boxwright
	$(BIN)/mypy

# Three workers on CI's two cores: most of the suite waits (on agents, containers, leases, sleeps of
# the kill cases), so files run side by side; a file stays on one worker (its module fixtures: a
# Redis server, a fake cloud, a replica pair). The slowest 40 tests are listed for the CI budget.
test: lint
	$(BIN)/pytest -q -p no:cacheprovider -n 3 --dist loadfile --durations=40

bench: $(STAMP)
	$(BIN)/python bench/exec_overhead.py
	$(BIN)/python bench/event_codec.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
