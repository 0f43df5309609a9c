from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError
from experiment.storage.urls import check_location

# the mesh axes every run has; a family's axis rules may lay logical axes out on more (``MeshConfig.axes``)
BASE_MESH_AXES = ("data", "fsdp", "tensor")
# the mesh axis that splits each sequence (context parallelism, model/context.py): ``train.mesh.axes: {context: N}``
# lays the logical axis "length" out on it (experiment.config.check_context_axis)
CONTEXT_AXIS = "context"
# The least peak learning rate a run may set. AdamW moves each weight by about the learning rate a step, and float32
# holds a weight w to about w x 2^-23 (1.2e-7 w): below ~1e-9 the updates of weights of the initialisers' size (0.02)
# round away and the run trains nothing. (No upper bound: a run made to diverge on purpose is a test of the guards.)
MIN_LEARNING_RATE = 1e-9


@dataclass
class MeshConfig:
    data: int = -1  # -1: all devices left over
    fsdp: int = 1
    tensor: int = 1
    dcn_data: int = 1  # multi-slice: data parallelism across slices over the data-centre network
    # the sizes of the mesh axes beyond data/fsdp/tensor that the family's rules (with ``rules`` below) lay a
    # logical axis out on, e.g. {expert: 2} for a mixture-of-experts family's "expert" axis (expert
    # parallelism). Config load adds every such axis not sized here with size 1 (not split) and refuses an
    # axis here that no rule uses (experiment.config.check_sections). The mesh is data, fsdp, these axes in
    # this order, tensor (model.sharding.build_mesh); their product with the others must match the devices
    axes: dict[str, int] = field(default_factory=dict)
    # logical axis name -> list of mesh axes (data, fsdp, tensor, or an axis sized in ``axes``); [] keeps that
    # dim unsharded. Only the names to change: the family's own rules (AXIS_RULES in model/<family>/config.py)
    # give the rest, and a name the family's parameters and activations do not use is an error
    # (experiment.config.check_sections)
    rules: dict[str, list[str]] = field(default_factory=dict)

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        for name in ("fsdp", "tensor", "dcn_data"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key '{prefix}{name}': must be >= 1, got {getattr(self, name)}")
        if self.data == 0 or self.data < -1:
            raise ConfigError(f"config key '{prefix}data': must be >= 1 or -1 (all devices left over), got {self.data}")
        for axis, size in self.axes.items():
            if axis in (*BASE_MESH_AXES, "dcn_data"):
                raise ConfigError(f"config key '{prefix}axes.{axis}': size it as {prefix}{axis} (axes holds the "
                                  "mesh axes a model family adds, such as expert)")
            if not axis.isidentifier():
                raise ConfigError(f"config key '{prefix}axes.{axis}': a mesh axis name is a Python identifier")
            if size < 1:
                raise ConfigError(f"config key '{prefix}axes.{axis}': must be >= 1, got {size}")
        known = (*BASE_MESH_AXES, *self.axes)
        for logical, axes in self.rules.items():
            bad = [a for a in axes if a not in known]
            if bad:
                raise ConfigError(f"config key '{prefix}rules.{logical}': unknown mesh axes {bad} "
                                  f"(use {', '.join(known)}, or size a family's mesh axis in {prefix}axes)")
            if len(set(axes)) != len(axes):
                raise ConfigError(f"config key '{prefix}rules.{logical}': a mesh axis is listed twice: {axes}")


@dataclass
class MixtureSetConfig:
    """One shard set of a training mixture: recipe 03's output, mixed by weight without re-tokenizing."""

    name: str
    shards: str = ""  # a finished shards folder made with this run's tokenizer and seq_len; "" = this run's shards/
    weight: float = 1.0  # relative: the loader normalises the weights to shares of the rows


@dataclass
class MixtureStageConfig:
    """A change of the mixture's weights: from global batch ``step`` on (the batches of steps ``step + 1``, ...) the
    sets are read at ``weights`` (relative, normalised; a set left out reads 0). Levanter's ``train_weights`` stages."""

    step: int
    weights: dict[str, float] = field(default_factory=dict)


def check_mixture(names: list[str], weights: list[float], stages: list[tuple[int, dict[str, float]]],
                  prefix: str = "train.", steps: int = 0, first: int = 0) -> None:
    """The one check of ``train.mixture``'s weights and ``train.mixture_schedule``'s stages (``names`` and
    ``weights``: the sets'; ``stages``: ``(step, {name: weight})``); one ConfigError naming the key of the first bad
    entry (``prefix``: the section's, e.g. ``train.``). The config's load runs it (``TrainConfig.validate``), before
    anything is written; recipe 04 runs it once more only where the load cannot know where the stream begins (a
    decay branch of a stage: the parent's checkpoint says), and the loader's entry (``make_mixture_iterator``) for
    callers without a config. ``MixtureSchedule`` takes what it passed."""
    _check_start_weights(names, weights, stages, f"{prefix}mixture")
    _check_schedule(names, stages, f"{prefix}mixture_schedule", steps, first)


def _check_start_weights(names: list[str], weights: list[float], stages: list[tuple[int, dict[str, float]]],
                         key: str) -> None:
    """The mixture's own weights (step 0): positive, or 0 for a set a later stage brings in (Levanter's stages
    introduce sets so), and not all 0; one ConfigError naming ``key[i].weight`` (or ``key``)."""
    for index, (name, weight) in enumerate(zip(names, weights, strict=True)):
        if math.isinf(weight):  # the loader's integer proportions of the weights would overflow
            raise ConfigError(f"config key '{key}[{index}].weight': must be finite, got {weight}")
        brought_in = weight == 0 and any(stage.get(name, 0) > 0 for _, stage in stages)
        if not (weight > 0 or brought_in):
            raise ConfigError(f"config key '{key}[{index}].weight': must be positive, got {weight}"
                              + (" (0 only for a set that train.mixture_schedule brings in later)" if weight == 0
                                 else ""))
    if names and not sum(weights) > 0:
        raise ConfigError(f"config key '{key}': at least one set needs a positive weight at step 0")
    _check_spread(weights, key)


# the loader interleaves by the weights scaled so the least positive one is 100 (data_prep.shards.loader.
# integer_proportions): weights further apart than this make integers no interleaving needs, or overflow a float
MAX_WEIGHT_SPREAD = 1e9


def _check_spread(weights: Sequence[float], key: str) -> None:
    """The largest weight at most ``MAX_WEIGHT_SPREAD`` times the least positive one (finite ones that far apart,
    1e300 beside 1e-300, overflowed the loader's integer proportions after the run had opened)."""
    positive = [weight for weight in weights if weight > 0]
    if positive and not max(positive) <= MAX_WEIGHT_SPREAD * min(positive):
        raise ConfigError(f"config key '{key}': the largest weight ({max(positive):g}) is more than "
                          f"{MAX_WEIGHT_SPREAD:g} times the least positive one ({min(positive):g}): give weights "
                          "closer together (a share below one in a billion rows is no share)")


def _check_schedule(names: list[str], stages: list[tuple[int, dict[str, float]]], key: str, steps: int,
                    first: int) -> None:
    """The first bad stage: steps increasing from ``first`` + 1 (step ``first`` reads ``train.mixture``'s own
    weights: 0, or a stage's branch step) and, with ``steps``, below it; only the mixture's set names; weights >= 0,
    finite and not all 0."""
    if stages and not names:
        raise ConfigError(f"config key '{key}': a schedule changes the weights of train.mixture, which is empty")
    previous = first
    for index, (step, weights) in enumerate(stages):
        where = f"{key}[{index}]"
        if step <= previous:
            raise ConfigError(f"config key '{where}.step': {step} must be above {previous} (the steps increase; "
                              f"step {first} reads the weights of train.mixture"
                              + (": a stage's stream starts at its branch_step)" if first else ")"))
        if steps and step >= steps:
            raise ConfigError(f"config key '{where}.step': {step} is never reached by a run of train.steps={steps}")
        unknown = [name for name in weights if name not in names]
        if unknown:
            raise ConfigError(f"config key '{where}.weights.{unknown[0]}': not a set of train.mixture "
                              f"({', '.join(names)})")
        infinite = [name for name, weight in weights.items() if math.isinf(weight)]
        if infinite:
            raise ConfigError(f"config key '{where}.weights.{infinite[0]}': must be finite, got {weights[infinite[0]]}")
        bad = [name for name, weight in weights.items() if not weight >= 0]
        if bad:
            raise ConfigError(f"config key '{where}.weights.{bad[0]}': must be >= 0, got {weights[bad[0]]}")
        if not sum(weights.values()) > 0:
            raise ConfigError(f"config key '{where}.weights': at least one set needs a positive weight")
        _check_spread(list(weights.values()), f"{where}.weights")
        previous = step


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32  # global batch, in sequences
    grad_accum_steps: int = 1  # micro-batches per optimizer step; batch_size must divide by it
    # sequence positions whose logits exist at once in the loss (model.loss.chunked_cross_entropy):
    # B x chunk x V floats instead of B x T x V, for one more forward matmul of the output head; 0: all
    loss_chunk_len: int = 1024
    learning_rate: float = 3e-4
    warmup_steps: int = 100  # linear warmup from 0 to learning_rate, in every schedule
    # learning-rate schedule after the warmup (trainer/schedules.py): cosine decays over all the steps
    # left; wsd (warmup-stable-decay) holds learning_rate, then decays over the last decay_steps;
    # constant holds learning_rate to the end
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    decay: Literal["linear", "cosine", "1-sqrt"] = "linear"  # wsd only: the shape of its decay
    decay_steps: int = 0  # wsd only (and required there): length of the final decay, in steps
    min_lr_ratio: float = 0.1  # cosine and wsd decay to learning_rate * min_lr_ratio at the last step
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # global-norm clipping; 0 turns it off
    beta1: float = 0.9
    beta2: float = 0.95
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # master weights and optimizer state
    # quantized training through Qwix (trainer/quantization.py): the projections' and MLP's matmuls in
    # int8 (TPU v5e/v6e) or fp8 (H100/B200), forward and backward; parameters and checkpoints stay float
    quantization: Literal["none", "int8", "fp8"] = "none"
    checkpoint_every: int = 100
    keep_checkpoints: int = 2  # the latest N are kept ...
    keep_checkpoints_every: int = 0  # ... plus every K-th step forever (0: none)
    async_checkpointing: bool = True
    log_every: int = 10
    eval_every: int = 0  # 0: no eval during training
    # a step whose loss, gradient or updated parameters and moments are not finite stops the run (naming
    # the newest checkpoint still worth resuming from: trainer/guard.py), or skips that update
    nan_policy: Literal["stop", "skip"] = "stop"
    max_skipped_steps: int = 5  # skipped steps (nan_policy skip, skip_spikes) in a row beyond this stop the run
    # skip a loss spike like a non-finite step (MaxText's skip_step_on_spikes): a step whose loss or gradient
    # norm is above mean + spike_sigma * std of the last spike_window finite steps' keeps the previous weights
    # and moments (trainer/guard.py); checked once the window is half full
    skip_spikes: bool = False
    spike_window: int = 128
    spike_sigma: float = 6.0
    # the hang watchdog (trainer/watchdog.py): a step, or the blocking part of a checkpoint save, running longer
    # than this many seconds dumps every thread's stack to the log, books the hang in the ledger and exits with
    # HUNG_EXIT_CODE for the relauncher; the session's first step (which compiles) gets first_step_deadline_s.
    # 0 turns that deadline off
    step_deadline_s: float = 1800.0
    first_step_deadline_s: float = 3600.0
    save_deadline_s: float = 3600.0
    # a resume whose learning-rate schedule (learning_rate, warmup_steps, schedule, decay, decay_steps,
    # min_lr_ratio, and steps where it moves the decay) gives a step already trained, or the next one,
    # another rate than the checkpoints' is refused; true applies the new schedule and records the change
    allow_schedule_change: bool = False
    preemption_grace_s: float = 30.0  # after SIGTERM: save and exit within this many seconds
    compilation_cache: bool = True  # keep compiled steps in <run>/xla_cache: a restart skips the compile
    distributed: bool = False  # jax.distributed.initialize() first: multi-host TPU slices, multi-node GPUs
    # CPU-only hosts: JAX devices to split the batch over (trainer/cpu_host.py); 0: one per core, as many
    # as divide the micro-batch; 1: JAX's default single device
    cpu_devices: int = 0
    # CPU-only hosts: glibc keeps freed memory, so steps take no page faults (faster, at a higher peak RSS:
    # bench/README.md, "Train step: JAX/Flax decoder vs PyTorch + transformers"); false to save memory
    cpu_keep_freed_memory: bool = True
    peak_flops_per_chip: float | None = None  # for MFU; None: the cost catalog's bf16 peak for cost.accelerator
    fit_topologies: list[str] = field(default_factory=lambda: ["v5e-16", "v6e-8"])  # for recipes/04b_tpu_fit_check.py
    # recipe 04b: check another model's shape, hf:<folder or config.json> of a Hugging Face model (its
    # vocabulary; model.max_seq_len, remat and attention from this config); empty: the experiment's model
    fit_model: str = ""
    # recipe 04b: instead of checking the configured setting, try remat policies, attention kernels and
    # micro-batch splits per slice, and report the table and the best setting that fits (trainer/fit_check.py)
    fit_search: bool = False
    fit_search_remat: list[str] = field(
        default_factory=lambda: ["none", "save_dots", "offload", "full"])  # tried in order
    # [first step, count]: a JAX profiler trace of those steps into <run>/profile (trainer/profiling.py),
    # logged as a W&B artifact; [] for none. Step 1 compiles, so the first step traced is 2 or later
    profile_steps: list[int] = field(default_factory=list)
    # a decay branch: start from the checkpoint of step branch_step in another run folder (parameters,
    # optimizer state, data position) and train on with this config's schedule (trainer/branch.py)
    branch_from: str = ""
    branch_step: int = 0
    # what the branch reads: parent (a decay branch: the parent's shards from its data position, at its length)
    # or own (a stage: this run's shards or train.mixture, from the start of a stream of its own, at this
    # config's model.max_seq_len and RoPE; the model's shape otherwise the parent's)
    branch_data: Literal["parent", "own"] = "parent"
    # which parameters train: all, or only the input embeddings and the LM head (the vocabulary-adaptation
    # phase of RuAdapt / Vikhr); embeddings_only_steps: the first N steps train only those, then all
    trainable: Literal["all", "embeddings"] = "all"
    embeddings_only_steps: int = 0
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # several shard sets mixed by weight at train time (data_prep.shards.loader.make_mixture_iterator);
    # [] trains on this run's shards alone
    mixture: list[MixtureSetConfig] = field(default_factory=list)
    # the mixture's weights changed at given steps, piecewise constant (data_prep.shards.loader.MixtureSchedule)
    mixture_schedule: list[MixtureStageConfig] = field(default_factory=list)

    @property
    def stream_start_step(self) -> int:
        """The step at which this run's data stream begins: a stage's branch step, else 0 (a decay branch reads
        on in its parent's stream, which began at 0)."""
        return self.branch_step if self.branch_data == "own" else 0

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        check_location(self.branch_from, f"{prefix}branch_from")
        for index, part in enumerate(self.mixture):
            check_location(part.shards, f"{prefix}mixture[{index}].shards")
        if self.steps < 0:  # 0: write the step-0 checkpoint (e.g. an imported model) without training
            raise ConfigError(f"config key '{prefix}steps': must be >= 0, got {self.steps}")
        for name in ("batch_size", "grad_accum_steps", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key '{prefix}{name}': must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum_steps:
            raise ConfigError(
                f"config key '{prefix}grad_accum_steps': {self.grad_accum_steps} does not divide "
                f"batch_size={self.batch_size}"
            )
        if self.learning_rate <= 0:
            raise ConfigError(f"config key '{prefix}learning_rate': must be positive, got {self.learning_rate}")
        if self.learning_rate < MIN_LEARNING_RATE:
            raise ConfigError(f"config key '{prefix}learning_rate': {self.learning_rate!r} is below "
                              f"{MIN_LEARNING_RATE:g}: AdamW moves each weight by about the learning rate a step, and "
                              "float32 weights of the initialisers' size do not change by less, so the run would train "
                              "nothing")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"config key '{prefix}min_lr_ratio': must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or (self.steps and self.warmup_steps >= self.steps):
            raise ConfigError(f"config key '{prefix}warmup_steps': must be in [0, steps={self.steps}), "
                              f"got {self.warmup_steps}")
        if self.steps and self.schedule == "wsd" and not 1 <= self.decay_steps <= self.steps - self.warmup_steps:
            raise ConfigError(f"config key '{prefix}decay_steps': schedule wsd needs "
                              "1 <= decay_steps <= steps - warmup_steps "
                              f"= {self.steps - self.warmup_steps}, got {self.decay_steps}")
        if self.schedule != "wsd" and self.decay_steps:
            raise ConfigError(f"config key '{prefix}decay_steps': only used by schedule wsd "
                              f"(schedule is {self.schedule}); "
                              f"remove it or set train.schedule=wsd")
        for name in ("weight_decay", "grad_clip", "eval_every", "keep_checkpoints_every", "preemption_grace_s",
                     "cpu_devices", "loss_chunk_len", "embeddings_only_steps", "max_skipped_steps",
                     "step_deadline_s", "first_step_deadline_s", "save_deadline_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key '{prefix}{name}': must be >= 0, got {getattr(self, name)}")
        if self.spike_window < 2:  # a standard deviation needs two losses
            raise ConfigError(f"config key '{prefix}spike_window': must be >= 2, got {self.spike_window}")
        if not self.spike_sigma > 0:
            raise ConfigError(f"config key '{prefix}spike_sigma': must be positive, got {self.spike_sigma}")
        unknown = [p for p in self.fit_search_remat if p not in ("none", "save_dots", "offload", "full")]
        if unknown or not self.fit_search_remat:
            raise ConfigError(f"config key '{prefix}fit_search_remat': give some of none, save_dots, offload, full "
                              f"(got {self.fit_search_remat})")
        if self.profile_steps and (len(self.profile_steps) != 2 or self.profile_steps[0] < 2
                                   or self.profile_steps[1] < 1 or sum(self.profile_steps) - 1 > self.steps):
            raise ConfigError(f"config key '{prefix}profile_steps': give [first step, count] with first >= 2 (step 1 "
                              f"compiles) and first + count - 1 <= steps={self.steps}, got {self.profile_steps}")
        if bool(self.branch_from) != bool(self.branch_step):
            raise ConfigError(f"config key '{prefix}{'branch_step' if self.branch_from else 'branch_from'}': a branch "
                              "needs both branch_from (the parent run folder) and branch_step (its checkpoint step)")
        if self.branch_from and not 1 <= self.branch_step < self.steps:
            raise ConfigError(f"config key '{prefix}branch_step': must be in [1, steps={self.steps}), "
                              f"got {self.branch_step}")
        if self.branch_data not in ("parent", "own"):
            raise ConfigError(f"config key '{prefix}branch_data': give parent (a decay branch) or own (a stage), "
                              f"got {self.branch_data!r}")
        if self.branch_data == "own" and not self.branch_from:
            raise ConfigError(f"config key '{prefix}branch_data': own data is a stage of another run: give "
                              "train.branch_from and train.branch_step too")
        if self.fit_model and not self.fit_model.startswith("hf:"):
            raise ConfigError(f"config key '{prefix}fit_model': give hf:<model folder or config.json>, "
                              f"got {self.fit_model!r}")
        names = [m.name for m in self.mixture]
        for i, m in enumerate(self.mixture):
            if not m.name.strip() or m.name in names[:i]:
                raise ConfigError(f"config key '{prefix}mixture[{i}].name': {m.name!r} must be a non-empty name "
                                  "that no other set has")
        stages = [(s.step, s.weights) for s in self.mixture_schedule]
        check_mixture(names, [m.weight for m in self.mixture], stages, prefix, self.steps, self.stream_start_step)
        if self.peak_flops_per_chip is not None and self.peak_flops_per_chip <= 0:
            raise ConfigError(f"config key '{prefix}peak_flops_per_chip': must be positive, "
                              f"got {self.peak_flops_per_chip}")
