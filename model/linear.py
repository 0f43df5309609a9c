"""The projections every family's matmuls against a parameter go through: ``project`` and ``linear``.

``linear`` is ``x @ w`` with a hand-written backward pass. It computes what autodiff of the einsum
would on every platform; the backward's operand order is what XLA:CPU (where this project trains its
demo and runs its tests) needs to avoid a slow layout copy (``_linear_backward``). ``plain_projections``
is quantized training's switch (trainer/quantization.py): within it ``project`` emits one plain
``dot_general`` of the parameter instead, which Qwix can recognise and differentiate with its own VJP.

Every projection's output carries a name (``PROJECTIONS``, ``jax.ad_checkpoint.checkpoint_name``) outside the
custom VJP, which is what ``model.remat``'s policies save (model/layers.py): a policy that looks for dots
(``dots_with_no_batch_dims_saveable``) cannot see one inside ``linear``'s custom VJP, and saved nothing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

# set while a step is traced for quantized training (trainer/quantization.py): Qwix must see each
# projection as one dot_general against the parameter itself, and differentiate it with its own VJP
_PLAIN_PROJECTIONS: ContextVar[bool] = ContextVar("plain_projections", default=False)


# the names of the projections' outputs, the same in every family (Hugging Face's module names where a family has
# them): attention's query, key, value and output projections, DeepSeek-V3's low-rank query and key-value
# projections, the gated MLP's (and a shared expert's) gate, up and down projections, a mixture of experts' router
# logits and a multi-token prediction module's input projection. ``model.remat``'s save_dots and offload keep
# these, and only these (a mixture of experts' routed experts are ragged dots and batched einsums, not
# projections: recomputed, as each MoE family's ``recompute_flops`` counts)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj",
               "gate_proj", "up_proj", "down_proj", "router", "eh_proj")


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


def project(x: jax.Array, w: jax.Array, n_in: int = 1, *, name: str) -> jax.Array:
    """x [..., in dims] @ w [in dims, out dims] -> [..., out dims]: the last ``n_in`` dims of ``x``
    contract with the first ``n_in`` of ``w`` (e.g. q/k/v [D] @ [D, H, K], o [H, K] @ [H, K, D], an MLP's
    [D] @ [D, F]).

    ``name`` (one of ``PROJECTIONS``) names the output for ``model.remat``'s policies, outside ``linear``'s
    custom VJP, where a remat policy sees it. Normally through ``linear`` on 2-D views. Within
    ``plain_projections``: one ``dot_general`` of the parameter array itself, cast only if its dtype differs
    (Qwix recognises a weight operand by identity with a module's ``nnx.Param`` value, and quantizes the
    backward of dots whose VJP it owns).
    """
    if projections_plain():
        w = w if w.dtype == x.dtype else w.astype(x.dtype)
        contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
        return checkpoint_name(jax.lax.dot_general(x, w, (contract, ((), ()))), name)
    in_size = math.prod(w.shape[:n_in])
    y = linear(x.reshape(*x.shape[:x.ndim - n_in], in_size), w.astype(x.dtype).reshape(in_size, -1))
    return checkpoint_name(y.reshape(*x.shape[:x.ndim - n_in], *w.shape[n_in:]), name)
