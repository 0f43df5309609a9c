"""RoPE scaling for a longer context against Transformers (the `hf` extra: torch and transformers): tiny random
Llama and Qwen3 models made by Transformers with ``rope_parameters`` of type yarn, linear and llama3, pretrained
context (``original_max_position_embeddings``) 32, are saved with ``save_pretrained`` and imported with
model/hf_checkpoint.py; our logits over 96 positions (three times the original context) equal Transformers' within
1e-4, and the export writes the same RoPE settings back (config.json and Transformers' reload of it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from tests.conftest import import_extra
from tests.hf_parity import export_reloads_both_ways, their_logits

VOCAB, ORIGINAL, LENGTH = 97, 32, 96
# a small base, so that the 8 frequencies of a 16-wide head span wavelengths of 6 to 350 positions: each scaling's
# kept, scaled and ramped bands all hold some dimension at an original context of 32
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=LENGTH, initializer_range=0.2,
             rms_norm_eps=1e-6, tie_word_embeddings=False)
ROPES = {
    "yarn": {"rope_type": "yarn", "rope_theta": 100.0, "factor": 3.0, "original_max_position_embeddings": ORIGINAL},
    # YaRN with every setting given: another ramp, no rounding of its ends, DeepSeek's mscale pair
    "yarn-set": {"rope_type": "yarn", "rope_theta": 100.0, "factor": 3.0, "original_max_position_embeddings": ORIGINAL,
                 "beta_fast": 8.0, "beta_slow": 2.0, "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5},
    "linear": {"rope_type": "linear", "rope_theta": 100.0, "factor": 3.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 100.0, "factor": 3.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
}
FAMILIES = {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}
CASES = [(family, rope) for family in FAMILIES for rope in ROPES]


def hf_model(family: str, rope: str) -> Any:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    torch.manual_seed(0)
    config = getattr(transformers, FAMILIES[family])(**SHAPE, rope_parameters=dict(ROPES[rope]))
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:  # norm weights moved off 1, so a misplaced norm shows
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{r}" for f, r in CASES])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Any, Path]:
    family, rope = request.param
    model = hf_model(family, rope)
    folder = tmp_path_factory.mktemp(f"{family}-{rope}")
    model.save_pretrained(str(folder))
    return family, rope, model, folder


def test_logits_beyond_the_original_context_match_transformers(saved: tuple[str, str, Any, Path]) -> None:
    import jax.numpy as jnp

    from model.hf_checkpoint import load_hf_checkpoint

    family, rope, theirs_model, folder = saved
    imported = load_hf_checkpoint(folder, scan_layers=False)
    cfg = imported.model_cfg
    assert imported.family == family and cfg.rope_scaling == ROPES[rope]["rope_type"] and cfg.rope_theta == 100.0
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, LENGTH)).astype(np.int32)
    ours = np.asarray(imported.model()(jnp.asarray(tokens)), np.float32)
    theirs = their_logits(theirs_model, tokens)
    beyond = np.abs(ours - theirs)[:, ORIGINAL:]
    print(f"{family} {rope}: max |logit diff| at positions {ORIGINAL}-{LENGTH - 1} {float(beyond.max()):.2e} "
          f"(logit std {theirs.std():.2f})")
    assert theirs.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_the_scaling_changes_the_logits_beyond_the_original_context(saved: tuple[str, str, Any, Path]) -> None:
    """The parity above is not parity of unscaled RoPE: the same weights without the scaling give other logits."""
    import dataclasses

    import jax.numpy as jnp

    from model.hf_checkpoint import load_hf_checkpoint

    _, _, theirs_model, folder = saved
    imported = load_hf_checkpoint(folder, scan_layers=False)
    plain = dataclasses.replace(imported.model_cfg, rope_scaling="none")
    model = imported.model()
    from flax import nnx

    from model.registry import get_family
    unscaled = get_family(imported.family).init(plain, VOCAB, seed=0)
    nnx.update(unscaled, nnx.state(model, nnx.Param))
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, LENGTH)).astype(np.int32)
    theirs = their_logits(theirs_model, tokens)
    off = np.abs(np.asarray(unscaled(jnp.asarray(tokens)), np.float32) - theirs)[:, ORIGINAL:].max()
    assert off > 1e-2


def test_export_writes_the_same_rope_settings_back(saved: tuple[str, str, Any, Path], tmp_path: Path) -> None:
    family, rope, theirs, folder = saved
    imported, reloaded = export_reloads_both_ways(family, theirs, folder, tmp_path, VOCAB)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    saved_config = json.loads((folder / "config.json").read_text())
    assert written["rope_parameters"] == saved_config["rope_parameters"]
    assert reloaded.config.rope_parameters == theirs.config.rope_parameters
