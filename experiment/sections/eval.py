from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError, echo
from experiment.storage.urls import check_location

SHARED_BENCH = "${RU_SHARED_DATA:-../shared/data}/bench"


# Russian openings of different kinds (a fact, narrative prose, a definition, an everyday sentence): what a
# team reads at each eval to see the model learn to write
# MERA's text tasks recipe 05c predicts (eval/mera.py's table, by its hub config names)
MERA_CONFIGS = ("parus", "rcb", "rwsd", "ruworldtree", "ruopenbookqa", "multiq", "chegeka", "rummlu", "mamuramu",
                "mathlogicqa", "ruhhh", "ruhatespeech", "bps", "lcs", "simplear", "rumodar", "rumultiar", "use",
                "rutie", "ruethics", "rudetox", "ruhumaneval", "rucodeeval")
SAMPLE_PROMPTS = ("Москва — столица", "Однажды зимним вечером", "Язык — это", "Завтра утром я пойду")


@dataclass
class PasskeyConfig:
    """The ``passkey`` task (eval/passkey.py): a key hidden in Russian filler at each depth of each length."""

    # prompt budgets in tokens (EOS, prompt and answer); a length past the model's context is capped at it
    lengths: list[int] = field(default_factory=lambda: [4096, 8192, 16384, 32768, 65536, 131072])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # share of filler before the key
    items_per_depth: int = 4  # items per (length, depth)
    digits: int = 5  # the key's digits: exact-match chance 10^-digits
    filler_file: str = ""  # UTF-8 text whose sentences are the filler; "": the run's validation shards, decoded

    def validate(self, key: str) -> None:
        check_location(self.filler_file, f"{key}.filler_file")
        if not self.lengths or any(length < 1 for length in self.lengths):
            raise ConfigError(f"config key '{key}.lengths': positive token counts, got {self.lengths}")
        if not self.depths or any(not 0.0 <= depth <= 1.0 for depth in self.depths):
            raise ConfigError(f"config key '{key}.depths': shares between 0 and 1, got {self.depths}")
        if self.items_per_depth < 1:
            raise ConfigError(f"config key '{key}.items_per_depth': must be positive, got {self.items_per_depth}")
        if not 1 <= self.digits <= 12:
            raise ConfigError(f"config key '{key}.digits': 1 to 12, got {self.digits}")


