"""The family contract, checked the same way for every family that ships and the toy plugin family.

Each family runs at its own tiny shape (``ModelFamily.tiny``; tests/tiny_models.py: every parameter moved by
N(0, 0.2), the same parameters in both layer layouts):

- the forward pass gives finite float32 logits [B, T, V], and the scanned layout the unrolled one's (within 1e-5);
- text generation with the KV cache (model/generate.py, model/kv_cache.py) gives the full forward pass's logits
  (a left-padded row too), and its greedy tokens for prompts of different lengths are greedy decoding by full
  forward passes; a family without cached decoding says so in one line;
- a train step sharded over 8 devices (data 2 x fsdp 2 x tensor 2, the ``eight_devices`` worker) gives the
  one-device step's loss and gradient norm;
- where the family has a Hugging Face adapter: export, then import, gives identical tensors in either layout and
  the same model config (Transformers itself is not needed; tests/test_hf_import.py compares with it);
- the parameters other stages reach into are the family's to name (``ModelFamily.roles``): a family whose
  embedding table is called otherwise trains only it under ``train.trainable: embeddings``, and a role that names
  no such parameter is one ConfigError at registration; a model section must subclass ``ModelSection``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.errors import ConfigError
from experiment.sections.model import register_model_section
from experiment.sections.train import MeshConfig, TrainConfig
from model.family import ParamRoles, check_roles, register_family
from model.generate import check_decodes, generate
from model.kv_cache import cached_logits, init_cache
from model.loss import output_logits
from model.registry import families, get_family
from model.sharding import build_mesh
from model.stacking import path_keys, scan_layers, stacked
from tests.device_worker import DeviceWorker
from tests.tiny_models import VOCAB, contract_families, hf_families, tiny_model, tiny_pair
from tests.toy_family import TOY, ToyBlock, ToyConfig, _norm, _param
from trainer.step import TrainProgram, global_batch

FAMILIES = contract_families()
SEQ = 16
NEW = 6  # generated tokens compared with full forward passes


def flat(tree: Any) -> dict[str, np.ndarray]:
    """A parameter tree (``nnx.State`` or pure dict) as ``path -> array``."""
    pure = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
    return {"/".join(map(str, path_keys(path))): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_are_finite_and_the_scanned_layout_gives_the_unrolled_ones(family: str) -> None:
    unrolled, scanned = tiny_pair(family)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (2, SEQ)), jnp.int32)
    segments = jnp.asarray(np.repeat([[1, 2]], SEQ // 2, axis=1).repeat(2, axis=0), jnp.int32)  # two documents
    forward = nnx.jit(lambda m, t, s: m(t, s))
    got, want = np.asarray(forward(scanned, tokens, segments)), np.asarray(forward(unrolled, tokens, segments))
    assert got.shape == (2, SEQ, VOCAB) and got.dtype == np.float32 and np.isfinite(got).all()
    assert got.std() > 0.3  # logits that vary: a difference cannot hide
    print(f"{family}: max |scanned - unrolled| {np.abs(got - want).max():.1e}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_decoding_equals_full_forward_passes(family: str, scan_layers: bool) -> None:
    model = tiny_model(family, scan_layers)
    try:
        check_decodes(model)
    except ConfigError as exc:  # optional (model.family.CachedDecoding): generation says it cannot, in one line
        assert "no KV-cache decoding" in str(exc) and "\n" not in str(exc)
        with pytest.raises(ConfigError, match="no KV-cache decoding"):
            generate(model, [[1, 2]], 2)
        return
    rng = np.random.default_rng(0)
    forward = nnx.jit(lambda m, t: m(t))

    # the cached prefill of 13 tokens and 8 decode steps of one give the full forward pass's logits; row 1 is
    # left-padded by 3: its sequence is tokens[1, 3:], whose logits a forward pass of its own gives
    tokens = rng.integers(1, VOCAB, size=(2, 21)).astype(np.int32)
    full = np.asarray(forward(model, jnp.asarray(tokens)))
    padded = tokens.copy()
    padded[1, :3] = 0
    cached, cache = cached_logits(model, padded, 13, init_cache(model, 2, 32, start=np.asarray([0, 3], np.int32)))
    cached = np.asarray(cached)
    assert int(cache.index) == tokens.shape[1]
    np.testing.assert_allclose(cached[0], full[0], atol=1e-5, rtol=0)
    alone = np.asarray(forward(model, jnp.asarray(tokens[1:, 3:])))
    np.testing.assert_allclose(cached[1, 3:], alone[0], atol=1e-5, rtol=0)

    # greedy generation of a batch of prompts of different lengths (left-padded into one batch, with the cache) =
    # greedy decoding by full forward passes, the prompts right-padded into one array (causal attention never
    # reads the slots after the position it predicts from)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in (3, 9, 6)]
    generated = generate(model, prompts, NEW)
    assert generated.finished == ["length"] * 3
    rows = np.zeros((3, max(map(len, prompts)) + NEW), np.int32)
    for row, ids in enumerate(prompts):
        rows[row, :len(ids)] = ids
    for k in range(NEW):
        logits = np.asarray(forward(model, jnp.asarray(rows)))
        for row, ids in enumerate(prompts):
            rows[row, len(ids) + k] = int(np.argmax(logits[row, len(ids) + k - 1]))
    reference = [rows[row, len(ids):len(ids) + NEW].tolist() for row, ids in enumerate(prompts)]
    assert generated.tokens == reference


def train_steps_on_8_devices(family: str) -> dict[str, Any]:
    """In the 8-device worker: two train steps of the family's tiny shape on data 2 x fsdp 2 x tensor 2 and on one
    device, from the same step-0 parameters and batches: the losses, gradient norms, and how many parameters the
    mesh split."""
    fam = get_family(family)
    cfg = fam.tiny_config()
    train = TrainConfig(steps=10, batch_size=8, learning_rate=1e-2, warmup_steps=1,
                        mesh=MeshConfig(fsdp=2, tensor=2))
    one = dataclasses.replace(train, mesh=MeshConfig(data=1))
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, VOCAB, (8, SEQ + 1)).astype(np.int32) for _ in range(2)]
    out: dict[str, Any] = {"devices": jax.device_count()}
    for name, train_cfg, devices in (("mesh", train, None), ("one", one, jax.devices()[:1])):
        rules = fam.mesh_rules(train_cfg.mesh.rules)  # a family's own axes (expert) at size 1
        program = TrainProgram(cfg, train_cfg, VOCAB, build_mesh(train_cfg.mesh, devices, rules), seed=0)
        state = program.init_state()
        metrics = []
        for rows in batches:
            state, m = program.step(state, global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]},
                                                        program.batch_sharding))
            metrics.append({k: float(m[k]) for k in ("loss", "grad_norm")})
        out[name] = metrics
        out[f"{name}_mesh"] = dict(program.mesh.shape)
        out[f"{name}_split"] = sum(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state["params"]))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_train_step_sharded_over_8_devices_gives_the_one_device_loss(family: str,
                                                                      eight_devices: DeviceWorker) -> None:
    out = eight_devices.run(train_steps_on_8_devices, family)
    assert out["devices"] == 8
    assert {axis: size for axis, size in out["mesh_mesh"].items() if size > 1} == {"data": 2, "fsdp": 2, "tensor": 2}
    assert out["mesh_split"] > 0 and out["one_split"] == 0  # the mesh really splits parameters
    for sharded, single in zip(out["mesh"], out["one"], strict=True):  # step 1, then a step after an update
        assert abs(sharded["loss"] - single["loss"]) < 1e-5, (out["mesh"], out["one"])
        assert sharded["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("family", hf_families())
def test_hf_export_then_import_gives_identical_tensors(family: str) -> None:
    from trainer.init_from import RUN_KEYS

    fam = get_family(family)
    adapter = fam.hf_adapter
    assert adapter is not None
    cfg = fam.tiny_config()
    unrolled, scanned = tiny_pair(family)
    state_dict, config = adapter.export(scanned, cfg, VOCAB)
    config = json.loads(json.dumps(config))  # what config.json holds
    assert config["model_type"] == adapter.model_type and config["architectures"] == [adapter.architecture]
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in state_dict.values())
    for model, scanned_layout in ((scanned, True), (unrolled, False)):
        back_cfg, state = adapter.import_(config, state_dict, scan_layers=scanned_layout)
        assert back_cfg.scan_layers == scanned_layout
        got, want = flat(state), flat(nnx.state(model, nnx.Param))
        assert sorted(got) == sorted(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        shape = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in RUN_KEYS}
        assert {name: getattr(back_cfg, name) for name in shape} == shape
    # the unrolled model exports the same state dict
    again, _ = adapter.export(unrolled, dataclasses.replace(cfg, scan_layers=False), VOCAB)
    assert sorted(again) == sorted(state_dict)
    for name, value in state_dict.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)


# -- the parameters other stages reach into are the family's to name (ModelFamily.roles) --

TABLE_NAME = "toy_table"


@dataclasses.dataclass
class TableConfig(ToyConfig):
    family: str = TABLE_NAME


class TableDecoder(nnx.Module):
    """The toy decoder without positions, its embedding table called ``token_table`` (no ``embed``)."""

    def __init__(self, cfg: ToyConfig, vocab_size: int, rngs: nnx.Rngs):
        self.token_table = _param(rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std)
        self.blocks = stacked(lambda layer_rngs: ToyBlock(cfg, layer_rngs), cfg.n_layers, rngs)
        self.final_norm = nnx.Param(jnp.ones((cfg.d_model,)), out_sharding=("norm",))

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
        mask = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))[None]
        x = scan_layers(self.blocks, jnp.take(self.token_table[...], tokens, axis=0), lambda block, h: block(h, mask))
        return _norm(x, self.final_norm)

    def output_weight(self) -> jax.Array:
        return self.token_table[...].T

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
        return output_logits(self.hidden(tokens, segment_ids, positions), self.output_weight())


class UntiedTableDecoder(TableDecoder):
    """``TableDecoder`` with an untied output head, ``proj``."""

    def __init__(self, cfg: ToyConfig, vocab_size: int, rngs: nnx.Rngs):
        super().__init__(cfg, vocab_size, rngs)
        self.proj = _param(rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std)

    def output_weight(self) -> jax.Array:
        return self.proj[...]


TABLE_TOY = register_family(dataclasses.replace(TOY, name=TABLE_NAME, config_cls=TableConfig, build=TableDecoder,
                                                roles=ParamRoles(embedding="token_table")))


def test_a_family_names_its_embedding_and_only_it_trains_under_trainable_embeddings() -> None:
    train = TrainConfig(steps=10, batch_size=4, learning_rate=1e-2, warmup_steps=0, trainable="embeddings")
    program = TrainProgram(TableConfig(), train, VOCAB, build_mesh(train.mesh), seed=0)
    rows = np.random.default_rng(0).integers(0, VOCAB, (4, SEQ + 1)).astype(np.int32)
    batch = global_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]}, program.batch_sharding)
    state = program.init_state()
    start = flat(state["params"])
    assert program.param_trainable_frozen == start["token_table"].size
    for _ in range(2):
        state, _ = program.step(state, batch)
    now = flat(state["params"])
    assert not np.array_equal(now["token_table"], start["token_table"])
    body = [name for name in start if name != "token_table"]
    assert len(body) > 5 and all(np.array_equal(now[name], start[name]) for name in body)


@pytest.mark.parametrize(("build", "roles", "message"), [
    (TableDecoder, ParamRoles(), r"roles.embedding 'embed' is not a \[vocabulary, d_model\] parameter"),
    (TableDecoder, ParamRoles(embedding="token_table", layers=("layers",)),
     "roles.layers names 'layers', which is no top-level attribute holding parameters"),
    (UntiedTableDecoder, ParamRoles(embedding="token_table"),
     "parameter proj has the vocabulary's dimension but no role"),
    (UntiedTableDecoder, ParamRoles(embedding="token_table", output_head="final_norm"),
     r"roles.output_head 'final_norm' is not a \[d_model, vocabulary\] parameter"),
])
def test_a_role_naming_no_such_parameter_is_one_error_at_registration(build: type, roles: ParamRoles,
                                                                       message: str) -> None:
    wrong = dataclasses.replace(TOY, name="toy_wrong_roles", config_cls=TableConfig, build=build, roles=roles)
    with pytest.raises(ConfigError, match=message) as caught:
        register_family(wrong)
    assert "\n" not in str(caught.value) and "model family 'toy_wrong_roles'" in str(caught.value)
    assert "toy_wrong_roles" not in families()
    # named right, the same module passes
    check_roles(dataclasses.replace(wrong, roles=ParamRoles(embedding="token_table", output_head="proj")
                                    if build is UntiedTableDecoder else ParamRoles(embedding="token_table")))


def test_a_model_section_must_subclass_the_base_section() -> None:
    @dataclasses.dataclass
    class Plain:
        family: str = "plain"
        d_model: int = 32

    with pytest.raises(ConfigError, match="must be a dataclass subclassing experiment.sections.model.ModelSection"):
        register_model_section("plain", Plain, {})  # type: ignore[arg-type]
