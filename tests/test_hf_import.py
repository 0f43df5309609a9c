"""Importing Transformers' own models (the `hf` extra: torch and transformers), family by family.

For each registered family with a Hugging Face adapter (``ModelFamily.hf_adapter``), a tiny random model made by
Transformers from the config.json of the family's tiny shape (``ModelFamily.tiny``; tests/tiny_models.py: fp32,
init std 0.2, biases and norm scales randomised too) is saved with ``save_pretrained`` and imported with
model/hf_checkpoint.py: our logits equal Transformers' within 1e-4 and greedy continuations of 20 tokens are
identical; exporting it back gives a folder Transformers reloads with identical tensors; a sharded safetensors
index and a PyTorch state dict (``torch.save``, fp32 and bf16) import too. (Export then import without
Transformers, every family: tests/test_family_contract.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from model.registry import get_family
from tests.conftest import import_extra
from tests.tiny_models import hf_families, transformers_model

VOCAB = 101
PROMPT, NEW = 8, 20
FAMILIES = hf_families()


def hf_model(family: str, seed: int = 0):
    """A tiny random Transformers model of ``family`` (tests/tiny_models.py's ``transformers_model``)."""
    return transformers_model(family, VOCAB, seed)


def save(model, folder: Path, **kwargs) -> Path:
    model.save_pretrained(str(folder), **kwargs)
    return folder


def our_greedy(model, prompt: np.ndarray) -> np.ndarray:
    """Greedy continuation with our model: one compiled shape (the prompt plus NEW slots; causal attention
    never looks at the slots not yet filled)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    tokens = np.zeros((prompt.shape[0], PROMPT + NEW), np.int32)
    tokens[:, :PROMPT] = prompt
    forward = nnx.jit(lambda m, t: m(t))
    for i in range(PROMPT, PROMPT + NEW):
        logits = forward(model, jnp.asarray(tokens))
        tokens[:, i] = np.asarray(jax.device_get(jnp.argmax(logits[:, i - 1], axis=-1)))
    return tokens[:, PROMPT:]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_continuation_match_transformers(tmp_path: Path, family: str) -> None:
    torch = import_extra("torch", "hf")
    import jax.numpy as jnp

    from model.hf_checkpoint import load_hf_checkpoint

    theirs_model = hf_model(family)
    imported = load_hf_checkpoint(save(theirs_model, tmp_path / "hf"))
    assert imported.family == family and imported.vocab_size == VOCAB
    ours_model = imported.model()

    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(3, 40)).astype(np.int32)
    ours = np.asarray(ours_model(jnp.asarray(tokens)), np.float32)
    with torch.no_grad():
        theirs = theirs_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert ours.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    prompt = tokens[:, :PROMPT]
    theirs_model.generation_config.eos_token_id = None  # 20 tokens whatever comes
    with torch.no_grad():
        generated = theirs_model.generate(torch.from_numpy(prompt.astype(np.int64)), max_new_tokens=NEW,
                                          attention_mask=torch.ones(prompt.shape, dtype=torch.int64),
                                          do_sample=False, pad_token_id=0)
    np.testing.assert_array_equal(our_greedy(ours_model, prompt), generated[:, PROMPT:].numpy())


@pytest.mark.parametrize("family", FAMILIES)
def test_export_back_reloads_with_identical_tensors(tmp_path: Path, family: str) -> None:
    import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")

    from eval.hf_export import write_export
    from model.hf_checkpoint import load_hf_checkpoint

    theirs = hf_model(family, seed=1)
    imported = load_hf_checkpoint(save(theirs, tmp_path / "hf"))
    assert imported.model_cfg.scan_layers  # imported into stacked layers (the default), exported per layer
    out = write_export(imported.model(), imported.model_cfg, imported.vocab_size, tmp_path / "back")
    adapter = get_family(family).hf_adapter
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == adapter.model_type and config["architectures"] == [adapter.architecture]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert type(reloaded).__name__ == adapter.architecture
    want, got = theirs.state_dict(), reloaded.state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        np.testing.assert_array_equal(got[name].numpy(), tensor.numpy(), err_msg=name)


def test_sharded_index_and_pytorch_state_dicts_import(tmp_path: Path) -> None:
    torch = import_extra("torch", "hf")
    import jax
    import ml_dtypes

    from model.hf_checkpoint import load_hf_checkpoint

    theirs = hf_model("qwen2", seed=2)
    reference = load_hf_checkpoint(save(theirs, tmp_path / "single")).state

    def same(state, want=reference) -> None:
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    sharded = save(theirs, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    imported = load_hf_checkpoint(sharded)
    assert len([f for f in imported.source_files if f.endswith(".safetensors")]) > 2
    same(imported.state)

    pt = tmp_path / "pt"
    pt.mkdir()
    (pt / "config.json").write_text((tmp_path / "single" / "config.json").read_text())
    torch.save(theirs.state_dict(), pt / "weights.pt")
    imported = load_hf_checkpoint(pt)
    assert set(imported.source_files) == {"config.json", "weights.pt"}
    same(imported.state)

    # bf16 weights stay bf16: cast to bf16 parameters they are the very same values
    (pt / "weights.pt").unlink()
    torch.save(theirs.to(torch.bfloat16).state_dict(), pt / "pytorch_model.bin")
    bf16 = load_hf_checkpoint(pt, "bfloat16").state
    assert {leaf.dtype for leaf in jax.tree.leaves(bf16)} == {np.dtype(ml_dtypes.bfloat16)}
    same(bf16, jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), reference))
