"""RoPE scalings (experiment/sections/rope.py) without torch or JAX: the inverse frequencies of linear, llama3
and YaRN scaling against hand computations, the ``model.rope_*`` keys' validation (one line naming the key), and
the reading of the Hugging Face ``rope_parameters`` / ``rope_scaling`` entries."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.sections.rope import Rope, rope_from_hf, rope_to_hf

TINY = Path(__file__).resolve().parent / "configs" / "tiny.yaml"
# base 10,000 over a head of 8: inverse wavelengths 1, 0.1, 0.01, 0.001, wavelengths 2 pi times 1, 10, 100, 1000
PLAIN = [1.0, 0.1, 0.01, 0.001]


def test_linear_divides_every_frequency_by_the_factor() -> None:
    np.testing.assert_allclose(Rope(10_000.0, "linear", factor=4.0).frequencies(8), [0.25, 0.025, 0.0025, 0.00025],
                               rtol=1e-6)
    np.testing.assert_allclose(Rope(10_000.0).frequencies(8), PLAIN, rtol=1e-6)
    assert Rope(10_000.0, "linear", factor=4.0).attention_factor() == 1.0


def test_llama3_keeps_short_wavelengths_slows_long_ones_and_ramps_between() -> None:
    """Original context 1,000, low/high frequency factors 1 and 4: wavelengths below 1000 / 4 = 250 kept (6.3, 63),
    above 1000 slowed 8x (6,283); 628 between, mixed with weight s = (1000 / 628.3 - 1) / (4 - 1) = 0.19718 on the
    kept frequency: 0.01 (0.80282 / 8 + 0.19718) = 0.0029753."""
    rope = Rope(10_000.0, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=1000)
    np.testing.assert_allclose(rope.frequencies(8), [1.0, 0.1, 0.0029753, 0.001 / 8], rtol=1e-4)


def test_yarn_ramps_by_dimension_and_scales_sin_and_cos() -> None:
    """Original context 1,000, beta 32 / 1, factor 4: dimension i turns 1000 f_i / (2 pi) times, so the ramp runs
    from floor(4 ln(1000 / (2 pi 32)) / ln 10^4) = floor(0.697) = 0 to ceil(4 ln(1000 / (2 pi)) / ln 10^4) =
    ceil(2.20) = 3: weights 0, 1/3, 2/3, 1 on f / 4, giving 1, 0.1 (1/12 + 2/3), 0.01 (2/12 + 1/3), 0.001 / 4;
    sin and cos are scaled by 0.1 ln 4 + 1 unless the attention factor is given."""
    rope = Rope(10_000.0, "yarn", factor=4.0, original_max_len=1000, beta_fast=32.0, beta_slow=1.0)
    np.testing.assert_allclose(rope.frequencies(8), [1.0, 0.075, 0.005, 0.00025], rtol=1e-6)
    assert rope.attention_factor() == pytest.approx(0.1 * math.log(4) + 1)
    assert Rope(10_000.0, "yarn", factor=4.0, yarn_attention_factor=1.5).attention_factor() == 1.5
    # without rounding the ramp runs from 0.69668 to 2.20179: dimension 1 weighs (1 - 0.69668) / 1.50511 = 0.20153
    # on f / 4, giving 0.1 (0.20153 / 4 + 0.79847) = 0.084885
    unrounded = Rope(10_000.0, "yarn", factor=4.0, original_max_len=1000, truncate=False).frequencies(8)
    assert unrounded[1] == pytest.approx(0.084885, rel=1e-4)


def test_rope_keys_load_for_llama_and_qwen3() -> None:
    cfg = load_config(TINY, ['model={"family": "qwen3", "rope_scaling": "yarn", "rope_factor": 4.0, '
                             '"rope_original_max_len": 4096, "rope_theta": 5e5}']).model
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_max_len, cfg.rope_theta) == ("yarn", 4.0, 4096, 5e5)
    assert load_config(TINY, ['model={"family": "llama", "rope_scaling": "linear", "rope_factor": 2}']
                       ).model.rope_scaling == "linear"


@pytest.mark.parametrize(("fields", "message"), [
    ({"rope_scaling": "dynamic"}, "config key 'model.rope_scaling'"),
    ({"rope_scaling": "linear", "rope_factor": 0.5}, "config key 'model.rope_factor': linear RoPE scaling needs a "
                                                     "factor >= 1, got 0.5"),
    ({"rope_scaling": "yarn", "rope_original_max_len": 0}, "config key 'model.rope_original_max_len': yarn needs"),
    ({"rope_scaling": "yarn", "rope_beta_fast": 1, "rope_beta_slow": 2}, "config key 'model.rope_beta_fast': yarn "
                                                                         "needs rope_beta_fast > rope_beta_slow > 0"),
    ({"rope_scaling": "yarn", "rope_attention_factor": -1}, "config key 'model.rope_attention_factor'"),
    ({"rope_scaling": "llama3", "rope_low_freq_factor": 4, "rope_high_freq_factor": 4},
     "config key 'model.rope_high_freq_factor': llama3 needs"),
    ({"rope_theta": 0}, "config key 'model.rope_theta': must be positive"),
])
def test_bad_rope_keys_are_one_line_naming_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(TINY, [f"model={json.dumps({'family': 'llama', **fields})}"])
    assert "\n" not in str(caught.value)


def test_hf_rope_entries_of_both_transformers_generations() -> None:
    where = "Hugging Face llama config"
    # Transformers 4: rope_theta beside rope_scaling with the older "type" key; the original context defaults to
    # max_position_embeddings as Transformers' standardize_rope_params does
    legacy = {"rope_theta": 5e5, "max_position_embeddings": 8192, "rope_scaling": {"type": "yarn", "factor": 4.0}}
    assert rope_from_hf(legacy, where) == {"rope_theta": 5e5, "rope_scaling": "yarn", "rope_factor": 4.0,
                                           "rope_original_max_len": 8192}
    current = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    fields = rope_from_hf(current, where)
    assert fields == {"rope_theta": 5e5, "rope_scaling": "llama3", "rope_factor": 8.0, "rope_low_freq_factor": 1.0,
                      "rope_high_freq_factor": 4.0, "rope_original_max_len": 8192}
    assert rope_to_hf(Rope(5e5, "llama3", 8.0, 1.0, 4.0, 8192)) == current["rope_parameters"]
    with pytest.raises(ConfigError, match=f"^{where}: rope_scaling of type linear lacks 'factor'$"):
        rope_from_hf({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, where)
    with pytest.raises(ConfigError, match=r"rope_type 'dynamic' is not supported \(only default, linear, llama3 and "
                                          r"yarn\)"):
        rope_from_hf({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, where)
    with pytest.raises(ConfigError, match="partial_rotary_factor is not supported"):
        rope_from_hf({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, where)


def test_a_stage_may_change_ropes_frequencies_but_not_how_the_weights_pair_its_dimensions() -> None:
    """A stage (train.branch_data=own) starts from checkpoints made at another RoPE base, scaling and length; the
    pairing of a head's RoPE dimensions (deepseek_v3's rope_interleave) or their number is the weights' own."""
    from experiment.errors import DataError
    from model.deepseek_v3.config import DeepseekV3Config
    from trainer.resume import check_same_run

    def meta(**changes: object) -> dict:
        model = {"family": "deepseek_v3", **dataclasses.asdict(dataclasses.replace(DeepseekV3Config(), **changes))}
        return {"model": model, "vocab_size": 64, "tokenizer_sha256": "t", "seq_len": 128, "param_dtype": "float32"}

    longer = meta(max_seq_len=4096, rope_theta=500_000.0, rope_scaling="yarn", rope_factor=4.0)
    check_same_run(meta(), {**longer, "seq_len": 4096}, "parent", stage=True)
    with pytest.raises(DataError, match="different model"):
        check_same_run(meta(), {**longer, "seq_len": 4096}, "parent")  # a resume or a decay branch: no
    with pytest.raises(DataError, match="rope_interleave"):
        check_same_run(meta(), meta(rope_interleave=not DeepseekV3Config().rope_interleave), "parent", stage=True)
