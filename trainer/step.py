"""The train step as one object: ``TrainProgram``, what one step computes, and the state it runs on.

Read it top to bottom as the step runs::

    step(state, batch)                 jit(train_step): in and out on the state's shardings, state donated
      train_step(state, batch)         pure: grads -> update -> the next state and the step's metrics
        grads(params, batch)           d loss / d params, summed over train.grad_accum_steps micro-batches
          loss(params, batch)          the model's hidden states -> chunked cross-entropy (+ z-loss, + the
                                       family's auxiliary losses: ``ModelFamily.aux_losses``)
        update(state, grads, loss)     freeze the body, clip + AdamW, skip a non-finite step or a spike
    step_skipping_spikes(state, batch, spike_limits)
                                       the same step, the update kept only under the guard's limits
                                       (train.skip_spikes: trainer/guard.py)
    lower(abstract_batch)              the same jitted step, lowered ahead of time (trainer/fit_check.py)

The train state is a plain dict ``{"params", "opt_state", "step", "rng"}`` so that Orbax saves
and restores it as one tree. Its shardings are computed once from the parameters' logical axis
names; the state is created by a jitted init with those ``out_shardings`` (so the optimizer state
is sharded like the parameters, not replicated) and the step takes and returns exactly the same
shardings, which is what keeps it from recompiling after the first step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from experiment.batch_split import BatchSplit
from experiment.errors import ConfigError
from experiment.sections.model import FamilyConfig
from experiment.sections.train import TrainConfig
from model.family import (
    EXPERT_LOAD,
    AuxLossModel,
    BalancedRouter,
    FamilyModel,
    ParamRoles,
    PredictsAhead,
    run_once_compile_options,
)
from model.loss import Labels, chunked_cross_entropy
from model.moe import RouterBias
from model.registry import family_of
from model.sharding import (
    activation_layout,
    batch_sharding,
    check_mesh_axes,
    replicated,
    spec_axes,
    tree_shardings,
)
from model.stacking import BLOCKS, layer_ndim, path_keys, stack_tree, unstack_tree
from trainer.quantization import quantize_module, tracing
from trainer.schedules import make_schedule

State = dict[str, Any]
Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
AuxLosses = dict[str, jax.Array]  # a family's auxiliary losses by name (``ModelFamily.aux_losses``), weighted
AUX_METRICS = "aux/"  # the step's metric of aux loss <name> is aux/<name> (train/aux/<name> in the logs)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class TrainProgram:
    """One model on one mesh: its train step (``step``, jitted), its state (created, restored, converted)
    and where everything lives (``state_shardings``, ``batch_sharding``).

    ``model_cfg`` is a model family's ``model:`` section (model/family.py); its family builds the model.
    Nothing here changes after ``__init__``: the traced methods read the configuration and write nothing
    to ``self``, so a traced step is a pure function of its arguments.
    """

    def __init__(self, model_cfg: FamilyConfig, train_cfg: TrainConfig, vocab_size: int, mesh: Mesh, seed: int) -> None:
        family = family_of(model_cfg)
        family.validate(model_cfg)
        self.model_cfg, self.train_cfg, self.vocab_size, self.mesh, self.seed = (model_cfg, train_cfg, vocab_size,
                                                                                 mesh, seed)
        self.family = family
        # what hidden_with_aux returns: the losses added to the loss, then the statistics only logged, then the
        # expert load the selection biases move by (DeepSeek-V3's balancing; a rate of 0: not returned)
        self.bias_rate = float(family.router_bias_rate(model_cfg)) if family.aux_losses else 0.0
        self.predicts_ahead = bool(family.aux_losses) and family.predicts_ahead(model_cfg) > 0
        self.aux_names = ((*family.aux_losses, *family.aux_metrics(model_cfg), *((EXPERT_LOAD,) if self.bias_rate
                                                                               else ())) if family.aux_losses else ())
        self.rules = family.mesh_rules(train_cfg.mesh.rules)
        check_mesh_axes(mesh, self.rules)  # a family's own mesh axis (expert) is one of the mesh's
        self.tx, self.schedule = make_optimizer(train_cfg, family.roles.layers)
        self.param_dtype, self.compute_dtype = DTYPES[train_cfg.param_dtype], DTYPES[train_cfg.compute_dtype]

        # eval and export merge the float ``graphdef``; the step merges its own: the same parameters, its
        # matmuls quantized by Qwix under train.quantization
        abstract = family.abstract(model_cfg, vocab_size)
        self.graphdef = nnx.graphdef(abstract)
        self.step_graphdef = (
            nnx.graphdef(quantize_module(family.abstract(model_cfg, vocab_size), family, train_cfg.quantization))
            if train_cfg.quantization != "none" else self.graphdef)

        # initial_state's shapes, without tracing the build again: its parameters, cast, and what state_of adds
        shapes = jax.eval_shape(self.state_of, jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, self.param_dtype),
                                                            nnx.state(abstract, nnx.Param)))
        tree_shardings(shapes["params"], mesh, self.rules)  # checked alone first so an error names the parameter
        self.state_shardings: State = tree_shardings(shapes, mesh, self.rules)
        self.abstract_state: State = with_shardings(shapes, self.state_shardings)  # the restore target
        self.batch_sharding: NamedSharding = batch_sharding(mesh, self.rules)
        check_batch(train_cfg, self.batch_sharding)
        # which leaves train while the body is frozen (train.trainable, train.embeddings_only_steps)
        self.trainable = embedding_mask(shapes["params"], family.roles) if freezes_body(train_cfg) else None
        # the family's parameters this config keeps but does not train (ModelFamily.idle_params): True where idle
        idle = family.idle_params(model_cfg)
        self.idle = (jax.tree_util.tree_map_with_path(lambda path, _: path_keys(path)[0] in idle, shapes["params"])
                     if idle else None)
        # parameters that train while the body is frozen (None: every parameter always trains)
        self.param_trainable_frozen: int | None = None if self.trainable is None else sum(
            math.prod(leaf.shape) for leaf, keep in zip(jax.tree.leaves(shapes["params"]),
                                                        jax.tree.leaves(self.trainable), strict=True) if keep)

        # the step keeps the state where it is (no recompilation after the first step) and reuses its
        # buffers for the next state (donated: one copy of the parameters and moments, not two)
        self.step = jax.jit(
            self.train_step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, replicated(mesh)),
            donate_argnums=0,
        )
        # train.skip_spikes: the step also takes the guard's [loss limit, gradient-norm limit] (trainer/guard.py),
        # an input on every process alike, so the skip is decided on the devices with no wait for the host
        self.step_skipping_spikes = jax.jit(
            self.train_step,
            in_shardings=(self.state_shardings, self.batch_sharding, replicated(mesh)),
            out_shardings=(self.state_shardings, replicated(mesh)),
            donate_argnums=0,
        )
        self._init = jax.jit(self.initial_state, out_shardings=self.state_shardings)
        self.state_finite = jax.jit(lambda state: all_finite((state["params"], state["opt_state"])))
        self._init_from = jax.jit(self.state_of, in_shardings=(self.state_shardings["params"],),
                                  out_shardings=self.state_shardings, donate_argnums=0)

    # -- what one step computes (traced under ``step``) --

    def loss(self, params: nnx.State, batch: Batch) -> tuple[jax.Array, tuple[jax.Array, AuxLosses]]:
        """``(loss to minimise, (cross-entropy, auxiliary losses))`` of one (micro-)batch: the model runs in
        ``train.compute_dtype`` on a cast of the master weights, the logits a chunk of positions at a time.

        A family that declares auxiliary losses (``ModelFamily.aux_losses``, e.g. a mixture of experts' load
        balance) runs ``hidden_with_aux``, which returns each already weighted by the family's config; their
        sum joins the loss the gradient is taken of. Others run ``hidden`` and the loss is what it always was."""
        model = nnx.merge(self.step_graphdef, jax.tree.map(lambda p: p.astype(self.compute_dtype), params))
        aux: AuxLosses = {}
        with tracing(self.train_cfg.quantization):
            if self.family.aux_losses:
                hidden, aux = self.aux_hidden(model, batch)
            else:
                hidden = model.hidden(batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
        # loss_weights (shards.on_corrupt=skip): the row standing in for a corrupt record trains nothing
        nll, z_term = chunked_cross_entropy(hidden, model.output_weight(), batch["targets"],
                                            self.train_cfg.loss_chunk_len, weights=batch.get("loss_weights"))
        loss = nll + self.model_cfg.z_loss * z_term
        if aux:
            loss = loss + sum(aux[name] for name in self.family.aux_losses)
        return loss, (nll, aux)

    def aux_hidden(self, model: FamilyModel, batch: Batch) -> tuple[jax.Array, AuxLosses]:
        """``model.hidden_with_aux`` of the batch: the hidden states, the family's declared auxiliary losses and its
        statistics (``aux_metrics``), each a float32 scalar (anything else is the family's bug, named while
        tracing)."""
        if self.predicts_ahead:  # multi-token prediction scores its predictions itself: it gets the labels
            labels = Labels(batch["targets"], batch.get("loss_weights"), self.train_cfg.loss_chunk_len)
            hidden, aux = cast(PredictsAhead, model).hidden_with_aux(
                batch["inputs"], batch.get("segment_ids"), batch.get("positions"), labels=labels)
        else:
            hidden, aux = cast(AuxLossModel, model).hidden_with_aux(batch["inputs"], batch.get("segment_ids"),
                                                                    batch.get("positions"))
        declared = self.aux_names
        shapes = {name: jnp.shape(value) for name, value in aux.items()}
        if set(aux) != set(declared) or any(shape for name, shape in shapes.items() if name != EXPERT_LOAD):
            raise ValueError(f"model family '{self.family.name}': hidden_with_aux returned auxiliary losses of shapes "
                             f"{shapes}; the family declares {list(declared)}, each a scalar")
        return hidden, {name: jnp.asarray(aux[name], jnp.float32) for name in declared}

    def grads(self, params: nnx.State, batch: Batch) -> tuple[jax.Array, jax.Array, AuxLosses, nnx.State]:
        """``(loss, cross-entropy, auxiliary losses, gradients)`` of the batch, averaged over
        ``train.grad_accum_steps`` micro-batches run one after another (a ``lax.scan``): the memory of one
        micro-batch. The auxiliary losses are accumulated and averaged like the loss."""
        grad_fn = jax.value_and_grad(self.loss, has_aux=True)
        accum = self.train_cfg.grad_accum_steps
        if accum == 1:
            (loss, (nll, aux)), grads = grad_fn(params, batch)
            return loss, nll, aux, grads

        def split(x: jax.Array) -> jax.Array:
            # row i of micro-batch j is row i * accum + j: each device keeps its own rows
            micro = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
            return jax.lax.with_sharding_constraint(
                micro, NamedSharding(self.mesh, jax.P(None, *self.batch_sharding.spec)))

        def add_micro(carry: tuple[Any, ...], micro: Batch) -> tuple[tuple[Any, ...], None]:
            loss_sum, nll_sum, aux_sum, grad_sum = carry
            (loss, (nll, aux)), grads = grad_fn(params, micro)
            return (loss_sum + loss, nll_sum + nll, jax.tree.map(jnp.add, aux_sum, aux),
                    jax.tree.map(jnp.add, grad_sum, grads)), None

        micro_batches = jax.tree.map(split, batch)
        # the auxiliary outputs' shapes (scalars, and an [L, E] expert load): of one micro-batch, traced abstractly
        aux_like = jax.eval_shape(lambda b: self.loss(params, b)[1][1], jax.tree.map(lambda x: x[0], micro_batches))
        zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_like),
                 jax.tree.map(jnp.zeros_like, params))
        (loss, nll, aux, grads), _ = jax.lax.scan(add_micro, zeros, micro_batches)
        return (loss / accum, nll / accum, {name: value / accum for name, value in aux.items()},
                jax.tree.map(lambda g: g / accum, grads))

    def update(self, state: State, grads: nnx.State, loss: jax.Array, spike_limits: jax.Array | None = None
               ) -> tuple[nnx.State, Any, jax.Array, jax.Array, jax.Array]:
        """The optimizer step: ``(new params, new optimizer state, gradient norm, finite, spike)``.

        A frozen body (``freeze_body``) gets zero gradients and zero updates. ``finite``: the loss, the
        gradient norm and every updated parameter and moment are finite; under ``train.nan_policy: skip`` a
        step that is not keeps the previous weights and moments. ``spike``: a finite loss or gradient norm
        above its limit in ``spike_limits`` (``[loss, gradient norm]``; None: not checked); such a step keeps
        the previous weights and moments whatever the NaN policy.
        """
        params, step = state["params"], state["step"]
        if self.trainable is not None:
            grads = freeze_body(grads, self.trainable, step, self.train_cfg)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], params)
        if self.trainable is not None:
            updates = freeze_body(updates, self.trainable, step, self.train_cfg)
        if self.idle is not None:  # no gradient reaches them; AdamW's weight decay would still shrink them
            updates = jax.tree.map(lambda update, idle: jnp.zeros_like(update) if idle else update, updates,
                                   self.idle)
        new_params = optax.apply_updates(params, updates)
        # the updated state itself: a step can have a finite loss and gradient and still overflow the weights
        # or the moments (a huge learning rate); one fused reduction over what the step computed anyway
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & all_finite((new_params, opt_state))
        spike = jnp.asarray(False)
        if spike_limits is not None:  # a NaN compares above nothing: only a finite step is a spike
            spike = finite & ((loss > spike_limits[0]) | (grad_norm > spike_limits[1]))
        keep = None if self.train_cfg.nan_policy != "skip" else finite
        if spike_limits is not None:
            keep = ~spike if keep is None else keep & ~spike
        if keep is not None:
            new_params, opt_state = jax.tree.map(
                lambda new, old: jnp.where(keep, new, old), (new_params, opt_state), (params, state["opt_state"])
            )
        return new_params, opt_state, grad_norm, finite, spike

    def train_step(self, state: State, batch: Batch, spike_limits: jax.Array | None = None) -> tuple[State, Metrics]:
        """One optimizer step, pure: ``step`` is this function jitted (call that one), ``step_skipping_spikes``
        with the guard's ``spike_limits``."""
        with self.layout():
            step = state["step"]
            loss, nll, aux, grads = self.grads(state["params"], batch)
            params, opt_state, grad_norm, finite, spike = self.update(state, grads, loss, spike_limits)
            if self.bias_rate:
                params = self.balanced(params, aux.pop(EXPERT_LOAD), finite & ~spike, step)
            new_state = {
                "params": params,
                "opt_state": opt_state,
                "step": step + 1,
                # advanced every step so that stochastic features (dropout, sampling) resume exactly
                "rng": jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), step)),
            }
            metrics = {"loss": nll, "total_loss": loss, "grad_norm": grad_norm, "lr": self.schedule(step),
                       "finite": finite, "spike": spike,
                       **{f"{AUX_METRICS}{name}": value for name, value in aux.items()}}
        return new_state, metrics

    def balanced(self, params: nnx.State, expert_load: jax.Array, finite: jax.Array, step: jax.Array) -> nnx.State:
        """``params`` with the MoE layers' selection biases moved by the step's expert load (``BalancedRouter``,
        at the family's ``router_bias_rate``): DeepSeek-V3's aux-loss-free balancing, outside the optimizer. A step
        that is not finite, or one whose body is frozen (``train.trainable``, ``train.embeddings_only_steps``),
        leaves them where they were."""
        model = nnx.merge(self.graphdef, params)
        before = jax.tree.map(lambda x: x, nnx.state(model, RouterBias))  # the arrays: the update replaces them
        cast(BalancedRouter, model).update_router_biases(expert_load, self.bias_rate)
        keep = finite
        if self.trainable is not None:
            frozen = (jnp.asarray(True) if self.train_cfg.trainable == "embeddings"
                      else step < self.train_cfg.embeddings_only_steps)
            keep = keep & ~frozen
        moved = jax.tree.map(lambda new, old: jnp.where(keep, new, old), nnx.state(model, RouterBias), before)
        return nnx.merge_state(params, moved)  # only the biases' leaves are new

    @contextlib.contextmanager
    def layout(self) -> Iterator[None]:
        """While tracing: the mesh as the abstract mesh, and the logical rules the model's activation
        constraints (``model.sharding.constrain``) and splash attention's ``shard_map`` read. Entered inside
        the traced step so that every call of ``step`` traces the same program whatever the caller's context
        (``jax.set_mesh`` cannot be entered under jit; its abstract half traces the same program)."""
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh), activation_layout(self.mesh, self.rules):
            yield

    def lower(self, abstract_batch: dict[str, jax.ShapeDtypeStruct]) -> jax.stages.Lowered:
        """The step the loop runs (``step``, or ``step_skipping_spikes`` under ``train.skip_spikes``) lowered
        for the abstract state and ``abstract_batch``: compile it ahead of time (e.g. for a TPU topology:
        trainer/fit_check.py) or read its HLO."""
        if self.train_cfg.skip_spikes:
            limits = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=replicated(self.mesh))
            return self.step_skipping_spikes.lower(self.abstract_state, abstract_batch, limits)
        return self.step.lower(self.abstract_state, abstract_batch)

    def abstract_batch(self, batch_size: int, seq_len: int, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        keys = ("inputs", "targets", "segment_ids", "positions") if packed else ("inputs", "targets")
        return {k: jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32, sharding=self.batch_sharding) for k in keys}

    # -- the state the step runs on --

    def initial_state(self) -> State:
        """Step 0 of a run that starts afresh (traced: ``init_state`` runs it compiled)."""
        return self.state_of(initial_params(self.model_cfg, self.vocab_size, self.seed, self.param_dtype))

    def state_of(self, params: nnx.State) -> State:
        """The state of step 0 with ``params``: fresh optimizer state, step 0, the run's RNG."""
        return {
            "params": params,
            "opt_state": self.tx.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(jax.random.fold_in(jax.random.key(self.seed), 1)),
        }

    def init_state(self) -> State:
        """``initial_state`` on the devices, laid out as the step expects."""
        with jax.set_mesh(self.mesh), activation_layout(self.mesh, self.rules):
            options = run_once_compile_options(self.mesh.devices.flat[0].platform)
            return self._init.lower().compile(compiler_options=options)()

    def init_state_from(self, pure: dict[str, Any]) -> State:
        """The state of step 0 with given parameters (a pure dict of the family's module, e.g. an imported
        model): fresh optimizer state, step 0, the same RNG as ``init_state``."""
        params = nnx.state(self.family.abstract(self.model_cfg, self.vocab_size), nnx.Param)
        nnx.replace_by_pure_dict(params, pure)
        params = jax.tree.map(lambda value, like: jax.device_put(jnp.asarray(value, like.dtype), like.sharding),
                              params, self.abstract_state["params"])
        with jax.set_mesh(self.mesh), activation_layout(self.mesh, self.rules):
            return self._init_from(params)

    def checkpoint_layout(self, scanned: bool) -> tuple[State, Callable[[State], State]]:
        """``scanned``, a checkpoint's layer layout -> (its restore target, the function that brings the
        restored state to this program's layout): a checkpoint of the other layout is restacked (or
        unstacked) once, on the devices, each array laid out as the step expects."""
        if scanned == self.model_cfg.scan_layers:
            return self.abstract_state, lambda state: state
        other_cfg = dataclasses.replace(self.model_cfg, scan_layers=scanned)
        other = jax.eval_shape(lambda: self.state_of(initial_params(other_cfg, self.vocab_size, self.seed,
                                                                    self.param_dtype)))
        other_abstract = with_shardings(other, tree_shardings(other, self.mesh, self.rules))
        ours = self.abstract_state
        stacks = self.family.roles.layers
        convert = ((lambda state: unstack_tree(state, ours, stacks)) if scanned
                   else (lambda state: stack_tree(state, ours, stacks)))
        return other_abstract, jax.jit(convert, out_shardings=self.state_shardings, donate_argnums=0)

    def model(self, params: nnx.State) -> FamilyModel:
        """The float model with ``params`` (eval during training, export)."""
        return nnx.merge(self.graphdef, params)


