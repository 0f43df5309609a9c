from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MeshConfig:
    data: int = -1  # -1: all devices left over
    fsdp: int = 1
    tensor: int = 1


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32  # global batch, in sequences
    learning_rate: float = 3e-4
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 0  # 0: no eval during training
    mesh: MeshConfig = field(default_factory=MeshConfig)
