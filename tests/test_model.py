"""The decoder: parameter count against the formula, attention masking, presets, config errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.errors import ConfigError
from experiment.presets import preset_model_config
from model.layers import rope_angles
from model.linear import linear
from model.llama.config import LlamaConfig
from model.llama.family import LLAMA
from model.llama.flops import forward_flops_per_token, param_count, train_flops_per_token
from model.llama.model import Decoder
from model.loss import cross_entropy

VOCAB = 97
TINY = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32)


_BUILT: dict[str, Decoder] = {}


def build(cfg: LlamaConfig = TINY) -> Decoder:
    """One initialised model per config for the whole module (compiling the init is the slow part)."""
    if repr(cfg) not in _BUILT:
        _BUILT[repr(cfg)] = LLAMA.init(cfg, VOCAB, seed=0)
    return _BUILT[repr(cfg)]


@nnx.jit
def forward(model: Decoder, tokens: jax.Array, segment_ids: jax.Array | None = None,
            positions: jax.Array | None = None) -> jax.Array:
    return model(tokens, segment_ids=segment_ids, positions=positions)


@pytest.mark.parametrize("tie", [True, False])
def test_param_count_matches_formula(tie: bool) -> None:
    cfg = dataclasses.replace(TINY, tie_embeddings=tie, head_dim=12)
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: Decoder(cfg, VOCAB, nnx.Rngs(0)))
    d, f, hd = cfg.d_model, cfg.d_ff, 12
    by_hand = (VOCAB * d * (1 if tie else 2) + (2 * cfg.n_layers + 1) * d
               + cfg.n_layers * (d * 4 * hd + 2 * d * 2 * hd + 4 * hd * d + 3 * d * f))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == param_count(cfg, VOCAB) == by_hand


def test_preset_70b_has_llama2_70b_size() -> None:
    cfg = preset_model_config("70b")
    assert cfg.n_layers == 80 and cfg.d_model == 8192
    assert 68.5e9 < param_count(cfg, 32_000) < 69.5e9  # Llama-2-70B: 68.98B with a 32k vocabulary


def test_logits_shape_dtype_and_train_flops() -> None:
    logits = forward(build(), jnp.zeros((2, 8), jnp.int32))
    assert logits.shape == (2, 8, VOCAB) and logits.dtype == jnp.float32
    assert train_flops_per_token(TINY, VOCAB, 8) == 3 * forward_flops_per_token(TINY, VOCAB, 8)
    assert forward_flops_per_token(TINY, VOCAB, 8) > 2 * (param_count(TINY, VOCAB) - VOCAB * TINY.d_model)


def test_attention_is_causal() -> None:
    model = build()
    tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, VOCAB)
    changed = tokens.at[0, 7].set((tokens[0, 7] + 1) % VOCAB)
    a, b = forward(model, tokens), forward(model, changed)
    np.testing.assert_array_equal(a[0, :7], b[0, :7])
    assert not np.allclose(a[0, 7:], b[0, 7:])


@pytest.mark.parametrize("impl", ["dot_product", "einsum"])
def test_packed_documents_do_not_see_each_other(impl: str) -> None:
    """Two documents packed in one row with segment ids and reset positions give each one's own logits."""
    model = build(dataclasses.replace(TINY, attention=impl))
    doc_a = jax.random.randint(jax.random.key(2), (1, 5), 0, VOCAB)
    doc_b = jax.random.randint(jax.random.key(3), (1, 7), 0, VOCAB)
    packed = jnp.concatenate([doc_a, doc_b], axis=1)
    segments = jnp.array([[1] * 5 + [2] * 7])
    positions = jnp.array([list(range(5)) + list(range(7))])
    logits = forward(model, packed, segments, positions)
    np.testing.assert_allclose(logits[:, :5], forward(model, doc_a), atol=1e-5)
    np.testing.assert_allclose(logits[:, 5:], forward(model, doc_b), atol=1e-5)


