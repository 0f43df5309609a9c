"""Recipe 04c, the static jax-neuronx check: planted constructs are found at their source lines, the shipped
configs' train steps are clean under the Neuron settings, and the Neuron-path step trains as the default one.

Every planted construct below sits on a line marked ``# plant: <name>``; a test expects the finding at
exactly that line (``planted``), so a construct reported at the wrong frame fails as surely as a missed one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental import checkify, io_callback

import trainer.step
from experiment.config import load_config
from experiment.errors import ConfigError
from experiment.runfolder import RunFolder
from model.registry import family_of
from model.sharding import build_mesh
from tests.recipe_runner import REPO, error_line, run_recipe, tiny_config
from trainer.neuron_check import (
    CLEAN,
    UnsupportedOnNeuron,
    find_unsupported,
    neuron_check,
    neuron_model_config,
    neuron_settings,
    trace_neuron_step,
)
from trainer.step import TrainProgram, global_batch

THIS = Path(__file__)


def planted(name: str, path: Path = THIS) -> str:
    """``file:line`` of the line marked ``# plant: <name>`` in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# plant: {name}")]
    return f"{path.resolve().relative_to(REPO)}:{number}"


def findings(fn: Callable[[jax.Array], jax.Array], grad: bool = False) -> list[str]:
    """The findings of a toy train step around ``fn``: a jitted forward pass, or (``grad``) a gradient step."""
    def step(params: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        if grad:
            loss, g = jax.value_and_grad(lambda p: fn(p * x).sum())(params)
            return params - 0.1 * g, loss
        return params, jax.jit(fn)(params * x).sum()

    return [str(f) for f in find_unsupported(jax.make_jaxpr(step)(jnp.ones(4), jnp.ones(4)))]


# -- the planted constructs --

def plant_cond(x):
    return jax.lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: -v, x)  # plant: cond


def plant_switch(x):
    return jax.lax.switch(jnp.argmax(x), [lambda v: v, lambda v: -v], x)  # plant: switch


def plant_data_while(x):
    return jax.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: v * 2.0, x)  # plant: data_while


def plant_traced_fori(x):
    n = jnp.argmax(x)
    return jax.lax.fori_loop(0, n, lambda i, v: v + 1.0, x)  # plant: traced_fori


def plant_traced_step_while(x):
    # the counter starts from and is compared with constants, but steps by a value of the data
    by = jnp.argmax(x) + 1
    return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + by, c[1] * 2.0), (0, x))[1]  # plant: traced_step


def plant_debug_print(x):
    jax.debug.print("x {}", x)  # plant: debug_print
    return x


def plant_debug_callback(x):
    jax.debug.callback(lambda v: None, x)  # plant: debug_callback
    return x


def plant_io_callback(x):
    return io_callback(lambda v: v, jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # plant: io_callback


def plant_pure_callback(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # plant: pure_callback


def plant_check(x):
    checkify.check(x.sum() > 0, "negative")  # plant: check
    return x


def plant_threefry(x):
    return x + jax.random.normal(jax.random.key(0), x.shape)  # plant: threefry


def plant_fp8(x):
    return x.astype(jnp.float8_e4m3fnuz).astype(x.dtype)  # plant: fp8


def plant_reduce_precision(x):
    return jax.lax.reduce_precision(x, exponent_bits=4, mantissa_bits=3)  # plant: reduce_precision


def plant_cond_in_scan(x):
    def body(carry, _):
        return jax.lax.cond(carry.sum() > 0, jnp.sin, jnp.cos, carry), None  # plant: cond_in_scan
    return jax.lax.scan(body, x, length=3)[0]


@jax.custom_vjp
def _clipped(x):
    return x


def _clipped_fwd(x):
    return x, x


def _clipped_bwd(x, g):
    return (jax.lax.cond(x.sum() > 0, lambda: g, lambda: -g),)


_clipped.defvjp(_clipped_fwd, _clipped_bwd)


def plant_cond_in_vjp_bwd(x):
    # jax names a backward rule's equations at the custom_vjp function's call (trainer/neuron_check.source_line)
    return _clipped(x) * 2.0  # plant: cond_in_vjp_bwd


def plant_cond_under_remat(x):
    return jax.checkpoint(lambda v: jax.lax.cond(v.sum() > 0, jnp.sin, jnp.cos, v))(x)  # plant: cond_under_remat


def plant_traced_start(x):
    # the counter is compared with a constant and steps by one, but starts from a value of the data
    start = (jnp.argmax(x), x)
    return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2.0), start)[1]  # plant: traced_start


