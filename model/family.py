"""Model families: one registration per architecture, and the contract the rest of the package relies on.

A family is everything the trainer, checkpoint loader, evaluator, HF exporter, planner and fit check
need to know about an architecture, in one ``ModelFamily``: the dataclass its ``model:`` config
section is read into, a builder for its Flax NNX module, its hand-counted FLOPs, recomputation and
parameter count, the logical axis names its parameters carry with their default mesh rules, its own
config checks, the submodules quantized training quantizes, and its Hugging Face adapter (None: no
HF export or import). Those stages look the family up by ``cfg.model.family`` (``get_family``,
``family_of``) and never import a model file themselves.

A family that ships is one folder, model/<family>/ (``config.py``: data; ``family.py``: the
``register_family(ModelFamily(...))``; its model, FLOPs and adapter), plus its line in
experiment/families.py, which is how ``get_family`` finds it by name (as torchtitan's TrainSpec
registry). A family defined elsewhere calls ``register_family`` when its module is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, NoReturn, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiment.errors import ConfigError
from experiment.families import FAMILY_PACKAGES, family_module, shipped_families
from experiment.sections.model import FamilyConfig, register_model_section
from model.attention import resolve_attention
from model.loss import Labels
from model.stacking import BLOCKS, path_keys


class TrainCosts(NamedTuple):
    """What one trained token costs a config on a platform (the fit check reports it, the planner prices it)."""

    attention: str  # the kernel ``model.attention`` stands for on that platform
    model_flops: float  # the hand-counted FLOPs of forward and backward (MFU's numerator)
    hardware_flops: float  # with the work the backward pass recomputes (remat, flash kernels, the chunked loss)


@runtime_checkable
class FamilyModel(Protocol):
    """What the train step, the chunked loss, eval scoring and the exporters call on a family's module.

    The train step computes the loss from ``hidden`` and ``output_weight`` (``model.loss``: the
    logits of a chunk at a time, never all at once); eval scores ``__call__``'s logits. A family that
    declares auxiliary losses (``ModelFamily.aux_losses``) adds ``hidden_with_aux`` (``AuxLossModel``),
    which the train step calls instead of ``hidden``; eval and export never do.
    """

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] int32 -> logits [B, T, V] float32 (``model.loss.output_logits`` of the two below)."""
        ...

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        """tokens [B, T] -> the hidden states [B, T, D] the output projection reads. ``segment_ids``
        (packed documents) and ``positions`` (row-local, restarting per document) may be None."""
        ...

    def output_weight(self) -> jax.Array:
        """The output projection [D, V] (the embedding table transposed when tied)."""
        ...


@runtime_checkable
class AuxLossModel(FamilyModel, Protocol):
    """A ``FamilyModel`` whose family declares auxiliary losses (``ModelFamily.aux_losses``: a mixture of
    experts' load-balancing or router z-loss, say); required of exactly those families (``register_family``)."""

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``hidden``'s states [B, T, D] and ``{name: scalar}`` for every name the family declares: its
        ``aux_losses``, each already weighted by the family's config, whose sum the train step adds to the loss it
        differentiates, and its ``aux_metrics(model_cfg)``, statistics it only logs; each averaged over
        micro-batches like the loss and logged as ``train/aux/<name>``."""
        ...


@runtime_checkable
class PredictsAhead(AuxLossModel, Protocol):
    """An ``AuxLossModel`` whose auxiliary losses predict tokens further ahead than the next (multi-token
    prediction; ``ModelFamily.predicts_ahead`` > 0): the train step passes the batch's labels."""

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None, labels: Labels | None = None
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``AuxLossModel.hidden_with_aux``; ``labels`` (``model.loss.Labels``: targets, weights, the loss's chunk
        length) are what the predictions are scored against."""
        ...


EXPERT_LOAD = "router/expert_load"  # hidden_with_aux's [L, E] token-slots per expert, for ``BalancedRouter``


@runtime_checkable
class BalancedRouter(Protocol):
    """An ``AuxLossModel`` whose mixture-of-experts layers carry DeepSeek-V3's per-expert selection bias, moved
    outside the optimizer: after each optimizer step the train step merges the new parameters into the module
    and calls ``update_router_biases`` with the step's load (``hidden_with_aux``'s ``EXPERT_LOAD``, averaged over
    micro-batches), unless the step is skipped or the body is frozen."""

    def update_router_biases(self, expert_load: jax.Array, rate: float) -> None:
        """Move each MoE layer's bias by ``rate`` toward balance (``expert_load``: [L, E], layer order)."""
        ...


