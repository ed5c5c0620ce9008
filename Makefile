# rqsys: `make run` runs the example queues in embedded mode (web on :3333);
# `make test` runs ruff, mypy and the whole test suite; `make deb` builds the
# Debian package.  Each first installs what it needs (Debian packages when
# run as root: .ci/install-debs, which waits for another apt holding the lock).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip -q --disable-pip-version-check
PORT  ?= 3333
ROOT  ?= $(CURDIR)/run-root
PYTHON ?= $(shell command -v python3.11 || command -v python3)

# Running: a venv, and compilers and headers for the cffi spawn helper and
# systemd-python (built from source by pip), scdoc for the man pages.
RUN_DEBS  := python3-venv python3-dev gcc libc6-dev libsystemd-dev pkg-config scdoc man-db
# Building the .deb (debian/control's Build-Depends) and checking it.
DEB_DEBS  := dpkg-dev debhelper dh-python pybuild-plugin-pyproject python3-all-dev \
             python3-cffi python3-setuptools python3-wheel scdoc lintian
# Only the tests: systemd booted in containers, man pages, network namespaces,
# curl, a browser, the Nix module's checks, Debian's kernel booted under QEMU
# (power cuts on ext4 and xfs images, cgroup v2 limits), crash points
# (strace's fault injection), and the .deb.
TEST_DEBS := systemd systemd-container man-db mandoc iproute2 curl strace \
             chromium chromium-driver nix-bin jq e2fsprogs xfsprogs nats-server \
             qemu-system-x86 linux-image-amd64 initramfs-tools \
             $(DEB_DEBS)

VERSION  := $(shell sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' debian/changelog)
ARCH     := $(shell dpkg --print-architecture 2>/dev/null || uname -m)
DEB      := build/deb/rqsys_$(VERSION)_$(ARCH).deb
DEB_TREE := debian rqsys man units docs setup.py pyproject.toml MANIFEST.in README.md
DEB_SKIP := --exclude=__pycache__ --exclude='*.so' --exclude=_rqspawn.c --exclude='*.egg-info'
# dpkg-buildpackage with Debian's own python3 and nothing of the caller's
# environment (a venv or pyenv first on PATH would build for another Python).
DEB_ENV  := env -i HOME="$$HOME" LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin

.PHONY: install install-test run man vendor-js test test-fast lint bench bench-ab deb conformance test-powercut test-crashpoints test-pool-1000 clean
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py rqsys/_native/spawn.c rqsys/_native/rqspawnd.c rqsys/_native/build_spawn.py
	@bash .ci/install-debs $(RUN_DEBS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --upgrade pip
	@$(PIP) install -e .
	@touch $@

install-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed
	@bash .ci/install-debs $(TEST_DEBS)
	@$(PIP) install -e '.[test]'
	@touch $@

run: install man
	@mkdir -p $(ROOT)
	@echo "rqsys: web UI on http://localhost:$(PORT)/ - Ctrl-C stops it (log: $(ROOT)/serve.log)"
	@echo "rqsys: in another shell, for rq: export RQ_ROOT=$(ROOT) PATH=$(CURDIR)/$(VENV)/bin:\$$PATH"
	@echo "rqsys: and for man rq: export MANPATH=$(CURDIR)/build/man:"
	@$(VENV)/bin/rqsys serve --root $(ROOT) --scandir $(CURDIR)/scandir-examples \
	  --port $(PORT) >>$(ROOT)/serve.log 2>&1 || { tail -n 20 $(ROOT)/serve.log; exit 1; }

# The man pages, for man rq after make run (the .deb installs its own).
MAN_PAGES := build/man/man1/rq.1 build/man/man5/rqsys.json.5 \
             build/man/man7/rq-queue-script.7 build/man/man8/rqsys.8
man: $(MAN_PAGES)

build/man/man1/%.1: man/%.1.scd
	@mkdir -p $(@D) && scdoc < $< > $@
build/man/man5/%.5: man/%.5.scd
	@mkdir -p $(@D) && scdoc < $< > $@
build/man/man7/%.7: man/%.7.scd
	@mkdir -p $(@D) && scdoc < $< > $@
build/man/man8/%.8: man/%.8.scd
	@mkdir -p $(@D) && scdoc < $< > $@

# The console's JavaScript libraries, from npm (kept in the checkout: see .ci/vendor-js).
vendor-js:
	bash .ci/vendor-js

lint: install-test
	$(VENV)/bin/ruff check rqsys tests bench
	$(VENV)/bin/mypy rqsys

test: lint
	$(VENV)/bin/pytest -q tests

# The inner loop: unit and integration tests (no containers, guests, NATS or browser).
test-fast: install-test
	$(VENV)/bin/pytest -q -m "unit or integration" tests

# The benchmarks' baselines: task-spooler beside the drain, strace counting syscalls.
BENCH_DEBS := task-spooler strace

bench: install-test
	@bash .ci/install-debs $(BENCH_DEBS)
	$(PY) bench/run_all.py

# Before/after, alternated in one run: make bench-ab BEFORE=<old checkout, after make install>
# [SECTIONS="enqueue e2e"] (bench_queue.py's sections; all by default)
bench-ab: install
	$(PY) bench/ab.py --rounds 3 $(BEFORE) $(CURDIR) $(SECTIONS)

deb: $(DEB)
	@echo $(DEB)

$(DEB): $(shell find $(DEB_TREE) -type f -not -path '*/__pycache__/*' -not -name '*.so' \
                 -not -name _rqspawn.c 2>/dev/null)
	@bash .ci/install-debs $(DEB_DEBS)
	@rm -rf build/deb && mkdir -p build/deb/src
	@tar -c $(DEB_SKIP) $(DEB_TREE) | tar -x -C build/deb/src
	@cd build/deb/src && $(DEB_ENV) dpkg-buildpackage -b -us -uc >../build.log 2>&1 \
	  || { tail -n 40 ../build.log; echo "make deb: failed, see build/deb/build.log"; exit 1; }
	@lintian --fail-on error $@ 2>&1 | grep -v "^running with root privileges"; \
	  exit $${PIPESTATUS[0]}

# RQ's own test suite, run against this checkout (where shared/ has it).
conformance: install
	@if [ -f ../shared/rq-suite/run.sh ]; then bash ../shared/rq-suite/run.sh "$(CURDIR)"; \
	  else echo "conformance: ../shared/rq-suite/run.sh is not here"; exit 1; fi

# The full power-cut run, then the proof that a build that does not sync loses
# messages (about an hour on 2 cores with KVM, many under TCG: CUTS=N per file
# system); make test runs a few cuts.
CUTS ?= 70
test-powercut: install-test
	$(PY) tests/system/powercut/run.py --cycles $(CUTS) --fs ext4,xfs,ext4-nojournal --jobs 3
	$(PY) tests/system/powercut/run.py --cycles 2 --fs ext4,ext4-nojournal --jobs 2 --nosync

# Every crash point of the queue daemon (about an hour on 2 cores).
test-crashpoints: install-test
	$(PY) tests/system/crashpoints/run.py --jobs 2

# Pool queues at the issue's size: 1,000 messages over three hosts in namespaces
# (make test runs 200), then the failures (a few minutes on 2 cores).
test-pool-1000: install-test
	RQ_POOL_N=1000 $(VENV)/bin/pytest -q tests/system/test_pool_e2e.py

clean:
	rm -rf $(VENV) build *.egg-info run-root