def test_attention_implementations_agree() -> None:
    tokens = jax.random.randint(jax.random.key(4), (2, 16), 0, VOCAB)
    segments = jnp.array([[1] * 6 + [2] * 10, [1] * 16])
    einsum_model = build(dataclasses.replace(TINY, attention="einsum"))
    xla_model = build(dataclasses.replace(TINY, attention="dot_product"))
    for segment_ids in (segments, None):  # packed documents (a mask), or plain causal
        ref = forward(einsum_model, tokens, segment_ids)
        np.testing.assert_allclose(ref, forward(xla_model, tokens, segment_ids), atol=2e-5)


def test_remat_gives_same_gradients() -> None:
    tokens = jax.random.randint(jax.random.key(5), (2, 8), 0, VOCAB)

    def grads(cfg: LlamaConfig) -> list[jax.Array]:
        graphdef, params = nnx.split(build(cfg), nnx.Param)

        def loss(p: nnx.State) -> jax.Array:
            return cross_entropy(nnx.merge(graphdef, p)(tokens[:, :-1]), tokens[:, 1:])[0]

        return jax.tree.leaves(jax.jit(jax.grad(loss))(params))

    for a, b in zip(grads(TINY), grads(dataclasses.replace(TINY, remat="save_dots")), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(("features_in", "features_out"), [(6, 10), (10, 6)])  # both weight-gradient dots
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_linear_gradients_equal_autodiff(features_in: int, features_out: int, dtype: jnp.dtype) -> None:
    """The hand-written backward of every projection gives autodiff's gradients (leading dims summed)."""
    kx, kw, kd = jax.random.split(jax.random.key(6), 3)
    x = jax.random.normal(kx, (2, 3, features_in), dtype)
    w = jax.random.normal(kw, (features_in, features_out), dtype)
    probe = jax.random.normal(kd, (2, 3, features_out), dtype)  # a weighted sum so every output matters

    def loss(fn: object) -> tuple[jax.Array, jax.Array]:
        return jax.grad(lambda a, b: jnp.sum((fn(a, b) * probe).astype(jnp.float32)), argnums=(0, 1))(x, w)

    ours, reference = loss(linear), loss(lambda a, b: a @ b)
    np.testing.assert_allclose(linear(x, w).astype(jnp.float32), (x @ w).astype(jnp.float32), rtol=1e-6)
    for got, want in zip(ours, reference, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32),
                                   rtol=1e-5 if dtype == jnp.float32 else 2e-2, atol=1e-5)


def test_rope_table_lookup_equals_the_formula() -> None:
    """The trace-time sin/cos table gives the angles pos * theta^(-2i/d) for packed, restarting positions."""
    positions = jnp.array([[0, 1, 2, 0, 1, 5], [5, 4, 3, 2, 1, 0]])
    sin, cos = rope_angles(positions, head_dim=8, theta=10_000.0)
    angles = np.asarray(positions, np.float64)[..., None] * 10_000.0 ** (-np.arange(4) / 4)
    assert sin.shape == cos.shape == (2, 6, 1, 4)
    np.testing.assert_allclose(sin[:, :, 0], np.sin(angles), atol=1e-6)
    np.testing.assert_allclose(cos[:, :, 0], np.cos(angles), atol=1e-6)


def test_cross_entropy_and_z_loss_by_hand() -> None:
    logits = jnp.array([[[0.0, 1.0, 2.0]]])
    nll, z = cross_entropy(logits, jnp.array([[2]]))
    log_z = np.log(np.exp([0.0, 1.0, 2.0]).sum())
    assert float(nll) == pytest.approx(log_z - 2.0, rel=1e-6)
    assert float(z) == pytest.approx(log_z**2, rel=1e-6)


@pytest.mark.parametrize(("fields", "key"), [
    ({"n_heads": 4, "n_kv_heads": 3}, "model.n_kv_heads"),
    ({"d_model": 30, "n_heads": 4}, "model.head_dim"),
    ({"head_dim": 7}, "model.head_dim"),
    ({"n_layers": 0}, "model.n_layers"),
])
def test_bad_model_config_names_the_key(fields: dict, key: str) -> None:
    from experiment.config import build_dataclass

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_dataclass(LlamaConfig, fields, "model")
