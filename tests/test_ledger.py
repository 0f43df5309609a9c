"""The cost ledger: arithmetic against worked examples, crash and resume, SIGKILL survival."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cost.ledger import Ledger
from cost.ledger_format import LEDGER_FILE
from cost.ledger_pricing import summarize_ledger, summarize_ledger_at
from cost.ledger_report import summarize_sessions
from cost.rates import UsdRubRate
from experiment.errors import DataError
from experiment.files import atomic_write_json
from experiment.sections.cost import CostConfig, InfraItem
from tests.fake_clock import HOUR, FakeClock

REPO = Path(__file__).resolve().parents[1]




def v5e_config(**changes: object) -> CostConfig:
    """8 TPU v5e chips on demand (1.20 USD per chip-hour in the bundled catalog) at 100 RUB per USD."""
    values = {"accelerator": "tpu-v5e", "pricing": "on-demand", "chips": 8, "usd_rub_rate": 100.0,
              "usd_rub_date": dt.date.today().isoformat(), "flush_seconds": 1.0}
    values.update(changes)
    return CostConfig(**values)


RATE = UsdRubRate(100.0, dt.date.today(), "test")
RUB_PER_HOUR = 8 * 1.20 * 100.0  # 960 rubles per wall-clock hour of an 8-chip v5e slice


def open_fake(tmp_path: Path, clock: FakeClock, cfg: CostConfig | None = None, startup_hours: float = 0.0) -> Ledger:
    return Ledger.open(tmp_path / "ledger", cfg or v5e_config(), "run-1", rate=RATE, clock=clock,
                       started_at=clock() - startup_hours * HOUR, background=False)


def test_worked_example_single_session(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock, v5e_config(token_budget=4_000_000_000), startup_hours=0.5)
    with ledger.phase("compile"):
        clock.advance(0.5)
    with ledger.phase("train"):
        clock.advance(2.0)
        ledger.add_tokens(200, 2_000_000_000)
    with ledger.phase("checkpoint"):
        clock.advance(0.25)
        ledger.mark_checkpoint(200)
    clock.advance(0.25)  # outside any phase after the first one: idle
    ledger.close()
    s = summarize_ledger(tmp_path / "ledger")
    assert s.hours == pytest.approx(3.5)
    assert s.chip_hours == pytest.approx(28.0)
    assert s.usd_total == pytest.approx(3.5 * 8 * 1.20)
    assert s.rub_total == pytest.approx(3.5 * RUB_PER_HOUR)  # 3360
    assert s.rub_by_phase == pytest.approx({"startup": 480.0, "compile": 480.0, "train": 1920.0,
                                               "checkpoint": 240.0, "idle": 240.0})
    assert s.tokens == 2_000_000_000
    assert s.rub_per_1b_tokens == pytest.approx(1680.0)
    assert s.rub_lost_to_restarts == 0.0
    # steady phases (train + checkpoint + idle) cost 2400 RUB for 2B tokens: 2B more cost 2400 more
    assert s.projected_rub_to_budget == pytest.approx(2400.0)
    assert s.projected_rub_total == pytest.approx(3360.0 + 2400.0)
    assert s.usd_rub_rate == 100.0 and s.price.usd == 1.20 and s.price.source


def crashed_session(tmp_path: Path, clock: FakeClock) -> None:
    """0.5 h compile, 1 h train to step 100 (1B tokens), checkpoint 0.25 h, 1 h more to step 150, SIGKILL."""
    ledger = open_fake(tmp_path, clock)
    with ledger.phase("compile"):
        clock.advance(0.5)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(100, 1_000_000_000)
    with ledger.phase("checkpoint"):
        clock.advance(0.25)
        ledger.mark_checkpoint(100)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(150, 500_000_000)  # more than flush_seconds since the last sync: written and fsynced
    ledger._file.close()  # the process dies here: no close record  # noqa: SLF001


@pytest.mark.parametrize("say_resume", [True, False])
def test_crash_then_resume_prices_lost_work_once(tmp_path: Path, say_resume: bool) -> None:
    clock = FakeClock()
    crashed_session(tmp_path, clock)
    clock.advance(0.25)  # the restart gap: an on-demand slice stays held, billed as idle (cost.between_sessions)
    ledger = open_fake(tmp_path, clock)
    if say_resume:
        ledger.mark_resume(100)
    before = ledger.summary()
    assert before.rub_lost_to_restarts == pytest.approx(1.0 * RUB_PER_HOUR)  # known as soon as it reopens
    with ledger.phase("compile"):
        clock.advance(0.5)
    with ledger.phase("train"):
        clock.advance(1.5)
        ledger.add_tokens(200, 1_000_000_000)
    ledger.close()
    s = summarize_ledger(tmp_path / "ledger")
    assert s.sessions == 2
    assert s.seconds_by_phase == pytest.approx({"compile": 1.0 * HOUR, "train": 2.5 * HOUR,
                                                   "checkpoint": 0.25 * HOUR, "lost": 1.0 * HOUR, "idle": 0.25 * HOUR})
    assert s.hours == pytest.approx(5.0)  # every paid hour once: 0.5+1+0.25+1, the 0.25 gap, then 0.5+1.5
    assert s.rub_total == pytest.approx(5.0 * RUB_PER_HOUR)
    assert s.rub_lost_to_restarts == pytest.approx(RUB_PER_HOUR)
    assert s.tokens == 2_000_000_000  # steps 101-150 of the crashed session are not counted
    assert s.last_step == 200
    assert s.rub_per_1b_tokens == pytest.approx(5.0 * RUB_PER_HOUR / 2)


def test_resume_from_an_older_checkpoint_loses_more(tmp_path: Path) -> None:
    """If the last checkpoint turned out unreadable and training restarted from step 0, all its work was lost."""
    clock = FakeClock()
    crashed_session(tmp_path, clock)
    ledger = open_fake(tmp_path, clock)
    ledger.mark_resume(0)
    s = ledger.summary()
    ledger.close()
    assert s.seconds_by_phase["lost"] == pytest.approx(2.0 * HOUR)  # both hours of training
    assert s.seconds_by_phase["checkpoint"] == pytest.approx(0.25 * HOUR)  # saving is never redone work
    assert s.seconds_by_phase["compile"] == pytest.approx(0.5 * HOUR)
    assert s.tokens == 0


def test_nested_phases_and_live_summary(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock)
    clock.advance(0.1)  # before the first phase: start-up
    with ledger.phase("train"):
        clock.advance(1.0)
        with ledger.phase("eval"):
            clock.advance(0.5)
        clock.advance(1.0)
        live = ledger.summary()  # includes the span in progress
    ledger.close()
    assert live.seconds_by_phase == pytest.approx({"startup": 0.1 * HOUR, "train": 2.0 * HOUR, "eval": 0.5 * HOUR})
    assert summarize_ledger(tmp_path / "ledger").hours == pytest.approx(2.6)


def test_a_skipped_step_is_booked_as_lost_and_its_data_wait_stays_data(tmp_path: Path) -> None:
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock)
    with ledger.phase("train"):  # a step that trained
        clock.advance(1.0)
    with ledger.phase("train"):  # a step found, once it ran, to have been skipped (train.nan_policy=skip)
        with ledger.phase("data"):
            clock.advance(0.25)
        clock.advance(0.5)
        ledger.book_as_lost()
    ledger.close()
    by_phase = summarize_ledger(tmp_path / "ledger").seconds_by_phase
    assert by_phase == pytest.approx({"train": 1.0 * HOUR, "data": 0.25 * HOUR, "lost": 0.5 * HOUR})


def test_infrastructure_rows_are_added(tmp_path: Path) -> None:
    clock = FakeClock()
    storage = tmp_path / "storage.csv"  # the bundled catalog holds no storage price: a user catalog gives one
    storage.write_text("kind,name,cloud,region,pricing,usd,unit,source,date,note\n"
                       "infra,my-storage,gcp,us-central1,on-demand,0.020,gb-month,our contract,2026-11-01,\n",
                       encoding="utf-8")
    cfg = v5e_config(infrastructure=[InfraItem("cpu-host-e2-standard-16", 2), InfraItem("my-storage", 730)],
                     catalog_path=str(storage))
    ledger = open_fake(tmp_path, clock, cfg)
    with ledger.phase("train"):
        clock.advance(1.0)
    s = ledger.summary()
    ledger.close()
    # per hour: 8 x 1.20 chips + 2 x 0.53609 hosts + 730 GB x 0.020 / 730 h storage
    assert s.usd_total == pytest.approx(9.6 + 2 * 0.53609 + 0.020)


def test_torn_last_line_is_dropped_and_bad_records_named(tmp_path: Path) -> None:
    clock = FakeClock()
    crashed_session(tmp_path, clock)
    path = tmp_path / "ledger" / LEDGER_FILE
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"e": "time", "t0": 1.0, "seco')  # SIGKILL mid-write
    ledger = open_fake(tmp_path, clock)
    ledger.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert all(json.loads(line) for line in lines)  # the torn line is gone, new records start on a new line
    path.write_text(path.read_text(encoding="utf-8") + "not json\n{}\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"ledger.jsonl line \d+"):
        summarize_ledger(tmp_path / "ledger")


def test_a_complete_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    """A kill between a record and its newline: the record is whole (experiment.jsonl keeps it), and the
    next session starts its records on a fresh line."""
    clock = FakeClock()
    crashed_session(tmp_path, clock)
    path = tmp_path / "ledger" / LEDGER_FILE
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[-1])["e"] == "tokens"
    before = summarize_ledger(tmp_path / "ledger")
    assert before.last_step == 150  # the unterminated tokens record of steps 101-150 counts
    open_fake(tmp_path, clock).close()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    kinds = [r["e"] for r in records]
    assert kinds[-3:] == ["tokens", "open", "close"] and records[-3]["step"] == 150


def test_unknown_phase_is_refused(tmp_path: Path) -> None:
    ledger = open_fake(tmp_path, FakeClock())
    with pytest.raises(ValueError, match="unknown ledger phase"), ledger.phase("training"):
        pass
    ledger.close()


WORKER = textwrap.dedent("""
    import sys, time
    from cost.ledger import Ledger
    from experiment.sections.cost import CostConfig, InfraItem
    cfg = CostConfig(accelerator="tpu-v5e", chips=8, usd_rub_rate=100.0, usd_rub_date=sys.argv[2],
                     flush_seconds=0.2)
    ledger = Ledger.open(sys.argv[1], cfg, "run-kill")
    if sys.argv[3] != "-":
        ledger.mark_resume(int(sys.argv[3]))
    start, stop = int(sys.argv[4]), int(sys.argv[5])
    for step in range(start, stop + 1):
        with ledger.phase("train"):
            time.sleep(0.03)
            ledger.add_tokens(step, 100)
        if step % 10 == 0:
            with ledger.phase("checkpoint"):
                ledger.mark_checkpoint(step)
            print(f"ckpt {step}", flush=True)
    ledger.close()
    print("done", flush=True)
