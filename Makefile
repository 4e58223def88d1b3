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

# Three xdist workers on the 2-core CI machine: the cluster tests spend most of their time waiting
# on daemons and on CPU-budgeted testbed hosts (the quick 16-core suite: 23 s of CPU in 88 s), so
# a third overlaps the other two's waits. Measured on a fresh 2-core machine, the whole suite:
# 563-589 s on two workers, 480-485 s on three (557 s with a simulator bench running beside it).
# loadfile keeps a module on one worker (a cluster it shares is built once);
# tests/support/parallel_plan.py sends the long modules first. `make test TEST_WORKERS=0` runs the
# suite serially, in one process.
TEST_WORKERS ?= 3

test: $(STAMP)
	-@sh bin/ensure-test-packages
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 tests

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
