"""Cached generation (model/generate.py) against Transformers' ``generate`` (the `hf` extra: torch and transformers).

For each family a tiny random Transformers model (fp32, weights N(0, 0.2), 1-D tensors 1 + N(0, 0.2) so
that biases and norm scales count; Gemma's norm weights N(0, 0.2): it scales by 1 + w) is saved with
``save_pretrained`` and imported with model/hf_checkpoint.py in either layer layout. Our greedy 32 new
tokens of a batch of three prompts of different lengths (left-padded into one batch, with a KV cache)
equal Transformers' ``generate(do_sample=False)`` run on each prompt alone. Gemma 3 has 8 layers (a
scanned group of 6 and a tail of 2) and a window of 4, shorter than every sequence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from tests.conftest import import_extra

VOCAB, NEW = 101, 32
LENGTHS = (5, 11, 8)
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6,
             eos_token_id=None)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_parameters={"rope_type": "default",
                                                                       "rope_theta": 10_000.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=8, head_dim=16, query_pre_attn_scalar=12, sliding_window=4,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1_000.0}})),
}


def hf_model(family: str, seed: int = 0) -> Any:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**SHAPE, **extra})
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((0 if family == "gemma3" else 1) + 0.2 * torch.randn_like(p))
    return model


def their_greedy(model: Any, prompt: list[int]) -> list[int]:
    torch = import_extra("torch", "hf")
    ids = torch.tensor([prompt], dtype=torch.int64)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(f"generate-{request.param}")
    model.save_pretrained(str(folder))
    return request.param, model, folder


@pytest.mark.parametrize("scan_layers", [True, False])
def test_cached_greedy_batch_equals_transformers_generate_per_prompt(saved: tuple[str, Any, Path],
                                                                     scan_layers: bool) -> None:
    from model.generate import generate
    from model.hf_checkpoint import load_hf_checkpoint

    family, theirs, folder = saved
    imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
    assert imported.family == family and imported.model_cfg.scan_layers == scan_layers
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in LENGTHS]
    ours = generate(imported.model(), prompts, NEW, max_len=imported.model_cfg.max_seq_len)
    for prompt, mine in zip(prompts, ours.tokens, strict=True):
        reference = their_greedy(theirs, prompt)
        assert len(mine) == NEW
        assert mine == reference, f"{family} scan_layers={scan_layers}: prompt of {len(prompt)} tokens"
    print(f"{family} scan_layers={scan_layers}: {len(prompts)} x {NEW} greedy tokens equal Transformers'; "
          f"decode {ours.decode_tokens_per_second:.0f} tokens/s")
