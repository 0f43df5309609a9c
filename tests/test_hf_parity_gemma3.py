"""Gemma 3 (text) against Transformers' ``Gemma3ForCausalLM`` (the `hf` extra: torch and transformers).

A tiny random model made by Transformers from a ``Gemma3TextConfig`` (fp32, weights N(0, 0.2), norm weights
N(0, 0.2) too: Gemma scales by 1 + w, so zeros would hide a missing norm) is saved with ``save_pretrained``
and imported with model/hf_checkpoint.py in either layer layout: 8 layers of the 5 local : 1 global pattern
(two local tail layers after the scanned group), a window of 4 under sequences of 16 and 28 tokens so
local and global layers differ, head_dim != d_model / n_heads, query_pre_attn_scalar != head_dim, fewer KV
heads than query heads, and in one case linear RoPE scaling on the global layers. Our logits equal
Transformers' within 1e-4 and 20-token greedy continuations are identical; exports of ours load in
Transformers with the same logits and tensors; unsupported config.json features are one error line.
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

VOCAB, PROMPT, NEW = 101, 8, 20
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20, sliding_window=4,
             max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6, eos_token_id=None)
CASES = {
    # small RoPE bases so that the angles differ visibly across 28 positions for both layer kinds
    "default": dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                     "full_attention": {"rope_type": "default", "rope_theta": 1_000.0}}),
    "linear": dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000.0}}),
}


def hf_model(case: str, seed: int = 0) -> Any:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(**SHAPE, **CASES[case])
    model = transformers.Gemma3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:  # norm weights: Gemma scales by 1 + w
                p.copy_(0.2 * torch.randn_like(p))
    return model


def our_greedy(model: Any, prompt: np.ndarray) -> np.ndarray:
    """Greedy continuation, the whole sequence recomputed each step (there is no KV cache): one compiled
    shape, the prompt plus NEW slots, which causal attention never reads before they are filled."""
    import jax.numpy as jnp
    from flax import nnx

    tokens = np.zeros((prompt.shape[0], PROMPT + NEW), np.int32)
    tokens[:, :PROMPT] = prompt
    forward = nnx.jit(lambda m, t: jnp.argmax(m(t), axis=-1))
    for i in range(PROMPT, PROMPT + NEW):
        tokens[:, i] = np.asarray(forward(model, jnp.asarray(tokens)))[:, i - 1]
    return tokens[:, PROMPT:]


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(f"gemma3-{request.param}")
    model.save_pretrained(str(folder))
    return request.param, model, folder


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_and_greedy_continuation_match_transformers(saved: tuple[str, Any, Path], scan_layers: bool) -> None:
    import jax.numpy as jnp

    from model.hf_checkpoint import load_hf_checkpoint

    case, theirs_model, folder = saved
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
    cfg = imported.model_cfg
    assert imported.family == "gemma3" and imported.vocab_size == VOCAB and cfg.scan_layers == scan_layers
    assert (cfg.layer_types(), cfg.global_every, cfg.sliding_window, cfg.attn_scale) == ("LLLLLGLL", 6, 4, 20 ** -0.5)
    assert cfg.rope_scaling == ("linear" if case == "linear" else "none")
    ours_model = imported.model()

    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 16)).astype(np.int32)
    ours = np.asarray(ours_model(jnp.asarray(tokens)), np.float32)
    theirs = their_logits(theirs_model, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"gemma3 {case} scan_layers={scan_layers}: max |logit diff| {diff:.2e} (logit std {theirs.std():.2f})")
    assert theirs.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    prompt = tokens[:, :PROMPT]
    mine, reference = our_greedy(ours_model, prompt), their_greedy(theirs_model, prompt, NEW)
    print(f"gemma3 {case} scan_layers={scan_layers}: greedy 20 tokens equal: {bool((mine == reference).all())}")
    np.testing.assert_array_equal(mine, reference)


def test_export_reloads_in_transformers_both_ways(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """Theirs -> ours -> export -> Transformers: the very tensors; ours (fresh, perturbed) -> export ->
    Transformers: our logits; -> import again: our parameters."""
    import_extra("torch", "hf")
    _, theirs, folder = saved
    _, reloaded = export_reloads_both_ways("gemma3", theirs, folder, tmp_path, VOCAB)
    assert reloaded.config.layer_types == theirs.config.layer_types
    assert reloaded.config.rope_parameters == theirs.config.rope_parameters



def rewrite_config(source: Path, target: Path, **changes: Any) -> Path:
    """A copy of the folder ``source`` (its weights linked) whose config.json has ``changes``."""
    target.mkdir()
    for path in source.iterdir():
        if path.name != "config.json":
            (target / path.name).symlink_to(path)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **changes}))
    return target


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                          "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}},
     "rope_parameters.full_attention.rope_type 'yarn' is not supported "
     "(only default and linear for the global layers)"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "rope_parameters.sliding_attention.rope_type 'linear' is not supported (only default for the local layers)"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
    ({"hidden_activation": "silu"}, "hidden_activation='silu' is not supported"),
    ({"layer_types": ["sliding_attention"] * 7 + ["chunked_attention"]},
     "layer_types entry 'chunked_attention' is not supported"),
])
def test_unsupported_config_is_one_error_line(saved: tuple[str, Any, Path], tmp_path: Path, changes: dict,
                                              message: str) -> None:
    from experiment.errors import ConfigError
    from model.hf_checkpoint import load_hf_checkpoint

    folder = rewrite_config(saved[2], tmp_path / "bad", **changes)
    with pytest.raises(ConfigError) as caught:
        load_hf_checkpoint(folder)
    text = str(caught.value)
    assert text.startswith(f"{folder / 'config.json'}: Hugging Face gemma3_text config: ") and message in text, text
    assert "\n" not in text


def test_earlier_config_keys_read_alike(saved: tuple[str, Any, Path]) -> None:
    """A config.json from before Transformers 5: rope_theta, rope_local_base_freq, rope_scaling and
    sliding_window_pattern instead of rope_parameters and layer_types."""
    from model.hf_checkpoint import hf_model_config

    case, _, folder = saved
    config = json.loads((folder / "config.json").read_text())
    legacy = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types")}
    rope = config["rope_parameters"]
    legacy.update(rope_theta=rope["full_attention"]["rope_theta"], sliding_window_pattern=6,
                  rope_local_base_freq=rope["sliding_attention"]["rope_theta"])
    if case == "linear":
        legacy["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    assert hf_model_config(legacy)[1] == hf_model_config(config)[1]


def test_bad_tensors_are_one_line_naming_tensor_and_file(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    from experiment.errors import DataError
    from model.hf_checkpoint import load_hf_checkpoint

    source = saved[2]
    tensors = load_file(str(source / "model.safetensors"))
    name = "model.layers.7.post_feedforward_layernorm.weight"
    for label, edit, message in (
            ("missing", lambda t: t.pop(name), f"tensor '{name}' is missing (Hugging Face gemma3_text weights)"),
            ("shape", lambda t: t.update({name: np.zeros(3, np.float32)}),
             f"tensor '{name}' has shape (3,), the config implies (64,)"),
            ("unknown", lambda t: t.update({"model.layers.8.mlp.up_proj.weight": t[name]}),
             "tensor 'model.layers.8.mlp.up_proj.weight' has no place in the gemma3_text model")):
        folder = tmp_path / label
        folder.mkdir()
        (folder / "config.json").write_text((source / "config.json").read_text())
        bad = dict(tensors)
        edit(bad)
        save_file(bad, str(folder / "model.safetensors"))
        with pytest.raises(DataError) as caught:
            load_hf_checkpoint(folder)
        text = str(caught.value)
        assert text.startswith(str(folder / "model.safetensors")) and message in text and "\n" not in text, text
