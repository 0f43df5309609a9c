"""Qwen3-MoE's config data: its ``model:`` section, named sizes and axis rules.

Data only (imports nothing above ``experiment``): config load reads it by family name
(experiment/families.py) without importing jax or the model code.

The architecture (Qwen Team, "Qwen3 Technical Report", 2025; Transformers' ``models/qwen3_moe/``): Qwen3's
attention (grouped-query, RoPE, an RMSNorm over each query and key head, no biases) and, in every layer, a
mixture-of-experts MLP instead of a dense one: a softmax router picks ``top_k`` of ``n_experts`` SwiGLU experts of
width ``d_expert`` per token (their weights renormalised to sum 1 with ``norm_topk_prob``), no shared expert;
untied embeddings. Transformers' ``decoder_sparse_step`` and ``mlp_only_layers`` (dense MLP layers between the
sparse ones) are not built: every layer is sparse, as in every published Qwen3-MoE checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from experiment.errors import ConfigError
from experiment.sections.model import GroupedHeads, ModelSection

# Named sizes (``model.preset``). The published shapes are those of the config.json files on the Hugging Face hub:
# Qwen/Qwen3-30B-A3B (hidden_size 2048, 48 layers, 32 heads / 4 KV heads, head_dim 128, 128 experts, 8 per token,
# moe_intermediate_size 768) and Qwen/Qwen3-235B-A22B (4096, 94 layers, 64 / 4 heads, head_dim 128, 128 experts, 8
# per token, moe_intermediate_size 1536); both norm_topk_prob true, rope_theta 1e6, rms_norm_eps 1e-6, untied,
# router_aux_loss_coef 0.001, max_position_embeddings 40960, vocab_size 151936 (the vocabulary is the tokenizer's,
# not a preset's). MaxText's configs/models/qwen3-30b-a3b.yml and qwen3-235b-a22b.yml give the same shapes (their
# RoPE bases, 1e7 and 5e6, are the 2507 updates'). ``max_seq_len`` is config.json's; a run sets its own.
PRESETS: dict[str, dict[str, Any]] = {
    # a few layers for tests and the family contract (``ModelFamily.tiny`` is this shape)
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, n_experts=4, top_k=2, d_expert=32,
                 max_seq_len=64),
    "30b-a3b": dict(d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, n_experts=128, top_k=8,
                    d_expert=768, max_seq_len=40_960),
    "235b-a22b": dict(d_model=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, n_experts=128, top_k=8,
                      d_expert=1536, max_seq_len=40_960),
}

# Logical axis -> mesh axes: Llama's names (a run's ``train.mesh.rules`` mean the same for either family), plus
# ``expert``, the experts' leading dimension (model/moe.py), laid out on a mesh axis of its own, ``expert``
# (``train.mesh.axes: {expert: N}``; config load adds it at 1, not split, when the config does not size it), which
# also splits the batch, as MaxText lays out expert parallelism.
AXIS_RULES: dict[str, list[str]] = {
    "batch": ["data", "fsdp", "expert"],  # activations: the batch is split over every data-parallel axis
    "length": [],
    "act_embed": [],
    "act_heads": ["tensor"],
    "act_mlp": ["tensor"],
    "vocab": ["tensor"],
    "embed": ["fsdp"],  # FSDP/ZeRO-3: parameters sharded along d_model, gathered per layer
    "heads": ["tensor"],
    "kv_heads": ["tensor"],
    "head_dim": [],  # also the q/k norms' scales
    "mlp": ["tensor"],  # each expert's hidden width
    "expert": ["expert"],  # the experts of a layer (and the router's output)
    "norm": [],
    # the stacked layer axis of scanned layers (model/stacking.py): never split, a layer's weights are
    # gathered over fsdp inside the scan body
    "layers": [],
}


@dataclass
class Qwen3MoeConfig(GroupedHeads, ModelSection):
    """Qwen3-MoE's decoder (model/qwen3_moe/model.py); the section of the qwen3_moe family."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    AXIS_RULES: ClassVar[dict[str, list[str]]] = AXIS_RULES

    family: str = "qwen3_moe"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64  # Qwen3 sets it explicitly (128); 0: d_model // n_heads
    n_experts: int = 8  # routed experts per layer (Transformers: num_experts)
    top_k: int = 2  # experts per token (num_experts_per_tok)
    d_expert: int = 256  # each expert's hidden width (moe_intermediate_size)
    norm_topk_prob: bool = True  # the chosen experts' weights renormalised to sum 1 (every published Qwen3-MoE)
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6  # every RMSNorm's epsilon (rms_norm_eps)
    tie_embeddings: bool = False  # Qwen3-MoE's output head is its own (tie_word_embeddings false)
    # the load-balancing loss's weight in the train loss: Transformers' ``router_aux_loss_coef`` times its
    # ``load_balancing_loss_func`` (model/qwen3_moe/model.py: top_k times model/moe.py's Switch loss, pooled over the
    # layers), so an imported coefficient trains the objective Transformers trains; 0: not added
    router_aux_loss_coef: float = 0.001
    # ST-MoE's router z-loss weight (mean over layers of mean(logsumexp(router logits)^2)); not Transformers'
    router_z_loss_coef: float = 0.0
    # dropless: every token-slot computed (``jax.lax.ragged_dot`` over the slots sorted by expert, Transformers'
    # result); capacity: each expert takes ceil(capacity_factor * tokens * top_k / n_experts) slots of a batch, the
    # rest dropped (GShard, Switch; dense einsums of a fixed size), model/moe.py
    routing: Literal["dropless", "capacity"] = "dropless"
    capacity_factor: float = 1.25

    def validate(self, key: str) -> None:
        super().validate(key)
        prefix = f"{key}." if key else ""
        self.check_positive(key, ("d_model", "n_layers", "n_heads", "n_kv_heads", "n_experts", "top_k", "d_expert"))
        self.check_heads(key)
        if self.top_k > self.n_experts:
            raise ConfigError(f"config key '{prefix}top_k': {self.top_k} is more than n_experts={self.n_experts} "
                              "(a token's top_k experts are distinct)")
        self.check_positive(key, ("rope_theta", "norm_eps", "capacity_factor"))
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key '{prefix}{name}': must be >= 0, got {getattr(self, name)}")


# family name -> its ``model:`` section class (config load builds ``model`` with the class of ``model.family``)
SECTIONS: dict[str, type[Qwen3MoeConfig]] = {"qwen3_moe": Qwen3MoeConfig}
