"""The fit check's kept compiler answers: keyed by everything the answer depends on, verified when read back."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainer.fit_check import GIB, read_answer
from trainer.fit_verdicts import FitVerdicts, verdict_key

PROGRAM = "module @jit_train_step attributes {mhlo.num_partitions = 16 : i32} { ... }"
TARGET = {"topology": "v5e:4x4", "chip_config": "default", "num_slices": 1}
MEMORY = {"argument": 3 * GIB, "output": 3 * GIB, "alias": 3 * GIB, "temp": 5 * GIB, "generated_code": 1024}


def test_the_key_changes_with_the_program_the_target_the_flags_and_the_versions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    key = verdict_key(PROGRAM, TARGET)
    assert key == verdict_key(PROGRAM, dict(reversed(TARGET.items())))  # the same program and target: the same entry
    others = {verdict_key(PROGRAM.replace("16", "32"), TARGET), verdict_key(PROGRAM, {**TARGET, "topology": "v6e:2x4"}),
              verdict_key(PROGRAM, {**TARGET, "num_slices": 2})}
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=false")
    others.add(verdict_key(PROGRAM, TARGET))
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    monkeypatch.setattr("trainer.fit_verdicts.compiler_versions", lambda: {"jax": "0.10.2", "libtpu": "another"})
    others.add(verdict_key(PROGRAM, TARGET))
    assert key not in others and len(others) == 5


def test_an_answer_reads_back_and_fits_by_the_capacity_of_this_run(tmp_path: Path) -> None:
    verdicts = FitVerdicts(tmp_path / "tpu_fit")
    key = verdict_key(PROGRAM, TARGET)
    assert verdicts.get(key) is None
    verdicts.put(key, {"memory_bytes": MEMORY, "compile_s": 41.5}, {"slice": "v5e-16"})
    answer = verdicts.get(key)
    assert answer == {"memory_bytes": MEMORY, "compile_s": 41.5}
    report = read_answer(answer, 15.75)
    # arguments + outputs - aliased (donated) + temporaries + code
    assert report["fits"] and report["needed_gib"] == pytest.approx(8 + 1024 / GIB)
    assert not read_answer(answer, 7.5)["fits"]  # the capacity is this run's, never stored
    oom = {"error": "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm", "compile_s": 3.0}
    verdicts.put("k2", oom, {})
    assert read_answer(verdicts.get("k2"), 15.75) == {"fits": False, "compile_s": 3.0, "error": oom["error"]}
    with pytest.raises(ValueError, match="not a fit verdict"):
        verdicts.put("k3", {"memory_bytes": {"argument": 1}, "compile_s": 1.0}, {})


@pytest.mark.parametrize("damage", ["torn", "flipped", "other key", "not an object"])
def test_a_damaged_entry_is_compiled_again_with_a_warning_naming_it(tmp_path: Path, damage: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    verdicts = FitVerdicts(tmp_path)
    key = verdict_key(PROGRAM, TARGET)
    verdicts.put(key, {"memory_bytes": MEMORY, "compile_s": 41.5}, {})
    path = verdicts.path(key)
    text = path.read_text(encoding="utf-8")
    entry = json.loads(text)
    if damage == "torn":
        path.write_text(text[: len(text) // 2], encoding="utf-8")
    elif damage == "flipped":  # one byte count changed: the checksum no longer matches
        entry["answer"]["memory_bytes"]["temp"] -= 2 * GIB
        path.write_text(json.dumps(entry), encoding="utf-8")
    elif damage == "other key":  # an entry copied under another program's name
        path.write_text(json.dumps({**entry, "key": "0" * 64}), encoding="utf-8")
    else:
        path.write_text("[]", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="trainer.fit_check"):
        assert verdicts.get(key) is None
    assert str(path) in caplog.text and "compiling again" in caplog.text


def test_a_folder_that_cannot_be_written_costs_only_the_next_compile(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    verdicts = FitVerdicts(blocker / "tpu_fit")  # under a file: mkdir fails
    with caplog.at_level(logging.WARNING, logger="trainer.fit_check"):
        verdicts.put("k", {"memory_bytes": MEMORY, "compile_s": 1.0}, {})
    assert "the next run compiles again" in caplog.text and verdicts.get("k") is None


def test_the_answers_live_beside_jax_s_cache_or_in_the_run_and_jax_s_own_cache_is_off(tmp_path: Path) -> None:
    import jax

    from experiment.config import load_config
    from experiment.runfolder import RunFolder
    from trainer.fit_check import fit_verdicts

    config = Path(__file__).parent / "configs" / "tiny.yaml"
    cfg = load_config(config, [f"experiment.run_root={tmp_path / 'runs'}"])
    run = RunFolder.for_config(cfg)
    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir", "jax_enable_compilation_cache")}
    try:
        where = {}
        for cache_dir in (str(tmp_path / "xla"), "gs://bucket/xla", None):
            jax.config.update("jax_compilation_cache_dir", cache_dir)
            jax.config.update("jax_enable_compilation_cache", True)
            where[cache_dir] = fit_verdicts(cfg, run).folder
            # a topology's executable could not be read back: JAX's cache is off for the fit check's process
            assert jax.config.jax_enable_compilation_cache is False
        assert where == {str(tmp_path / "xla"): tmp_path / "xla" / "tpu_fit",
                         "gs://bucket/xla": Path(run.root) / "xla_cache" / "tpu_fit",
                         None: Path(run.root) / "xla_cache" / "tpu_fit"}
        assert fit_verdicts(load_config(config, ["train.compilation_cache=false"]), run) is None
    finally:
        for key, value in saved.items():
            jax.config.update(key, value)


def mosaic_kernel_call(source_file: str, op: str = "arith.addi") -> str:
    """A lowered custom call carrying a Mosaic kernel as jax serializes one (the mosaic-serde pass, MLIR
    bytecode, base64 in the JSON backend_config), its operation located in ``source_file``."""
    import base64
    import io

    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    context = mlir.make_ir_context()
    tpu.register_dialect(context)
    with context:
        module = ir.Module.parse(f"""module attributes {{stable_mosaic.version = 15 : i64}} {{
          func.func @kernel(%a: i32, %b: i32) -> i32 {{
            %c = {op} %a, %b : i32 loc("{source_file}":3:4)
            return %c : i32
          }}
        }}""")
        context.allow_unregistered_dialects = True  # as jax serializes
        PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(module.operation)
        buffer = io.BytesIO()
        module.operation.write_bytecode(buffer, desired_version=0)
    body = base64.b64encode(buffer.getvalue()).decode()
    return ('%0 = stablehlo.custom_call @tpu_custom_call(%arg0) {backend_config = "{\\22custom_call_config\\22: '
            f'{{\\22body\\22: \\22{body}\\22, \\22serialization_format\\22: 1}}}}"}}')


def test_a_kernel_from_another_venv_is_the_same_program_and_another_kernel_is_not() -> None:
    """A Pallas kernel's bytecode records the path of its source file, inside the venv: two checkouts of
    the same code must still find each other's answers (measured: every kept answer of the tpu lane was
    compiled again by a fresh clone's CI before this), while a kernel that computes otherwise must not."""
    from trainer.fit_verdicts import program_fingerprint

    here = mosaic_kernel_call("/work/main/.venvs/tpu/lib/python3.11/site-packages/jax/splash.py")
    there = mosaic_kernel_call("/tmp/fresh/.venvs/tpu/lib/python3.11/site-packages/jax/splash.py")
    other = mosaic_kernel_call("/work/main/.venvs/tpu/lib/python3.11/site-packages/jax/splash.py", "arith.muli")
    assert here != there  # the raw texts differ by the path
    assert program_fingerprint(here) == program_fingerprint(there) != program_fingerprint(other)
    assert "mosaic-sha256:" in program_fingerprint(here) and "site-packages" not in program_fingerprint(here)
    assert verdict_key(here, TARGET) == verdict_key(there, TARGET) != verdict_key(other, TARGET)


def test_only_the_programs_own_answers_are_kept() -> None:
    """Memory figures and HBM exhaustion belong to the program; a host that ran out of memory while compiling
    does not, nor does a feature a newer libtpu may compile: the next run tries those again."""
    from trainer.fit_check import compiler_error
    from trainer.fit_verdicts import worth_keeping

    hbm = RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm.")
    assert worth_keeping({"memory_bytes": MEMORY, "compile_s": 1.0})
    assert worth_keeping({"error": compiler_error(hbm), "compile_s": 1.0})
    assert not worth_keeping({"error": compiler_error(MemoryError("std::bad_alloc")), "compile_s": 1.0})
    assert not worth_keeping({"error": compiler_error(NotImplementedError("no lowering for x")), "compile_s": 1.0})
