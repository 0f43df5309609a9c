# Two commands matter: `make demo` (set up, then run the whole CPU demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
CONFIG ?= recipes/configs/demo.yaml
# Optional extras installed for the tests (each test of an extra skips where it is missing).
TEST_EXTRAS ?= test
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(TEST_EXTRAS))
comma := ,

export JAX_PLATFORMS ?= cpu
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test lint clean-demo

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $@

setup: $(STAMP)

demo: setup
	$(PY) recipes/01_build_corpus.py --config $(CONFIG)
	$(PY) recipes/02_train_tokenizer.py --config $(CONFIG)
	$(PY) recipes/03_shard.py --config $(CONFIG)
	$(PY) recipes/04_pretrain.py --config $(CONFIG)
	$(PY) recipes/05_evaluate.py --config $(CONFIG)
	$(PY) recipes/06_compare_costs.py --config $(CONFIG)

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .

clean-demo:
	rm -rf runs/demo
