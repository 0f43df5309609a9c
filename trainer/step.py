"""The compiled pieces of training: optimizer, sharded state creation and the train step.

The train state is a plain dict ``{"params", "opt_state", "step", "rng"}`` so that Orbax saves
and restores it as one tree. Its shardings are computed once from the parameters' logical axis
names; the state is created by a jitted init with those ``out_shardings`` (so the optimizer state
is sharded like the parameters, not replicated) and the step takes and returns exactly the same
shardings, which is what keeps it from recompiling after the first step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from experiment.errors import ConfigError
from experiment.sections.train import TrainConfig
from model.family import FamilyModel, run_once_compile_options
from model.loss import chunked_cross_entropy
from model.registry import family_of
from model.sharding import Rules, activation_layout, batch_sharding, replicated, tree_shardings
from model.stacking import layer_ndim, stack_tree, unstack_tree
from model.vocab_adaptation import EMBEDDING_PARAMS
from trainer.quantization import quantize_module, tracing
from trainer.schedules import make_schedule

State = dict[str, Any]
Batch = dict[str, jax.Array]
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def make_optimizer(train_cfg: TrainConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW on train.schedule (trainer/schedules.py), after global-norm clipping.

    Weight decay skips vectors (norm scales): decaying them only fights the normalisation. A scanned
    layer's norm scale is a [layers, D] matrix of vectors: the rank that counts is the per-layer one.
    """
    schedule = make_schedule(train_cfg)
    adamw = optax.adamw(
        schedule, b1=train_cfg.beta1, b2=train_cfg.beta2, weight_decay=train_cfg.weight_decay,
        mask=lambda params: jax.tree_util.tree_map_with_path(lambda path, p: layer_ndim(path, p) > 1, params),
    )
    if train_cfg.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(train_cfg.grad_clip), adamw), schedule
    return adamw, schedule


def embedding_mask(params: Any) -> Any:
    """True for the input embeddings and the output head (``model.vocab_adaptation.EMBEDDING_PARAMS``)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: bool(path) and getattr(path[0], "key", None) in EMBEDDING_PARAMS, params)


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


def initial_params(model_cfg: Any, vocab_size: int, seed: int, param_dtype: Any) -> nnx.State:
    """The parameters of step 0 of a run that starts afresh: the family's initialisers drawn from
    ``fold_in(key(seed), 0)``, cast to ``train.param_dtype``. Traced inside the trainer's state init and
    by eval's random-init baseline (``eval.run.random_init_model``), so both get the same values."""
    with nnx.use_eager_sharding(False):
        model = family_of(model_cfg).build(model_cfg, vocab_size,
                                           nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), 0)))
    return jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(model, nnx.Param))


@dataclasses.dataclass
class TrainProgram:
    """Everything compiled for one model/mesh: create the state, run a step, where things live."""

    graphdef: nnx.GraphDef
    mesh: Mesh
    rules: Rules
    abstract_state: State  # ShapeDtypeStructs with shardings: the restore target
    state_shardings: State
    batch_sharding: NamedSharding
    schedule: optax.Schedule
    init_state: Callable[[], State]
    # the state of step 0 with given parameters (a pure dict of the family's module, e.g. an imported
    # model): fresh optimizer state, step 0, the same RNG as init_state
    init_state_from: Callable[[dict[str, Any]], State]
    train_step: Callable[[State, Batch], tuple[State, dict[str, jax.Array]]]
    # scan_layers of a checkpoint -> (its restore target, the function that brings the restored state to
    # this program's layout): a checkpoint of the other layer layout is restacked (or unstacked) once
    checkpoint_layout: Callable[[bool], tuple[State, Callable[[State], State]]]

    def model(self, params: nnx.State) -> FamilyModel:
        return nnx.merge(self.graphdef, params)

    def abstract_batch(self, batch_size: int, seq_len: int, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        keys = ("inputs", "targets", "segment_ids", "positions") if packed else ("inputs", "targets")
        return {k: jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32, sharding=self.batch_sharding) for k in keys}

    def lower_step(self, abstract_batch: dict[str, jax.ShapeDtypeStruct]) -> jax.stages.Lowered:
        """The train step lowered for abstract inputs: compile it ahead of time (e.g. for a TPU topology)."""
        with jax.set_mesh(self.mesh), activation_layout(self.mesh, self.rules):
            return self.train_step.jitted.lower(self.abstract_state, abstract_batch)  # type: ignore[attr-defined]


