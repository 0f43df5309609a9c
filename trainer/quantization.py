"""Quantized training (``train.quantization: int8 | fp8``) through Qwix, the JAX quantization library
MaxText uses (https://github.com/google/qwix).

Qwix's quantized training (QT, "QAT") intercepts the model's matmuls while the step is traced: inside
the modules its rules match, each ``dot_general`` against a parameter is computed on int8 or fp8
operands (weights per output channel, activations per row, absmax scales), and its backward pass
quantizes the incoming gradient too. The parameters, the optimizer state and so the checkpoints stay
the float ones: a quantized run resumes, evaluates and exports to Hugging Face like any other, and
can be resumed or branched without quantization.

What is quantized: the matmuls of the family's ``quantized_modules`` (Llama-shaped families: the
q/k/v/o projections and the SwiGLU MLP, model/llama/model.py ``QUANTIZED_MODULES``), forward and both
backward dots. Not quantized, on purpose: attention's score and value einsums (activation x
activation; MaxText's Qwix rules also name only ``dot_general``), the output head (its logits feed
the softmax cross-entropy directly; torchtitan's float8 recipes leave the ``output`` layer out too)
and the embedding lookup (a gather).

The recipes follow MaxText's Qwix rules (MaxText/layers/quantizations.py): int8 forward and backward
for TPU v5e/v6e, whose MXUs run int8 at twice the bf16 rate; fp8 with e4m3 forward and e5m2
gradients (NVIDIA Transformer Engine's HYBRID format) for H100/H200/B200 tensor cores. On a CPU the
quantization is exact in its numerics but slower than float: there it checks correctness only.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
from flax import nnx

from experiment.errors import ConfigError
from model.family import ModelFamily
from model.linear import plain_projections

QUANTIZATIONS = ("none", "int8", "fp8")
# (weight, activation, gradient) types of each recipe
QTYPES = {
    "int8": (jnp.int8, jnp.int8, jnp.int8),
    "fp8": (jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.float8_e5m2),
}


def quantization_rule(mode: str, module_path: str) -> Any:
    """The Qwix QT rule of ``mode`` for the modules ``module_path`` matches (``qwix.QtRule``)."""
    import qwix  # imported only by quantized runs

    weight, act, grad = QTYPES[mode]
    return qwix.QtRule(module_path=module_path, op_names=("dot_general",),
                       weight_qtype=weight, act_qtype=act, bwd_qtype=grad)


def quantize_module(module: nnx.Module, family: ModelFamily, mode: str) -> nnx.Module:
    """A copy of ``module`` whose ``hidden`` (the body the train step differentiates) runs quantized.

    ``module`` may be abstract (``family.abstract``): nothing is computed, Qwix's QT keeps no state of
    its own (dynamic scales), so the copy's parameters are the module's and its graphdef merges with
    the float train state."""
    import qwix

    if mode not in QTYPES:
        raise ConfigError(f"config key 'train.quantization': unknown value '{mode}' "
                          f"(known: {', '.join(QUANTIZATIONS)})")
    if family.aux_losses:
        # its step runs ``hidden_with_aux``; Qwix intercepting that method failed inside qwen3_moe's scanned layers
        # ("lhs and rhs cannot be both weights", qwix 0.1, 2026-12-06), and the experts' ragged_dot is no
        # dot_general its rules see: refused, rather than a run that quantizes nothing
        raise ConfigError(f"config key 'train.quantization': model family '{family.name}' has auxiliary losses; "
                          "quantized training of such a family is not supported yet; use none")
    if not family.quantized_modules:
        raise ConfigError(f"config key 'train.quantization': model family '{family.name}' names no modules to "
                          "quantize (ModelFamily.quantized_modules); use none")
    provider = qwix.QtProvider([quantization_rule(mode, family.quantized_modules)])
    # the inputs are not run (skip_nnx_init): QT creates no variables, only the interception is installed
    tokens = jnp.zeros((1, 1), jnp.int32)
    with qwix_quiet():
        return qwix.quantize_model(module, provider, tokens, methods=("hidden",), skip_nnx_init=True)


@contextlib.contextmanager
def tracing(mode: str) -> Iterator[None]:
    """Around the traced forward pass of a quantized step: projections as plain ``dot_general``s of
    their parameters (model/linear.py), so that Qwix sees the weights and owns the backward."""
    if mode == "none":
        yield
        return
    with plain_projections(), qwix_quiet():
        yield


@contextlib.contextmanager
def qwix_quiet() -> Iterator[None]:
    """Qwix 0.1.8 reads ``Variable.value`` and ``Module.iter_modules``, which Flax 0.12 deprecates: one
    warning per matmul per trace, none of them ours to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"qwix\.")
        yield
