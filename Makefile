# rqsys: `make run` runs the example queues in embedded mode (web on :3333);
# `make test` runs ruff, mypy and the whole test suite. Both install first.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PORT  ?= 3333
ROOT  ?= $(CURDIR)/run-root
DEBS  := python3-venv libsystemd-dev pkg-config gcc systemd systemd-container \
         mandoc scdoc iproute2 curl chromium chromium-driver nix-bin
PYTHON ?= $(shell command -v python3.11 || command -v python3)

.PHONY: install run test lint bench clean
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py rqsys/_native/spawn.c rqsys/_native/build_spawn.py
	@bash .ci/install-debs $(DEBS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

run: install
	$(VENV)/bin/rqsys serve --root $(ROOT) --scandir $(CURDIR)/scandir-examples --port $(PORT)

lint: install
	$(VENV)/bin/ruff check rqsys tests bench
	$(VENV)/bin/mypy rqsys

test: lint
	$(VENV)/bin/pytest -q tests

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info run-root
