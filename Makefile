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
# Python's default: bytecode cached in __pycache__ (git-ignored). An environment that turns it off makes
# pytest rewrite the asserts of every test module again in every worker, every session (5 of the 12 s a
# worker takes to collect, measured here)
unexport PYTHONDONTWRITEBYTECODE
# five venvs are built from the same wheels: a pip cache would only hold a second copy of them on disk
export PIP_NO_CACHE_DIR := 1

.PHONY: setup check demo demo-bucket storage-servers storage-emulators generate demo-sweep demo-stage demo-anneal test test-base \
	test-extras install-extras lint clean-demo launch-engines test-extra-launch

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	@mkdir -p .venvs
	$(EDITABLE_LOCK) $(PY) -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $@

setup: $(STAMP)

# Every recipe's checks of a config, writing nothing: one line per problem and exit 1, else a short "ok"
# (e.g. make check CONFIG=recipes/configs/ru-8b-v6e-64.yaml ARGS='train.batch_size=256')
check: setup
	$(PY) -m experiment.check --config $(CONFIG) $(ARGS)

# DEMO_ARGS: overrides for every recipe of the demo, e.g. DEMO_ARGS='experiment.run_root=gs://my-bucket/runs'
demo: setup
	$(PY) recipes/01_build_corpus.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/02_train_tokenizer.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/03_shard.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/04_pretrain.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/05_evaluate.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/06_compare_costs.py --config $(CONFIG) $(DEMO_ARGS)
	$(PY) recipes/07_plan_costs.py --config $(CONFIG) $(DEMO_ARGS)

# A venv of its own (the folder of the stamp $@) with the requirements file $< and nothing of the project: for
# tools whose pins clash with the project's
define requirements_venv
	@mkdir -p $(@D)
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install -q --upgrade pip
	$(@D)/bin/python -m pip install -q --no-compile -r $<
	@touch $@
endef

# The storage API servers the tests use (GCS: fake-gcs-server, S3: moto), in a venv of their own
STORAGE_VENV := .venvs/storage
storage-servers: $(STORAGE_VENV)/.installed
$(STORAGE_VENV)/.installed: tests/storage-servers.txt
	$(requirements_venv)

# The demo with its run folder in a bucket: both servers start on loopback, the demo (recipes 01-07, then 09's
# completions) runs with experiment.run_root=<bucket>/runs (BUCKET_SCHEME=gs or s3), the servers stop (and forget
# the bucket) at the end
# (DEMO_BUCKET_KEEP=folder: a copy of what the demo left in the bucket, kept there when the servers stop)
BUCKET_SCHEME ?= gs
demo-bucket: setup storage-servers
	$(PY) -m tests.storage_servers run --scheme $(BUCKET_SCHEME) $(if $(DEMO_BUCKET_KEEP),--keep $(DEMO_BUCKET_KEEP)) \
	  -- $(MAKE) demo generate \
	  DEMO_ARGS='experiment.run_root=$${RU_DEMO_BUCKET}/runs $(DEMO_ARGS)' ARGS='experiment.run_root=$${RU_DEMO_BUCKET}/runs'

# Both servers in the foreground for trying a bucket by hand: prints the environment to export, Ctrl-C stops them
storage-emulators: setup storage-servers
	$(PY) -m tests.storage_servers serve

# The demo model's completions of generate.prompts (after `make demo`; overrides: ARGS='generate.temperature=0.8')
generate: setup
	$(PY) recipes/09_generate.py --config $(CONFIG) $(ARGS)

# Three widths of the demo decoder compared by rubles to a target quality (reuses runs/demo's data)
demo-sweep: setup
	$(PY) recipes/08_sweep.py --config recipes/configs/demo_sweep.yaml

# Two stages after the demo (after `make demo`): 100 steps at 256 tokens from its step 200, then 150 steps at
# 1,024 with YaRN on a new mixture (long prose and the demo's text), scored at its first and last checkpoints:
# the passkey at 1,024 against chance and bits per byte by position (recipes/configs/demo_stage_*.yaml)
STAGE_256 = recipes/configs/demo_stage_256.yaml
STAGE_1024 = recipes/configs/demo_stage_1024.yaml
demo-stage: setup
	$(PY) recipes/03_shard.py --config $(STAGE_256)
	$(PY) recipes/04_pretrain.py --config $(STAGE_256)
	$(PY) recipes/03_shard.py --config $(STAGE_1024) experiment.name=demo-1024-debian
	$(PY) recipes/01_build_corpus.py --config $(STAGE_1024)
	$(PY) recipes/03_shard.py --config $(STAGE_1024)
	$(PY) recipes/04_pretrain.py --config $(STAGE_1024)
	$(PY) recipes/05_evaluate.py --config $(STAGE_1024) eval.checkpoint_step=325
	$(PY) recipes/05_evaluate.py --config $(STAGE_1024)

