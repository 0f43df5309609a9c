"""What the Transformers parity tests of every family share (tests/test_hf_parity_<family>.py, the hf lane):
Transformers' logits and greedy continuation, and the export round trip in both directions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import import_extra


def their_logits(model: Any, tokens: np.ndarray) -> np.ndarray:
    torch = import_extra("torch", "hf")
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


def their_greedy(model: Any, prompt: np.ndarray, new: int) -> np.ndarray:
    """Transformers' greedy continuation of ``prompt`` [B, P] by ``new`` tokens."""
    torch = import_extra("torch", "hf")
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt.astype(np.int64)), max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones(prompt.shape, dtype=torch.int64), pad_token_id=0)
    return out[:, prompt.shape[1]:].numpy()


def export_reloads_both_ways(family: str, theirs: Any, folder: Path, tmp_path: Path, vocab: int) -> tuple[Any, Any]:
    """Theirs (saved in ``folder``) -> ours -> export -> Transformers gives the very tensors and our config back;
    a model of ours that Transformers never saw (its vectors, the norm scales, moved off their init) -> export ->
    Transformers gives our logits, and -> import our parameters. Returns (the import of ``folder``, Transformers'
    reload of its export) for the family's own config checks."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from eval.hf_export import write_export
    from model.hf_checkpoint import load_hf_checkpoint
    from model.registry import get_family

    transformers = import_extra("transformers", "hf")
    model_class = type(theirs)
    imported = load_hf_checkpoint(folder)
    out = write_export(imported.model(), imported.model_cfg, vocab, tmp_path / "back", special_ids={"bos": 2, "pad": 0})
    reloaded = model_class.from_pretrained(str(out)).eval()
    want, got = theirs.state_dict(), reloaded.state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        np.testing.assert_array_equal(got[name].numpy(), tensor.numpy(), err_msg=name)
    assert load_hf_checkpoint(out).model_cfg == imported.model_cfg

    cfg = dataclasses.replace(imported.model_cfg, init_std=0.2, scan_layers=False)
    model = get_family(family).init(cfg, vocab, seed=5)
    params = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
    nnx.update(model, jax.tree.map(lambda p: p + 0.2 * jax.random.normal(next(keys), p.shape) if p.ndim == 1 else p,
                                   params))
    out = write_export(model, cfg, vocab, tmp_path / "ours")
    theirs_of_ours = getattr(transformers, model_class.__name__).from_pretrained(str(out)).eval()
    tokens = np.random.default_rng(1).integers(0, vocab, size=(2, 16)).astype(np.int32)
    ours, logits = np.asarray(model(jnp.asarray(tokens)), np.float32), their_logits(theirs_of_ours, tokens)
    print(f"{family} export of ours: max |logit diff| {float(np.abs(ours - logits).max()):.2e}")
    np.testing.assert_allclose(ours, logits, atol=1e-4, rtol=0)
    back = load_hf_checkpoint(out, scan_layers=False)
    for a, b in zip(jax.tree.leaves(back.state), jax.tree.leaves(nnx.state(model, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return imported, reloaded
