"""model/hf_checkpoint.py in the base venv: folders written by our own exporter and by hand (no torch).

Parity with Transformers' own models is tests/test_hf_import.py (the `hf` extra).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from experiment.errors import ConfigError, DataError
from tests.device_worker import DeviceWorker

VOCAB = 128
SHAPE = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64, init_std=0.3)


def exported(tmp_path: Path, family: str = "llama", **overrides: object) -> tuple[Path, object, object]:
    """A tiny model of ``family`` exported by eval/hf_export.py: (folder, model, model config)."""
    from eval.hf_export import write_export
    from model.registry import get_family

    fam = get_family(family)
    cfg = fam.config_cls(**{**SHAPE, **overrides})
    model = fam.init(cfg, VOCAB, seed=3)
    folder = write_export(model, cfg, VOCAB, tmp_path / family)
    return folder, model, cfg


def tensors_of(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def save(folder: Path, tensors: dict[str, np.ndarray], name: str = "model.safetensors") -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(folder / name), metadata={"format": "pt"})


@pytest.mark.parametrize("family,overrides", [
    ("llama", {"rope_scaling": "llama3", "rope_original_max_len": 32, "rope_theta": 10_000.0}),
    ("qwen2", {"tie_embeddings": True}),
    ("qwen3", {"head_dim": 16}),
    ("mistral", {}),
])
@pytest.mark.parametrize("scan_layers", [True, False])
def test_every_family_imports_what_it_exports(tmp_path: Path, family: str, overrides: dict, scan_layers: bool) -> None:
    """Exported from a scanned model (the default), imported into either layer layout; exported again
    from the import, the tensors are the same bytes."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from eval.hf_export import write_export
    from model.hf_checkpoint import load_hf_checkpoint

    folder, model, cfg = exported(tmp_path, family, **overrides)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == family
    imported = load_hf_checkpoint(folder, scan_layers=scan_layers)
    same = dataclasses.replace(imported.model_cfg, init_std=cfg.init_std, scan_layers=True)  # init_std is no HF setting
    assert (imported.family, imported.vocab_size, same) == (family, VOCAB, cfg)
    assert imported.model_cfg.scan_layers == scan_layers
    assert isinstance(imported.model().blocks, nnx.List) != scan_layers
    again = tensors_of(write_export(imported.model(), imported.model_cfg, VOCAB, tmp_path / "again"))
    first = tensors_of(folder)
    assert sorted(again) == sorted(first)
    for name, tensor in first.items():
        np.testing.assert_array_equal(again[name], tensor, err_msg=name)
    assert set(imported.source_files) == {"config.json", "model.safetensors"}
    assert all(len(h) == 64 for h in imported.source_files.values())
    tokens = jnp.asarray(np.arange(24, dtype=np.int32).reshape(2, 12) * 5 % VOCAB)
    if scan_layers:  # the same program as the exported model's
        np.testing.assert_array_equal(np.asarray(imported.model()(tokens)), np.asarray(model(tokens)))
    else:  # the loop: the same values, summed in another order
        np.testing.assert_allclose(np.asarray(imported.model()(tokens)), np.asarray(model(tokens)),
                                   rtol=1e-5, atol=1e-5)
    from model.registry import get_family

    assert get_family(family).param_count(cfg, VOCAB) == sum(leaf.size for leaf in jax.tree.leaves(imported.state))