def make_optimizer(train_cfg: TrainConfig, stacks: tuple[str, ...] = (BLOCKS,)
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW on train.schedule (trainer/schedules.py), after global-norm clipping.

    Weight decay skips vectors (norm scales): decaying them only fights the normalisation. A scanned
    layer's norm scale is a [layers, D] matrix of vectors: the rank that counts is the per-layer one.
    """
    schedule = make_schedule(train_cfg)
    adamw = optax.adamw(
        schedule, b1=train_cfg.beta1, b2=train_cfg.beta2, weight_decay=train_cfg.weight_decay,
        mask=lambda params: jax.tree_util.tree_map_with_path(lambda path, p: layer_ndim(path, p, stacks) > 1, params),
    )
    if train_cfg.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(train_cfg.grad_clip), adamw), schedule
    return adamw, schedule


def all_finite(tree: Any) -> jax.Array:
    """Whether every float leaf of ``tree`` is finite: one boolean scalar (integer leaves, such as
    optimizer step counts, cannot be NaN)."""
    leaves = [jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return jnp.stack(leaves).all() if leaves else jnp.asarray(True)


def embedding_mask(params: Any, roles: ParamRoles) -> Any:
    """True for the input embeddings and the untied output head: the family's ``roles.embedding`` and
    ``roles.output_head`` (``model.family.ParamRoles``), checked against its parameters at registration."""
    return jax.tree_util.tree_map_with_path(lambda path, _: roles.is_table(path_keys(path)), params)


def freezes_body(train_cfg: TrainConfig) -> bool:
    return train_cfg.trainable == "embeddings" or train_cfg.embeddings_only_steps > 0


def freeze_body(tree: Any, mask: Any, step: jax.Array, train_cfg: TrainConfig) -> Any:
    """Zero every leaf but the embeddings' while the body is frozen: always under ``train.trainable:
    embeddings``, the first ``train.embeddings_only_steps`` steps otherwise. Applied to the gradients
    (so clipping and the moments see only what trains) and to the updates (AdamW's weight decay would
    move a frozen weight otherwise). The phase is a function of the state's step, so a resumed run
    switches at the same step."""
    frozen = (jnp.asarray(True) if train_cfg.trainable == "embeddings"
              else step < train_cfg.embeddings_only_steps)
    return jax.tree.map(lambda leaf, keep: leaf if keep else jnp.where(frozen, jnp.zeros_like(leaf), leaf), tree, mask)


def initial_params(model_cfg: FamilyConfig, vocab_size: int, seed: int, param_dtype: Any) -> nnx.State:
    """The parameters of step 0 of a run that starts afresh: the family's initialisers drawn from
    ``fold_in(key(seed), 0)``, cast to ``train.param_dtype``. Traced inside the trainer's state init and
    by eval's random-init baseline (``eval.run.random_init_model``), so both get the same values."""
    with nnx.use_eager_sharding(False):
        model = family_of(model_cfg).build(model_cfg, vocab_size,
                                           nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), 0)))
    return jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(model, nnx.Param))


def with_shardings(shapes: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying their shardings (a restore target, an ahead-of-time input)."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def check_batch(train_cfg: TrainConfig, data_sharding: NamedSharding) -> None:
    spec = data_sharding.spec[0] if data_sharding.spec else None
    split = BatchSplit(train_cfg.batch_size, train_cfg.grad_accum_steps,
                       {axis: data_sharding.mesh.shape[axis] for axis in spec_axes(spec)})
    if not split.even:
        raise ConfigError(
            f"config key 'train.batch_size': the micro-batch of {split.micro} sequences (batch_size / "
            f"grad_accum_steps) cannot be split over the {split.parts} data-parallel devices "
            f"({'x'.join(split.axis_sizes)})"
        )


def global_batch(local: dict[str, Any], sharding: NamedSharding) -> Batch:
    """Assemble the global batch from this process's rows (one process: just a device_put)."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
