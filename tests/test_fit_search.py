"""The fit search's choices without a compiler: accumulation splits, the jump after an out-of-memory
compile, the ranking of fitting settings, and the hand-counted recompute of each setting."""

from __future__ import annotations

import dataclasses

import pytest

from experiment.sections.train import TrainConfig
from model.family import get_family
from model.llama.config import LlamaConfig
from model.llama.flops import forward_flops_per_token, recompute_flops, train_flops_per_token
from trainer.fit_check import accumulation_splits, best_setting, next_split, search_table, setting_costs


def test_accumulation_splits_keep_the_micro_batch_divisible() -> None:
    assert accumulation_splits(TrainConfig(batch_size=128), data_parts=8) == [1, 2, 4, 8, 16]
    assert accumulation_splits(TrainConfig(batch_size=48), data_parts=16) == [1, 3]


def test_next_split_jumps_by_the_compilers_temporaries() -> None:
    splits = [1, 2, 4, 8, 16]
    oom = {"capacity_gib": 31.24, "error": "RESOURCE_EXHAUSTED: ... HLO temporaries (196.12G) exceeds available HBM"}
    assert next_split(splits, 1, oom) == 8  # 196 GiB / 31 GiB: a micro-batch 7x smaller at least
    over = {"capacity_gib": 31.24, "argument_gib": 1.10, "temp_gib": 31.25}
    assert next_split(splits, 1, over) == 2  # just over: the next split
    assert next_split(splits, 4, {"capacity_gib": 15.75, "error": "no figure"}) == 8
    assert next_split(splits, 16, over) is None


def test_best_is_fewest_micro_batches_then_least_recompute_then_least_memory() -> None:
    rows = [
        {"remat": "none", "grad_accum_steps": 2, "recompute_factor": 1.05, "needed_gib": 20.0, "fits": True},
        {"remat": "save_dots", "grad_accum_steps": 1, "recompute_factor": 1.10, "needed_gib": 25.0, "fits": True},
        {"remat": "offload", "grad_accum_steps": 1, "recompute_factor": 1.10, "needed_gib": 22.0, "fits": True},
        {"remat": "full", "grad_accum_steps": 1, "recompute_factor": 1.36, "needed_gib": 12.0, "fits": True},
        {"remat": "none", "grad_accum_steps": 1, "recompute_factor": 1.05, "fits": False,
         "error": "RESOURCE_EXHAUSTED: ..."},
    ]
    assert best_setting(rows)["remat"] == "offload"
    assert best_setting([rows[-1]]) is None
    for row in rows:
        row.update(attention_kernel="splash", micro_batch_per_device=16 // row["grad_accum_steps"],
                   model_flops_per_step=1e15, best=row is rows[2])
    table = search_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and "**best**" in table[4] and "no (OOM)" in table[-1]


def test_recompute_of_each_setting_by_hand() -> None:
    cfg = LlamaConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=256)
    vocab, t = 1000, 256
    attention = 2 * 2 * t * 4 * 16 * 2
    head = 2 * 64 * vocab
    blocks = forward_flops_per_token(cfg, vocab, t) - head
    assert recompute_flops(cfg, vocab, t, "dot_product") == 0
    assert recompute_flops(cfg, vocab, t, "splash") == attention / 2
    for remat, extra in (("full", blocks), ("save_dots", attention), ("offload", attention)):
        assert recompute_flops(dataclasses.replace(cfg, remat=remat), vocab, t, "einsum") == extra
    # the chunked loss's recompute of the output head is the trainer's to add, once, for every family
    llama = get_family("llama")
    for chunk, extra in ((64, head), (0, 0.0), (t, 0.0)):
        _, model, hardware = llama.train_costs(cfg, vocab, t, "cpu", "float32", chunk)
        assert hardware - model == extra
    costs = setting_costs(dataclasses.replace(cfg, remat="full"), TrainConfig(batch_size=4, loss_chunk_len=64),
                          vocab, t, "tpu")
    assert costs["attention_kernel"] == "splash"
    assert costs["model_flops_per_step"] == train_flops_per_token(cfg, vocab, t) * 4 * t
    model = train_flops_per_token(cfg, vocab, t)
    assert costs["recompute_factor"] == pytest.approx((model + blocks + attention / 2 + head) / model)