# An anneal comparison on the demo's run (made first when runs/demo has no checkpoints): its checkpoint 150 annealed
# on the demo's Debian documentation and on a mixture adding Pushkin's prose (the shared data's ruslit, sharded with
# the demo's tokenizer), three seeds each; bits per byte per data set with 95% intervals, and rubles
demo-anneal: setup
	@test -d runs/demo/checkpoints/150 || $(MAKE) demo
	$(PY) recipes/01_build_corpus.py --config recipes/configs/demo_lit.yaml
	$(PY) recipes/03_shard.py --config recipes/configs/demo_lit.yaml
	$(PY) recipes/08_sweep.py --config recipes/configs/demo_anneal.yaml

# The README's test command: the base suite, then each optional extra in its own venv (Beam pins
# protobuf below 7 and TensorFlow is 1.4 GB, so they never share the base environment). Three steps:
# 1. The base venv, alone: 1.5 min here, 4.5 min when it shared the CPUs with the extras' installs, and
#    the suite waits for it.
# 2. The base suite, alone on the CPUs (some of its tests kill and time training runs), while the four
#    extras' venvs install beside it: pip reads local indexes, so the installs mostly wait on the disk
#    and overlap the suite instead of queueing after it. -j3 = the suite + two installs; -k lets the
#    others finish and report when one fails, and the step still fails.
# 3. The extras' test lanes, two at a time (CI has 2 cores); -k: every lane runs and reports.
test:
	rm -rf $(TEST_REPORTS)
	$(MAKE) setup storage-servers
	$(MAKE) -k -j3 test-base install-extras
	$(MAKE) -k -j2 --output-sync=target test-extras

# Each lane writes its JUnit report into TEST_REPORTS (counts and wall time), which `make readme-figures` quotes.
# --durations: the slowest tests in the log, so a CI run shows where the suite's time goes
TEST_REPORTS := runs/test-reports
test-base: setup storage-servers
	$(PY) -m pytest -q --durations=25 --junitxml=$(TEST_REPORTS)/base.xml

# The loop while editing: no recipe run, no other process, no shared data (tests/README.md)
test-unit: setup
	$(PY) -m pytest -q -m "not integration" --junitxml=$(TEST_REPORTS)/unit.xml

# extra name : test files run in that extra's venv
EXTRA_TESTS_tf := tests/test_tfrecord_tf.py
# (the beam venv also has zstandard: the .zst reading path of the corpus sources runs there)
EXTRA_TESTS_beam := tests/test_corpus_beam.py tests/test_shard_beam.py \
	tests/test_corpus_build.py::test_zstd_jsonl_is_read_or_needs_the_extra
# (of test_tokenizer.py only the test that needs transformers: the base suite runs the rest;
# tests/test_hf_parity_<family>.py: a model family's logits and generation against Transformers')
EXTRA_TESTS_hf := tests/test_eval_hf_export.py tests/test_eval_lm_eval.py tests/test_hf_import.py \
	tests/test_tokenizer.py::test_transformers_loads_export_offline_with_identical_ids $(wildcard tests/test_hf_parity_*.py)
EXTRA_TESTS_tpu := tests/test_fit_check.py
EXTRAS := tpu hf tf beam  # the longest installs first
EXTRA_PIP_tf := tf,test
EXTRA_PIP_beam := beam,zstd,test
EXTRA_PIP_hf := hf,lm-eval,test
EXTRA_PIP_tpu := tpu,test

# Each editable install rewrites ru_pretrain.egg-info in this folder: they take turns (flock, where the
# system has it) while everything else about the venvs installs in parallel.
EDITABLE_LOCK := $(if $(shell command -v flock),flock .venvs/.editable.lock)
# The requirements of the project and of the extras named in its argument, read from pyproject.toml
# without building the project.
REQUIREMENTS_PY := import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print("\n".join(p["dependencies"] + [r for e in sys.argv[1].split(",") for r in p["optional-dependencies"][e]]))

