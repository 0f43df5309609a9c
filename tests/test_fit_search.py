"""The fit search's choices without a compiler: accumulation splits, the jump after an out-of-memory
compile, the ranking of fitting settings, the hand-counted recompute of each setting, and the context splits
it tries when nothing fits with whole sequences per chip."""

from __future__ import annotations

import dataclasses

import pytest

from experiment.sections.train import MeshConfig, TrainConfig
from model.family import get_family
from model.gemma3.config import Gemma3Config
from model.llama.config import LlamaConfig
from model.llama.flops import forward_flops_per_token, recompute_flops, train_flops_per_token
from trainer.fit_check import (
    ContextSplit,
    Setting,
    accumulation_splits,
    best_setting,
    context_candidates,
    next_split,
    search_table,
    setting_costs,
    setting_of,
)


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


LONG = LlamaConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=131072)


def splits_of(candidates: list[ContextSplit]) -> list[tuple[int, int, int]]:
    return [(c.parts, c.data, c.fsdp) for c in candidates]


def test_context_splits_take_their_chips_from_fsdp_first_and_shard_the_state_over_them() -> None:
    """fsdp 32 on 32 chips, one sequence per chip (the batch of 32): context N leaves fsdp 32 / N, so fsdp x context,
    which the parameters and optimizer state are sharded over (embed gains the context axis), stays 32."""
    train = TrainConfig(batch_size=32, mesh=MeshConfig(data=1, fsdp=32))
    candidates, why = context_candidates(LONG, train, 131072, devices=32)
    assert why == ""
    assert splits_of(candidates) == [(n, 1, 32 // n) for n in (2, 4, 8, 16, 32)]
    assert all(c.attention == "ring" and c.embed == ("fsdp", "context") for c in candidates)
    # one sequence a step: only the split over every chip leaves one data-parallel device, which 1 row divides
    one = dataclasses.replace(train, batch_size=1)
    assert splits_of(context_candidates(LONG, one, 131072, devices=32)[0]) == [(32, 1, 1)]
    # data-parallel replicas (data 4 x fsdp 8) give their chips first, fsdp after; a batch of 4 rules out the splits
    # that leave more than 4 data-parallel devices (context 2 and 4)
    replicas = TrainConfig(batch_size=4, mesh=MeshConfig(data=-1, fsdp=8))
    assert splits_of(context_candidates(LONG, replicas, 131072, devices=32)[0]) == [(8, 1, 4), (16, 1, 2), (32, 1, 1)]
    assert splits_of(context_candidates(LONG, dataclasses.replace(replicas, batch_size=16), 131072, 32)[0])[:2] == [
        (2, 2, 8), (4, 1, 8)]


def test_context_splits_keep_tensor_parallelism_and_need_the_sequence_to_cut() -> None:
    """tensor 4 stays: the sequence splits over the other 8 chips; a length that does not cut into 2N chunks
    (model/context.py's load balance) rules N out; a configured context axis is the floor."""
    train = TrainConfig(batch_size=8, mesh=MeshConfig(data=1, fsdp=8, tensor=4))
    assert splits_of(context_candidates(LONG, train, 131072, devices=32)[0]) == [(2, 1, 4), (4, 1, 2), (8, 1, 1)]
    assert splits_of(context_candidates(LONG, train, 12, devices=32)[0]) == [(2, 1, 4)]  # 12 = 3 x 4: N = 2 only
    configured = TrainConfig(batch_size=8, mesh=MeshConfig(data=1, fsdp=4, axes={"context": 2},
                                                           rules={"length": ["context"]}))
    assert splits_of(context_candidates(LONG, configured, 131072, devices=8)[0]) == [(4, 1, 2), (8, 1, 1)]


def test_no_context_split_for_a_family_without_it_or_a_batch_that_cannot_split() -> None:
    gemma = Gemma3Config(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=131072)
    candidates, why = context_candidates(gemma, TrainConfig(batch_size=1, mesh=MeshConfig(fsdp=32)), 131072, 32)
    assert candidates == [] and "gemma3 family's decoder does not split a sequence" in why
    odd = TrainConfig(batch_size=3, mesh=MeshConfig(data=1, fsdp=32))
    candidates, why = context_candidates(LONG, odd, 12, devices=32)  # N = 2 leaves 16 data-parallel devices
    assert candidates == [] and "cuts the sequence of 12 into 2 x N chunks" in why and "batch of 3" in why
    candidates, why = context_candidates(LONG, odd, 131072, devices=24)  # fsdp 32 does not divide 24 chips
    assert candidates == [] and "but 24 are available" in why


def test_a_context_splits_overrides_are_the_config_keys_that_reproduce_it() -> None:
    split = ContextSplit(8, "ring", 1, 4, ("fsdp", "context"))
    setting = Setting("full", "auto", 1, split)
    assert setting.overrides() == [
        "model.remat=full", "model.attention=auto", "train.grad_accum_steps=1", "train.mesh.data=1",
        "train.mesh.fsdp=4", "train.mesh.axes.context=8", "train.mesh.rules.embed=[fsdp,context]",
        "model.context_attention=ring"]
    mesh = split.mesh(MeshConfig(data=1, fsdp=32, rules={"act_heads": []}))
    assert (mesh.data, mesh.fsdp, mesh.axes) == (1, 4, {"context": 8})
    assert mesh.rules == {"act_heads": [], "length": ["context"], "embed": ["fsdp", "context"]}
    # a report (JSON: the tuple comes back a list) gives the setting back
    report = {"remat": "full", "attention": "auto", "grad_accum_steps": 1, "context": dataclasses.asdict(split)}
    report["context"]["embed"] = list(split.embed)
    assert setting_of(report) == setting
    assert setting_of({**report, "context": None}).context is None


def test_the_best_context_row_splits_over_the_fewest_chips_then_takes_the_least_memory() -> None:
    def row(parts: int, attention: str, needed: float, fits: bool = True) -> dict:
        return {"remat": "full", "grad_accum_steps": 1, "recompute_factor": 1.4, "needed_gib": needed, "fits": fits,
                "context_parts": parts, "context_attention": attention, "attention_kernel": "splash",
                "micro_batch_per_device": 1, "model_flops_per_step": 1e15}

    rows = [row(1, "", 40.0, fits=False), row(8, "ring", 20.0, fits=False), row(16, "ring", 18.0),
            row(16, "all_gather", 26.0), row(32, "ring", 9.0)]
    best = best_setting(rows)
    assert (best["context_parts"], best["context_attention"]) == (16, "ring")
    rows[3]["needed_gib"] = 17.0
    assert best_setting(rows)["context_attention"] == "all_gather"
    for r in rows:
        r["best"] = r is best
    table = search_table(rows).splitlines()
    assert "| 16 ring |" in table[4] and "**best**" in table[4] and "| - |" in table[2]
