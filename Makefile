# The two front-door commands: `make run` (gateway, with an embedded nats-server unless
# JSGW_NATS_URL is set) and `make test` (installs everything it needs, then runs the suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test openapi clean

run: $(STAMP)
	$(BIN)/jsgw serve

test: $(STAMP)
	$(BIN)/pytest -q

openapi: $(STAMP)
	$(BIN)/jsgw openapi -o openapi/openapi.json

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
