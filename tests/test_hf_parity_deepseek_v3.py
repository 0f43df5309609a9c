"""DeepSeek-V3 (GigaChat 3's architecture) against Transformers' ``DeepseekV3ForCausalLM`` (the `hf` extra).

A tiny random model made by Transformers from a ``DeepseekV3Config`` (fp32, weights N(0, 0.2), norm weights and the
routers' selection biases moved off their init) is saved with ``save_pretrained`` and imported with
model/hf_checkpoint.py in either layer layout: 3 layers (one dense first), latent attention with a query
bottleneck and interleaved RoPE (as a second case without either, as a third with YaRN over 16 original positions
and its softmax mscale), 4 routed experts in 2 groups (top 2 from the best group) and a shared expert, scaled
weights, and the multi-token prediction layer the published checkpoints carry (which Transformers does not build:
added to its files). Our logits equal Transformers' within 1e-4, 32-token greedy continuations (ours with the KV
cache) are identical, and exports load back in Transformers as the very tensors (theirs -> ours -> theirs, the
prediction layer's bit for bit in the files) and with our logits (ours -> theirs).
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
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=12, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
             routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=64, initializer_range=0.2,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1_000.0}, eos_token_id=None,
             tie_word_embeddings=False)
CASES = {
    # DeepSeek-V3's and GigaChat 3's layout: a query bottleneck, interleaved RoPE pairs, group-limited routing
    "lora_groups": dict(q_lora_rank=32, rope_interleave=True, n_group=2, topk_group=1),
    # DeepSeek-V2-Lite's query projection, RoPE over halves, plain top-k
    "plain": dict(q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1),
    # DeepSeek-V3's context extension: YaRN over the rope part, mscale in the softmax scale
    "yarn": dict(q_lora_rank=32, rope_interleave=True, n_group=2, topk_group=1,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 1_000.0, "factor": 4.0, "beta_fast": 32,
                                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "original_max_position_embeddings": 16}),
}


def hf_model(case: str, seed: int = 0) -> Any:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(**{**SHAPE, **CASES[case]})
    model = transformers.DeepseekV3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:  # norm weights start at one: move them so that a missing norm cannot hide
                p.add_(0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init: a bias that is not read would hide
                b.add_(0.1 * torch.randn_like(b))
    return model


def add_prediction_layer(folder: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """The published checkpoints' multi-token prediction layer, which Transformers neither builds nor saves, added
    to a saved model as DeepSeek-V3's files hold it: ``model.layers.<num_hidden_layers>``'s ``enorm``, ``hnorm``,
    ``eh_proj``, a MoE decoder layer, ``shared_head.norm`` (random, norms off one) and copies of the embedding and
    head; config.json's ``num_nextn_predict_layers`` 1. Returns every tensor of the folder."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    tensors = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    n, d = config["num_hidden_layers"], config["hidden_size"]
    moe_layer = f"model.layers.{n - 1}."  # the last layer is a MoE one: the module's layer has its tensors' shapes
    mtp = {f"model.layers.{n}.{name[len(moe_layer):]}": (0.2 * rng.standard_normal(t.shape)).astype(np.float32)
           + (1.0 if t.ndim == 1 and "bias" not in name else 0.0)
           for name, t in tensors.items() if name.startswith(moe_layer)}
    mtp.update({f"model.layers.{n}.enorm.weight": 1 + 0.2 * rng.standard_normal(d).astype(np.float32),
                f"model.layers.{n}.hnorm.weight": 1 + 0.2 * rng.standard_normal(d).astype(np.float32),
                f"model.layers.{n}.shared_head.norm.weight": 1 + 0.2 * rng.standard_normal(d).astype(np.float32),
                f"model.layers.{n}.eh_proj.weight": 0.2 * rng.standard_normal((d, 2 * d)).astype(np.float32),
                f"model.layers.{n}.embed_tokens.weight": tensors["model.embed_tokens.weight"].copy(),
                f"model.layers.{n}.shared_head.head.weight": tensors["lm_head.weight"].copy()})
    tensors.update({name: np.ascontiguousarray(t, np.float32) for name, t in mtp.items()})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}, indent=2))
    return tensors


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(f"deepseek-v3-{request.param}")
    model.save_pretrained(str(folder))
    add_prediction_layer(folder)
    return request.param, model, folder


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_and_greedy_tokens_match_transformers(saved: tuple[str, Any, Path], scan_layers: bool) -> None:
    import jax.numpy as jnp
    from flax import nnx

    from model.generate import generate
    from model.hf_checkpoint import load_hf_checkpoint

    case, theirs_model, folder = saved
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["architectures"] == ["DeepseekV3ForCausalLM"]
    imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
    cfg = imported.model_cfg
    assert imported.family == "deepseek_v3" and imported.vocab_size == VOCAB and cfg.scan_layers == scan_layers
    assert (cfg.first_k_dense, cfg.n_experts, cfg.n_shared_experts, cfg.routed_scaling_factor) == (1, 4, 1, 2.5)
    assert (cfg.q_lora_rank, cfg.rope_interleave, cfg.n_group) == (
        CASES[case]["q_lora_rank"] or 0, CASES[case]["rope_interleave"], CASES[case]["n_group"])
    assert (cfg.rope_scaling, cfg.rope_factor) == (("yarn", 4.0) if case == "yarn" else ("none", 1.0))
    ours_model = imported.model()

    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 16)).astype(np.int32)
    ours = np.asarray(nnx.jit(lambda m, t: m(t))(ours_model, jnp.asarray(tokens)), np.float32)
    theirs = their_logits(theirs_model, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"deepseek_v3 {case} scan_layers={scan_layers}: max |logit diff| {diff:.2e} (logit std {theirs.std():.2f})")
    assert theirs.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    prompt = tokens[:, :PROMPT]
    mine = np.asarray(generate(ours_model, prompt.tolist(), NEW).tokens)  # with the KV cache
    reference = their_greedy(theirs_model, prompt, NEW)
    print(f"deepseek_v3 {case} scan_layers={scan_layers}: greedy {NEW} tokens equal: "
          f"{bool((mine == reference).all())}")
    np.testing.assert_array_equal(mine, reference)


def test_export_reloads_in_transformers_both_ways(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """Theirs -> ours -> export -> Transformers: the very tensors (the selection biases included); ours (fresh,
    perturbed) -> export -> Transformers: our logits; -> import again: our parameters."""
    import_extra("torch", "hf")
    case, theirs, folder = saved
    imported, reloaded = export_reloads_both_ways("deepseek_v3", theirs, folder, tmp_path, VOCAB)
    assert (reloaded.config.n_group, reloaded.config.q_lora_rank) == (CASES[case]["n_group"],
                                                                      CASES[case]["q_lora_rank"])
    # the prediction layer Transformers does not load: in the export as it was in the checkpoint, bit for bit
    from safetensors.numpy import load_file

    source = load_file(str(folder / "model.safetensors"))
    exported = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert imported.model_cfg.mtp_layers == 1 and sorted(exported) == sorted(source)
    layer = f"model.layers.{SHAPE['num_hidden_layers']}."
    assert {f"{layer}{name}.weight" for name in ("enorm", "hnorm", "eh_proj", "embed_tokens", "shared_head.norm",
                                                 "shared_head.head", "mlp.experts.3.down_proj")} <= set(source)
    for name, tensor in source.items():
        np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
