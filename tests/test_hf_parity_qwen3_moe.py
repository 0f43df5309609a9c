"""Qwen3-MoE against Transformers' ``Qwen3MoeForCausalLM`` (the `hf` extra: torch and transformers).

A tiny random model made by Transformers from a ``Qwen3MoeConfig`` (fp32, weights N(0, 0.2), norm weights moved
by N(0, 0.2) off their ones) is saved with ``save_pretrained`` (one tensor per expert, as the published checkpoints)
and imported with model/hf_checkpoint.py in either layer layout: 3 layers of 8 experts (top 2), head_dim !=
d_model / n_heads, fewer KV heads than query heads, with and without ``norm_topk_prob``, tied and untied. Our logits
equal Transformers' within 1e-4, 32-token greedy continuations (ours with the KV cache) are identical, our
load-balancing loss is ``router_aux_loss_coef`` times Transformers' ``aux_loss``, and exports load back in
Transformers as the very tensors (theirs -> ours -> theirs) and with our logits (ours -> theirs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from tests.conftest import import_extra
from tests.hf_parity import export_reloads_both_ways, their_greedy, their_logits

VOCAB, PROMPT, NEW = 101, 8, 32
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=2,
             max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6, router_aux_loss_coef=0.02,
             rope_parameters={"rope_type": "default", "rope_theta": 1_000.0}, eos_token_id=None)
CASES = {
    "normed": dict(norm_topk_prob=True, tie_word_embeddings=False),  # the published models' routing
    "raw_tied": dict(norm_topk_prob=False, tie_word_embeddings=True),  # Transformers' defaults for the routing
}


def hf_model(case: str, seed: int = 0) -> Any:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    torch.manual_seed(seed)
    config = transformers.Qwen3MoeConfig(**SHAPE, **CASES[case])
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:  # norm weights start at one: move them so that a missing norm cannot hide
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(f"qwen3-moe-{request.param}")
    model.save_pretrained(str(folder))
    return request.param, model, folder


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_greedy_tokens_and_aux_loss_match_transformers(saved: tuple[str, Any, Path], scan_layers: bool) -> None:
    import jax.numpy as jnp
    from flax import nnx
    from safetensors import safe_open

    from model.generate import generate
    from model.hf_checkpoint import load_hf_checkpoint

    torch = import_extra("torch", "hf")
    case, theirs_model, folder = saved
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["architectures"] == ["Qwen3MoeForCausalLM"]
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:  # the per-expert layout
        assert "model.layers.2.mlp.experts.7.down_proj.weight" in set(f.keys())
    imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
    cfg = imported.model_cfg
    assert imported.family == "qwen3_moe" and imported.vocab_size == VOCAB and cfg.scan_layers == scan_layers
    assert (cfg.n_experts, cfg.top_k, cfg.d_expert, cfg.head_dim, cfg.router_aux_loss_coef) == (8, 2, 32, 24, 0.02)
    assert cfg.norm_topk_prob == CASES[case]["norm_topk_prob"] and cfg.tie_embeddings == CASES[case][
        "tie_word_embeddings"]
    ours_model = imported.model()

    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 16)).astype(np.int32)
    ours = np.asarray(nnx.jit(lambda m, t: m(t))(ours_model, jnp.asarray(tokens)), np.float32)
    theirs = their_logits(theirs_model, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"qwen3_moe {case} scan_layers={scan_layers}: max |logit diff| {diff:.2e} (logit std {theirs.std():.2f})")
    assert theirs.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    # the load-balancing loss: Transformers' aux_loss (router logits of every layer pooled) times the coefficient
    _, aux = nnx.jit(lambda m, t: m.hidden_with_aux(t))(ours_model, jnp.asarray(tokens))
    with torch.no_grad():
        out = theirs_model(torch.from_numpy(tokens.astype(np.int64)), output_router_logits=True)
    want = 0.02 * float(out.aux_loss)
    print(f"qwen3_moe {case}: load_balance {float(aux['load_balance']):.6f}, Transformers' {want:.6f}")
    np.testing.assert_allclose(float(aux["load_balance"]), want, rtol=1e-5)

    prompt = tokens[:, :PROMPT]
    mine = np.asarray(generate(ours_model, prompt.tolist(), NEW).tokens)  # with the KV cache
    reference = their_greedy(theirs_model, prompt, NEW)
    print(f"qwen3_moe {case} scan_layers={scan_layers}: greedy {NEW} tokens equal: {bool((mine == reference).all())}")
    np.testing.assert_array_equal(mine, reference)


def test_export_reloads_in_transformers_both_ways(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """Theirs -> ours -> export -> Transformers: the very tensors; ours (fresh, perturbed) -> export ->
    Transformers: our logits; -> import again: our parameters."""
    import_extra("torch", "hf")
    _, theirs, folder = saved
    _, reloaded = export_reloads_both_ways("qwen3_moe", theirs, folder, tmp_path, VOCAB)
    assert reloaded.config.rope_parameters["rope_theta"] == theirs.config.rope_parameters["rope_theta"]
    assert (reloaded.config.num_experts, reloaded.config.norm_topk_prob) == (8, theirs.config.norm_topk_prob)