def build_program(model_cfg: Any, train_cfg: TrainConfig, vocab_size: int, mesh: Mesh,
                  seed: int) -> TrainProgram:
    """``model_cfg``: a model family's ``model:`` section (model/family.py); its family builds the model."""
    family = family_of(model_cfg)
    family.validate(model_cfg)
    rules = family.mesh_rules(train_cfg.mesh.rules)
    tx, schedule = make_optimizer(train_cfg)
    param_dtype, compute_dtype = DTYPES[train_cfg.param_dtype], DTYPES[train_cfg.compute_dtype]

    def create_state() -> State:
        return state_of(initial_params(model_cfg, vocab_size, seed, param_dtype))

    def state_of(params: nnx.State) -> State:
        return {
            "params": params,
            "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1)),
        }

    graphdef = nnx.graphdef(family.abstract(model_cfg, vocab_size))
    # the step's own model: the same parameters, its matmuls quantized by Qwix under train.quantization;
    # eval and export merge the float ``graphdef``
    quantizing = train_cfg.quantization != "none"
    step_graphdef = (nnx.graphdef(quantize_module(family.abstract(model_cfg, vocab_size), family, train_cfg.quantization))
                     if quantizing else graphdef)
    shapes = jax.eval_shape(create_state)
    tree_shardings(shapes["params"], mesh, rules)  # checked alone first so an error names the parameter
    state_shardings = tree_shardings(shapes, mesh, rules)
    abstract_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  shapes, state_shardings)
    data_sharding = batch_sharding(mesh, rules)
    check_batch(train_cfg, data_sharding)

    def loss_fn(params: nnx.State, batch: Batch) -> tuple[jax.Array, jax.Array]:
        model = nnx.merge(step_graphdef, jax.tree.map(lambda p: p.astype(compute_dtype), params))
        with tracing(train_cfg.quantization):
            hidden = model.hidden(batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
        # loss_weights (shards.on_corrupt=skip): the row standing in for a corrupt record trains nothing
        nll, z_term = chunked_cross_entropy(hidden, model.output_weight(), batch["targets"], train_cfg.loss_chunk_len,
                                            weights=batch.get("loss_weights"))
        return nll + model_cfg.z_loss * z_term, nll

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    trainable = embedding_mask(shapes["params"]) if freezes_body(train_cfg) else None

    def gradients(params: nnx.State, batch: Batch) -> tuple[jax.Array, jax.Array, nnx.State]:
        accum = train_cfg.grad_accum_steps
        if accum == 1:
            (loss, nll), grads = grad_fn(params, batch)
            return loss, nll, grads

        def split(x: jax.Array) -> jax.Array:
            # row i of micro-batch j is row i * accum + j: each device keeps its own rows
            micro = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
            return jax.lax.with_sharding_constraint(micro, NamedSharding(mesh, jax.P(None, *data_sharding.spec)))

        def add_micro(carry: tuple[Any, ...], micro: Batch) -> tuple[tuple[Any, ...], None]:
            loss_sum, nll_sum, grad_sum = carry
            (loss, nll), grads = grad_fn(params, micro)
            return (loss_sum + loss, nll_sum + nll, jax.tree.map(jnp.add, grad_sum, grads)), None

        zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        (loss, nll, grads), _ = jax.lax.scan(add_micro, zeros, jax.tree.map(split, batch))
        return loss / accum, nll / accum, jax.tree.map(lambda g: g / accum, grads)

    def train_step(state: State, batch: Batch) -> tuple[State, dict[str, jax.Array]]:
        params, step = state["params"], state["step"]
        loss, nll, grads = gradients(params, batch)
        if trainable is not None:
            grads = freeze_body(grads, trainable, step, train_cfg)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        if trainable is not None:
            updates = freeze_body(updates, trainable, step, train_cfg)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        if train_cfg.nan_policy == "skip":  # keep the previous weights and moments for a bad batch
            new_params, opt_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (new_params, opt_state), (params, state["opt_state"])
            )
        new_state = {
            "params": new_params,
            "opt_state": opt_state,
            "step": step + 1,
            # advanced every step so that stochastic features (dropout, sampling) resume exactly
            "rng": jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), step)),
        }
        metrics = {"loss": nll, "total_loss": loss, "grad_norm": grad_norm, "lr": schedule(step), "finite": finite}
        return new_state, metrics

    jitted_init = jax.jit(create_state, out_shardings=state_shardings)
    jitted_step = jax.jit(
        train_step,
        in_shardings=(state_shardings, data_sharding),
        out_shardings=(state_shardings, replicated(mesh)),
        donate_argnums=0,
    )

    def init_state() -> State:
        with jax.set_mesh(mesh), activation_layout(mesh, rules):
            return jitted_init.lower().compile(compiler_options=run_once_compile_options(mesh.devices.flat[0].platform))()

    jitted_from = jax.jit(state_of, in_shardings=(state_shardings["params"],), out_shardings=state_shardings,
                          donate_argnums=0)

    def init_state_from(pure: dict[str, Any]) -> State:
        params = nnx.state(family.abstract(model_cfg, vocab_size), nnx.Param)
        nnx.replace_by_pure_dict(params, pure)
        params = jax.tree.map(lambda value, shape, sharding: jax.device_put(jnp.asarray(value, shape.dtype), sharding),
                              params, shapes["params"], state_shardings["params"])
        with jax.set_mesh(mesh), activation_layout(mesh, rules):
            return jitted_from(params)

    def run_step(state: State, batch: Batch) -> tuple[State, dict[str, jax.Array]]:
        # the layout context matters only while tracing (the first call); cheap afterwards
        with jax.set_mesh(mesh), activation_layout(mesh, rules):
            return jitted_step(state, batch)

    run_step.jitted = jitted_step  # type: ignore[attr-defined]  # for AOT lowering and cache checks

    def checkpoint_layout(scanned: bool) -> tuple[State, Callable[[State], State]]:
        if scanned == bool(getattr(model_cfg, "scan_layers", False)):
            return abstract_state, lambda state: state
        other_cfg = dataclasses.replace(model_cfg, scan_layers=scanned)
        other = jax.eval_shape(lambda: state_of(initial_params(other_cfg, vocab_size, seed, param_dtype)))
        other_abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                      other, tree_shardings(other, mesh, rules))
        # stacked on the devices, each array laid out as this program's step expects
        convert = ((lambda state: unstack_tree(state, shapes)) if scanned
                   else (lambda state: stack_tree(state, shapes)))
        return other_abstract, jax.jit(convert, out_shardings=state_shardings, donate_argnums=0)

    return TrainProgram(graphdef, mesh, rules, abstract_state, state_shardings, data_sharding, schedule,
                        init_state, init_state_from, run_step, checkpoint_layout)


def check_batch(train_cfg: TrainConfig, data_sharding: NamedSharding) -> None:
    spec = data_sharding.spec[0] if data_sharding.spec else None
    axes = () if spec is None else (spec,) if isinstance(spec, str) else spec
    parts = 1
    for axis in axes:
        parts *= data_sharding.mesh.shape[axis]
    micro = train_cfg.batch_size // train_cfg.grad_accum_steps
    if micro % parts:
        raise ConfigError(
            f"config key 'train.batch_size': the micro-batch of {micro} sequences (batch_size / grad_accum_steps) "
            f"cannot be split over the {parts} data-parallel devices ({'x'.join(axes)})"
        )


def global_batch(local: dict[str, Any], sharding: NamedSharding) -> Batch:
    """Assemble the global batch from this process's rows (one process: just a device_put)."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
