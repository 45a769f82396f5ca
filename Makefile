VENV ?= .venv
PY := $(VENV)/bin/python
# The package alone (what the demo needs), then the development tools (what the tests need).
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check clean

$(BASE_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -e . --config-settings editable_mode=compat
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/tether --folder examples --store sqlite:///.tether/demo.db run pipeline --input '{"count": 5}' --poll-ms 100

test: $(STAMP)
	scripts/with-postgres $(PY) -m pytest -q -rs

lint: $(STAMP)
	$(VENV)/bin/ruff check tether tests bench examples
	$(VENV)/bin/ruff format --check tether tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict tether

check: test lint typecheck

clean:
	rm -rf $(VENV) .tether .pytest_cache .mypy_cache .ruff_cache

.PHONY: docs
docs: $(STAMP)
	$(PY) -m tether.clidoc docs/cli.md
	$(PY) -m tether.docgen

# Benchmarks: the peers are benchmark-only dependencies in their own environment (bench/.venv).
BENCH_VENV := bench/.venv
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=

$(BENCH_STAMP): bench/requirements.txt pyproject.toml
	test -x $(BENCH_PY) || python3 -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install --quiet --upgrade pip
	$(BENCH_PY) -m pip install --quiet -r bench/requirements.txt
	$(BENCH_PY) -m pip install --quiet -e .
	touch $(BENCH_STAMP)

.PHONY: bench bench-smoke
bench: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.run $(BENCH_ARGS)

bench-smoke: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.run --smoke $(BENCH_ARGS)

# The reliability suite at soak sizes; its counts go to a dated report in docs/reliability/.
SOAK_REPORT ?= docs/reliability/soak-$(shell date +%F).md

.PHONY: soak
soak: $(STAMP)
	mkdir -p $(dir $(SOAK_REPORT))
	rm -f $(SOAK_REPORT)
	TETHER_SOAK=1 TETHER_SOAK_REPORT=$(SOAK_REPORT) scripts/with-postgres $(PY) -m pytest -q -s tests/reliability
	@echo "soak report: $(SOAK_REPORT)"
