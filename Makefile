# toolwatch — two commands on a fresh machine (Python 3.11 + make):
#   make demo   set up, analyze the bundled sample logs, print flagged sessions, open the dashboard
#   make test   set up (incl. Chromium for the browser test) and run the whole test suite
# While editing:
#   make test-fast   unit and in-process tests only (-m "not slow"), on every core, with
#                    few Hypothesis examples: a few minutes. CONTRIBUTING.md has the tiers.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_DIR ?= .toolwatch/demo
# The demo's log files (labels.ndjson and manifest.json beside them are not logs).
DEMO_LOGS := $(wildcard sample_logs/demo/*.jsonl*)
PORT   ?= 8501
# make test's xdist workers. Three on two cores: many tests wait on processes they start,
# so two workers left the cores ~30% idle.
TEST_WORKERS ?= 3

.PHONY: setup setup-dev browser demo analyze-demo dashboard test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Runtime install (editable, so the repo's sample logs and dashboard files are used in place).
# Stamp files: the install reruns only when pyproject.toml changes.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# Test/dev install: extras plus a Jupyter kernel for the notebook test.
setup-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@ $(VENV)/.installed

# Debian's Chromium for the real-browser dashboard test (Playwright drives it; no browser
# download). Needs root (CI runs as root); elsewhere install it yourself or the test skips.
browser:
	@if [ -x /usr/bin/chromium ]; then echo "chromium present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "apt-get install chromium failed"; exit 1; }; \
	else echo "chromium missing and not root: the browser test will be skipped"; fi

# The main job on the embedded default: sample logs -> store -> detectors -> flagged
# sessions, then the dashboard on the same store.
analyze-demo: setup
	rm -rf $(DEMO_DIR)
	$(BIN)/toolwatch analyze $(DEMO_LOGS) -c sample_logs/demo/toolwatch.toml -d $(DEMO_DIR)/store --alerts-out $(DEMO_DIR)/alerts.jsonl

demo: analyze-demo
	@echo "alerts written to $(DEMO_DIR)/alerts.jsonl"
	$(BIN)/toolwatch dashboard -d $(DEMO_DIR)/store --port $(PORT)

# Two phases. Everything on pytest-xdist workers, one file at a time (a module's fixture
# is built once), but the tests marked `alone` (Kafka consumer groups that rebalance within
# deadlines another worker's load can overrun); then those, one at a time. Both phases
# always run; the target fails if either fails (pytest's 5, "no tests", is a failure).
test: setup-dev browser
	@rc=0; \
	$(BIN)/python -m pytest -m "not alone" -n $(TEST_WORKERS) --dist loadfile || rc=$$?; \
	$(BIN)/python -m pytest -m alone || rc=$$?; \
	exit $$rc

# The tier to run while editing: no process-starting, browser, broker or long tests
# (marked `slow`), property tests on the `dev` Hypothesis profile (tests/conftest.py),
# spread over the cores by pytest-xdist: one file per worker at a time (--dist loadfile),
# so a module's expensive fixture is built once. `make test` stays the full suite.
test-fast: setup-dev
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -m "not slow" -n auto --dist loadfile -q

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layers.py  # import-linter floors

bench: setup
	$(BIN)/python benchmarks/bench_ingest.py

clean:
	rm -rf $(VENV) .toolwatch artifacts build *.egg-info
