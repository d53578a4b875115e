# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
CLUSTER := $(PY) tests/cluster/localslurm.py

.PHONY: run ui test install install-dev cluster-up cluster-down lint

install:
	scripts/bootstrap

install-dev:
	scripts/bootstrap dev

# Install, then run the default experiment locally.
run: install
	$(VENV)/bin/stoker run

# The MLflow UI on the store `make run` recorded into (http://127.0.0.1:5000).
ui:
	$(VENV)/bin/stoker ui

# Install everything, start the local SLURM cluster, run the whole suite (the cluster
# tests and the rest side by side: scripts/test-suite; STOKER_TEST_SERIAL=1 for one
# process), lint,
# stop the cluster (also when tests fail) and keep pytest's exit status.
test: install-dev
	$(CLUSTER) install
	$(PY) tests/browser.py install
	$(PY) tests/promtool.py install
	$(CLUSTER) start
	status=0; \
	STOKER_VENV=$(VENV) scripts/test-suite $(PYTEST_ARGS) || status=$$?; \
	$(MAKE) --no-print-directory lint || status=$$((status ? status : 1)); \
	$(CLUSTER) stop || true; \
	exit $$status

lint:
	$(VENV)/bin/ruff check stoker tests benchmarks
	$(VENV)/bin/ruff format --check stoker tests benchmarks
	$(VENV)/bin/mypy

cluster-up:
	$(CLUSTER) install
	$(CLUSTER) start

cluster-down:
	$(CLUSTER) stop
