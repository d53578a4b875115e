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
# process) with lint beside it at nice 19 (it fills the time the tests wait), stop the
# cluster (also when tests fail) and keep pytest's exit status, else lint's.
# Each part's wall time, each test's CPU seconds and the machine's (/proc/stat) go to
# $(COST_DIR); the budget table
# prints last (tests/cost_report.py; docs/operations.md, "The suite's budget").
COST_DIR ?= .test-cost
test:
	rm -rf $(COST_DIR); mkdir -p $(COST_DIR); head -1 /proc/stat >$(COST_DIR)/proc-stat.start
	@began=$$(date +%s); $(MAKE) --no-print-directory install-dev && \
	printf 'install\t%s\n' $$(( $$(date +%s) - began )) >>$(COST_DIR)/parts.tsv
	@began=$$(date +%s); $(CLUSTER) install && $(PY) tests/browser.py install && \
	$(PY) tests/promtool.py install && $(CLUSTER) start && \
	printf 'cluster and tools start\t%s\n' $$(( $$(date +%s) - began )) >>$(COST_DIR)/parts.tsv
	status=0; began=$$(date +%s); \
	( nice -n 19 $(MAKE) --no-print-directory lint >$(COST_DIR)/lint.log 2>&1; \
	  echo $$? >$(COST_DIR)/lint.status; \
	  printf 'lint\t%s\tside\n' $$(( $$(date +%s) - began )) >>$(COST_DIR)/parts.tsv ) & \
	STOKER_VENV=$(VENV) STOKER_TEST_COST_DIR=$(abspath $(COST_DIR)) scripts/test-suite $(PYTEST_ARGS) || status=$$?; \
	wait; echo; echo "=== lint (exit $$(cat $(COST_DIR)/lint.status)) ==="; cat $(COST_DIR)/lint.log; \
	[ "$$(cat $(COST_DIR)/lint.status)" = 0 ] || status=$$((status ? status : 1)); \
	$(CLUSTER) stop || true; \
	head -1 /proc/stat >$(COST_DIR)/proc-stat.end; \
	$(PY) -m tests.cost_report $(COST_DIR) || true; \
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
