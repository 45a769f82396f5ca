VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tether --folder examples --store sqlite:///.tether/demo.db run pipeline --input '{"count": 5}' --poll-ms 100

test: $(STAMP)
	$(PY) -m pytest -q

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