@dataclass
class EvalConfig:
    checkpoint_step: int | None = None  # None: the latest checkpoint
    batch_size: int = 16  # sequences per scoring batch
    max_validation_batches: int | None = None  # None: the whole validation split
    # names in eval.tasks.TASKS (checked where the eval starts: eval.tasks.check_task_names); the default: every task
    # with local files in the shared bench folder
    tasks: list[str] = field(default_factory=lambda: ["rublimp", "parus", "terra", "rcb", "rucola", "ruworldtree"])
    bench_dir: str = SHARED_BENCH  # local benchmark files ({bench} in eval.tasks sources)
    rublimp_dir: str = ""  # RuBLiMP's folder of per-phenomenon CSVs; "": <bench_dir>/rublimp
    task_files: dict[str, str] = field(default_factory=dict)  # task -> local file in any of the task's schemas
    # task -> the schema its eval.task_files file is in (a source's name in eval/tasks.py: local, hub,
    # release), instead of detecting it from the first record; checked against the task where the eval starts
    task_schemas: dict[str, str] = field(default_factory=dict)
    missing_tasks: Literal["error", "skip"] = "error"  # a task whose files are absent: stop, or warn and skip
    max_items_per_task: int | None = None  # per phenomenon for RuBLiMP; None: all items
    balance_labels: bool = False  # draw capped items evenly over gold answers (chance = 1/choices exactly)
    num_fewshot: int = 0  # solved examples put before each item (tasks with a prompt only)
    seed: int = 0  # item sampling and few-shot example choice
    # raw UTF-8 texts: bits per byte on each, by recipe 05 and at every eval during training (train.eval_every)
    heldout_text_files: list[str] = field(default_factory=list)
    # shard sets (name -> a finished shards folder made with the run's tokenizer; "": this run's shards) whose
    # validation splits recipe 05 and eval during training also measure, bits per byte per set beside
    # train.mixture's sets (an anneal comparison measures every run on every set it names)
    validation_sets: dict[str, str] = field(default_factory=dict)
    # false: the run's own shards/ are not measured as `validation` (an anneal run's shards/ links to its parent's
    # only for recipe 04's manifest: the sets above measure its data, each once, under the names a comparison reads)
    validate_run_shards: bool = True
    # bits per byte by position in the context: the starts of the position buckets (e.g. [0, 256, 512, 1024]; the
    # last ends at the model's context, starts past it are dropped), over the validation documents at least as long
    # as the context, each one's first window; [] (the default): not measured. Recipe 05 and eval during training
    bpb_position_buckets: list[int] = field(default_factory=list)
    position_bucket_documents: int | None = None  # documents scored at most; None: all the validation batches read
    passkey: PasskeyConfig = field(default_factory=PasskeyConfig)  # the passkey task's settings
    # eval during training (train.eval_every > 0): a quick subset, logged against step and rubles
    train_tasks: list[str] = field(default_factory=lambda: ["rublimp"])
    train_max_items_per_task: int = 10
    train_validation_batches: int = 5
    # samples during training: at each eval (train.eval_every) the model continues these prompts greedily and the
    # completions go to W&B (a table: step, rubles spent, prompt, completion) and samples/step_NNNNNNN.jsonl
    sample_prompts: list[str] = field(default_factory=lambda: list(SAMPLE_PROMPTS))
    sample_max_new_tokens: int = 24  # 0: no samples
    random_init_baseline: bool = True  # recipe 05 also scores the tasks with the untrained model (the run's step 0)
    # a continued run (model.init_from): recipe 05 also scores the base model it started from (re-imported as the
    # run imported it) on the same validation shards, held-out texts and task items, beside the trained step
    base_model_baseline: bool = True
    export_hf: bool = False  # also write a Hugging Face (Llama) export of the checkpoint to eval/hf/
    # recipe 05c (a MERA submission): the MERA tasks predicted (eval.mera.MERA_TASKS' configs), their test inputs
    # from <mera_dir>/<task>.jsonl in MERA's schema, else the hub; mera_max_items caps each (a trial run)
    mera_tasks: list[str] = field(default_factory=lambda: list(MERA_CONFIGS))
    mera_dir: str = ""
    mera_max_items: int | None = None
    # leaderboard: each task's number of solved examples as MERA's scripts/run_benchmark.sh runs it (from
    # <mera_dir>/<task>.<split>.jsonl or the hub); zero: none (a submission the leaderboard does not compare)
    mera_fewshot: Literal["leaderboard", "zero"] = "leaderboard"

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        check_location(self.bench_dir, f"{prefix}bench_dir")
        check_location(self.rublimp_dir, f"{prefix}rublimp_dir")
        check_location(self.mera_dir, f"{prefix}mera_dir")
        for name, shards in self.validation_sets.items():
            check_location(shards, f"{prefix}validation_sets.{name}")
        if self.batch_size <= 0:
            raise ConfigError(f"config key '{prefix}batch_size': must be positive, got {self.batch_size}")
        if self.sample_max_new_tokens < 0:
            raise ConfigError(f"config key '{prefix}sample_max_new_tokens': must be >= 0 (0: no samples), got "
                              f"{self.sample_max_new_tokens}")
        if any(not prompt.strip() for prompt in self.sample_prompts):
            raise ConfigError(f"config key '{prefix}sample_prompts': a prompt is empty")
        for task in self.mera_tasks:
            if task not in MERA_CONFIGS:
                raise ConfigError(f"config key '{prefix}mera_tasks': unknown MERA task '{task}' (known: "
                                  f"{', '.join(MERA_CONFIGS)})")
        for name in ("max_validation_batches", "max_items_per_task", "train_max_items_per_task", "mera_max_items",
                     "train_validation_batches", "checkpoint_step", "position_bucket_documents"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "checkpoint_step" else 1):
                raise ConfigError(f"config key '{prefix}{name}': must be positive, got {value}")
        for task, schema in self.task_schemas.items():
            if not isinstance(schema, str) or not schema.strip():
                raise ConfigError(f"config key '{prefix}task_schemas.{task}': must name a schema, got {echo(schema)}")
            if task not in self.task_files:
                raise ConfigError(f"config key '{prefix}task_schemas.{task}': names the schema of "
                                  f"'{prefix}task_files.{task}', which is not set")
        starts = self.bpb_position_buckets
        if starts and (starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False))):
            raise ConfigError(f"config key '{prefix}bpb_position_buckets': bucket starts must increase from 0, got "
                              f"{starts}")
        if self.num_fewshot < 0:
            raise ConfigError(f"config key '{prefix}num_fewshot': must be 0 or more, got {self.num_fewshot}")
