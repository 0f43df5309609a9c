"""Hugging Face export: the files, and logits parity with Transformers' Llama in fp32 (the `hf` extra).

The parity test needs torch and transformers (`pip install -e .[hf]`; torch==2.13.0 is a CPU wheel);
where they are missing it is skipped with that reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from model.llama.config import LlamaConfig
from tests.conftest import import_extra, needs_shared, shared_data_dir

VOCAB = 97


def tiny_model(tie: bool, seed: int = 0):
    from flax import nnx

    from model.llama.model import Decoder

    # a large init so that logits are far from uniform: a wrong transpose cannot hide in the noise
    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64, init_std=0.3,
                      tie_embeddings=tie, rope_theta=500.0)
    with nnx.use_eager_sharding(False):
        model = nnx.jit(lambda: Decoder(cfg, VOCAB, nnx.Rngs(seed)))()
    return model, cfg


def test_export_writes_llama_files(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from eval.hf_export import write_export

    model, cfg = tiny_model(tie=True)
    out = write_export(model, cfg, VOCAB, tmp_path / "hf", special_ids={"pad": 0, "unk": 1, "bos": 2, "eos": 3})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == 3
    tensors = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in tensors  # tied to the embedding
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 8, 32)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 8, 32)
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (32, 48)
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], np.asarray(model.embed[...]))
    assert not list(tmp_path.glob(".hf.*")), "staging folder left behind"


@pytest.mark.parametrize("tie", [True, False])
def test_transformers_logits_match_ours(tmp_path: Path, tie: bool) -> None:
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    import jax.numpy as jnp

    from eval.hf_export import write_export

    model, cfg = tiny_model(tie=tie, seed=1)
    out = write_export(model, cfg, VOCAB, tmp_path / "hf")
    hf_model = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(3, 40)).astype(np.int32)
    ours = np.asarray(model(jnp.asarray(tokens)), np.float32)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert ours.std() > 0.5  # logits that actually vary
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_trained_checkpoint_restored_from_orbax_matches_transformers(tmp_path: Path) -> None:
    """The path recipe 05 takes: train a few real steps (trainer.step), save through Orbax with checksums,
    load the latest step back (trainer.trained_model.load_trained_model), export, and compare with Transformers."""
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    import dataclasses
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    from eval.hf_export import write_export
    from experiment.sections.train import TrainConfig
    from model.sharding import build_mesh
    from model.stacking import layout_meta
    from trainer import checkpoint
    from trainer.step import TrainProgram, global_batch
    from trainer.trained_model import load_trained_model

    _, cfg = tiny_model(tie=False)
    train_cfg = TrainConfig(steps=10, batch_size=4, warmup_steps=1, learning_rate=3e-2, keep_checkpoints=2,
                            cpu_devices=1, mesh=dataclasses.replace(TrainConfig().mesh, data=1))
    program = TrainProgram(cfg, train_cfg, VOCAB, build_mesh(train_cfg.mesh, jax.devices()[:1]), seed=3)
    state = program.init_state()
    rows = np.random.default_rng(1).integers(0, VOCAB, size=(4, 33)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    first = jax.tree.leaves(jax.tree.map(np.asarray, state["params"]))  # the step donates its input state
    for _ in range(4):
        state, _ = program.step(state, batch)
    manager = checkpoint.open_manager(tmp_path / "checkpoints", train_cfg)
    meta = {"model": dataclasses.asdict(cfg), "vocab_size": VOCAB, "tokenizer_sha256": "0" * 64, "seq_len": 32,
            "layout": layout_meta(cfg.scan_layers)}  # as the trainer records it
    checkpoint.save(manager, 4, state, {}, {}, meta, force=True)
    manager.wait_until_finished()
    manager.close()

    model, step, _ = load_trained_model(SimpleNamespace(checkpoints=tmp_path / "checkpoints"))
    assert step == 4
    trained = jax.tree.leaves(jax.tree.map(np.asarray, state["params"]))
    assert any(not np.array_equal(a, b) for a, b in zip(trained, first, strict=True))  # it did train
    from flax import nnx

    restored = jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(model, nnx.Param)))
    for a, b in zip(restored, trained, strict=True):
        np.testing.assert_array_equal(a, b)  # Orbax gave back exactly what was trained
    out = write_export(model, cfg, VOCAB, tmp_path / "hf")
    hf_model = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    tokens = np.random.default_rng(2).integers(0, VOCAB, size=(2, 32)).astype(np.int32)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(theirs, np.asarray(model(jnp.asarray(tokens)), np.float32), atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def russian_tokenizer() -> tuple[object, object, Path]:
    """A SentencePiece BPE (the default model type) trained on a Pushkin novel, its special ids, and the novel."""
    import sentencepiece as spm

    from experiment.sections.tokenizer import TokenizerConfig
    from tokenizer.train import special_ids, train_sentencepiece, trainer_options

    novel = shared_data_dir() / "text" / "ruslit" / "prose" / "Pushkin" / "Капитанская дочка.txt"
    needs_shared(novel)
    lines = [line for line in novel.read_text(encoding="utf-8").splitlines() if line.strip()][:800]
    tok_cfg = TokenizerConfig(vocab_size=600, model_type="bpe")
    sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(iter(lines), trainer_options(tok_cfg, 0)))
    return sp, special_ids(tok_cfg), novel


@pytest.mark.parametrize("family,overrides", [("llama", {}), ("mistral", {}), ("qwen2", {"tie_embeddings": True}),
                                              ("qwen3", {"head_dim": 16}), ("gemma3", {"head_dim": 8})])
def test_every_familys_export_round_trips_through_autotokenizer(tmp_path: Path, russian_tokenizer: tuple,
                                                                family: str, overrides: dict) -> None:
    """AutoTokenizer on each family's export gives our ids and text back on unseen Russian: transformers picks a
    model type's own tokenizer class for some types (qwen2's byte-level Qwen2Tokenizer encoded Russian into
    byte pieces before the export named its class); AutoModelForCausalLM loads the same folder."""
    transformers = import_extra("transformers", "hf")
    from eval.hf_export import write_export
    from model.registry import get_family

    sp, ids, novel = russian_tokenizer
    fam = get_family(family)
    cfg = fam.config_cls(**{**dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64),
                            **overrides})
    ours_model = fam.init(cfg, sp.get_piece_size(), seed=0)
    out = write_export(ours_model, cfg, sp.get_piece_size(), tmp_path / family, sp=sp, special_ids=ids)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert type(hf_tok).__name__ != "Qwen2Tokenizer"
    unseen = (novel.parent / "Дубровский.txt").read_text(encoding="utf-8").splitlines()[10:15]
    for text in unseen + ["Ёжик в тумане, 2024 год!", "  два пробела\nи перевод строки"]:
        encoded = hf_tok.encode(text, add_special_tokens=False)
        assert encoded == sp.encode(text), (family, text)
        assert hf_tok.decode(encoded) == sp.decode(encoded)  # the normalized text (no-break spaces become spaces)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert model.config.vocab_size == sp.get_piece_size()
    # the exported model continues a Russian prompt (encoded by AutoTokenizer) with our greedy tokens
    torch = import_extra("torch", "hf")
    from model.generate import generate

    prompt = hf_tok.encode("Ёжик в тумане шёл по лесу", add_special_tokens=False)
    theirs = model.float().generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    ours = generate(ours_model, [prompt], 12).tokens[0]
    assert theirs[0, len(prompt):].tolist() == ours, family


def test_a_continued_run_exports_the_base_models_context(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A base built for 64 positions trained at 16 exports as a 64-position model, and says why; a run trained
    longer than its base declares its own length only with model.extend_context (without it the export used to
    raise the limit silently: it keeps the base's and warns); a run from scratch declares model.max_seq_len."""
    import dataclasses
    import logging

    from eval.hf_export import write_export

    model, cfg = tiny_model(tie=True)
    short = dataclasses.replace(cfg, max_seq_len=16)
    with caplog.at_level(logging.INFO, logger="eval.hf_export"):
        out = write_export(model, short, VOCAB, tmp_path / "a", base_context=64)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 64
    assert "max_position_embeddings 64: the base model's, which the run trained at model.max_seq_len 16" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="eval.hf_export"):
        out = write_export(model, cfg, VOCAB, tmp_path / "b", base_context=32)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 32
    assert "trained at model.max_seq_len 64 past it without model.extend_context" in caplog.text
    extended = dataclasses.replace(cfg, extend_context=True)
    out = write_export(model, extended, VOCAB, tmp_path / "b2", base_context=32)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 64
    out = write_export(model, short, VOCAB, tmp_path / "c")
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 16


@pytest.mark.parametrize("tie", [True, False])
def test_llama_adapter_imports_a_transformers_model(tie: bool) -> None:
    """The Llama family's HF import on a random Transformers Llama (GQA, randomised norms): our logits match."""
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    import jax.numpy as jnp
    from flax import nnx

    from model.registry import get_family

    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, tie_word_embeddings=tie, rope_theta=500.0)
    hf_model = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, tensor in hf_model.named_parameters():
            tensor.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)  # norms too: a skipped one would show
    state_dict = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    llama = get_family("llama")
    model_cfg, params = llama.hf_adapter.import_(hf_cfg.to_dict(), state_dict)
    assert (model_cfg.n_kv_heads, model_cfg.tie_embeddings, model_cfg.rope_theta) == (2, tie, 500.0)
    model = nnx.merge(nnx.graphdef(llama.abstract(model_cfg, VOCAB)), params)
    tokens = np.random.default_rng(3).integers(0, VOCAB, size=(2, 24)).astype(np.int32)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(tokens)), np.float32), theirs, atol=1e-4, rtol=0)
