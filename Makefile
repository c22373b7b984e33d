# The two front-door commands: `make run` (gateway, with an embedded nats-server unless
# JSGW_NATS_URL is set) and `make test` (installs everything it needs, then runs the suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# axe-core for the console's accessibility checks (tests/browser; see its rule below).
AXE_VERSION := 4.14.1
AXE := $(VENV)/axe/node_modules/axe-core/axe.min.js
# The versions the suite passed with: every install (this venv, CI, deploy/Dockerfile) is
# constrained to them, so a release published tomorrow changes nothing until `make lock`.
CONSTRAINTS := constraints.txt

.PHONY: run test lint openapi docs problems clean chromium lock

run: $(STAMP)
	$(BIN)/jsgw serve

# nats-server releases other than the installed one that tests/integration runs against,
# each installed into .venv/nats-servers/<version> (docs/releases.md); the first is the
# oldest the gateway supports, and `make test` runs it too.
COMPAT_RELEASES := 2.10.26 2.11.11 2.12.8 2.14.6
# What `make test` runs against the oldest: what the gateway offers there (KV's own
# operations, docs/releases.md) and the checks that it refuses the rest; `make compat` runs
# all of tests/integration against each release.
OLDEST_TESTS := tests/integration/test_kv*.py tests/integration/test_server_releases.py

# The suite runs in two processes (pytest-xdist, tests/parallel.py): a module's tests stay
# together in one process, and the tests whose latency bounds the suite's own load could
# decide (browsers, partitions, slow clients, attackers' bodies) run alone at the end.
# Clean-clone CI runs took 14-16 min for the main pass (16.6-19 min in all, install
# included), against 21.5 min serially. `make test PARALLEL=` runs it serially.
# --durations: each run ends with its slowest tests, so that the suite's time stays in view.
PARALLEL ?= -n 2 --dist loadscope
test: $(STAMP) chromium $(AXE) lint
	$(BIN)/pytest -q $(PARALLEL) --durations=20
	$(BIN)/pytest -q $(PARALLEL) --durations=10 $(OLDEST_TESTS) \
		--nats-server $(firstword $(COMPAT_RELEASES))

compat: $(STAMP)
	@for release in $(COMPAT_RELEASES); do \
		echo "== tests/integration against nats-server $$release"; \
		$(BIN)/pytest -q tests/integration --nats-server $$release || exit 1; \
	done

# The code's own rules, before any test: ruff (lint and format) and mypy (strict) as
# configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# tests/browser drive Debian's chromium through Playwright (never `playwright install`).
# Installed here when missing and we can (root with apt); otherwise those tests skip.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for tests/browser"; \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null \
			|| echo "could not install chromium: tests/browser will be skipped"; \
	else echo "tests/browser will be skipped: install Debian's 'chromium' package (apt-get install chromium)"; fi

# tests/browser check the console's accessibility with axe-core (the npm package, injected into
# the page): installed into the venv with the machine's npm; without npm those checks skip.
$(AXE):
	@if command -v npm >/dev/null 2>&1; then \
		npm install -q --no-audit --no-fund --prefix $(VENV)/axe axe-core@$(AXE_VERSION) >/dev/null \
			|| echo "could not install axe-core: the accessibility checks will be skipped"; \
	else echo "no npm: the accessibility checks of tests/browser will be skipped"; fi

openapi: $(STAMP)
	$(BIN)/jsgw openapi -o openapi/openapi.json

# The documentation site (mkdocs.yml, docs/) on 127.0.0.1:8000, rebuilt as pages change.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The pages of the problem codes (docs/problems/), written from the registry in app/errors.py.
problems: $(STAMP)
	$(BIN)/jsgw docs -o docs/problems

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]" -c $(CONSTRAINTS)
	touch $(STAMP)

# Writes $(CONSTRAINTS) from the venv as it is (pip freeze, without jsgw itself).
lock:
	@test -x $(BIN)/pip || { echo "no $(VENV): run make test first" >&2; exit 1; }
	{ printf '%s\n' \
		"# The versions the test suite passed with. make test (CI) and deploy/Dockerfile install" \
		"# with -c $(CONSTRAINTS); tests/deploy/test_constraints.py checks it against pyproject.toml." \
		"# To change a version: edit its pin here (and its range in pyproject.toml if capped)," \
		"# run \`make test\` (which reinstalls), then \`make lock\` to write the whole set again" \
		"# (pip freeze --exclude-editable of .venv, without jsgw itself)."; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^jsgw[=@ ]'; } > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis site
