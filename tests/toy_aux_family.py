"""Toy families with what a mixture of experts brings to the family contract, defined outside the package.

- ``toy_mha_aux``: tests/toy_family.py's decoder with one auxiliary loss (``ModelFamily.aux_losses``):
  ``activation_l2`` = ``model.activation_l2`` x mean(hidden^2), from ``hidden_with_aux``. The train step adds
  it to the loss and logs it as ``train/aux/activation_l2``.
- ``toy_expert``: the same decoder with a dense "experts" MLP after its blocks, whose parameters [E, D, F] and
  [E, F, D] carry a logical axis "expert" that its rules lay out on a mesh axis of its own, "expert"
  (``train.mesh.axes.expert``); its batch is split over data x fsdp x expert, as in expert parallelism.

Recipes in subprocesses see them through ``RU_PRETRAIN_PLUGINS=tests.toy_aux_family``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from model.family import register_family
from tests.toy_family import AXIS_RULES, TOY, ToyConfig, ToyDecoder, _param

AUX_NAME = "toy_mha_aux"
EXPERT_NAME = "toy_expert"
AUX_LOSS = "activation_l2"


@dataclass
class ToyAuxConfig(ToyConfig):
    family: str = AUX_NAME
    activation_l2: float = 0.01  # the weight of mean(hidden^2) in the train loss


class ToyAuxDecoder(ToyDecoder):
    def __init__(self, cfg: ToyAuxConfig, vocab_size: int, rngs: nnx.Rngs):
        super().__init__(cfg, vocab_size, rngs)
        self.activation_l2 = cfg.activation_l2

    def hidden_with_aux(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``hidden``, and its auxiliary loss weighted by the config (the train step adds it to the loss)."""
        hidden = self.hidden(tokens, segment_ids, positions)
        return hidden, {AUX_LOSS: self.activation_l2 * jnp.mean(jnp.square(hidden.astype(jnp.float32)))}


TOY_AUX = register_family(dataclasses.replace(TOY, name=AUX_NAME, config_cls=ToyAuxConfig, build=ToyAuxDecoder,
                                              aux_losses=(AUX_LOSS,)))


@dataclass
class ToyExpertConfig(ToyConfig):
    family: str = EXPERT_NAME
    n_experts: int = 4


class ToyExpertDecoder(ToyDecoder):
    """The toy decoder, then x + mean over experts of gelu(x W_up[e]) W_down[e]: every expert sees every token
    (no router), so the layer is exact on any mesh; its weights are what expert parallelism splits."""

    def __init__(self, cfg: ToyExpertConfig, vocab_size: int, rngs: nnx.Rngs):
        super().__init__(cfg, vocab_size, rngs)
        e, d, f = cfg.n_experts, cfg.d_model, cfg.d_ff
        self.expert_up = _param(rngs, (e, d, f), ("expert", "embed", "mlp"), cfg.init_std)
        self.expert_down = _param(rngs, (e, f, d), ("expert", "mlp", "embed"), cfg.init_std)

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        x = super().hidden(tokens, segment_ids, positions)
        up = jax.nn.gelu(jnp.einsum("btd,edf->btef", x, self.expert_up[...].astype(x.dtype)))
        out = jnp.einsum("btef,efd->btd", up, self.expert_down[...].astype(x.dtype))
        return x + out / self.expert_up.shape[0]


def expert_param_count(cfg: ToyExpertConfig, vocab_size: int) -> int:
    return TOY.param_count(cfg, vocab_size) + 2 * cfg.n_experts * cfg.d_model * cfg.d_ff


# the toy's rules, plus the expert axis: its own mesh axis, which also splits the batch (expert parallelism)
EXPERT_AXIS_RULES = {**AXIS_RULES, "batch": ["data", "fsdp", "expert"], "expert": ["expert"]}

TOY_EXPERT = register_family(dataclasses.replace(
    TOY, name=EXPERT_NAME, config_cls=ToyExpertConfig, build=ToyExpertDecoder, param_count=expert_param_count,
    axis_rules=EXPERT_AXIS_RULES))
