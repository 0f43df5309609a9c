"""KV-cache size per token: multi-head latent attention (``deepseek_v3``) against grouped-query attention (``llama``)
of the same width and depth, how exactly each cache reproduces the full forward pass, and how fast a decode step
over the latent cache runs absorbed (attending in the latent space) against expanded (keys and values made from
every cached latent at each step).

    python bench/bench_kv_cache.py                 # JSON on stdout
    python bench/bench_kv_cache.py --out results/kv_cache.json --rounds 3

Sizes come from ``model.kv_cache.init_cache`` traced abstractly (``jax.eval_shape``: nothing allocated) for one
row of 1,024 slots in bf16, divided by the slots: what one token costs in every layer's cache. The DeepSeek-V3
preset (61 layers, d_model 7168; the latent 512 + rope key 64 per token and layer) is set against a Llama of its
width and depth with Llama 3's grouped-query layout at that width (56 heads of 128, 8 KV heads) and with
every head its own keys and values (56 KV heads). Exactness: at each family's tiny shape, a cached prefill of 13
tokens and 8 decode steps of one against the full forward pass of the 21 tokens (max |logit difference|).
Decode speed: GigaChat 3 Lightning's attention and experts (``gigachat3-lightning``: d_model 1536, 32 heads, latent
512 + rope 64, values 192) over two layers (one dense, one MoE), fp32, one row; a cache filled to S - 8 tokens by
one prefill (``mla_decode: auto``), then 8 one-token steps timed (jitted, after a warm-up), each form once per
round in rotating order (bench/interleave.py); the steps' logits of the two forms compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from interleave import cpu_model, interleaved_rounds, median_ratio, medians  # noqa: E402


def bytes_per_token(model_cfg: Any, vocab: int = 1024, slots: int = 1024) -> int:
    import jax
    import jax.numpy as jnp

    from model.kv_cache import init_cache
    from model.registry import family_of

    family = family_of(model_cfg)
    model = family.abstract(model_cfg, vocab)
    cache = jax.eval_shape(lambda: init_cache(model, 1, slots, dtype=jnp.bfloat16))
    return int((cache.k.size + cache.v.size) * 2 // slots)


def cached_vs_full(family_name: str) -> float:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from model.kv_cache import cached_logits
    from model.registry import get_family

    family = get_family(family_name)
    model = family.init(family.tiny_config(), 97, seed=0)
    tokens = np.random.default_rng(0).integers(1, 97, size=(1, 21)).astype(np.int32)
    full = np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens)))
    return float(np.abs(np.asarray(cached_logits(model, tokens, 13)[0]) - full).max())


def decode_speed(cache_len: int, rounds: int, steps: int = 8) -> dict[str, Any]:
    """Seconds per one-token decode step, absorbed against expanded, with the cache filled to ``cache_len``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from experiment.presets import preset_model_config
    from model.kv_cache import init_cache
    from model.registry import get_family

    family = get_family("deepseek_v3")
    base = dataclasses.replace(preset_model_config("gigachat3-lightning", "deepseek_v3"), n_layers=2,
                               first_k_dense=1, mtp_layers=0, max_seq_len=cache_len)
    tokens = np.random.default_rng(0).integers(0, 1024, size=(1, cache_len)).astype(np.int32)
    prefill_len = cache_len - steps
    runs, logits = {}, {}
    decode = nnx.jit(lambda m, t, c: m.decode(t, c))
    # one prefill for both (mla_decode auto: expanded at this length), the same weights (seed 0) in every model
    prefiller = family.init(base, 1024, seed=0)
    _, filled = decode(prefiller, jnp.asarray(tokens[:, :prefill_len]), init_cache(prefiller, 1, cache_len))
    for form in ("absorbed", "expanded"):
        model = family.init(dataclasses.replace(base, mla_decode=form), 1024, seed=0)

        def run(model: Any = model, decode: Any = decode, filled: Any = filled, form: str = form) -> float:
            cache, out = filled, []
            start = time.perf_counter()
            for i in range(prefill_len, cache_len):
                step, cache = decode(model, jnp.asarray(tokens[:, i:i + 1]), cache)
                out.append(step)
            jax.block_until_ready(out)
            logits[form] = np.concatenate([np.asarray(x) for x in out], axis=1)
            return (time.perf_counter() - start) / steps

        run()  # compile and warm up
        runs[form] = run
    times = interleaved_rounds(runs, rounds)
    return {"cache_len": cache_len, "steps_timed": steps, "s_per_step_median": medians(times, 5),
            "s_per_step": {k: [round(v, 5) for v in vs] for k, vs in times.items()},
            "expanded_over_absorbed": median_ratio(times["expanded"], times["absorbed"], 2),
            "max_abs_logit_diff": float(np.abs(logits["absorbed"] - logits["expanded"]).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-lens", type=int, nargs="+", default=[512, 4096])
    args = parser.parse_args()
    from experiment.presets import preset_model_config
    from model.llama.config import LlamaConfig

    ds = preset_model_config("deepseek-v3", "deepseek_v3")
    gqa = LlamaConfig(d_model=ds.d_model, n_layers=ds.n_layers, n_heads=56, n_kv_heads=8, head_dim=128, d_ff=18432,
                      max_seq_len=4096)
    rows = {"deepseek_v3 (latent 512 + rope key 64)": bytes_per_token(ds),
            "llama, 8 KV heads of 128": bytes_per_token(gqa),
            "llama, 56 KV heads of 128": bytes_per_token(dataclasses.replace(gqa, n_kv_heads=56))}
    load_before = os.getloadavg()[0]
    out = {"bytes_per_token_bf16": rows, "layers": ds.n_layers, "d_model": ds.d_model,
           "max_abs_logit_diff_cached_vs_full": {name: cached_vs_full(name) for name in ("deepseek_v3", "llama")},
           "decode_absorbed_vs_expanded": [decode_speed(n, args.rounds) for n in args.cache_lens],
           "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "load_average_before": load_before,
           "load_average_after": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
