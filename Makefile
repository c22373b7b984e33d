# The two front-door commands: `make run` (gateway, with an embedded nats-server unless
# JSGW_NATS_URL is set) and `make test` (installs everything it needs, then runs the suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test openapi docs clean chromium

run: $(STAMP)
	$(BIN)/jsgw serve

test: $(STAMP) chromium
	$(BIN)/pytest -q

# tests/browser drive Debian's chromium through Playwright (never `playwright install`).
# Installed here when missing and we can (root with apt); otherwise those tests skip.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for tests/browser"; \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null \
			|| echo "could not install chromium: tests/browser will be skipped"; \
	else echo "tests/browser will be skipped: install Debian's 'chromium' package (apt-get install chromium)"; fi

openapi: $(STAMP)
	$(BIN)/jsgw openapi -o openapi/openapi.json

docs: $(STAMP)
	$(BIN)/jsgw docs -o docs/problems

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
