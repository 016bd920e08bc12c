# The front door: `make demo` runs the main job, `make test` runs the tests. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]' torch==2.13.0
	touch $(STAMP)

.PHONY: test
test: $(STAMP)
	$(PY) -m pytest -q
