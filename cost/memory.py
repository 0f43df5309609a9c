"""What a training step needs per device, estimated from the model, for hardware nobody fit-checked.

On TPUs recipe 04b compiles the real step for the slice and reads the compiler's memory figure; for GPUs and
Trainium there is no such compiler here, so the planner estimates, per device:

    state        16 bytes per parameter (fp32 weights, gradients, Adam's two moments), sharded (FSDP)
    activations  the family's saved values per token (``ModelFamily.saved_values``) x 2 bytes (bf16)
                 x the tokens of one micro-batch on the device
    logits       one loss chunk's (or the whole sequence's) fp32 logits and their bf16 gradient

and takes the cheapest setting whose sum fits ``HBM_BUDGET`` of the device's memory: no remat with the fewest
micro-batches first (micro-batches cost no FLOPs), then ``save_dots``, then ``full``. The estimate leaves out
XLA's temporary buffers and fragmentation (the budget's headroom is for them), so it is a plan, not a promise:
recipe 04b's compiled figure replaces it wherever it ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiment.sections.model import FamilyConfig
from model.registry import family_of

STATE_BYTES_PER_PARAM = 16
ACTIVATION_BYTES = 2  # bf16 compute: the saved activations are bf16
LOGIT_BYTES = 4 + 2  # fp32 logits of a chunk and their bf16 gradient
HBM_BUDGET = 0.85  # of a device's HBM: XLA's scratch buffers and fragmentation need the rest
REMAT_ORDER = ("none", "save_dots", "full")  # least recomputed work first


@dataclass(frozen=True)
class MemoryEstimate:
    remat: str
    grad_accum_steps: int
    bytes_per_device: float
    budget_bytes: float

    @property
    def fits(self) -> bool:
        return self.bytes_per_device <= self.budget_bytes

    def describe(self) -> str:
        return (f"memory estimate {self.bytes_per_device / 2**30:,.1f} of {self.budget_bytes / 2**30:,.1f} GiB "
                f"({HBM_BUDGET:.0%} of HBM)")


def step_bytes(model_cfg: FamilyConfig, params: int, vocab_size: int, seq_len: int, sequences_per_device: float,
               devices: int, remat: str, loss_chunk_len: int) -> float:
    """Bytes one device holds at the peak of a step: sharded state, one micro-batch's activations and logits."""
    tokens = sequences_per_device * seq_len
    activations = family_of(model_cfg).saved_values(model_cfg, remat) * ACTIVATION_BYTES * tokens
    chunk = loss_chunk_len if 0 < loss_chunk_len < seq_len else seq_len
    logits = sequences_per_device * chunk * vocab_size * LOGIT_BYTES
    return params * STATE_BYTES_PER_PARAM / devices + activations + logits


def cheapest_fitting(model_cfg: FamilyConfig, params: int, vocab_size: int, seq_len: int, batch_size: int, devices: int,
                     hbm_gib_per_device: float, loss_chunk_len: int) -> MemoryEstimate:
    """The least-recompute setting (then the fewest micro-batches) whose estimate fits; the last tried if none."""
    budget = HBM_BUDGET * hbm_gib_per_device * 2**30
    per_device = max(batch_size / devices, 1.0)  # a batch smaller than the slice still puts a sequence on each
    splits = [a for a in range(1, int(per_device) + 1) if int(per_device) % a == 0] or [1]
    estimate = None
    for remat in REMAT_ORDER:
        for accum in splits:
            estimate = MemoryEstimate(remat, accum, step_bytes(model_cfg, params, vocab_size, seq_len,
                                                               per_device / accum, devices, remat, loss_chunk_len),
                                      budget)
            if estimate.fits:
                return estimate
    assert estimate is not None
    return estimate
