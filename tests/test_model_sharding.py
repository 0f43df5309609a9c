"""Layout on an 8-device mesh (data 2 x fsdp 2 x tensor 2) of fake CPU devices.

The device count is fixed when JAX starts, so the check runs in the session's 8-device worker
(``--xla_force_host_platform_device_count=8``, tests/device_worker.py) and reports back as JSON;
the assertions stay here.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from experiment.errors import ConfigError
from experiment.sections.train import MeshConfig, TrainConfig
from model.llama.config import LlamaConfig
from model.sharding import build_mesh
from tests.device_worker import DeviceWorker
from trainer.step import TrainProgram, global_batch


def layout_on_8_devices() -> dict:
    """In the 8-device worker (tests/device_worker.py): the layout, one step, scanned vs unrolled, the errors."""
    out = {"devices": jax.device_count()}
    model = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
    train = TrainConfig(steps=10, batch_size=8, warmup_steps=1, mesh=MeshConfig(fsdp=2, tensor=2))
    prog = TrainProgram(model, train, 64, build_mesh(train.mesh), seed=0)
    state = prog.init_state()

    def path_name(path):
        return "/".join(str(getattr(k, "key", getattr(k, "name", k)))
                        for k in path if getattr(k, "name", "") != "value")

    out["params"] = {path_name(p): [str(leaf.sharding.spec), list(leaf.addressable_shards[0].data.shape)]
                     for p, leaf in jax.tree_util.tree_leaves_with_path(state["params"])}
    adam = state["opt_state"][1][0]  # chain(clip, adamw): adamw's ScaleByAdamState
    out["mu_matches"] = all(m.sharding == p.sharding for m, p in
                            zip(jax.tree.leaves(adam.mu), jax.tree.leaves(state["params"]), strict=True))
    out["count"] = str(adam.count.sharding.spec)

    rows = np.random.default_rng(0).integers(0, 64, (8, 17)).astype(np.int32)
    local = {"inputs": rows[:, :-1], "targets": rows[:, 1:]}
    state, metrics = prog.step(state, global_batch(local, prog.batch_sharding))
    out["after_step_same"] = all(a.sharding == b for a, b in
                                 zip(jax.tree.leaves(state), jax.tree.leaves(prog.state_shardings), strict=True))
    out["loss_8"] = float(metrics["loss"])
    out["recompiles"] = prog.step._cache_size()
    one = dataclasses.replace(train, mesh=MeshConfig(data=1))
    prog1 = TrainProgram(model, one, 64, build_mesh(one.mesh, jax.devices()[:1]), seed=0)
    _, metrics1 = prog1.step(prog1.init_state(), global_batch(local, prog1.batch_sharding))
    out["loss_1"] = float(metrics1["loss"])

    # the scanned step on 8 devices against the unrolled reference on one, from the same parameters:
    # three steps (AdamW, weight decay on matrices only) with a new batch each
    unrolled = dataclasses.replace(model, scan_layers=False)
    ref = TrainProgram(unrolled, one, 64, build_mesh(one.mesh, jax.devices()[:1]), seed=0)
    ref_state = ref.init_state()
    target, restack = prog.checkpoint_layout(False)
    scanned_state = restack(jax.device_put(jax.tree.map(np.array, ref_state),
                                           jax.tree.map(lambda s: s.sharding, target)))
    rng = np.random.default_rng(1)
    out["steps_8"], out["steps_ref"] = [], []
    for _ in range(3):
        rows = rng.integers(0, 64, (8, 17)).astype(np.int32)
        local = {"inputs": rows[:, :-1], "targets": rows[:, 1:]}
        scanned_state, m8 = prog.step(scanned_state, global_batch(local, prog.batch_sharding))
        ref_state, m1 = ref.step(ref_state, global_batch(local, ref.batch_sharding))
        out["steps_8"].append(float(m8["loss"]))
        out["steps_ref"].append(float(m1["loss"]))
    got = nnx.to_pure_dict(scanned_state["params"])
    want = nnx.to_pure_dict(ref_state["params"])
    out["param_diff"] = max(float(np.abs(np.asarray(got["blocks"]["mlp"]["w_up"][i])
                                         - np.asarray(want["blocks"][i]["mlp"]["w_up"])).max())
                            for i in range(2))
    out["norm_decayed"] = bool(np.any(np.asarray(got["blocks"]["attn_norm"]["scale"]) != 1.0))
    out["norm_moved"] = float(np.abs(np.asarray(got["blocks"]["attn_norm"]["scale"][1])
                                     - np.asarray(want["blocks"][1]["attn_norm"]["scale"])).max())

    errors = {}
    for name, m, t in [
        ("kv_heads", dataclasses.replace(model, n_heads=8, n_kv_heads=2),
         dataclasses.replace(train, mesh=MeshConfig(tensor=4))),
        ("batch", model, dataclasses.replace(train, batch_size=4, mesh=MeshConfig())),
        ("vocab", model, train),
    ]:
        try:
            TrainProgram(m, t, 63 if name == "vocab" else 64, build_mesh(t.mesh), seed=0)
            errors[name] = None
        except ConfigError as exc:
            errors[name] = str(exc)
    out["errors"] = errors
    return out


def test_every_parameter_follows_the_rules_on_8_devices(eight_devices: DeviceWorker) -> None:
    out = eight_devices.run(layout_on_8_devices)
    assert out["devices"] == 8
    # the default rules by hand: embed->fsdp, heads/kv_heads/mlp/vocab->tensor, head_dim/norm unsharded
    expected = {
        "embed": ("P('tensor', 'fsdp')", [32, 16]),
        # scanned layers (the default): every block parameter has a leading layer axis, never sharded
        "blocks/attn/wq": ("P(None, 'fsdp', 'tensor', None)", [2, 16, 2, 8]),
        "blocks/attn/wk": ("P(None, 'fsdp', 'tensor', None)", [2, 16, 1, 8]),
        "blocks/attn/wv": ("P(None, 'fsdp', 'tensor', None)", [2, 16, 1, 8]),
        "blocks/attn/wo": ("P(None, 'tensor', None, 'fsdp')", [2, 2, 8, 16]),
        "blocks/mlp/w_gate": ("P(None, 'fsdp', 'tensor')", [2, 16, 32]),
        "blocks/mlp/w_up": ("P(None, 'fsdp', 'tensor')", [2, 16, 32]),
        "blocks/mlp/w_down": ("P(None, 'tensor', 'fsdp')", [2, 32, 16]),
        "blocks/attn_norm/scale": ("P(None, None)", [2, 32]),
        "blocks/mlp_norm/scale": ("P(None, None)", [2, 32]),
        "final_norm/scale": ("P(None,)", [32]),
    }
    assert {k: (v[0], v[1]) for k, v in out["params"].items()} == expected
    assert out["mu_matches"], "Adam moments must be sharded like their parameters"
    assert out["count"] == "P()"
    assert out["after_step_same"] and out["recompiles"] == 1
    assert abs(out["loss_8"] - out["loss_1"]) < 1e-5, "the sharded step must compute what one device computes"
    errors = out["errors"]
    assert errors["kv_heads"] and errors["kv_heads"].startswith("parameter blocks/attn/wk")
    assert "size 2 cannot be split over mesh axes tensor (4 devices)" in errors["kv_heads"]
    # scanned on data 2 x fsdp 2 x tensor 2 = unrolled on one device, step after step, parameters too
    np.testing.assert_allclose(out["steps_8"], out["steps_ref"], rtol=1e-5)
    assert out["param_diff"] < 1e-5 and out["norm_moved"] < 1e-5 and out["norm_decayed"]
    assert errors["batch"] and "train.batch_size" in errors["batch"]
    assert errors["vocab"] and errors["vocab"].startswith("parameter embed ('vocab', 'embed'): dimension of size 63")


def test_data_left_over_spans_the_slices() -> None:
    from experiment.sections.train import MeshConfig
    from model.sharding import mesh_shape

    # 2 slices of 8 chips, fsdp 4 within a slice: 2-way data parallel per slice, 4-way in all
    assert mesh_shape(MeshConfig(fsdp=4, dcn_data=2), 16) == {"data": 4, "fsdp": 4, "tensor": 1}