""")


def wait_for_heartbeat_after(path: Path, step: int, timeout: float = 60.0) -> None:
    """Until the background thread has fsynced the tokens of ``step`` (polled, no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_bytes().split(b"\n")[:-1]  # complete lines only
        if any(r["e"] == "tokens" and r["step"] >= step for r in map(json.loads, lines)):
            return
        time.sleep(0.02)
    raise AssertionError(f"no tokens record of step {step} in {path} after {timeout} s")


@pytest.mark.integration
def test_sigkill_mid_run_then_resume(tmp_path: Path) -> None:
    ledger_dir = tmp_path / "ledger"
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    today = dt.date.today().isoformat()
    t_begin = time.time()
    proc = subprocess.Popen([sys.executable, str(script), str(ledger_dir), today, "-", "1", "1000"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ckpt 20":
            break
    t_seen = time.time()
    wait_for_heartbeat_after(ledger_dir / LEDGER_FILE, step=22)  # however loaded the machine is
    proc.send_signal(signal.SIGKILL)
    t_killed = time.time()
    proc.wait(timeout=10)
    crashed = summarize_ledger(ledger_dir)
    assert crashed.last_step >= 21  # the heartbeat fsynced steps after the checkpoint
    resumed = subprocess.run([sys.executable, str(script), str(ledger_dir), today, "20", "21", "30"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    t_end = time.time()
    s = summarize_ledger(ledger_dir)
    assert s.sessions == 2
    assert s.tokens == 30 * 100  # one continuous run of 30 steps: nothing counted twice
    assert s.last_step == 30
    # the steps after 20 up to the last heartbeat (two or more of 30 ms), never more than the time it ran
    assert 0.06 < s.seconds_by_phase["lost"] < t_killed - t_seen + 1.0
    assert s.rub_lost_to_restarts == pytest.approx(s.seconds_by_phase["lost"] / HOUR * RUB_PER_HOUR)
    # every second priced once: time records never overlap and never exceed the wall clock we watched
    records = [json.loads(line) for line in (ledger_dir / LEDGER_FILE).open(encoding="utf-8")]
    spans = sorted((r["t0"], r["t1"]) for r in records if r["e"] == "time")
    assert all(sum(r["seconds"].values()) == pytest.approx(r["t1"] - r["t0"]) for r in records if r["e"] == "time")
    assert all(a_end <= b_start + 1e-6 for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    paid = sum(t1 - max(t0, t_begin) for t0, t1 in spans if t1 > t_begin)
    assert paid <= t_end - t_begin + 1e-3


def test_steps_cost_no_io_between_flushes(tmp_path: Path) -> None:
    """10,000 steps of 10 ms with flush_seconds=5: a record per flush, not per step."""
    clock = FakeClock()
    ledger = open_fake(tmp_path, clock, v5e_config(flush_seconds=5.0))
    for step in range(1, 10_001):
        with ledger.phase("train"):
            clock.t += 0.009
            ledger.add_tokens(step, 512)
        clock.t += 0.001  # between steps: idle
    ledger.close()
    lines = (tmp_path / "ledger" / LEDGER_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) < 2 * 100 / 5 + 10  # ~20 flushes of a time and a tokens record
    s = summarize_ledger(tmp_path / "ledger")
    assert s.tokens == 10_000 * 512 and s.last_step == 10_000
    assert s.seconds_by_phase["train"] == pytest.approx(90.0)
    assert s.seconds_by_phase["idle"] == pytest.approx(10.0)


def test_cost_summary_table(tmp_path: Path) -> None:
    from cost.report import to_terminal
    from cost.summary import PHASE_COLUMNS

    clock = FakeClock()
    ledger = open_fake(tmp_path, clock, v5e_config(token_budget=2_000_000_000))
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(10, 1_000_000_000)
    with ledger.phase("eval"):
        clock.advance(0.25)
    ledger.close()
    summary = summarize_ledger(tmp_path / "ledger")
    rows = summary.phase_rows()
    assert [r["phase"] for r in rows] == ["train", "eval", "total"]
    assert rows[-1]["rub"] == pytest.approx(1.25 * RUB_PER_HOUR) and rows[0]["share"] == pytest.approx(0.8)
    text = to_terminal(rows, PHASE_COLUMNS, "")
    assert " 960 │" in text and " 1,200 │" in text and " 80.0% │" in text
    assert summary.projected_rub_total == pytest.approx(2400.0)


def test_bad_cost_config_is_refused_before_any_record(tmp_path: Path) -> None:
    from cost.catalog import CatalogError
    from experiment.config import load_config
    from experiment.errors import ConfigError

    demo = REPO / "recipes" / "configs" / "demo.yaml"
    cfg = load_config(demo, ["cost.infrastructure=[{name: cpu-host-e2-standrd-16, quantity: 1}]"])
    with pytest.raises(CatalogError, match=r"cost.infrastructure\[0\].name.*did you mean 'cpu-host-e2-standard-16'"):
        Ledger.open(tmp_path / "ledger", cfg.cost, "r", rate=RATE, background=False)
    with pytest.raises(CatalogError, match=r"cost.accelerator.*unknown accelerator 'tpu-v9'"):
        Ledger.open(tmp_path / "ledger", v5e_config(accelerator="tpu-v9"), "r", rate=RATE, background=False)
    assert not (tmp_path / "ledger" / LEDGER_FILE).exists()
    with pytest.raises(ConfigError, match=r"cost.usd_rub_date': a configured usd_rub_rate needs its date"):
        load_config(demo, ["cost.usd_rub_date="])
    with pytest.raises(ConfigError, match=r"cost.chips': must be >= 1"):
        load_config(demo, ["cost.chips=0"])


def test_a_later_resume_judges_every_earlier_session(tmp_path: Path) -> None:
    """Session 0 crashed after checkpoint 100; session 1 resumed from 100 and ended cleanly at 200;
    session 2 started over from step 0 (checkpoints deleted): all earlier training was redone."""
    clock = FakeClock()
    crashed_session(tmp_path, clock)  # train 1 h to step 100, checkpoint, 1 h more to step 150
    ledger = open_fake(tmp_path, clock)
    ledger.mark_resume(100)
    with ledger.phase("train"):
        clock.advance(1.0)
        ledger.add_tokens(200, 1_000_000_000)
    ledger.close()
    kept = summarize_ledger(tmp_path / "ledger")
    assert kept.seconds_by_phase["lost"] == pytest.approx(1.0 * HOUR) and kept.tokens == 2_000_000_000
    ledger = open_fake(tmp_path, clock)
    ledger.mark_resume(0)
    ledger.close()
    s = summarize_ledger(tmp_path / "ledger")
    assert s.seconds_by_phase["lost"] == pytest.approx(3.0 * HOUR)  # every training hour of sessions 0 and 1
    assert s.tokens == 0 and s.hours == pytest.approx(kept.hours)


# ---------------------------------------------------------------------------------------------
# Reconciliation on resume, driven through the trainer's own code: each session restores like
# trainer/train.py (trainer.resume.restore_or_init, trainer.branch.restore_or_branch: mark_resume,
# inherit), trains in trainer.train.run_loop (train_one_step books compile/train/data and the tokens)
# and saves with trainer.hooks.SaveCheckpoint / StopOnSignal (CheckpointSaves: the ledger item taken
# when a save starts, the mark once it is known on disk). Only Orbax and the model are stand-ins: a
# fake clock, a train step that takes ``STEP_S`` of it, and a checkpoint manager that writes each
# step's JSON items and their checksums (trainer.checkpoint_integrity) where Orbax would commit them.

TOKENS_PER_STEP = 2048  # the tiny experiment: 60 steps are 122,880 tokens
STEP_S = 1.0  # fake seconds per train step
SAVE_S = 0.25  # fake seconds a checkpoint save blocks the loop
META = {"family": "llama", "model": {"family": "llama"}, "vocab_size": 8, "tokenizer_sha256": "0" * 64, "seq_len": 2}


class FakeManager:
    """Orbax's CheckpointManager as the trainer uses it, over plain files: ``save`` commits the step at
    once (an async save finished in the background), ``restore`` gives back the JSON items saved."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.directory, self.clock = Path(directory), clock
        self.directory.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, args: Any, force: bool = False) -> bool:
        from trainer.checkpoint_integrity import mark_checksummed, write_checksums

        self.clock.t += SAVE_S
        step_dir = self.directory / str(step)
        step_dir.mkdir()
        mark_checksummed(self.directory)
        atomic_write_json(step_dir / "items.json", {name: args[name].item for name in ("loader", "ledger", "meta")})
        write_checksums(step_dir)
        return True

    def items(self, step: int) -> dict[str, Any]:
        return json.loads((self.directory / str(step) / "items.json").read_text(encoding="utf-8"))

    def restore(self, step: int, args: Any) -> dict[str, Any]:
        items = self.items(step)
        train = {"opt_state": {}, "step": step, "rng": 0}
        return {name: items.get(name, {} if name == "params" else train) for name in args}  # the items asked for

    def all_steps(self) -> list[int]:
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def wait_until_finished(self) -> None: ...

    def reload(self) -> None: ...

    def close(self) -> None: ...


class FakeProgram:
    """A TrainProgram whose step takes STEP_S of the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        import jax

        self.clock = clock
        self.batch_sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        self.abstract_state = {"params": {}, "opt_state": {}, "step": 0, "rng": 0}

    def init_state(self) -> dict[str, Any]:
        return dict(self.abstract_state)

    def checkpoint_layout(self, scanned: bool) -> tuple[dict[str, Any], Any]:
        return self.abstract_state, lambda state: state

    def step(self, state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        self.clock.t += STEP_S
        return state, {"loss": 1.0, "grad_norm": 1.0, "finite": True}


class FakeLoader:
    def __init__(self) -> None:
        self.position = 0

    def __next__(self) -> dict[str, Any]:
        import numpy as np

        self.position += 1
        return {"inputs": np.zeros((1, 2), np.int32)}

    def get_state(self) -> dict[str, Any]:
        return {"position": self.position}

    def set_state(self, state: dict[str, Any]) -> None:
        self.position = state["position"]

    def tokens_by_set(self, batch: int, tokens_per_step: int) -> None:  # one shard set: no tokens by set
        return None


class Killed(BaseException):
    """SIGKILL: nothing after it runs (no hook, no ledger close)."""


@dataclasses.dataclass
class StepHook:
    """A hook due after every step that does ``action(ctx)`` after step ``step``."""

    step: int
    action: Any

    def schedule(self, train_cfg: Any) -> Any:
        from trainer.hooks import Schedule

        return Schedule(every=1)

    def __call__(self, ctx: Any) -> None:
        if ctx.step == self.step:
            self.action(ctx)


def kill(ctx: Any) -> None:
    raise Killed


def sigkill(ledger: Ledger) -> None:
    ledger._file.close()  # the process dies: what was only counted in memory is gone  # noqa: SLF001


def run_session(root: Path, clock: FakeClock, cfg: CostConfig, *, to: int, checkpoint_every: int,
                killed: bool = False, branch: Any = None, hooks: tuple[Any, ...] | None = None) -> Ledger:
    """One process of recipe 04 on the run folder ``root``: open the ledger, restore as trainer.train
    does (the newest complete checkpoint, or the parent's for a branch without one of its own), train
    up to step ``to`` with the trainer's hooks. ``killed``: SIGKILL right after step ``to``; otherwise
    ``to`` is ``train.steps``, the loop saves it and waits for its saves, and the ledger is closed."""
    from trainer.branch import restore_or_branch
    from trainer.hooks import CheckpointSaves, LoopContext, SaveCheckpoint, StopOnSignal
    from trainer.throughput import MetricsWindow
    from trainer.train import run_loop

    ledger = open_fake(root, clock, cfg)
    manager, program, loader = FakeManager(root / "checkpoints", clock), FakeProgram(clock), FakeLoader()
    state, start, _ = restore_or_branch(manager, program, loader, META, ledger, branch)
    train_cfg = SimpleNamespace(steps=10**9 if killed else to, checkpoint_every=checkpoint_every,
                                preemption_grace_s=10**9, nan_policy="stop")
    ctx = LoopContext(cfg=SimpleNamespace(train=train_cfg),
                      run_folder=SimpleNamespace(checkpoints=root / "checkpoints"),
                      program=program, loader=loader, ledger=ledger, wandb_run=None, train_log=None,
                      saves=CheckpointSaves(manager, ledger), window=MetricsWindow(TOKENS_PER_STEP, 1.0, None),
                      meta=META, tokens_per_step=TOKENS_PER_STEP, start_step=start, state=state, step=start)
    loop_hooks = list(hooks if hooks is not None else (SaveCheckpoint(), StopOnSignal()))
    if killed:
        with pytest.raises(Killed):
            run_loop(ctx, [*loop_hooks, StepHook(to, kill)])
        sigkill(ledger)
        return ledger
    with ledger:  # as trainer.train.pretrain: an exception (SystemExit after SIGTERM) closes it with clean=False
        run_loop(ctx, loop_hooks)
    return ledger


def ledger_item(root: Path, step: int) -> dict[str, Any]:
    """The ledger item of the checkpoint of ``step`` in the run folder ``root``, as saved."""
    return FakeManager(root / "checkpoints", FakeClock()).items(step)["ledger"]


def test_two_kills_count_every_step_before_the_checkpoint_once(tmp_path: Path) -> None:
    """Session 0 saves step 40 and is killed at 46, session 1 resumes from 40 and is killed at 57
    before its save of 60; session 2 resumes from 40 again and finishes: 60 steps, 122,880 tokens."""
    clock = FakeClock()
    cfg = v5e_config(flush_seconds=6.0)
    run_session(tmp_path, clock, cfg, to=46, checkpoint_every=40, killed=True)
    run_session(tmp_path, clock, cfg, to=57, checkpoint_every=60, killed=True)
    run_session(tmp_path, clock, cfg, to=60, checkpoint_every=60)
    s = summarize_ledger(tmp_path / "ledger")
    assert s.sessions == 3 and s.last_step == 60
    assert [r["resumed_from"] for r in summarize_sessions(tmp_path / "ledger")] == [0, 40, 40]
    assert s.tokens == 60 * TOKENS_PER_STEP == 122_880
    # redone and priced as lost: the training flushed to the file after the save of 40 (steps 41-46
    # of session 0, 42-52 of session 1 after compiling 41); what ran after a session's last flush
    # is not in the file
    assert s.seconds_by_phase["lost"] == pytest.approx(6.0 + 11.0)
    assert s.seconds_by_phase["train"] == pytest.approx(39.0 + 19.0)  # steps 2-40 and 42-60 once
    assert s.seconds_by_phase["compile"] == pytest.approx(3.0)
    assert s.seconds_by_phase["checkpoint"] == pytest.approx(2 * SAVE_S)  # the saves of 40 and 60


def test_kills_before_the_first_checkpoint_then_a_fresh_start(tmp_path: Path) -> None:
    """Two sessions killed before any checkpoint existed; the third starts from step 0 (trainer/resume.py
    books that as a resume from 0), saves step 10 and is killed at 12; the fourth resumes from 10 and
    finishes at 14. The first two trained steps the third trained again: none of their tokens count."""
    clock = FakeClock()
    cfg = v5e_config(flush_seconds=2.0)
    for last in (6, 8, 12):
        run_session(tmp_path, clock, cfg, to=last, checkpoint_every=10, killed=True)
    run_session(tmp_path, clock, cfg, to=14, checkpoint_every=10)
    assert summarize_ledger(tmp_path / "ledger").tokens == 14 * TOKENS_PER_STEP
    sessions = summarize_sessions(tmp_path / "ledger")
    assert [(s["tokens"], s["resumed_from"], s["closed"], s["clean"]) for s in sessions] == [
        (0, 0, False, None), (0, 0, False, None), (10 * TOKENS_PER_STEP, 0, False, None),
        (4 * TOKENS_PER_STEP, 10, True, True)]
    # steps 2-6 and 2-8 (after compiling step 1), on file since the 2 s heartbeat came due at steps 6
    # and 8; steps 11-12 after the save of 10
    assert [s["seconds_by_phase"].get("lost", 0.0) for s in sessions] == pytest.approx([5.0, 7.0, 2.0, 0.0])


def test_kill_within_flush_seconds_after_a_checkpoint(tmp_path: Path) -> None:
    """The first save of a session, then a kill 3 steps later, long before the next heartbeat: the
    10 steps before the save are counted with their time, not lost."""
    clock = FakeClock()
    cfg = v5e_config(flush_seconds=1000.0)
    run_session(tmp_path, clock, cfg, to=13, checkpoint_every=10, killed=True)
    run_session(tmp_path, clock, cfg, to=20, checkpoint_every=10)
    s = summarize_ledger(tmp_path / "ledger")
    assert s.tokens == 20 * TOKENS_PER_STEP and s.last_step == 20
    assert s.seconds_by_phase["train"] == pytest.approx(9.0 + 9.0)
    assert s.seconds_by_phase.get("lost", 0.0) == 0.0  # steps 11-13 of session 0 never reached the file


def test_checkpoint_saved_before_the_ledger_flushed_is_reconciled(tmp_path: Path) -> None:
    """A checkpoint whose ledger item is a plain summary (an older trainer saved it without flushing
    the ledger first): the file has session 0's tokens up to its last heartbeat (step 31), the
    checkpoint says step 40."""
    from trainer import checkpoint

    def old_trainer_save(ctx: Any) -> None:  # what the older SaveCheckpoint did: no phase, no flush
        checkpoint.save(ctx.saves.manager, ctx.step, ctx.state, ctx.loader.get_state(),
                        dataclasses.asdict(ctx.ledger.summary()), ctx.meta, force=True)

    clock = FakeClock()
    cfg = v5e_config(flush_seconds=32.0)
    run_session(tmp_path, clock, cfg, to=46, checkpoint_every=0, killed=True, hooks=(StepHook(40, old_trainer_save),))
    assert summarize_ledger(tmp_path / "ledger").last_step < 40  # the file missed steps up to 40
    assert "session" not in ledger_item(tmp_path, 40)
    run_session(tmp_path, clock, cfg, to=60, checkpoint_every=20)
    s = summarize_ledger(tmp_path / "ledger")
    assert s.tokens == 60 * TOKENS_PER_STEP == 122_880 and s.last_step == 60


def test_sigterm_exit_after_its_checkpoint_is_a_clean_close(tmp_path: Path) -> None:
    """SIGTERM during step 25: the trainer saves the step it is at, waits for the save, then raises
    SystemExit(143) (trainer.preemption, StopOnSignal); the ledger's close is clean."""
    from trainer.hooks import SaveCheckpoint, StopOnSignal

    def sigterm(ctx: Any) -> None:
        assert signal.getsignal(signal.SIGTERM) == ctx.preemption._on_sigterm  # noqa: SLF001 (or SIGTERM kills pytest)
        clock.t += 0.5  # the signal arrives between steps: idle, not lost
        os.kill(os.getpid(), signal.SIGTERM)

    clock = FakeClock()
    with pytest.raises(SystemExit) as exited:
        run_session(tmp_path, clock, v5e_config(), to=100, checkpoint_every=0,
                    hooks=(StepHook(25, sigterm), SaveCheckpoint(), StopOnSignal()))
    assert exited.value.code == 143
    records = [json.loads(line) for line in (tmp_path / "ledger" / LEDGER_FILE).open(encoding="utf-8")]
    assert [r["step"] for r in records if r["e"] == "ckpt"] == [25]
    assert records[-1]["e"] == "close" and records[-1]["clean"] is True
    assert "lost" not in summarize_ledger(tmp_path / "ledger").seconds_by_phase
    run_session(tmp_path, clock, v5e_config(), to=26, checkpoint_every=0)
    s = summarize_ledger(tmp_path / "ledger")
    assert [r["resumed_from"] for r in summarize_sessions(tmp_path / "ledger")] == [0, 25]
    assert s.tokens == 26 * TOKENS_PER_STEP
    assert "lost" not in s.seconds_by_phase and s.seconds_by_phase["idle"] == pytest.approx(0.5)


def test_checkpoint_item_is_the_resume_mark_and_older_items_restore_alike(tmp_path: Path) -> None:
    """The item holds what a resume reads (session, moment, tokens), not the summary (the file has the costs);
    an item saved with the whole summary beside those keys reconciles exactly as the mark does."""
    from trainer.checkpoint_integrity import write_checksums

    clock = FakeClock()
    cfg = v5e_config(flush_seconds=2.0)
    ledger = run_session(tmp_path / "run", clock, cfg, to=25, checkpoint_every=20, killed=True)
    summary_at_25 = ledger.summary()
    item = ledger_item(tmp_path / "run", 20)
    assert set(item) == {"step", "session", "t", "tokens"} and item["tokens"] == 20 * TOKENS_PER_STEP
    older = {**dataclasses.asdict(summary_at_25), **item}
    summaries = []
    for saved in (item, older):
        copy = tmp_path / f"copy-{len(summaries)}"
        shutil.copytree(tmp_path / "run", copy)
        step_dir = copy / "checkpoints" / "20"
        atomic_write_json(step_dir / "items.json", {**json.loads((step_dir / "items.json").read_text()),
                                                    "ledger": saved})
        write_checksums(step_dir)
        run_session(copy, clock, cfg, to=20, checkpoint_every=20)  # resume from 20, nothing left to train
        summaries.append(summarize_ledger(copy / "ledger"))
    assert summaries[0].tokens == summaries[1].tokens == 20 * TOKENS_PER_STEP
    assert summaries[0].rub_lost_to_restarts == pytest.approx(summaries[1].rub_lost_to_restarts)
    assert summaries[0].rub_lost_to_restarts > 0  # steps 21-25 were redone


def test_a_branch_costs_its_parent_up_to_the_branch_step_plus_its_own(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent is killed after saving step 20, resumes from it and saves 30 and 40; a decay branch
    from step 30 has its first session killed before any checkpoint, branches again, saves 35 and 40,
    is killed, and a third session resumes from 40 to 45. The parent's cost at 30 includes its lost
    work; the branch costs that plus its own and counts steps 1-45 once."""
    from experiment.runfolder import RunFolder
    from trainer import checkpoint
    from trainer.branch import Branch

    clock = FakeClock()
    cfg = v5e_config(flush_seconds=6.0)
    run_session(tmp_path / "parent", clock, cfg, to=29, checkpoint_every=20, killed=True)
    run_session(tmp_path / "parent", clock, cfg, to=40, checkpoint_every=10)
    at_30 = summarize_ledger_at(tmp_path / "parent" / "ledger", ledger_item(tmp_path / "parent", 30))
    assert at_30.tokens == 30 * TOKENS_PER_STEP and at_30.last_step == 30
    assert at_30.rub_lost_to_restarts > 0 and at_30.rub_total == pytest.approx(at_30.hours * RUB_PER_HOUR)
    assert at_30.rub_total < summarize_ledger(tmp_path / "parent" / "ledger").rub_total

    # the branch reads its parent's checkpoint through checkpoint.open_manager (Orbax): the same stand-in
    monkeypatch.setattr(checkpoint, "open_manager", lambda directory, train_cfg=None: FakeManager(directory, clock))
    branch = Branch(RunFolder(tmp_path / "parent"), 30)
    run_session(tmp_path / "branch", clock, cfg, to=39, checkpoint_every=100, killed=True, branch=branch)
    run_session(tmp_path / "branch", clock, cfg, to=41, checkpoint_every=5, killed=True, branch=branch)
    run_session(tmp_path / "branch", clock, cfg, to=45, checkpoint_every=5, branch=branch)

    s = summarize_ledger(tmp_path / "branch" / "ledger")
    assert [r["resumed_from"] for r in summarize_sessions(tmp_path / "branch" / "ledger")] == [30, 30, 40]
    assert s.tokens == 45 * TOKENS_PER_STEP and s.last_step == 45
    own_lines = [line for line in (tmp_path / "branch" / "ledger" / LEDGER_FILE).read_text().splitlines()
                 if json.loads(line)["e"] != "inherit"]
    (tmp_path / "own" / "ledger").mkdir(parents=True)
    (tmp_path / "own" / "ledger" / LEDGER_FILE).write_text("\n".join(own_lines) + "\n")
    own = summarize_ledger(tmp_path / "own" / "ledger")
    assert own.tokens == 15 * TOKENS_PER_STEP and own.rub_lost_to_restarts > 0  # the first session's steps
    assert s.rub_total == pytest.approx(at_30.rub_total + own.rub_total, rel=1e-12)
    assert s.hours == pytest.approx(at_30.hours + own.hours, rel=1e-12)
    assert s.rub_lost_to_restarts == pytest.approx(at_30.rub_lost_to_restarts + own.rub_lost_to_restarts, rel=1e-12)
