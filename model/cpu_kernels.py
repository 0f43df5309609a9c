"""Kernels written for XLA:CPU, kept out of the model files that use them.

Why this file exists: the CPU is where this project trains its demo and runs its tests, and XLA:CPU
lays out some dots badly (below). A fix that only matters on one backend belongs beside the model,
not inside it: the model calls ``linear`` for every projection and reads as plain einsums, and on
TPUs and GPUs ``linear`` computes exactly what autodiff of the einsum would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import jax
import jax.numpy as jnp

# set while a step is traced for quantized training (trainer/quantization.py): Qwix must see each
# projection as one dot_general against the parameter itself, and differentiate it with its own VJP
_PLAIN_PROJECTIONS: ContextVar[bool] = ContextVar("plain_projections", default=False)


@contextlib.contextmanager
def plain_projections() -> Iterator[None]:
    """Within: the model's projections are plain ``dot_general``s of the parameter (autodiff backward),
    not ``linear`` (whose custom VJP keeps the backward out of reach of a quantization library)."""
    token = _PLAIN_PROJECTIONS.set(True)
    try:
        yield
    finally:
        _PLAIN_PROJECTIONS.reset(token)


def projections_plain() -> bool:
    return _PLAIN_PROJECTIONS.get()


@jax.custom_vjp
def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out]: every projection of the model, with a backward pass tuned for XLA:CPU."""
    return jnp.einsum("...i,io->...o", x, w)


def _linear_forward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return linear(x, w), (x, w)


def _linear_backward(residuals: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The same gradients as autodiff, with the weight gradient's dot taking the smaller activation first.

    Why: XLA:CPU copies the first operand of a dot that contracts over leading dims into a transposed
    layout, and autodiff puts the output gradient first, so the copy got fused into the elementwise
    work that made that gradient (the SwiGLU backward) and ran 5-7x slower than a plain transpose:
    removing that made the CPU train step 1.12x faster. On TPUs and GPUs the operand order changes nothing.
    """
    x, w = residuals
    dx = jnp.einsum("...o,io->...i", dy, w)
    x_first = w.shape[0] <= w.shape[1]  # the activation with fewer features is the one copied
    dw = jnp.einsum("...i,...o->io", x, dy) if x_first else jnp.einsum("...o,...i->oi", dy, x).T
    return dx, dw


linear.defvjp(_linear_forward, _linear_backward)
