"""The batch-split rule: a step's batch, in its micro-batches, splits evenly over the devices of the mesh axes the
batch rule (``train.mesh.rules.batch``, else the family's) lays it out on.

Three places check it, each with what it knows of the mesh, and each words its own error for its reader: config
load (``experiment.config.check_batch_split``: the sizes train.mesh fixes), the planner
(``cost.planner.batch_split_problem``: the slice an option would run on) and the trainer (``trainer.step.check_batch``:
the mesh it built). The rule itself is here, once, in the lowest layer all three may import."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchSplit:
    """``batch_size`` sequences in ``grad_accum_steps`` micro-batches over the batch axes ``axis_sizes`` (a mesh
    axis, or a group of axes the caller sizes together, to its size)."""

    batch_size: int
    grad_accum_steps: int
    axis_sizes: dict[str, int]

    @property
    def micro(self) -> int:
        """Sequences in one micro-batch: what each step of the accumulation loop splits over the devices."""
        return self.batch_size // self.grad_accum_steps

    @property
    def parts(self) -> int:
        """Devices the batch is split over: the product of its axes' sizes (no axis: 1, the batch is not split)."""
        return math.prod(self.axis_sizes.values())

    @property
    def even(self) -> bool:
        """Every micro-batch holds as many sequences and splits into equal parts on the devices."""
        return self.batch_size % self.grad_accum_steps == 0 and self.micro % self.parts == 0