# An extra's venv: its third-party requirements, then the project (editable, no deps: all are there).
# Output goes to .venvs/NAME.log, so an install beside the base suite does not interleave with it; a
# failure prints the log's end and fails the target. No byte-compiling: it would take CPU from the
# suite for thousands of modules the tests never import.
.venvs/%/.installed: pyproject.toml
	@mkdir -p .venvs
	@echo "installing .venvs/$* (.[$(EXTRA_PIP_$*)], log in .venvs/$*.log)"
	@start=$$(date +%s); if ( set -x && \
	  $(PYTHON) -m venv .venvs/$* && \
	  .venvs/$*/bin/python -m pip install --upgrade pip && \
	  $(PYTHON) -c '$(REQUIREMENTS_PY)' $(EXTRA_PIP_$*) > .venvs/$*/requirements.txt && \
	  .venvs/$*/bin/python -m pip install --no-compile -r .venvs/$*/requirements.txt && \
	  $(EDITABLE_LOCK) .venvs/$*/bin/python -m pip install --no-compile --no-deps -e . \
	) > .venvs/$*.log 2>&1; then \
	  echo "installed .venvs/$* in $$(( $$(date +%s) - start )) s"; \
	else \
	  echo "error: installing .venvs/$* failed; the end of .venvs/$*.log:" >&2; tail -n 25 .venvs/$*.log >&2; exit 1; \
	fi
	@touch $@

# The engines recipe 07b writes jobs for (SkyPilot, xpk), in a venv of their own without the project (SkyPilot pins
# click below what W&B needs): tests/test_launch_spec.py writes the files with the project and has
# tests/launch_engines.py read them there, with each engine's own loader
LAUNCH_VENV := .venvs/launch
launch-engines: $(LAUNCH_VENV)/.installed
$(LAUNCH_VENV)/.installed: tests/launch-engines.txt
	$(requirements_venv)

# the launch lane: the base venv writes, the engines' venv reads (a missing engine fails here instead of skipping)
test-extra-launch: setup $(LAUNCH_VENV)/.installed
	RU_REQUIRE_EXTRAS=launch RU_LAUNCH_ENGINES=$(LAUNCH_VENV) $(PY) -m pytest -q -n 0 tests/test_launch_spec.py \
	  --junitxml=$(TEST_REPORTS)/extra-launch.xml

install-extras: $(foreach e,$(EXTRAS),.venvs/$(e)/.installed) $(LAUNCH_VENV)/.installed

# every extra that venv installed must import: a broken install fails instead of skipping. Each lane has
# a temporary folder of its own, removed after it: Beam's job server makes a beam-temp* folder in it per
# pipeline and leaves it behind (8 per run of the lane)
test-extra-%: .venvs/%/.installed
	lane_tmp=$$(mktemp -d) && trap 'rm -rf "$$lane_tmp"' EXIT && \
	TMPDIR=$$lane_tmp RU_REQUIRE_EXTRAS=$(EXTRA_PIP_$*) .venvs/$*/bin/python -m pytest -q -n 0 $(EXTRA_TESTS_$*) \
	  --junitxml=$(TEST_REPORTS)/extra-$*.xml

# The tpu lane (recipe 04b's TPU compiles) in two halves of similar CPU time that run in parallel: the
# fit search (8 compiles) with the shipped 1B config and the kept-answer test (which always compiles), and
# the other shipped configs (8B and 70B the largest) with the oversized model. Some compile passes keep two
# threads busy, the rest of a recipe run (start-up, tracing, other passes) one: two halves keep both cores
# busy through the single-threaded parts. Recipe 04b keeps the compiler's answers in the tests' compilation
# cache (trainer/fit_verdicts.py), so on a machine that ran the lane before only that test compiles (2 min
# for both halves instead of 11 here). Complementary -k expressions: a new test lands in one half.
TPU_A := fit_search or ru-1b-fineweb2-v6e-8 or compilers_answer_back
TPU_SPLIT_test-extra-tpu-a := $(TPU_A)
TPU_SPLIT_test-extra-tpu-b := not ($(TPU_A))
test-extra-tpu-a test-extra-tpu-b: .venvs/tpu/.installed
	RU_REQUIRE_EXTRAS=$(EXTRA_PIP_tpu) .venvs/tpu/bin/python -m pytest -q -n 0 $(EXTRA_TESTS_tpu) -k "$(TPU_SPLIT_$@)" \
	  --junitxml=$(TEST_REPORTS)/$(subst test-,,$@).xml

# hf (3 min) beside the tpu halves, then beam and tf: with the fit check's answers kept from an earlier run
# the tpu halves take 1-2 min each and the lanes end about together (4 min); without them (11 min each)
# the order ends no later than tpu first did
test-extras: test-extra-hf test-extra-tpu-a test-extra-tpu-b test-extra-beam test-extra-tf test-extra-launch

.PRECIOUS: .venvs/%/.installed

# The figures README.md, docs/guide.md and eval/README.md quote: the demo's and the sweep's from runs/demo and
# runs/demo-sweep, the tests' from TEST_REPORTS (tools/readme_figures.py; a source not here keeps its figures)
.PHONY: readme-figures test-unit
readme-figures: setup
	$(PY) -m tools.readme_figures --write --reports $(TEST_REPORTS)

lint: setup
	$(VENV)/bin/ruff check .

clean-demo:
	rm -rf runs/demo
