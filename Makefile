# Every target bootstraps .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint demo venv clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,lint,s3,ha]'
	touch $(STAMP)

test: $(STAMP)
	-@sh bin/ensure-test-packages
	$(PY) -m pytest -q -p no:cacheprovider tests

# ruff and mypy read their settings from pyproject.toml ([tool.ruff], [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(PY) -m elastane_cli.demo

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