@runtime_checkable
class CachedDecoding(Protocol):
    """What text generation (model/generate.py) calls on a family's module besides ``FamilyModel``'s: a
    forward pass of a few tokens over a KV cache (model/kv_cache.py). Optional: a family without it trains,
    evaluates and exports, and generation says it cannot. ``model.layers.CausalLM`` implements ``decode``
    from the family's ``decode_hidden``."""

    def decode(self, tokens: jax.Array, cache: Any, last: bool = False) -> tuple[jax.Array, Any]:
        """tokens [B, T] written into ``cache`` at its index -> (logits [B, T, V] float32, or [B, 1, V] of the
        last position with ``last``; the cache holding their keys and values, its index T further)."""
        ...

    def cache_shape(self) -> tuple[int, int, int, int]:
        """(layers, KV heads, key width, value width) of the cache it reads and writes (multi-head latent
        attention caches one latent and one rope key per token: 1 head, kv_lora_rank and qk_rope_head_dim wide)."""
        ...

    def compute_dtype(self) -> Any:
        """The dtype its activations (and so its cache) are in."""
        ...


class HFAdapter(Protocol):
    """A family's bridge to Hugging Face Transformers: weights in PyTorch's layout plus config.json."""

    architecture: str  # e.g. "LlamaForCausalLM", for log lines
    model_type: str  # config.json's model_type it reads (model/hf_checkpoint.py finds the family by it)

    def config(self, hf_config: Mapping[str, Any]) -> tuple[FamilyConfig, int]:
        """(the family's model config, vocabulary size) of a config.json; no weights read (planner, fit check)."""
        ...

    def export(self, model: Any, model_cfg: FamilyConfig, vocab_size: int,
               special_ids: Mapping[str, int] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(state dict of fp32 numpy arrays under Transformers' names, config.json as a dict)."""
        ...

    def import_(self, hf_config: Mapping[str, Any], state_dict: Mapping[str, Any], *, dtype: Any = np.float32,
                place: Any = None, scan_layers: bool | None = None,
                place_layers: Any = None) -> tuple[FamilyConfig, nnx.State]:
        """(the family's model config, the parameters as an ``nnx.State`` for ``nnx.merge``), in the layer
        layout ``scan_layers`` asks for (None: the config section's default); ``dtype``, ``place`` and
        ``place_layers`` as model.hf_tensors.import_tensors takes them (one tensor read at a time)."""
        ...


Builder = Callable[[FamilyConfig, int, nnx.Rngs], nnx.Module]


class DecoderShape(Protocol):
    """The shape fields of a pre-norm decoder with a gated MLP (``decoder_saved_values`` counts its activations;
    ``n_kv_heads`` is read where the section has it)."""

    @property
    def d_model(self) -> int: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def d_ff(self) -> int: ...


def params_label(n_params: int) -> str:
    """A parameter count as every report, log line and doc writes it, to 3 significant digits: 3.98M, 787M, 8.03B."""
    return f"{n_params / 1e6:.3g}M" if n_params < 999.5e6 else f"{n_params / 1e9:.3g}B"


def decoder_saved_values(cfg: DecoderShape, remat: str, head_dim: int) -> float:
    """Activation values per token a pre-norm decoder with a gated MLP keeps for its backward pass, all layers.

    Per layer, without remat: the residual input and its norm's output, the RoPE'd queries, keys and values,
    the attention output, the second residual and its norm's output, gate, up and their product (a flash
    kernel keeps only its softmax statistics, not the T x T scores; Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", section 4, count the same tensors for GPT). With
    ``save_dots``/``offload``: the projections' outputs and the layer input; with ``full``: the layer input
    only (one layer's full set is live again while it recomputes, counted once)."""
    kv_heads = getattr(cfg, "n_kv_heads", cfg.n_heads)  # a family without the field has one KV head per head
    q, kv, d, ff = cfg.n_heads * head_dim, kv_heads * head_dim, cfg.d_model, cfg.d_ff
    every = 4 * d + 2 * q + 2 * kv + 3 * ff
    per_layer = {"none": every, "save_dots": 3 * d + q + 2 * kv + 2 * ff, "offload": 3 * d + q + 2 * kv + 2 * ff,
                 "full": d}[remat]
    return float(cfg.n_layers * per_layer + (every if remat == "full" else 0))


@dataclass(frozen=True)
class ParamRoles:
    """Where the parameters that code other than the family's own reaches into live in its module: ``/``-separated
    paths of attribute names from the module's root (``nnx.to_pure_dict``'s keys). ``register_family`` checks them
    against the module its ``tiny`` shape builds (shapes only), so a family that names its tables otherwise is one
    ConfigError at registration, not a run that silently freezes every parameter.

    - ``embedding``: the input embedding table [V, D]: ``train.trainable: embeddings`` and
      ``train.embeddings_only_steps`` train it alone with the head (``trainer.step.freeze_body``), and
      ``model.vocab_adaptation`` rewrites its rows (``trainer.init_from``);
    - ``output_head``: the untied output head [D, V], trained and adapted with the embedding; None where the
      family always ties its head to the embedding. A family whose config may untie it names it (absent from
      the module where a config ties it); a ``tiny`` shape that unties it lets registration check it (Llama's);
    - ``layers``: the top-level attributes holding its layer stacks (model/stacking.py: one stacked module, or an
      ``nnx.List`` unrolled): checkpoints restack between the two layouts and weight decay reads a stacked
      parameter's per-layer rank by these names. Two for a family whose layers come in two stacks (dense layers,
      then mixture-of-experts layers)."""

    embedding: str = "embed"
    output_head: str | None = None
    layers: tuple[str, ...] = (BLOCKS,)

    def tables(self) -> tuple[str, ...]:
        """The paths of the embedding table and, where the family names one, the untied head."""
        return (self.embedding,) if self.output_head is None else (self.embedding, self.output_head)

    def is_table(self, keys: Sequence[Any]) -> bool:
        """Whether a parameter's path (its keys from the module's root) is in the embedding or the head."""
        names = tuple(str(k) for k in keys)
        return any(names[:len(parts)] == parts for parts in (tuple(t.split("/")) for t in self.tables()))


@dataclass(frozen=True)
class ModelFamily:
    """One architecture, registered once (``register_family``); see the module docstring."""

    name: str
    config_cls: type[FamilyConfig]  # the dataclass of its ``model:`` section (shipped: a ``ModelSection`` subclass)
    build: Builder  # (model_cfg, vocab_size, rngs) -> the NNX module (a ``FamilyModel``), fp32 parameters
    # (model_cfg, vocab_size, seq_len) -> model FLOPs per trained token
    flops: Callable[[FamilyConfig, int, int], float]
    param_count: Callable[[FamilyConfig, int], int]  # (model_cfg, vocab_size) -> parameters, by formula
    # (model_cfg, vocab_size) -> the parameters one token goes through (a mixture of experts: its top_k experts);
    # None: all of them (a dense family). The planner lends a sparse model only a sparse anchor's MFU
    active_param_count: Callable[[FamilyConfig, int], int] | None = None
    # (model_cfg, vocab_size, seq_len, attention kernel) -> forward FLOPs per trained token its backward pass
    # does again (remat, a flash kernel's score recompute); the chunked loss's is counted by ``train_costs``
    recompute_flops: Callable[[FamilyConfig, int, int, str], float] = lambda model_cfg, vocab_size, seq_len, kernel: 0.0
    # (model_cfg) -> the head dimension its attention runs at (which kernels ``attention: auto`` may pick)
    head_dim: Callable[[FamilyConfig], int] = lambda model_cfg: model_cfg.resolved_head_dim
    # logical axis name -> default mesh axes, for every name its parameters and activations use
    axis_rules: Mapping[str, Sequence[str]] = field(default_factory=dict)
    validate: Callable[[FamilyConfig], None] = lambda model_cfg: None  # family-specific checks; ConfigError, one line
    describe: Callable[[FamilyConfig], str] = lambda model_cfg: ""  # its shape in a few words, for log lines
    hf_adapter: HFAdapter | None = None
    # regex over the paths of its submodules (e.g. "blocks/0/mlp") inside which ``train.quantization``
    # quantizes the matmuls against a parameter (trainer/quantization.py); "": int8/fp8 not supported
    quantized_modules: str = ""
    # (model_cfg, remat, head_dim) -> activation values one trained token keeps for the backward pass, all
    # layers (the planner's memory estimate where no fit check ran); the default counts a pre-norm decoder
    # (its section a ``DecoderShape``)
    saved_values_per_token: Callable[[FamilyConfig, str, int], float] = decoder_saved_values
    # the names of its auxiliary losses (e.g. ("load_balance",)): its module then has ``hidden_with_aux``
    # (``AuxLossModel``), the train step adds them to the loss and logs each as train/aux/<name>; (): none
    aux_losses: tuple[str, ...] = ()
    # (model_cfg) -> the names of the scalar statistics ``hidden_with_aux`` also returns (a mixture of experts'
    # expert load per layer, its dropped token-slots): logged as train/aux/<name>, averaged over micro-batches
    # like the losses, never added to the loss; "/" may group them (e.g. "router/load_max_layer_00")
    aux_metrics: Callable[[FamilyConfig], tuple[str, ...]] = lambda model_cfg: ()
    # (model_cfg) -> the rate its mixture-of-experts layers' selection biases move at after each optimizer step
    # (DeepSeek-V3's aux-loss-free balancing, model/moe.py's ``updated_bias``); 0: they stay. Above 0 its module is
    # a ``BalancedRouter`` and ``hidden_with_aux`` also returns the load under ``EXPERT_LOAD``
    router_bias_rate: Callable[[FamilyConfig], float] = lambda model_cfg: 0.0
    # (model_cfg) -> how many tokens beyond the next one its auxiliary losses predict (multi-token prediction's
    # depth, as the step runs it); above 0 the train step passes ``hidden_with_aux`` the batch's labels
    # (``PredictsAhead``), and one of ``aux_losses`` is theirs
    predicts_ahead: Callable[[FamilyConfig], int] = lambda model_cfg: 0
    # (model_cfg) -> top-level parameter collections the config keeps but does not train (e.g. multi-token
    # prediction modules at loss weight 0): the train step zeroes their updates, AdamW's weight decay included
    idle_params: Callable[[FamilyConfig], tuple[str, ...]] = lambda model_cfg: ()
    # fields of its ``model:`` section that are the run's choice, not the checkpoint's shape (routing, loss
    # weights): under ``model.init_from`` they come from the YAML, beside trainer/init_from.py's RUN_KEYS
    run_keys: tuple[str, ...] = ()
    # where its embedding table, untied output head and layer stacks are (``ParamRoles``): what freezing the
    # body, vocabulary adaptation and checkpoint restacking reach into; checked at registration
    roles: ParamRoles = field(default_factory=ParamRoles)
    # the shape fields of a few-layer model of the family (d_model 32-64; {}: the section's defaults): what
    # registration builds (shapes only) to check ``roles``, and what tests/test_family_contract.py runs
    tiny: Mapping[str, Any] = field(default_factory=dict)

    def active_params(self, model_cfg: FamilyConfig, vocab_size: int) -> int:
        """The parameters one token goes through (``param_count`` for a dense family)."""
        count = self.active_param_count or self.param_count
        return count(model_cfg, vocab_size)

    def tiny_config(self, **overrides: Any) -> FamilyConfig:
        """The family's section with its ``tiny`` shape (and ``overrides``)."""
        return replace(self.config_cls(), **{**self.tiny, **overrides})

    def train_costs(self, model_cfg: FamilyConfig, vocab_size: int, seq_len: int, platform: str, compute_dtype: str,
                    loss_chunk_len: int) -> TrainCosts:
        """The attention kernel, model FLOPs and hardware FLOPs per trained token of ``model_cfg`` on ``platform``.

        The chunked loss (model/loss.py, ``0 < loss_chunk_len < seq_len``) computes the output head's logits
        chunk by chunk again in the backward pass: one more forward matmul of the head, whatever the family, for
        the next token and for each token further its auxiliary losses predict (``predicts_ahead``)."""
        kernel = resolve_attention(model_cfg.attention, platform, jnp.dtype(compute_dtype), self.head_dim(model_cfg),
                                   seq_len)
        model_flops = self.flops(model_cfg, vocab_size, seq_len)
        extra = self.recompute_flops(model_cfg, vocab_size, seq_len, kernel)
        if 0 < loss_chunk_len < seq_len:  # the next token's loss, and each further one a family predicts
            extra += (1 + self.predicts_ahead(model_cfg)) * 2.0 * model_cfg.d_model * vocab_size
        return TrainCosts(kernel, model_flops, model_flops + extra)

    def saved_values(self, model_cfg: FamilyConfig, remat: str) -> float:
        """Activation values per trained token kept for the backward pass under ``remat``, over all layers."""
        return self.saved_values_per_token(model_cfg, remat, self.head_dim(model_cfg))

    def mesh_rules(self, configured: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """The rules a run lays this family out with: its defaults, with the config's rules
        (``train.mesh.rules``) taking precedence for every name they give."""
        return {**{k: list(v) for k, v in self.axis_rules.items()}, **{k: list(v) for k, v in configured.items()}}

    def abstract(self, model_cfg: FamilyConfig, vocab_size: int) -> nnx.Module:
        """The module with shape-only parameters (no memory, no compute): graphdef and restore targets.

        A module of its own at every call (callers wrap it or fill its state); the build is traced once per
        configuration in a process: a run asks for it several times (its step, its quantized step, the
        evaluation's model, an import), and tracing a scanned 80-layer build is not free."""
        graphdef, state = abstract_parts(self.build, model_cfg, vocab_size)
        return nnx.merge(graphdef, state, copy=True)  # new Variables: the cached ones are never handed out

    def init(self, model_cfg: FamilyConfig, vocab_size: int, seed: int = 0) -> nnx.Module:
        """A freshly initialised module on the default device (no mesh), e.g. for tests and benchmarks."""
        self.validate(model_cfg)
        return init_module(self.build, model_cfg, vocab_size, seed)


def remat_recompute_flops(remat: str, kernel: str, blocks_forward: float, attention_forward: float) -> float:
    """Forward FLOPs per trained token the backward pass does again, for a decoder whose blocks' forward pass
    (everything but the output head) costs ``blocks_forward`` and whose attention scores and values cost
    ``attention_forward``:

    - ``model.remat``: full recomputes every block's forward (counted whole: the backward pass never reads a
      block's last projection, e.g. Llama's down projection, so the compiled step skips it and full is priced
      high by that much; tests/test_remat_policies.py compares with XLA's count); save_dots and offload keep the
      projections' outputs (model/linear.py's named ``PROJECTIONS``) and recompute attention's score and value
      dots (and a Pallas kernel's); none recomputes nothing.
    - flash-style kernels (splash, cudnn) recompute the scores QK^T in their backward pass: half of
      attention's forward matmuls.
    """
    extra = {"none": 0.0, "full": blocks_forward, "save_dots": attention_forward, "offload": attention_forward}[remat]
    if kernel in ("splash", "cudnn"):
        extra += attention_forward / 2
    return extra


_ABSTRACT_PARTS: dict[tuple[Any, ...], tuple[nnx.GraphDef[Any], nnx.State]] = {}


def abstract_parts(build: Builder, model_cfg: FamilyConfig, vocab_size: int) -> tuple[nnx.GraphDef[Any], nnx.State]:
    """(graphdef, shape-only state) of ``build(model_cfg, vocab_size)``, traced once per process for each
    configuration (the config sections are mutable dataclasses: keyed by the type and every field's repr)."""
    key = (build, type(model_cfg), tuple((f.name, repr(getattr(model_cfg, f.name))) for f in fields(model_cfg)),
           vocab_size)
    if key not in _ABSTRACT_PARTS:
        with nnx.use_eager_sharding(False):
            _ABSTRACT_PARTS[key] = nnx.split(nnx.eval_shape(lambda: build(model_cfg, vocab_size, nnx.Rngs(0))))
    return _ABSTRACT_PARTS[key]


def init_module(build: Builder, model_cfg: FamilyConfig, vocab_size: int, seed: int = 0) -> nnx.Module:
    """``build(model_cfg, vocab_size, Rngs(seed))`` on the default device (no mesh), under ``jax.jit``:
    eager initialisation compiles every random op on its own. The build is traced once: the jitted
    function's trace also gives the module's graphdef."""
    graphdefs: list[nnx.GraphDef[Any]] = []

    def make() -> nnx.State:
        graphdef, state = nnx.split(build(model_cfg, vocab_size, nnx.Rngs(seed)))
        graphdefs.append(graphdef)  # static structure, no tracer: the same as outside the trace
        return state

    with nnx.use_eager_sharding(False):
        options = run_once_compile_options(jax.devices()[0].platform)
        compiled = jax.jit(make).lower().compile(compiler_options=options)
        return nnx.merge(graphdefs[-1], compiled())


def run_once_compile_options(platform: str) -> dict[str, Any]:
    """XLA options for a program that runs once (initialisation): on CPU, LLVM's optimisation of the
    unrolled threefry random-number code costs ~3x more compile time than the single run saves."""
    return {"xla_backend_optimization_level": 0} if platform == "cpu" else {}


def check_aux_losses(family: ModelFamily) -> None:
    """A family that declares auxiliary losses names each once, as a metric name can hold it, and its module
    has ``hidden_with_aux``: one ConfigError line at registration rather than a trace error at the first step.
    The module's class is the builder itself where that is a class (nothing is built), else the type of an
    abstract build of its ``tiny`` shape (``nnx.eval_shape``: shapes only, no memory; ``check_roles``' build)."""
    names = family.aux_losses
    if not names:
        return
    distinct = isinstance(names, tuple) and len(set(names)) == len(names)
    if not distinct or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigError(f"model family '{family.name}': aux_losses must be a tuple of distinct names (letters, "
                          f"digits, _), got {names!r}")
    metrics = family.aux_metrics(family.tiny_config())
    if (not isinstance(metrics, tuple) or len(set(metrics + names)) != len(metrics) + len(names)
            or not all(isinstance(m, str) and all(p.isidentifier() for p in m.split("/")) for m in metrics)):
        raise ConfigError(f"model family '{family.name}': aux_metrics must give a tuple of distinct names (letters, "
                          f"digits, _ in parts joined by /), none an auxiliary loss's, got {metrics!r}")
    module_cls = (family.build if isinstance(family.build, type)
                  else type(family.abstract(family.tiny_config(), ROLE_CHECK_VOCAB)))
    if not callable(getattr(module_cls, "hidden_with_aux", None)):
        raise ConfigError(f"model family '{family.name}' declares auxiliary losses {list(names)}, but its module "
                          f"{module_cls.__name__} has no hidden_with_aux(tokens, segment_ids, positions) method")
    if family.predicts_ahead(family.tiny_config()) and "labels" not in inspect.signature(
            module_cls.hidden_with_aux).parameters:
        raise ConfigError(f"model family '{family.name}' predicts tokens ahead, but its module's hidden_with_aux "
                          "takes no labels (model.family.PredictsAhead)")


ROLE_CHECK_VOCAB = 251  # the vocabulary roles are checked at: a size no other dimension of a tiny shape has


def check_roles(family: ModelFamily) -> None:
    """``family.roles`` against the parameters of its ``tiny`` shape (an abstract build: ``nnx.eval_shape``, no
    memory): the embedding a [vocabulary, d_model] parameter, the untied head (where the build has it) a
    [d_model, vocabulary] one, each layer stack a top-level attribute holding parameters, and no other parameter
    with the vocabulary's dimension (a head the roles do not name would stay frozen under ``train.trainable:
    embeddings`` and keep the base model's rows under ``model.vocab_adaptation``). One ConfigError line."""
    roles, vocab = family.roles, ROLE_CHECK_VOCAB
    cfg = family.tiny_config()
    family.validate(cfg)
    _, state = abstract_parts(family.build, cfg, vocab)
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
    shapes = {"/".join(map(str, path_keys(path))): tuple(leaf.shape) for path, leaf in flat}

    def fail(problem: str) -> NoReturn:
        names = ", ".join(sorted({path.split("/")[0] for path in shapes}))
        raise ConfigError(f"model family '{family.name}': {problem} (ModelFamily.roles; the top-level parameters "
                          f"of its tiny shape: {names})")

    embedding = shapes.get(roles.embedding)
    if embedding is None or len(embedding) != 2 or embedding[0] != vocab:
        fail(f"roles.embedding {roles.embedding!r} is not a [vocabulary, d_model] parameter")
    head = shapes.get(roles.output_head) if roles.output_head is not None else None
    if head is not None and (len(head) != 2 or head[1] != vocab):
        fail(f"roles.output_head {roles.output_head!r} is not a [d_model, vocabulary] parameter")
    for name in roles.layers:
        if "/" in name or not any(path.split("/")[0] == name for path in shapes):
            fail(f"roles.layers names {name!r}, which is no top-level attribute holding parameters")
    unnamed = [path for path, shape in shapes.items() if vocab in shape and not roles.is_table(path.split("/"))]
    if unnamed:
        fail(f"parameter {unnamed[0]} has the vocabulary's dimension but no role: name the untied output head "
             "in roles.output_head")


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Make ``family`` known by its name (the config's ``model.family``); its section class reads ``model:``.

    Checked first, each a ConfigError line: its ``roles`` against an abstract build of its ``tiny`` shape
    (``check_roles``), its auxiliary losses (``check_aux_losses``), and (a plugin's) its section class subclassing
    ``ModelSection`` (``register_model_section``). Registering the same family object again is a no-op (a module
    imported twice); another family under a taken name is an error.
    """
    known = _FAMILIES.get(family.name)
    if known is not None and known != family:
        raise ValueError(f"model family '{family.name}' is already registered")
    check_aux_losses(family)
    check_roles(family)
    if family.name not in FAMILY_PACKAGES:  # a shipped family's section is read from its folder's config module
        register_model_section(family.name, family.config_cls, family.axis_rules)
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> ModelFamily:
    """The family registered as ``name``; a shipped one's folder is imported the first time it is asked for."""
    if name not in _FAMILIES and name in FAMILY_PACKAGES:
        family_module(name)
    if name not in _FAMILIES:
        raise ConfigError(f"config key 'model.family': unknown model family '{name}' (known: {', '.join(families())})")
    return _FAMILIES[name]


def families() -> tuple[str, ...]:
    """Every family known: those that ship and those registered from outside the package."""
    return tuple(sorted({*shipped_families(), *_FAMILIES}))


def family_of(model_cfg: FamilyConfig) -> ModelFamily:
    """The family of a ``model:`` section (its ``family`` field)."""
    return get_family(model_cfg.family)
