"""A family's own mesh axis (``train.mesh.axes``): tests/toy_aux_family.py's ``toy_expert`` lays the "expert"
logical axis of its [E, D, F] weights out on a mesh axis "expert", which also splits the batch (data x fsdp x
expert). On 8 fake CPU devices (tests/device_worker.py) its steps give the one-device losses; config load
sizes, fills in and refuses such axes by name."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig, TrainConfig
from model.sharding import build_mesh, mesh_shape
from tests.device_worker import DeviceWorker
from tests.recipe_runner import REPO
from tests.toy_aux_family import EXPERT_NAME, TOY_EXPERT, ToyExpertConfig
from trainer.step import TrainProgram, global_batch

TINY = REPO / "tests" / "configs" / "tiny.yaml"
EXPERT_MODEL = {"family": EXPERT_NAME, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_seq_len": 16,
                "n_experts": 4}
VOCAB, SEQ = 64, 16


def expert_parallel_on_8_devices() -> dict:
    """In the 8-device worker: data 2 x fsdp 2 x expert 2 x tensor 1 against one device, three steps."""
    model = ToyExpertConfig(**{k: v for k, v in EXPERT_MODEL.items() if k != "family"})
    train = TrainConfig(steps=10, batch_size=8, learning_rate=1e-2, warmup_steps=1,
                        mesh=MeshConfig(data=2, fsdp=2, tensor=1, axes={"expert": 2}))
    prog = TrainProgram(model, train, VOCAB, build_mesh(train.mesh), seed=0)
    one = dataclasses.replace(train, mesh=MeshConfig(data=1, axes={"expert": 1}))
    ref = TrainProgram(model, one, VOCAB, build_mesh(one.mesh, jax.devices()[:1]), seed=0)
    state, ref_state = prog.init_state(), ref.init_state()
    up, down = state["params"]["expert_up"].get_value(), state["params"]["expert_down"].get_value()
    out = {"axes": list(prog.mesh.axis_names), "mesh": dict(prog.mesh.shape), "batch": str(prog.batch_sharding.spec),
           "expert_up": [str(up.sharding.spec), list(up.addressable_shards[0].data.shape)],
           "expert_down": str(down.sharding.spec), "losses_8": [], "losses_1": []}
    rng = np.random.default_rng(0)
    for _ in range(3):
        rows = rng.integers(0, VOCAB, (8, SEQ + 1)).astype(np.int32)
        local = {"inputs": rows[:, :-1], "targets": rows[:, 1:]}
        state, m8 = prog.step(state, global_batch(local, prog.batch_sharding))
        ref_state, m1 = ref.step(ref_state, global_batch(local, ref.batch_sharding))
        out["losses_8"].append(float(m8["loss"]))
        out["losses_1"].append(float(m1["loss"]))
    got, want = nnx.to_pure_dict(state["params"]), nnx.to_pure_dict(ref_state["params"])
    out["param_diff"] = float(np.abs(np.asarray(got["expert_up"]) - np.asarray(want["expert_up"])).max())
    out["moved"] = float(np.abs(np.asarray(got["expert_up"])
                                - np.asarray(nnx.to_pure_dict(ref.init_state()["params"])["expert_up"])).max())
    out["after_step_same"] = all(a.sharding == b for a, b in
                                 zip(jax.tree.leaves(state), jax.tree.leaves(prog.state_shardings), strict=True))
    try:  # 4 experts over an expert axis of 8: the parameter check names the parameter and the axis
        bad = dataclasses.replace(train, mesh=MeshConfig(data=1, axes={"expert": 8}))
        TrainProgram(model, bad, VOCAB, build_mesh(bad.mesh), seed=0)
        out["indivisible"] = None
    except ConfigError as exc:
        out["indivisible"] = str(exc)
    return out


def test_expert_parallel_steps_match_one_device(eight_devices: DeviceWorker) -> None:
    out = eight_devices.run(expert_parallel_on_8_devices)
    # tensor innermost, the family's axis between fsdp and tensor
    assert out["axes"] == ["data", "fsdp", "expert", "tensor"]
    assert out["mesh"] == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
    assert out["batch"] == "P(('data', 'fsdp', 'expert'), None)"  # the batch split over data x fsdp x expert
    assert out["expert_up"] == ["P('expert', None, 'tensor')", [2, 32, 64]]  # [E, D, F]: 4 experts, 2 per device
    assert out["expert_down"] == "P('expert', 'tensor', None)"
    np.testing.assert_allclose(out["losses_8"], out["losses_1"], rtol=1e-5)
    assert out["param_diff"] < 1e-5 < out["moved"] and out["after_step_same"]
    assert out["indivisible"] and out["indivisible"].startswith("parameter expert_")
    assert "dimension of size 4 cannot be split over mesh axes expert (8 devices)" in out["indivisible"]


def test_config_load_sizes_the_familys_axis() -> None:
    toy = f"model={json.dumps(EXPERT_MODEL)}"
    assert load_config(TINY, [toy]).train.mesh.axes == {"expert": 1}  # used by the family's rules, not sized: 1
    cfg = load_config(TINY, [toy, "train.mesh.axes.expert=2", "train.batch_size=4"])
    rules = TOY_EXPERT.mesh_rules(cfg.train.mesh.rules)
    assert cfg.train.mesh.axes == {"expert": 2} and rules["expert"] == ["expert"]
    assert mesh_shape(cfg.train.mesh, 8) == {"data": 4, "fsdp": 1, "expert": 2, "tensor": 1}
    # a rule of the config may put the expert axis elsewhere: then nothing uses the mesh axis expert
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh\.axes\.expert': no logical axis of the "
                                          r"toy_expert family is laid out on mesh axis 'expert'"):
        load_config(TINY, [toy, "train.mesh.axes.expert=2", 'train.mesh.rules={"expert": [], "batch": ["data"]}'])
    with pytest.raises(ConfigError, match=r"^config key 'train\.batch_size': the micro-batch of 6 sequences .* "
                                          r"data x fsdp x expert"):
        load_config(TINY, [toy, "train.mesh.data=2", "train.mesh.fsdp=2", "train.mesh.axes.expert=2",
                           "train.batch_size=6"])


def test_a_family_without_the_axis_refuses_it() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(TINY, ["train.mesh.axes.expert=2"])
    message = str(caught.value)
    assert message.startswith("config key 'train.mesh.axes.expert': no logical axis of the llama family is laid "
                              "out on mesh axis 'expert'") and "\n" not in message
    assert load_config(TINY).train.mesh.axes == {}  # llama's mesh is data, fsdp, tensor as always
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh\.rules\.mlp': unknown mesh axes \['expert'\]"):
        load_config(TINY, ['train.mesh.rules={"mlp": ["expert"]}'])  # a rule may name only a sized axis


@pytest.mark.parametrize(("mesh", "key"), [
    ({"axes": {"expert": 0}}, "train.mesh.axes.expert"),
    ({"axes": {"tensor": 2}}, "train.mesh.axes.tensor"),
    ({"rules": {"embed": ["expert"]}}, "train.mesh.rules.embed"),
])
def test_bad_mesh_axes_name_the_key(mesh: dict, key: str) -> None:
    from experiment.config import build_dataclass

    with pytest.raises(ConfigError, match=f"^config key '{key.replace('.', '[.]')}'"):
        build_dataclass(TrainConfig, {"mesh": mesh}, "train")


def test_mesh_sizes_must_match_the_devices() -> None:
    assert mesh_shape(MeshConfig(fsdp=2, axes={"expert": 2}), 8) == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh': fsdp=2 x tensor=1 x dcn_data=1 x "
                                          r"axes\.expert=3 = 6 does not divide the 8 devices$"):
        mesh_shape(MeshConfig(fsdp=2, axes={"expert": 3}), 8)
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh': data x fsdp x expert x tensor = 2 x 2 x 4 x 1 "
                                          r"= 16 devices, but 8 are available$"):
        mesh_shape(MeshConfig(data=2, fsdp=2, axes={"expert": 4}), 8)
    # the run's rules add an axis the config does not size, at size 1 (a config built in code)
    rules = TOY_EXPERT.mesh_rules({})
    assert mesh_shape(MeshConfig(), 1, rules) == {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
    mesh = build_mesh(MeshConfig(), jax.devices()[:1], rules)
    assert mesh.axis_names == ("data", "fsdp", "expert", "tensor")


def test_a_mesh_without_the_familys_axis_is_a_config_error() -> None:
    train = TrainConfig(batch_size=2)
    with pytest.raises(ConfigError, match=r"^config key 'train\.mesh\.axes\.expert': the rule for logical axis "):
        TrainProgram(ToyExpertConfig(max_seq_len=SEQ), train, VOCAB, build_mesh(train.mesh, jax.devices()[:1]),
                     seed=0)