def test_bf16_weights_stay_bf16_until_cast(tmp_path: Path) -> None:
    import jax
    import ml_dtypes

    from model.hf_checkpoint import load_hf_checkpoint

    folder, _, _ = exported(tmp_path)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors_of(folder).items()}
    save(folder, tensors)
    for dtype, want in ((None, np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        state = load_hf_checkpoint(folder, dtype).state
        assert {leaf.dtype for leaf in jax.tree.leaves(state)} == {np.dtype(want)}
        np.testing.assert_array_equal(np.asarray(state["embed"][...], np.float32),
                                      tensors["model.embed_tokens.weight"].astype(np.float32))


def test_sharded_index_imports(tmp_path: Path) -> None:
    from model.hf_checkpoint import load_hf_checkpoint

    folder, model, _ = exported(tmp_path)
    tensors = tensors_of(folder)
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save(folder, {k: tensors[k] for k in keys}, shard)
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    imported = load_hf_checkpoint(folder)
    assert set(imported.source_files) == {"config.json", "model.safetensors.index.json", *shards}
    np.testing.assert_array_equal(np.asarray(imported.state["embed"][...]), np.asarray(model.embed[...]))

    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DataError,
                       match="model.safetensors.index.json: shard 'model-00002-of-00002.safetensors' is missing"):
        load_hf_checkpoint(folder)


def test_bad_weights_are_one_line_naming_file_and_tensor(tmp_path: Path) -> None:
    from model.hf_checkpoint import load_hf_checkpoint

    folder, _, _ = exported(tmp_path)
    good = tensors_of(folder)
    weights = folder / "model.safetensors"

    save(folder, {k: v for k, v in good.items() if k != "model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(DataError, match=rf"^{weights}: tensor 'model.layers.1.mlp.up_proj.weight' is missing"):
        load_hf_checkpoint(folder)

    save(folder, {**good, "model.layers.7.mlp.up_proj.weight": good["model.norm.weight"]})
    with pytest.raises(DataError, match=rf"^{weights}: tensor 'model.layers.7.mlp.up_proj.weight' has no place"):
        load_hf_checkpoint(folder)

    save(folder, {**good, "model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)})
    with pytest.raises(DataError, match=rf"^{weights}: tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
                                        r"\(32, 32\), the config implies \(16, 32\)"):
        load_hf_checkpoint(folder)

    weights.write_bytes(b"not safetensors")
    with pytest.raises(DataError, match=rf"^{weights}: not a readable safetensors file"):
        load_hf_checkpoint(folder)
    weights.unlink()
    with pytest.raises(DataError, match="no weights"):
        load_hf_checkpoint(folder)


def test_unsupported_config_is_one_line(tmp_path: Path) -> None:
    from model.hf_checkpoint import hf_model_config, load_hf_checkpoint

    folder, _, _ = exported(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    cases = [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}},
         "rope_type 'longrope' is not supported"),
        ({"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
         "rope_type 'dynamic' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
    ]
    for change, message in cases:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ConfigError, match=f"config.json: .*{message}"):
            load_hf_checkpoint(folder)
    mistral = {**config, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}
    with pytest.raises(ConfigError, match="sliding_window=16 < max_position_embeddings=64"):
        hf_model_config({**mistral, "sliding_window": 16})
    for window in (None, 64, 4096):
        assert hf_model_config({**mistral, "sliding_window": window})[0] == "mistral"
    qwen2 = {**config, "model_type": "qwen2", "use_sliding_window": False, "sliding_window": 16}
    family, model_cfg, vocab = hf_model_config(qwen2)
    assert (family, model_cfg.qkv_bias, vocab) == ("qwen2", True, VOCAB)
    with pytest.raises(ConfigError, match="sliding_window=16 < max_position_embeddings=64"):
        hf_model_config({**qwen2, "use_sliding_window": True})
    with pytest.raises(ConfigError, match="qwen3 config: attention_bias=True is not supported"):
        hf_model_config({**config, "model_type": "qwen3", "attention_bias": True})


def test_pytorch_state_dict_without_torch_is_one_line(tmp_path: Path) -> None:
    from model.hf_checkpoint import load_hf_checkpoint

    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here (tests/test_hf_import.py reads PyTorch files)")
    except ImportError:
        pass
    folder, _, _ = exported(tmp_path)
    (folder / "model.safetensors").rename(folder / "weights.pt")
    with pytest.raises(ConfigError, match=r"weights.pt: reading a PyTorch state dict needs torch"):
        load_hf_checkpoint(folder)


def test_planner_reads_real_configs() -> None:
    """Shapes of published config.json files: Qwen3-1.7B and Llama-3.2-1B, priced without any weights."""
    from model.hf_checkpoint import hf_model_config
    from model.registry import get_family

    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 28,
             "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}
    family, cfg, vocab = hf_model_config(qwen3)
    assert (family, cfg.qk_norm, cfg.resolved_head_dim, cfg.rope_theta) == ("qwen3", True, 128, 1e6)
    assert abs(get_family(family).param_count(cfg, vocab) / 1e9 - 1.72) < 0.01  # "Qwen3-1.7B": 1.7B with embeddings
    llama = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64, "hidden_act": "silu",
             "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
             "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256}
    family, cfg, vocab = hf_model_config(llama)
    assert (family, cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_max_len) == ("llama", "llama3", 32.0, 8192)
    assert abs(get_family(family).param_count(cfg, vocab) / 1e9 - 1.236) < 0.001  # Llama-3.2-1B: 1.24B


def import_onto_8_devices(folder: str) -> int:
    """In the 8-device worker (tests/device_worker.py): import ``folder`` onto fsdp 4 x tensor 2, check every
    parameter's sharding against the axis rules; the number of parameters sharded over some mesh axis."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding

    from experiment.sections.train import MeshConfig
    from model.hf_checkpoint import load_hf_checkpoint
    from model.registry import get_family
    from model.sharding import build_mesh, logical_to_spec

    assert len(jax.devices()) == 8
    mesh_cfg = MeshConfig(data=1, fsdp=4, tensor=2)
    mesh = build_mesh(mesh_cfg)
    imported = load_hf_checkpoint(folder, mesh=mesh, rules=mesh_cfg.rules)
    rules = get_family("qwen3").mesh_rules(mesh_cfg.rules)
    sharded = 0
    for path, leaf in nnx.to_flat_state(imported.state):
        want = NamedSharding(mesh, logical_to_spec(leaf.get_metadata()["out_sharding"], rules))
        assert leaf[...].sharding.is_equivalent_to(want, leaf.ndim), (path, leaf[...].sharding, want)
        sharded += any(s is not None for s in want.spec)
    return sharded


def test_import_onto_8_devices_follows_the_axis_rules(tmp_path: Path, eight_devices: DeviceWorker) -> None:
    folder, _, _ = exported(tmp_path, "qwen3")
    # stacked: q, k, v, o, gate, up, down (each all layers in one array) and the tied embedding
    assert eight_devices.run(import_onto_8_devices, str(folder)) == 8


def test_checkpoints_from_before_the_new_model_keys_still_resume() -> None:
    from trainer.resume import check_same_run

    saved = {"model": {"family": "llama", "d_model": 64, "rope_theta": 10_000.0}, "vocab_size": 600}
    current = {"model": {"family": "llama", "d_model": 64, "rope_theta": 10_000.0, "qkv_bias": False, "qk_norm": False,
                         "rope_scaling": "none"}, "vocab_size": 600}
    check_same_run(saved, current, "x")
    with pytest.raises(DataError, match="qkv_bias: False -> True"):
        check_same_run(saved, {**current, "model": {**current["model"], "qkv_bias": True}}, "x")


def test_a_pickled_pytorch_file_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.load(weights_only=True) refuses a file that pickles objects with a page of advice (what torch
    2.6+ raises, stood in for here: the base venv has no torch); the recipe says it in one line."""
    import pickle
    import sys
    import types

    from model.hf_checkpoint import load_torch_file

    advice = ("Weights only load failed. This file can still be loaded, to do so you have 2 options, do those steps "
              "only if you trust the source of the checkpoint.\n\t(1) ... Re-running `torch.load` with `weights_only` "
              "set to `False` will likely succeed, but it can result in arbitrary code execution.\n\t(2) ...\n\t"
              "WeightsUnpickler error: Unsupported global: GLOBAL __main__.Net was not an allowed global by default."
              "\n\nCheck the documentation of torch.load to learn more.")

    def load(*args: object, **kwargs: object) -> None:
        raise pickle.UnpicklingError(advice)

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load, Tensor=type("Tensor", (), {})))
    with pytest.raises(DataError) as info:
        load_torch_file(tmp_path / "pytorch_model.bin")
    message = str(info.value)
    assert "\n" not in message and "weights_only" not in message
    assert message.startswith(f"{tmp_path / 'pytorch_model.bin'}: holds pickled Python objects besides tensors "
                              "(it pickles __main__.Net)") and "convert it to safetensors" in message
