"""RoPE's frequencies and their scalings for a longer context, shared by every family (no JAX here: the
config sections and the Hugging Face adapters use it too; here, beside the sections, because a family's config
module imports only experiment, tests/test_import_graph.py).

Scalings, as Transformers' ``modeling_rope_utils`` defines them (``ROPE_INIT_FUNCTIONS``):
  linear: every inverse wavelength divided by ``factor`` (positions slowed down: Chen et al. 2023, "Extending
          Context Window of Large Language Models via Positional Interpolation");
  llama3: Llama 3.1's frequency-dependent one (wavelengths longer than original / low_freq_factor slowed by
          ``factor``, shorter than original / high_freq_factor kept, a smooth ramp between);
  yarn:   Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models" (NTK-by-parts:
          dimensions that turn fewer than beta_slow times over the original context slowed by ``factor``, more
          than beta_fast times kept, a linear ramp in dimension index between; sin and cos scaled by the
          attention factor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from experiment.errors import ConfigError

RopeScaling = Literal["none", "linear", "llama3", "yarn"]
SCALINGS: tuple[str, ...] = ("none", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class Rope:
    """RoPE's frequencies: base ``theta``, optionally scaled (``scaling``: the module docstring)."""

    theta: float = 10_000.0
    scaling: str = "none"
    factor: float = 8.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_len: int = 8192  # llama3, yarn: the context the model was trained at before scaling
    beta_fast: float = 32.0  # YaRN: rotations at which a dimension is left unscaled (extrapolated)
    beta_slow: float = 1.0  # YaRN: rotations below which a dimension is fully interpolated
    mscale: float = 0.0  # YaRN's attention temperature terms (0: unset; see ``attention_factor``)
    mscale_all_dim: float = 0.0
    yarn_attention_factor: float = 0.0  # YaRN: sin and cos scale given outright (0: derived from factor, mscale)
    truncate: bool = True  # YaRN: the ramp's ends rounded to whole dimensions (Transformers' default)

    def attention_factor(self) -> float:
        """What YaRN multiplies sin and cos by (1 otherwise): ``yarn_attention_factor`` when set, else
        mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set (DeepSeek-V3: 1), else
        mscale(factor), mscale(s, m) = 0.1 m ln s + 1."""
        if self.scaling != "yarn":
            return 1.0
        if self.yarn_attention_factor:
            return self.yarn_attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def frequencies(self, head_dim: int) -> np.ndarray:
        """Inverse wavelengths [head_dim / 2] (fp32), as Transformers' ``ROPE_INIT_FUNCTIONS`` compute them."""
        half = head_dim // 2
        freqs = np.float32(self.theta) ** (-np.arange(half, dtype=np.float32) / np.float32(half))
        if self.scaling == "linear":
            freqs = (freqs / np.float32(self.factor)).astype(np.float32)
        elif self.scaling == "llama3":
            # long wavelengths (low frequencies) slowed down by ``factor``, short ones kept, a ramp between
            wavelen = 2 * math.pi / freqs
            scaled = np.where(wavelen > self.original_max_len / self.low_freq_factor, freqs / self.factor, freqs)
            smooth = ((self.original_max_len / wavelen - self.low_freq_factor)
                      / (self.high_freq_factor - self.low_freq_factor))
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < self.original_max_len / self.high_freq_factor) & ~(
                wavelen > self.original_max_len / self.low_freq_factor)
            freqs = np.where(medium, smoothed, scaled).astype(np.float32)
        elif self.scaling == "yarn":
            # dimensions that turn fewer than beta_slow times over the original context are interpolated (slowed by
            # ``factor``), those that turn more than beta_fast times kept, a linear ramp between (in dimension index)
            def dim_at(rotations: float) -> float:
                return half * math.log(self.original_max_len / (rotations * 2 * math.pi)) / math.log(self.theta)

            low, high = dim_at(self.beta_fast), dim_at(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, head_dim - 1)
            ramp = np.clip((np.arange(half, dtype=np.float32) - low) / max(high - low, 0.001), 0, 1)
            freqs = (freqs / np.float32(self.factor) * ramp + freqs * (1 - ramp)).astype(np.float32)
        return freqs


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term, 0.1 mscale ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def check_rope(rope: Rope, prefix: str) -> None:
    """One ConfigError line naming the ``{prefix}rope_*`` key a scaling's settings get wrong."""
    if rope.theta <= 0:
        raise ConfigError(f"config key '{prefix}rope_theta': must be positive, got {rope.theta}")
    if rope.scaling not in SCALINGS:
        raise ConfigError(f"config key '{prefix}rope_scaling': one of {', '.join(SCALINGS)}, got {rope.scaling!r}")
    if rope.scaling == "none":
        return
    if not rope.factor >= 1:
        raise ConfigError(f"config key '{prefix}rope_factor': {rope.scaling} RoPE scaling needs a factor >= 1, "
                          f"got {rope.factor}")
    if rope.scaling in ("llama3", "yarn") and rope.original_max_len <= 0:
        raise ConfigError(f"config key '{prefix}rope_original_max_len': {rope.scaling} needs the pretraining "
                          f"context (> 0), got {rope.original_max_len}")
    if rope.scaling == "llama3" and not rope.high_freq_factor > rope.low_freq_factor > 0:
        raise ConfigError(f"config key '{prefix}rope_high_freq_factor': llama3 needs rope_high_freq_factor > "
                          f"rope_low_freq_factor > 0, got {rope.high_freq_factor} and {rope.low_freq_factor}")
    if rope.scaling == "yarn" and not rope.beta_fast > rope.beta_slow > 0:
        raise ConfigError(f"config key '{prefix}rope_beta_fast': yarn needs rope_beta_fast > rope_beta_slow > 0, "
                          f"got {rope.beta_fast} and {rope.beta_slow}")
    if rope.scaling == "yarn" and rope.yarn_attention_factor < 0:
        raise ConfigError(f"config key '{prefix}rope_attention_factor': must be >= 0 (0: derived from the factor), "
                          f"got {rope.yarn_attention_factor}")


