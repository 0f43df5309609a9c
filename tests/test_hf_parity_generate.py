"""Cached generation (model/generate.py) against Transformers' ``generate`` (the `hf` extra: torch and transformers).

For each registered family with a Hugging Face adapter, a tiny random Transformers model of the family's tiny shape
(``ModelFamily.tiny``; tests/tiny_models.py's ``transformers_model``: fp32, weights N(0, 0.2), every 1-D tensor
moved by N(0, 0.2) so that biases and norm scales count) is saved with ``save_pretrained`` and imported with
model/hf_checkpoint.py in either layer layout. Our greedy 32 new tokens of a batch of three prompts of different
lengths (left-padded into one batch, with a KV cache) equal Transformers' ``generate(do_sample=False)`` run on
each prompt alone. Gemma 3's tiny shape has 5 layers (a scanned group of 3 and a tail of 2) and a window of 5,
shorter than every sequence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from tests.conftest import import_extra
from tests.tiny_models import hf_families, transformers_model

VOCAB, NEW = 101, 32
LENGTHS = (5, 11, 8)


def their_greedy(model: Any, prompt: list[int]) -> list[int]:
    torch = import_extra("torch", "hf")
    ids = torch.tensor([prompt], dtype=torch.int64)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=hf_families())
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    model = transformers_model(request.param, VOCAB)
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
