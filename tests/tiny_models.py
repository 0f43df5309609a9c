"""Tiny random models of every family, for the tests that run each family the same way.

Each family names its own few-layer shape (``ModelFamily.tiny``); ``tiny_pair`` builds it unrolled, moves every
parameter by N(0, 0.2) (so that biases, which start at zero, and norm scales, which start at one or, in Gemma's
``1 + w``, at zero, all count), and stacks the very same parameters into the scanned layout
(model/stacking.py's ``stack_tree``, over the family's ``roles.layers``).
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiment.families import shipped_families
from model.registry import families, get_family
from model.stacking import stack_tree
from tests.toy_family import NAME as TOY_NAME

VOCAB = 96  # even: the vocabulary is split over the tensor axis on the 8-device mesh


def contract_families() -> list[str]:
    """Every family that ships, and the toy plugin family (tests/toy_family.py)."""
    return [*shipped_families(), TOY_NAME]


def hf_families() -> list[str]:
    """The registered families with a Hugging Face adapter (``ModelFamily.hf_adapter``)."""
    return [name for name in families() if get_family(name).hf_adapter is not None]


def perturb(model: nnx.Module, seed: int, scale: float = 0.2) -> None:
    """Every parameter of ``model`` moved by N(0, ``scale``), in place."""
    state = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(seed)
    for _, leaf in nnx.to_flat_state(state):
        value = np.asarray(leaf[...])
        leaf[...] = jnp.asarray(value + scale * rng.normal(size=value.shape), value.dtype)
    nnx.update(model, state)


@cache
def tiny_pair(family: str, vocab: int = VOCAB, seed: int = 3) -> tuple[nnx.Module, nnx.Module]:
    """(unrolled, scanned) modules of ``family``'s tiny shape with the same parameters (see the module docstring)."""
    fam = get_family(family)
    unrolled = fam.init(fam.tiny_config(scan_layers=False), vocab, seed=seed)
    perturb(unrolled, seed)
    graphdef, like = nnx.split(fam.abstract(fam.tiny_config(scan_layers=True), vocab), nnx.Param)
    scanned = nnx.merge(graphdef, stack_tree(nnx.state(unrolled, nnx.Param), like, fam.roles.layers))
    return unrolled, scanned


def tiny_model(family: str, scan_layers: bool, vocab: int = VOCAB) -> nnx.Module:
    """``family``'s tiny model in one layout (``tiny_pair``)."""
    return tiny_pair(family, vocab)[1 if scan_layers else 0]


def transformers_model(family: str, vocab: int, seed: int = 0) -> Any:
    """A tiny random Transformers model of ``family`` (the `hf` extra: torch and transformers): the config.json our
    tiny model of the family exports (its HF adapter), read back by Transformers (``AutoConfig.from_pretrained``,
    as a saved folder is) and built with ``AutoModelForCausalLM.from_config`` in fp32, weights N(0, 0.2)
    (``initializer_range``) and every 1-D tensor (norm weights, biases) moved by N(0, 0.2), so that a missing
    bias or norm cannot hide (Gemma's norm weights start at zero: it scales by 1 + w)."""
    from tests.conftest import import_extra  # the test session's module: not imported by the 8-device worker

    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    fam = get_family(family)
    assert fam.hf_adapter is not None, f"{family} has no Hugging Face adapter"
    _, config = fam.hf_adapter.export(tiny_model(family, True, vocab), fam.tiny_config(), vocab)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({**config, "initializer_range": 0.2}), encoding="utf-8")
        hf_config = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config).to(torch.float32).eval()
    assert type(model).__name__ == fam.hf_adapter.architecture, type(model).__name__
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model
