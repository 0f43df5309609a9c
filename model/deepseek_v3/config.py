"""DeepSeek-V3's config data: its ``model:`` section, named sizes and axis rules.

Data only (imports nothing above ``experiment``): config load reads it by family name (experiment/families.py)
without importing jax or the model code.

The architecture (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437; Transformers'
``models/deepseek_v3/``), which GigaChat 3 (Sber, MIT licence) follows by its model cards:

- multi-head latent attention (MLA): queries through a low-rank bottleneck (``q_lora_rank``, RMS-normed; 0: one
  full projection), keys and values from one compressed latent per token (``kv_lora_rank``, RMS-normed) expanded
  per head, plus a decoupled RoPE key (``qk_rope_head_dim``) shared by the heads; each head's query and key are
  ``qk_nope_head_dim`` + ``qk_rope_head_dim`` wide, its value ``v_head_dim``;
- the first ``first_k_dense`` layers with a dense SwiGLU MLP (``d_ff``), the others a mixture of experts: sigmoid
  scores, group-limited top-k (``n_group``, ``topk_group``), an aux-loss-free selection bias, the chosen weights
  renormalised and scaled by ``routed_scaling_factor``, and ``n_shared_experts`` shared experts;
- untied embeddings;
- multi-token prediction (MTP, ``mtp_layers``: the checkpoints' ``num_nextn_predict_layers``), trained only: depth k
  combines the hidden state at position i with the embedding of token i + k (``eh_proj`` of both RMS-normed), runs
  one more MoE layer and predicts token i + k + 1 through the shared embedding and output head, its loss weighted by
  ``mtp_loss_weight`` (the paper's lambda) and logged apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from experiment.errors import ConfigError
from experiment.sections.model import ModelSection
from experiment.sections.rope import check_rope, rope_of_config

# Named sizes (``model.preset``). "tiny" is the tests' and the family contract's; "deepseek-v3" is DeepSeek-V3's
# published config.json (deepseek-ai/DeepSeek-V3 on the Hugging Face hub, also Transformers' DeepseekV3Config
# defaults): hidden_size 7168, 61 layers (first_k_dense_replace 3), 128 heads, q_lora_rank 1536, kv_lora_rank 512,
# qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, intermediate_size 18432, 256 routed experts of 2048,
# 8 per token, 8 groups (top 4), 1 shared expert, routed_scaling_factor 2.5, rope_theta 10000, rms_norm_eps 1e-6,
# num_nextn_predict_layers 1.
# ``max_seq_len`` is config.json's max_position_embeddings before YaRN (4096); a run sets its own.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, n_layers=3, n_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                 qk_rope_head_dim=8, v_head_dim=12, d_ff=96, n_experts=4, top_k=2, d_expert=24, n_shared_experts=1,
                 n_group=2, topk_group=1, first_k_dense=1, mtp_layers=1, max_seq_len=64),
    # GigaChat 3 Lightning (Sber, MIT licence; "10B-A1.8B", context to 256k by its model cards on the Hugging Face
    # hub, ai-sage/GigaChat3-10B-A1.8B-base). The hub was unreachable here: the fields are read from a public
    # transcription of ai-sage/GigaChat3.1-10B-A1.8B-bf16's config.json (revision 189fff27; GitHub
    # WildPino/SiliconLLM, its GigaChat compatibility audit; GigaChat 3.1 Lightning's card names
    # GigaChat3-10B-A1.8B-base as its base model): hidden_size 1536, 26 layers (first_k_dense_replace 1), 32 heads,
    # no query bottleneck (q_lora_rank null), kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 192, intermediate_size 8960, 64 routed experts of 1280, 4 per token, n_group 1, one shared
    # expert, routed_scaling_factor 1, rope_theta 100000 with YaRN (factor 64 over 4,096 positions, beta_fast 32,
    # beta_slow 1, mscale 1, mscale_all_dim 1), rms_norm_eps 1e-6, untied, vocab 128256, one MTP layer. Checked:
    # these shapes give 11,479,750,784 parameters with the MTP layer's embedding and head copies, the count the
    # same audit reads from the checkpoint's tensors (tests/test_deepseek_v3.py); 10.67B and 1.83B active without
    # the MTP layer. ``model.init_from`` reads the folder's own config.json, which wins.
    "gigachat3-lightning": dict(d_model=1536, n_layers=26, n_heads=32, q_lora_rank=0, kv_lora_rank=512,
                                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=192, d_ff=8960, n_experts=64,
                                top_k=4, d_expert=1280, n_shared_experts=1, n_group=1, topk_group=1,
                                first_k_dense=1, routed_scaling_factor=1.0, rope_theta=100_000.0,
                                rope_scaling="yarn", rope_factor=64.0, rope_original_max_len=4096,
                                rope_beta_fast=32.0, rope_beta_slow=1.0, rope_mscale=1.0, rope_mscale_all_dim=1.0,
                                mtp_layers=1, max_seq_len=4096),
    "deepseek-v3": dict(d_model=7168, n_layers=61, n_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, d_ff=18432, n_experts=256,
                        top_k=8, d_expert=2048, n_shared_experts=1, n_group=8, topk_group=4, first_k_dense=3,
                        routed_scaling_factor=2.5, rope_theta=10_000.0, mtp_layers=1, max_seq_len=4096),
}

# Logical axis -> mesh axes: Llama's names, plus ``expert`` (the experts' leading dim, on a mesh axis of its own
# that also splits the batch, as model/qwen3_moe's) and the two latent widths, which stay whole (their projections
# are split along d_model by fsdp and along the heads by tensor).
AXIS_RULES: dict[str, list[str]] = {
    "batch": ["data", "fsdp", "expert"],
    "length": [],
    "act_embed": [],
    "act_heads": ["tensor"],
    "act_mlp": ["tensor"],
    "vocab": ["tensor"],
    "embed": ["fsdp"],
    "heads": ["tensor"],
    "head_dim": [],
    "q_lora": [],
    "kv_lora": [],
    "mlp": ["tensor"],
    "expert": ["expert"],
    "norm": [],
    "layers": [],
    "mtp_in": [],  # a multi-token prediction module's input: the normed embedding and hidden state, side by side
}


@dataclass
class DeepseekV3Config(ModelSection):
    """DeepSeek-V3's decoder (model/deepseek_v3/model.py); the section of the deepseek_v3 family."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    AXIS_RULES: ClassVar[dict[str, list[str]]] = AXIS_RULES

    family: str = "deepseek_v3"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    q_lora_rank: int = 64  # the queries' bottleneck; 0: one projection d_model -> heads (DeepSeek-V2-Lite)
    kv_lora_rank: int = 64  # the compressed latent the keys and values come from (what a KV cache would hold)
    qk_nope_head_dim: int = 32  # each head's query/key part without position
    qk_rope_head_dim: int = 16  # each head's query part and the shared key part with RoPE
    v_head_dim: int = 32
    d_ff: int = 512  # the dense first layers' SwiGLU width (intermediate_size)
    first_k_dense: int = 1  # layers with a dense MLP before the mixtures of experts (first_k_dense_replace)
    n_experts: int = 8  # routed experts per MoE layer (n_routed_experts)
    top_k: int = 2  # experts per token (num_experts_per_tok)
    d_expert: int = 128  # each routed expert's width (moe_intermediate_size)
    n_shared_experts: int = 1  # one dense SwiGLU of n_shared_experts x d_expert every token goes through
    n_group: int = 1  # expert groups; each token chooses among its topk_group best groups' experts
    topk_group: int = 1
    routed_scaling_factor: float = 1.0  # the chosen experts' weights' scale (DeepSeek-V3: 2.5)
    norm_topk_prob: bool = True
    rope_theta: float = 10_000.0
    rope_interleave: bool = True  # the rope part's pairs interleaved (x0, x1), (x2, x3)... as DeepSeek's weights
    # YaRN context extension of the rope part (DeepSeek-V3's config.json: factor 40 over 4,096 positions, beta_fast
    # 32, beta_slow 1, mscale 1, mscale_all_dim 1): frequencies interpolated by dimension, sin and cos scaled, and
    # with mscale_all_dim the softmax scale too (experiment/sections/rope.py's Rope)
    rope_scaling: Literal["none", "yarn"] = "none"
    rope_factor: float = 1.0
    rope_original_max_len: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 0.0
    rope_mscale_all_dim: float = 0.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    # the Switch/Transformers load-balancing loss weight (DeepSeek-V3 balances with the selection bias and a tiny
    # sequence-wise loss, not built); 0: not added, the statistics still logged
    router_aux_loss_coef: float = 0.0
    # DeepSeek-V3's aux-loss-free balancing: after each optimizer step every MoE layer's selection bias moves by this
    # much against its expert's load (down when above the layer's mean, up when below; the paper's gamma, 0.001
    # for most of its pretraining, 0 at the end); 0: the biases stay as imported
    router_bias_update_rate: float = 0.001
    routing: Literal["dropless", "capacity"] = "dropless"
    capacity_factor: float = 1.25
    # generation over the latent cache: attend in the latent space with wkv_b absorbed into the query and output
    # ("absorbed"), or expand every cached latent into keys and values ("expanded"); "auto": whichever takes fewer
    # multiply-adds for the step's shape (absorbed for one token over a long cache, expanded for a long prefill).
    # The same logits within rounding (tests/test_deepseek_v3.py), their speed in bench/README.md
    mla_decode: Literal["auto", "absorbed", "expanded"] = "auto"
    # multi-token prediction modules (num_nextn_predict_layers; DeepSeek-V3 and GigaChat 3 publish one): each
    # predicts one token further than the one before it, trained only (generation and eval use the main head)
    mtp_layers: int = 0
    # their loss's weight, over the depths' mean cross-entropy (the paper's lambda: 0.3 for DeepSeek-V3's first 10T
    # tokens, 0.1 after; Megatron-LM's mtp_loss_scaling_factor default 0.1); 0: the modules are kept (import,
    # checkpoints, export) but not run, and the step is the plain model's
    mtp_loss_weight: float = 0.1

    def validate(self, key: str) -> None:
        super().validate(key)
        prefix = f"{key}." if key else ""
        self.check_positive(key, ("d_model", "n_layers", "n_heads", "kv_lora_rank", "qk_nope_head_dim",
                                  "qk_rope_head_dim", "v_head_dim", "d_ff", "n_experts", "top_k", "d_expert",
                                  "n_group", "topk_group"))
        for name in ("q_lora_rank", "n_shared_experts", "router_aux_loss_coef", "router_bias_update_rate",
                     "mtp_layers", "mtp_loss_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key '{prefix}{name}': must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.first_k_dense < self.n_layers:
            raise ConfigError(f"config key '{prefix}first_k_dense': {self.first_k_dense} must be between 0 and "
                              f"n_layers - 1 = {self.n_layers - 1} (a mixture-of-experts layer at least)")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"config key '{prefix}qk_rope_head_dim': RoPE needs an even width, got "
                              f"{self.qk_rope_head_dim}")
        if self.top_k > self.n_experts:
            raise ConfigError(f"config key '{prefix}top_k': {self.top_k} is more than n_experts={self.n_experts}")
        if self.n_experts % self.n_group or self.topk_group > self.n_group or (
                self.n_group > 1 and self.n_experts // self.n_group < 2):
            raise ConfigError(f"config key '{prefix}n_group': {self.n_group} groups of n_experts={self.n_experts} "
                              f"with topk_group={self.topk_group}: the groups must be equal, of 2 experts or more, "
                              "and topk_group at most n_group")
        if self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise ConfigError(f"config key '{prefix}top_k': {self.top_k} is more than the experts of topk_group="
                              f"{self.topk_group} groups")
        check_rope(rope_of_config(self), prefix)
        self.check_positive(key, ("rope_theta", "norm_eps", "capacity_factor", "routed_scaling_factor"))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def resolved_head_dim(self) -> int:
        """The head width attention runs at (queries and keys; values are padded to it): which kernels fit."""
        return self.qk_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.first_k_dense

    @property
    def mtp_depth(self) -> int:
        """The multi-token prediction modules a train step runs: ``mtp_layers``, or none at weight 0."""
        return self.mtp_layers if self.mtp_loss_weight > 0 else 0


# family name -> its ``model:`` section class (config load builds ``model`` with the class of ``model.family``)
SECTIONS: dict[str, type[DeepseekV3Config]] = {"deepseek_v3": DeepseekV3Config}