def plant_callback_in_branch(x):
    def loud(v):
        jax.debug.print("{}", v)  # plant: callback_in_branch
        return v
    return jax.lax.cond(x.sum() > 0, loud, jnp.negative, x)  # plant: branching


COND = "jax.lax.cond / switch (cond primitive)"
DYNAMIC_WHILE = "jax.lax.while_loop with a dynamic trip count (while primitive)"
PLANTED = [
    ("cond", plant_cond, COND, False),
    ("switch", plant_switch, COND, False),
    ("data_while", plant_data_while, DYNAMIC_WHILE, False),
    ("traced_fori", plant_traced_fori, DYNAMIC_WHILE, False),
    ("traced_step", plant_traced_step_while, DYNAMIC_WHILE, False),
    ("debug_print", plant_debug_print, "host callback (jax.debug.print)", False),
    ("debug_callback", plant_debug_callback, "host callback (jax.debug.callback / breakpoint)", False),
    ("io_callback", plant_io_callback, "host callback (io_callback)", False),
    ("pure_callback", plant_pure_callback, "host callback (pure_callback)", False),
    ("check", plant_check, "host callback (checkify.check, not functionalized)", False),
    ("threefry", plant_threefry, "Threefry PRNG (use jax_default_prng_impl=rbg)", False),
    ("fp8", plant_fp8, "FP8 dtype float8_e4m3fnuz (only e4m3 and e5m2 are supported)", False),
    ("reduce_precision", plant_reduce_precision, "jax.lax.reduce_precision (JAX's remat adds one to each value "
     "model.remat=save_dots or offload keeps; model.remat=full or none adds none)", False),
    # inside sub-jaxprs: a scan body, a custom VJP's backward pass, a remat region, a function traced twice
    ("cond_in_scan", plant_cond_in_scan, COND, True),
    ("cond_in_vjp_bwd", plant_cond_in_vjp_bwd, COND, True),
    ("cond_under_remat", plant_cond_under_remat, COND, True),
    ("traced_start", plant_traced_start, DYNAMIC_WHILE, False),
]


