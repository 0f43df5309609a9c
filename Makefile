# Two commands matter: `make demo` (set up, then run the whole CPU demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
CONFIG ?= recipes/configs/demo.yaml
# Optional extras installed for the tests (each test of an extra skips where it is missing, except in
# that extra's own venv below, where RU_REQUIRE_EXTRAS makes a missing extra a failure).
TEST_EXTRAS ?= test
comma := ,
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(TEST_EXTRAS))

export JAX_PLATFORMS ?= cpu
export PYTHONUNBUFFERED := 1
# five venvs are built from the same wheels: a pip cache would only hold a second copy of them on disk
export PIP_NO_CACHE_DIR := 1

.PHONY: setup demo demo-sweep test test-base test-extras lint clean-demo

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
	$(PY) recipes/07_plan_costs.py --config $(CONFIG)

# Three widths of the demo decoder compared by rubles to a target quality (reuses runs/demo's data)
demo-sweep: setup
	$(PY) recipes/08_sweep.py --config recipes/configs/demo_sweep.yaml

# The README's test command: the base suite, then each optional extra in its own venv (Beam pins
# protobuf below 7 and TensorFlow is 1.4 GB, so they never share the base environment).
# The extras' venvs are built and tested two at a time (their TPU compiles and installs are single-threaded);
# the base suite runs alone first, since some of its tests kill and time training runs.
test: test-base
	$(MAKE) -j2 --output-sync=target test-extras

test-base: setup
	$(PY) -m pytest -q

# extra name : test files run in that extra's venv
EXTRA_TESTS_tf := tests/test_tfrecord_tf.py
# (the beam venv also has zstandard: the .zst reading path of the corpus sources runs there)
EXTRA_TESTS_beam := tests/test_corpus_beam.py tests/test_shard_beam.py \
	tests/test_corpus_build.py::test_zstd_jsonl_is_read_or_needs_the_extra
# (tests/test_hf_parity_<family>.py: a model family's logits and generation against Transformers')
EXTRA_TESTS_hf := tests/test_eval_hf_export.py tests/test_eval_lm_eval.py tests/test_tokenizer.py tests/test_hf_import.py \
	$(wildcard tests/test_hf_parity_*.py)
EXTRA_TESTS_tpu := tests/test_fit_check.py
EXTRAS := tf beam hf tpu
EXTRA_PIP_tf := tf,test
EXTRA_PIP_beam := beam,zstd,test
EXTRA_PIP_hf := hf,lm-eval,test
EXTRA_PIP_tpu := tpu,test

.venvs/%/.installed: pyproject.toml
	$(PYTHON) -m venv .venvs/$*
	.venvs/$*/bin/python -m pip install -q --upgrade pip
	.venvs/$*/bin/python -m pip install -q -e ".[$(EXTRA_PIP_$*)]"
	touch $@

# every extra that venv installed must import: a broken install fails instead of skipping
test-extra-%: .venvs/%/.installed
	RU_REQUIRE_EXTRAS=$(EXTRA_PIP_$*) .venvs/$*/bin/python -m pytest -q $(EXTRA_TESTS_$*)

test-extras: $(addprefix test-extra-,$(EXTRAS))

.PRECIOUS: .venvs/%/.installed

# README.md's and eval/README.md's figures of the demo and the sweep, reread from runs/demo and runs/demo-sweep
.PHONY: readme-figures
readme-figures: setup
	$(PY) -m eval.figures --write README.md eval/README.md

lint: setup
	$(VENV)/bin/ruff check .

clean-demo:
	rm -rf runs/demo