# our config fields (rope_<name>) <-> Transformers' rope_parameters keys, per scaling
_HF_KEYS: dict[str, dict[str, str]] = {
    "linear": {"factor": "factor"},
    "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
               "original_max_len": "original_max_position_embeddings"},
    "yarn": {"factor": "factor", "original_max_len": "original_max_position_embeddings", "beta_fast": "beta_fast",
             "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
             "yarn_attention_factor": "attention_factor", "truncate": "truncate"},
}
# YaRN's optional terms at the values Transformers assumes when they are absent (0: unset, derived)
_YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.0, "mscale_all_dim": 0.0,
                  "yarn_attention_factor": 0.0, "truncate": True}
# the config field of each Rope field (yarn_attention_factor: rope_attention_factor)
FIELD_KEYS = {"theta": "rope_theta", "scaling": "rope_scaling", "factor": "rope_factor",
              "low_freq_factor": "rope_low_freq_factor", "high_freq_factor": "rope_high_freq_factor",
              "original_max_len": "rope_original_max_len", "beta_fast": "rope_beta_fast",
              "beta_slow": "rope_beta_slow", "mscale": "rope_mscale", "mscale_all_dim": "rope_mscale_all_dim",
              "yarn_attention_factor": "rope_attention_factor", "truncate": "rope_truncate"}

# the model keys of RoPE's frequencies a long-context stage may change (trainer.resume.is_stage_key): the base
# (gemma3: one for its local and one for its global layers) and the scaling; not how a family pairs a head's
# dimensions (deepseek_v3's rope_interleave), which the trained weights depend on
STAGE_ROPE_KEYS = frozenset({*FIELD_KEYS.values(), "rope_theta_local", "rope_theta_global"})


def rope_to_hf(rope: Rope) -> dict[str, Any]:
    """Transformers' ``rope_parameters`` (the ``rope_scaling`` of files before Transformers 5) for ``rope``; YaRN's
    optional terms at Transformers' defaults are left out (as the files Transformers writes leave them), so an
    imported config.json is written back as it came."""
    if rope.scaling == "none":
        return {"rope_type": "default", "rope_theta": rope.theta}
    out: dict[str, Any] = {"rope_type": rope.scaling, "rope_theta": rope.theta}
    for ours, theirs in _HF_KEYS[rope.scaling].items():
        value = getattr(rope, ours)
        if rope.scaling == "yarn" and ours in _YARN_DEFAULTS and value == _YARN_DEFAULTS[ours]:
            continue
        out[theirs] = value
    return out


def rope_from_hf(hf_config: Mapping[str, Any], where: str, supported: tuple[str, ...] = SCALINGS,
                 default_theta: float = 10_000.0) -> dict[str, Any]:
    """Our ``rope_*`` config fields for a config.json's ``rope_parameters`` (Transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (earlier files; both merged, rope_parameters winning); only the scaling's own settings and
    the base are returned, so a family keeps its defaults for the rest. A scaling outside ``supported`` (dynamic,
    longrope, ...), a partial rotation or a missing required setting is one error line naming it."""
    rope = {**(hf_config.get("rope_scaling") or {}), **(hf_config.get("rope_parameters") or {})}
    if rope.get("partial_rotary_factor", 1.0) != 1.0 or hf_config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor is not supported (only RoPE over the whole head)")
    theta = float(rope.get("rope_theta") or hf_config.get("rope_theta") or default_theta)
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = "none" if kind == "default" else kind
    if scaling not in supported:
        known = ["default" if s == "none" else s for s in supported]
        raise ConfigError(f"{where}: rope_type '{kind}' is not supported (only {', '.join(known[:-1])} and "
                          f"{known[-1]})")
    fields: dict[str, Any] = {"rope_theta": theta}
    if scaling == "none":
        return fields
    if scaling in ("llama3", "yarn") and not rope.get("original_max_position_embeddings"):
        # Transformers' standardize_rope_params: the pretraining context defaults to max_position_embeddings
        rope["original_max_position_embeddings"] = hf_config.get("max_position_embeddings")
    if scaling == "yarn" and rope.get("factor") is None and rope.get("original_max_position_embeddings"):
        rope["factor"] = hf_config.get("max_position_embeddings", 0) / rope["original_max_position_embeddings"]
    fields["rope_scaling"] = scaling
    for ours, theirs in _HF_KEYS[scaling].items():
        value = rope.get(theirs)
        if value is None:
            if theirs in ("factor", "original_max_position_embeddings"):
                raise ConfigError(f"{where}: rope_scaling of type {kind} lacks '{theirs}'")
            continue  # Transformers' default (beta 32 / 1, mscale unset, truncate true)
        kind_of = type(getattr(Rope(), ours))
        fields[FIELD_KEYS[ours]] = bool(value) if kind_of is bool else kind_of(value)
    return fields


def rope_of_config(cfg: object) -> Rope:
    """The Rope of a model section's ``rope_*`` fields (those it has; Rope's defaults for the rest)."""
    return Rope(**{ours: getattr(cfg, key) for ours, key in FIELD_KEYS.items() if hasattr(cfg, key)})