@pytest.mark.parametrize(("name", "fn", "construct", "grad"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_construct_is_named_at_its_source_line(name: str, fn: Callable, construct: str, grad: bool) -> None:
    with jax.default_prng_impl("threefry2x32"):  # the threefry plant under JAX's default, whatever the process has
        assert findings(fn, grad) == [f"{planted(name)}: {construct}"]


def test_a_callback_in_a_cond_branch_is_named_besides_the_cond() -> None:
    assert findings(plant_callback_in_branch) == sorted([
        f"{planted('branching')}: {COND}",
        f"{planted('callback_in_branch')}: host callback (jax.debug.print)"])


# -- what is not reported --

def static_fori(x):
    return jax.lax.fori_loop(0, 5, lambda i, v: v + i, x)  # a Python-int trip count: a scan


def fixed_scan(x):
    return jax.lax.scan(lambda c, _: (c * 2.0, None), x, length=4)[0]


def static_while(x):
    return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]


def static_while_down(x):  # counting down, the constant on the left
    return jax.lax.while_loop(lambda c: 0 < c[0], lambda c: (c[0] - 2, c[1] + 1.0), (9, x))[1]  # noqa: SIM300


def static_while_bound_in_carry(x):  # the bound rides in the carry unchanged, as fori_loop's with traced bounds
    return jax.lax.while_loop(lambda c: c[0] < c[1], lambda c: (c[0] + 1, c[1], c[2] * 2.0), (0, 6, x))[2]


def static_while_closed_bound(x):  # the bound a constant the condition closes over
    bound = np.int32(7)
    return jax.lax.while_loop(lambda c: c[0] < bound, lambda c: (c[0] + 1, c[1] - 1.0), (np.int32(0), x))[1]


def rbg_random(x):
    with neuron_settings():
        return x + jax.random.normal(jax.random.key(0), x.shape) + jax.random.uniform(
            jax.random.fold_in(jax.random.key(1), 3), x.shape)


def supported_fp8(x):
    e4m3fn = x.astype(jnp.float8_e4m3fn).astype(x.dtype)
    e4m3 = x.astype(jnp.float8_e4m3).astype(x.dtype)
    return e4m3fn + e4m3 + x.astype(jnp.float8_e5m2).astype(x.dtype)


def selects(x):
    return jnp.where(x > 0, x, -x) + jax.lax.select(x < 1, x, x * 2)


CLEAN_STEPS = [static_fori, fixed_scan, static_while, static_while_down, static_while_bound_in_carry,
               static_while_closed_bound, rbg_random, supported_fp8, selects]


@pytest.mark.parametrize("fn", CLEAN_STEPS, ids=[f.__name__ for f in CLEAN_STEPS])
def test_static_loops_rbg_e4m3_e5m2_and_selects_are_not_reported(fn: Callable) -> None:
    assert findings(fn) == []


def test_a_while_loop_is_the_primitive_that_static_while_checks() -> None:
    """The static cases above really build a ``while`` (not a scan the check would pass anyway)."""
    for fn in (static_while, static_while_down, static_while_bound_in_carry, static_while_closed_bound):
        names = {eqn.primitive.name for eqn in jax.make_jaxpr(fn)(jnp.ones(4)).jaxpr.eqns}
        assert "while" in names, fn.__name__
    assert "scan" in {eqn.primitive.name for eqn in jax.make_jaxpr(static_fori)(jnp.ones(4)).jaxpr.eqns}


def test_findings_are_deduplicated_and_sorted() -> None:
    def twice(x):
        return plant_cond(plant_cond(x)) + plant_debug_print(x)

    assert findings(twice) == sorted([f"{planted('cond')}: jax.lax.cond / switch (cond primitive)",
                                      f"{planted('debug_print')}: host callback (jax.debug.print)"])


# -- the shipped configs --

SHIPPED = sorted((REPO / "recipes" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_config_has_no_construct_neuron_documents_as_unsupported(
        config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recipe 04c's stage on the config as shipped (no data prepared: vocabulary and length from the config),
    the 70B's scanned 80 layers included: in well under a second of tracing each."""
    cfg = load_config(config, [f"experiment.run_root={tmp_path}"])
    if cfg.model.remat in ("save_dots", "offload"):  # a TPU config whose policy saves: JAX's remat rounds what
        # it keeps with reduce_precision (one finding, at the projection that names it); without it, clean
        with pytest.raises(UnsupportedOnNeuron, match="uses 1 construct"):
            neuron_check(cfg, RunFolder.for_config(cfg), None)
        saved = json.loads((tmp_path / cfg.experiment.name / "reports" / "neuron_check.json").read_text())
        assert [(f["location"].split(":")[0], f["construct"]) for f in saved["findings"]] == [(
            "model/linear.py", "jax.lax.reduce_precision (JAX's remat adds one to each value "
            "model.remat=save_dots or offload keeps; model.remat=full or none adds none)")]
        cfg = load_config(config, [f"experiment.run_root={tmp_path}", "model.remat=full"])
    report = neuron_check(cfg, RunFolder.for_config(cfg), None)
    assert capsys.readouterr().out.splitlines()[-1] == CLEAN
    assert report["findings"] == [] and report["op_count"] > 500
    assert ("scan" in report["primitives"]) is True  # the layer stack (scanned) or the chunked loss
    assert json.loads((tmp_path / cfg.experiment.name / "reports" / "neuron_check.json").read_text()) == report
    # the hand count without the T x T attention (what a token costs beyond its first position's) against
    # 6 x parameters x tokens; a mixture of experts' tokens go through its active parameters (30.5B in
    # Qwen3-30B-A3B, 3.35B active; GigaChat 3 Lightning's latent attention at 4,096 adds 70% more on top)
    family, vocab, seq = family_of(cfg.model), cfg.tokenizer.vocab_size, cfg.model.max_seq_len
    params, tokens = family.active_params(cfg.model, vocab), cfg.train.batch_size * seq
    attention = (family.flops(cfg.model, vocab, seq) - family.flops(cfg.model, vocab, 1)) * tokens
    assert 6 * params * tokens * 0.8 < report["model_flops_per_step"] - attention < 6 * params * tokens * 1.6
    assert report["hardware_flops_per_step"] >= report["model_flops_per_step"]


def test_splash_and_cudnn_configs_trace_with_xla_attention() -> None:
    """A config that names a kernel Trainium lacks is checked with XLA's attention: no Pallas kernel, no
    shard_map around it (splash's), and no error (cuDNN's needs an NVIDIA GPU)."""
    cfg = load_config(SHIPPED[0], ["model.max_seq_len=128"])
    for kernel in ("splash", "cudnn"):
        model_cfg = dataclasses.replace(cfg.model, attention=kernel)
        closed = trace_neuron_step(model_cfg, cfg.train, 512, 128)
        names = {eqn.primitive.name for eqn in closed.jaxpr.eqns}
        assert not names & {"pallas_call", "shard_map"} and find_unsupported(closed) == []


def test_the_abstract_mesh_keeps_the_configs_layout_checks() -> None:
    """The check's mesh has the config's sizes, so a layout that cannot be split is the trainer's one-line
    error here too (a one-device mesh would pass it)."""
    cfg = load_config(SHIPPED[0], ["train.mesh.fsdp=16", "model.d_model=264"])
    with pytest.raises(ConfigError, match=r"size 264 cannot be split over mesh axes fsdp \(16 devices\)"):
        trace_neuron_step(cfg.model, cfg.train, 4000, 128)


STEP_RNG_LINE = next(i for i, line in enumerate(Path(trainer.step.__file__).read_text().splitlines(), 1)
                     if '"rng": jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data' in line)


@pytest.mark.parametrize("overrides", [[], ["train.nan_policy=skip", "train.grad_accum_steps=2", "model.remat=full",
                                            "train.embeddings_only_steps=3", "train.quantization=fp8",
                                            "train.compute_dtype=bfloat16", "model.scan_layers=false",
                                            "model.n_layers=2"]],  # unrolled: 2 layers trace in 2/5 the time of 4
                         ids=["demo", "every-option"])
def test_the_default_prng_would_be_reported_in_our_own_step(overrides: list[str]) -> None:
    """Under JAX's default Threefry the step's RNG advance (trainer/step.py) is what the check names, and
    nothing else, whatever the NaN policy, accumulation, remat, freezing, quantization (fp8's e4m3fn and
    e5m2) and layer layout: under rbg, nothing."""
    cfg = load_config(SHIPPED[0], overrides)
    default = find_unsupported(trace_neuron_step(cfg.model, cfg.train, 512, 128, prng_impl="threefry2x32"))
    assert [str(f) for f in default] == [
        f"trainer/step.py:{STEP_RNG_LINE}: Threefry PRNG (use jax_default_prng_impl=rbg)"]
    assert find_unsupported(trace_neuron_step(cfg.model, cfg.train, 512, 128)) == []


# -- the Neuron-path step trains as the default one --

SEQ, VOCAB, BATCH = 128, 256, 4


def learnable_batches(n: int) -> list[dict[str, np.ndarray]]:
    """Rows counting up from random starts (the next token is the current one + 1): the loss falls in 20 steps."""
    rng = np.random.default_rng(0)
    rows = [(rng.integers(0, VOCAB, (BATCH, 1)) + np.arange(SEQ + 1)) % VOCAB for _ in range(n)]
    return [{"inputs": r[:, :-1].astype(np.int32), "targets": r[:, 1:].astype(np.int32)} for r in rows]


def losses_of(program: TrainProgram, state: dict, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    out = []
    for batch in batches:
        state, metrics = program.step(state, global_batch(batch, program.batch_sharding))
        out.append(float(metrics["loss"]))
    return np.asarray(out)


def test_the_neuron_path_step_gives_the_default_path_losses_for_20_steps() -> None:
    """The default path of the shipped TPU configs (splash attention, Threefry; splash in Pallas' interpret mode
    here) against the Neuron path (XLA attention, rbg), from the same parameters and batches, with the NaN
    skip guard, two micro-batches and the chunked loss on. rbg draws another initialisation, so the Neuron program
    starts from the default one's parameters (``init_state_from``); its RNG key is rbg's (4 words).

    Tolerance: the two attentions differ by float rounding only; measured at most 2.4e-7 apart (1.2e-7
    relative: one float32 ulp) over the 20 steps, while the loss falls from 5.55 to 0.50, at least 5.9e-3 a
    step: rtol 1e-5 is ~80x the measured gap and far below any real difference. (The PRNG alone changes no
    loss: the step's key only advances, nothing draws from it.)"""
    overrides = [f"model.max_seq_len={SEQ}", "model.n_layers=1", "model.attention=splash", "train.nan_policy=skip",
                 "train.grad_accum_steps=2", "train.loss_chunk_len=32", f"train.batch_size={BATCH}",
                 "train.warmup_steps=2", "train.learning_rate=1e-2"]
    cfg = load_config(REPO / "tests" / "configs" / "tiny.yaml", overrides)
    mesh = build_mesh(cfg.train.mesh, jax.devices()[:1])
    batches = learnable_batches(20)
    with neuron_settings("threefry2x32"):
        default = TrainProgram(cfg.model, cfg.train, VOCAB, mesh, seed=0)
        state = default.init_state()
        start = nnx.to_pure_dict(jax.device_get(state["params"]))
        expected = losses_of(default, state, batches)
    with neuron_settings():
        neuron = TrainProgram(neuron_model_config(cfg.model), cfg.train, VOCAB, mesh, seed=0)
        neuron_state = neuron.init_state_from(start)
        assert neuron_state["rng"].shape == (4,) and state["rng"].shape == (2,)
        got = losses_of(neuron, neuron_state, batches)
    assert expected[-1] < expected[0] - 0.05  # it trains
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# -- the recipe --

def loud_loss(*args, **kwargs):
    jax.debug.print("hidden {}", args[0].sum())  # plant: recipe_callback
    return CHUNKED_LOSS(*args, **kwargs)


CHUNKED_LOSS = trainer.step.chunked_cross_entropy


@pytest.mark.integration
def test_recipe_04c_prints_the_verdict_last_and_writes_its_report(tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    proc = run_recipe("04c_neuron_check.py", config)
    assert proc.stdout.splitlines()[-1] == CLEAN
    report = json.loads((tmp_path / "runs" / "tiny" / "reports" / "neuron_check.json").read_text(encoding="utf-8"))
    assert report["findings"] == [] and report["vocab_size"] == 1000 and report["seq_len"] == 64
    assert re.search(r"tiny: train step traced for Trainium \(rbg PRNG, XLA attention; "
                     r"mesh data 1 x fsdp 1 x tensor 1\)"
                     r" in [\d.]+ s: [\d,]+ equations", proc.stderr)


@pytest.mark.integration
def test_recipe_04c_fails_on_a_planted_construct_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer.step, "chunked_cross_entropy", loud_loss)
    proc = run_recipe("04c_neuron_check.py", tiny_config(tmp_path), check=False)
    finding = f"{planted('recipe_callback')}: host callback (jax.debug.print)"
    assert proc.returncode == 2 and proc.stdout.splitlines()[-1] == finding
    line = error_line(proc)
    assert line.startswith("error: the train step uses 1 construct(s) jax-neuronx documents as unsupported")
    assert line.endswith(finding) and "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "runs" / "tiny" / "reports" / "neuron_check.json").read_text(encoding="utf-8"))
    assert report["finding_lines"] == [finding]


@pytest.mark.integration
def test_recipe_04c_names_a_misspelled_key_in_one_line(tmp_path: Path) -> None:
    proc = run_recipe("04c_neuron_check.py", tiny_config(tmp_path), "train.nan_polcy=skip", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert error_line(proc).startswith("error: unknown config key 'train.nan_polcy'; did you mean 'train.nan_policy'?")
    assert not (tmp_path / "runs" / "tiny" / "reports" / "neuron_check.json").exists()
