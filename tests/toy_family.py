"""A toy model family, defined outside the package: what adding an architecture takes (one module).

A pre-norm decoder without grouped-query attention: learned absolute positions instead of RoPE,
plain multi-head attention from one fused QKV projection, a GELU MLP, tied embeddings. It has its
own config section, FLOP and parameter counts, logical axes (a "qkv" of its own) with its default
rules (``embed`` replicated, where Llama's is split over fsdp), config checks, scanned layers through
model/stacking.py (or a loop, ``scan_layers: false``), and no Hugging Face adapter. Recipes in
subprocesses see it through ``RU_PRETRAIN_PLUGINS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from experiment.errors import ConfigError
from experiment.sections.model import ModelSection
from model.family import ModelFamily, register_family
from model.loss import output_logits
from model.stacking import scan_layers, stacked

NAME = "toy_mha"


@dataclass
class ToyConfig(ModelSection):  # every family's section subclasses it (register_model_section)
    family: str = NAME
    preset: str = ""  # the toy has no named sizes
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 64
    max_seq_len: int = 64
    z_loss: float = 0.0
    init_std: float = 0.02
    attention: Literal["einsum"] = "einsum"
    remat: Literal["none"] = "none"
    scan_layers: bool = True  # its blocks stacked and scanned by model/stacking.py, like the shipped families

    def validate(self, key: str) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"config key '{key}.n_heads': {self.n_heads} does not divide d_model={self.d_model}")
        if self.preset:
            raise ConfigError(f"config key '{key}.preset': the {NAME} family has no presets")


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], std: float) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32), out_sharding=axes)


def _norm(x: jax.Array, scale: nnx.Param) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * scale[...]).astype(x.dtype)


class ToyBlock(nnx.Module):
    def __init__(self, cfg: ToyConfig, rngs: nnx.Rngs):
        d, f = cfg.d_model, cfg.d_ff
        self.n_heads = cfg.n_heads
        self.norm1 = nnx.Param(jnp.ones((d,)), out_sharding=("norm",))
        self.qkv = _param(rngs, (d, 3, d), ("embed", "qkv", "mlp"), cfg.init_std)
        self.out = _param(rngs, (d, d), ("mlp", "embed"), cfg.init_std)
        self.norm2 = nnx.Param(jnp.ones((d,)), out_sharding=("norm",))
        self.up = _param(rngs, (d, f), ("embed", "mlp"), cfg.init_std)
        self.down = _param(rngs, (f, d), ("mlp", "embed"), cfg.init_std)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = jnp.einsum("btd,dse->sbte", _norm(x, self.norm1), self.qkv[...].astype(x.dtype))
        heads = lambda a: a.reshape(b, t, self.n_heads, d // self.n_heads)  # noqa: E731
        scores = jnp.einsum("bqhk,bshk->bhqs", heads(q), heads(k)).astype(jnp.float32) / (d // self.n_heads) ** 0.5
        weights = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e30), axis=-1).astype(x.dtype)
        x = x + jnp.einsum("bhqs,bshk->bqhk", weights, heads(v)).reshape(b, t, d) @ self.out[...].astype(x.dtype)
        return x + jax.nn.gelu(_norm(x, self.norm2) @ self.up[...].astype(x.dtype)) @ self.down[...].astype(x.dtype)


class ToyDecoder(nnx.Module):
    def __init__(self, cfg: ToyConfig, vocab_size: int, rngs: nnx.Rngs):
        self.embed = _param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        self.pos = _param(rngs, (cfg.max_seq_len, cfg.d_model), ("norm", "embed"), cfg.init_std)
        self.scanned = cfg.scan_layers
        self.blocks = (stacked(lambda layer_rngs: ToyBlock(cfg, layer_rngs), cfg.n_layers, rngs) if cfg.scan_layers
                       else nnx.List([ToyBlock(cfg, rngs) for _ in range(cfg.n_layers)]))
        self.final_norm = nnx.Param(jnp.ones((cfg.d_model,)), out_sharding=("norm",))

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        mask = jnp.tril(jnp.ones((t, t), bool))[None]
        if segment_ids is not None:
            mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
        x = jnp.take(self.embed[...], tokens, axis=0) + jnp.take(self.pos[...], positions, axis=0)
        if self.scanned:
            x = scan_layers(self.blocks, x, lambda block, h: block(h, mask))
        else:
            for block in self.blocks:
                x = block(x, mask)
        return _norm(x, self.final_norm)

    def output_weight(self) -> jax.Array:
        return self.embed[...].T

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        return output_logits(self.hidden(tokens, segment_ids, positions), self.output_weight())


def param_count(cfg: ToyConfig, vocab_size: int) -> int:
    d = cfg.d_model
    per_layer = 3 * d * d + d * d + 2 * d * cfg.d_ff + 2 * d
    return vocab_size * d + cfg.max_seq_len * d + cfg.n_layers * per_layer + d


def train_flops(cfg: ToyConfig, vocab_size: int, seq_len: int) -> float:
    d = cfg.d_model
    matmuls = cfg.n_layers * (4 * d * d + 2 * d * cfg.d_ff) + d * vocab_size
    attention = 2 * seq_len * d * cfg.n_layers  # QK^T and PV, full T x T
    return 3.0 * 2 * (matmuls + attention)


# every logical name its parameters and the shared code (loss, batch layout) use, with its own defaults:
# unlike Llama's, its embedding dimension is not split over fsdp (a family's rule, which a YAML may override)
AXIS_RULES = {"batch": ["data", "fsdp"], "length": [], "vocab": ["tensor"], "embed": [], "qkv": [],
              "mlp": ["tensor"], "norm": [], "layers": []}


TOY = register_family(ModelFamily(
    name=NAME, config_cls=ToyConfig, build=ToyDecoder, flops=train_flops, param_count=param_count,
    head_dim=lambda cfg: cfg.d_model // cfg.n_heads, axis_rules=AXIS_RULES,
    validate=lambda cfg: cfg.validate("model"), describe=lambda cfg: f"{cfg.n_layers} layers, {cfg.n_heads} heads",
))
