"""Hostile inputs: a config, a file the project reads back or a folder it writes into, made to exhaust memory,
the interpreter's stack or a disk; each is one error line naming the file, before anything is built from it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from experiment.config import MAX_ALIAS_VALUES, load_config
from experiment.errors import ECHO_LIMIT, ConfigError

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "recipes" / "configs" / "demo.yaml"
LOL = '["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'


def laughs(levels: int) -> str:
    """A billion-laughs flow list: anchor ``l0`` holds nine strings, each next anchor nine aliases of the last."""
    parts = [f"&l0 {LOL}"] + [f"&l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(parts)}]"


def config_with(tmp_path: Path, name_value: str) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text(DEMO.read_text(encoding="utf-8").replace("  name: demo\n", f"  name: {name_value}\n"),
                    encoding="utf-8")
    return path


def test_a_billion_laughs_config_is_one_short_line_naming_the_file(tmp_path: Path) -> None:
    """Five levels of aliases (66,430 values from six lines): the error used to quote them all, a 481 KB line."""
    config = config_with(tmp_path, laughs(5))
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert message.startswith(f"config file {config} is refused: its aliases expand to ") and len(message) < 300
    with pytest.raises(ConfigError, match=r"^override 'experiment.name': the value is refused: its aliases expand"):
        load_config(DEMO, [f"experiment.name={laughs(5)}"])


def test_aliases_within_the_bound_load_and_a_cycle_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared.yaml"  # one list reused: a few values more, as YAML users write them
    shared.write_text(DEMO.read_text(encoding="utf-8").replace("  d_model: 256", "  d_model: &width 256").replace(
        "  max_seq_len: 128", "  max_seq_len: *width"), encoding="utf-8")
    assert load_config(shared).model.max_seq_len == 256
    assert 9 ** 4 < MAX_ALIAS_VALUES < 9 ** 5  # four levels are within the bound, five beyond it
    with pytest.raises(ConfigError, match="expected a string, got"):
        load_config(config_with(tmp_path, laughs(4)))
    with pytest.raises(ConfigError, match="an alias refers to the anchor it is inside"):
        load_config(config_with(tmp_path, "&me [*me]"))


def test_an_error_quotes_at_most_a_line_of_the_value(tmp_path: Path) -> None:
    """A megabyte string or a long list given where a number belongs is quoted cut, on one line."""
    for override in ("train.steps=" + "x" * 1_000_000, "train.steps=[" + ", ".join(["1"] * 100_000) + "]",
                     "tokenizer.model_type=" + "y" * 10_000):
        with pytest.raises(ConfigError) as caught:
            load_config(DEMO, [override])
        assert len(str(caught.value)) < ECHO_LIMIT + 120 and "..." in str(caught.value)


def test_deeply_nested_yaml_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config file .*bomb.yaml is refused: values nested more than 32 levels"):
        load_config(config_with(tmp_path, "[" * 5000 + "]" * 5000))
    with pytest.raises(ConfigError, match=r"^override 'train.steps': the value is refused: values nested"):
        load_config(DEMO, ["train.steps=" + "{a: " * 40 + "1" + "}" * 40])


@pytest.mark.parametrize("depth", [150, 100_000])
def test_deeply_nested_json_in_a_manifest_or_a_ledger_line_is_one_line_naming_it(tmp_path: Path, depth: int) -> None:
    """100,000 levels used to be a RecursionError traceback; 150 parsed, a hazard for every walk after it."""
    from cost.ledger_format import read_records
    from experiment.errors import DataError
    from experiment.manifest import manifest_path, read_manifest, write_manifest
    from experiment.storage import location

    nested = "[" * depth + "]" * depth
    stage = tmp_path / "corpus"
    stage.mkdir()
    write_manifest(str(stage), "corpus", {"counts": {}})
    path = Path(str(manifest_path(str(stage))))
    path.write_text(path.read_text(encoding="utf-8").replace('"counts": {}', f'"counts": {nested}'), encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path} is not a readable manifest \(nested more than 100 levels deep\)"):
        read_manifest(str(stage), "corpus", "recipes/01_build_corpus.py")
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"kind": "session"}\n' + f'{{"kind": {nested}}}\n', encoding="utf-8")
    for text in (ledger.read_text(encoding="utf-8"), ledger.read_text(encoding="utf-8").rstrip("\n")):
        ledger.write_text(text, encoding="utf-8")  # with and without the last newline: deep is never a torn tail
        with pytest.raises(DataError, match=rf"^{ledger} line 2: not valid JSON \(nested more than 100 levels deep\)"):
            read_records(location(str(ledger)))


def sparse_hf_folder(folder: Path, **shape: int) -> int:
    """A Hugging Face Llama folder whose config.json and safetensors header agree on a model of ``shape``, the
    weights a sparse file (no disk used); returns the weights' declared bytes (bf16)."""
    import json

    import numpy as np
    from flax import nnx

    from model.hf_tensors import get_path
    from model.registry import get_family

    family = get_family("llama")
    cfg = family.config_cls(**shape, scan_layers=False)
    abstract = nnx.to_pure_dict(nnx.state(family.abstract(cfg, 32000), nnx.Param))
    header, offset = {}, 0
    for tensor in family.hf_adapter.tensors(cfg):
        hf_shape = tensor.hf_shape(tuple(get_path(abstract, tensor.path).shape))
        size = int(np.prod(hf_shape)) * 2
        header[tensor.name] = {"dtype": "BF16", "shape": list(hf_shape), "data_offsets": [offset, offset + size]}
        offset += size
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(family.hf_adapter.to_config(cfg, 32000)), encoding="utf-8")
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with (folder / "model.safetensors").open("wb") as weights:
        weights.write(len(head).to_bytes(8, "little") + head)
        weights.truncate(8 + len(head) + offset)
    return offset


def test_an_init_from_larger_than_memory_is_refused_before_a_tensor_is_read(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A consistent 2.2 TiB Llama folder (1.3 trillion parameters in bf16, sparse weights) was read tensor by tensor
    until a MemoryError; now one line names the folder and the sizes, and not a byte of a tensor is read."""
    from experiment.errors import DataError
    from model.hf_checkpoint import LazyTensor, load_hf_checkpoint

    def read(tensor: LazyTensor, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"tensor {tensor.name} was read")

    monkeypatch.setattr(LazyTensor, "__array__", read)

    folder = tmp_path / "huge"
    declared = sparse_hf_folder(folder, d_model=65536, n_layers=21, n_heads=512, n_kv_heads=8, d_ff=262144,
                                max_seq_len=4096)
    assert 2.2 * 2**40 < declared < 2.4 * 2**40
    with pytest.raises(DataError, match=rf"^{folder}: the model its config.json and weights declare has "
                                        r"1,\d{3},\d{3},\d{3},\d{3} parameters, \d+\.\d GiB as float32, more than the "
                                        r"\d+\.\d GiB available on 1 cpu device: nothing was read"):
        load_hf_checkpoint(folder)


def test_an_init_from_larger_than_the_planned_slice_is_refused_by_the_checks(tmp_path: Path) -> None:
    """The same folder under recipe 04's checks, before a run folder, W&B or JAX exists: on the demo's CPU (the
    machine's 8 GiB in cost/hardware.csv) and on 8 TPU v5e chips (8 x 16 GiB), one line naming the folder and the
    slice."""
    from experiment.check import check_config
    from experiment.stages import PRETRAIN

    folder = tmp_path / "huge"
    sparse_hf_folder(folder, d_model=65536, n_layers=21, n_heads=512, n_kv_heads=8, d_ff=262144, max_seq_len=4096)
    config = tmp_path / "huge.yaml"  # a continued-pretraining config: the shape is the base's
    config.write_text(f"experiment: {{name: huge, run_root: {tmp_path / 'runs'}}}\n"
                      f"model: {{init_from: {folder}, max_seq_len: 128}}\n"
                      "cost: {accelerator: cpu-e2-standard-2, chips: 1, usd_rub_rate: 100.0,\n"
                      "       usd_rub_date: '2026-12-01'}\n",
                      encoding="utf-8")
    for slice_overrides, where in (([], "1 x cpu-e2-standard-2"), (["cost.accelerator=tpu-v5e", "cost.chips=8"],
                                                                   "8 x tpu-v5e")):
        cfg = load_config(config, slice_overrides)
        problems, _, _ = check_config(cfg, [PRETRAIN])
        assert len(problems) == 1 and problems[0].startswith(f"{folder}: the model its config.json"), problems
        assert f"available on {where}" in problems[0]
    assert not (tmp_path / "runs").exists()


class FullDisk:
    """A log file's handle once its disk is full: every write and flush fails as write(2) does (ENOSPC)."""

    def __init__(self, handle: object) -> None:
        self.handle = handle

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    flush = write

    def fileno(self) -> int:
        return self.handle.fileno()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.handle.close()  # type: ignore[attr-defined]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the buffer it would write out first


def test_a_full_ledger_disk_stops_the_run_at_its_next_step_naming_the_ledger_and_its_disk(tmp_path: Path) -> None:
    """The heartbeat's flush failed in its own thread and died there: training went on unrecorded until the next
    checkpoint, whose error named the checkpoints' disk. Now the next call of the training thread raises it."""
    import datetime as dt

    from cost.ledger import Ledger
    from cost.rates import UsdRubRate
    from experiment.errors import WriteError
    from experiment.files import mount_point
    from experiment.sections.cost import CostConfig

    cfg = CostConfig(accelerator="tpu-v5e", pricing="on-demand", chips=8, usd_rub_rate=100.0,
                     usd_rub_date=dt.date.today().isoformat(), flush_seconds=0.05)
    ledger = Ledger.open(tmp_path / "ledger", cfg, "run-1", rate=UsdRubRate(100.0, dt.date.today(), "test"))
    path = tmp_path / "ledger" / "ledger.jsonl"
    with ledger.phase("train"):
        ledger.add_tokens(1, 1000)
    log = ledger._file._log
    log._handle = FullDisk(log._handle)
    assert ledger._thread is not None
    ledger._thread.join(timeout=10)  # the heartbeat's flush meets the full disk and ends
    assert not ledger._thread.is_alive()
    expected = (rf"^cannot write {path}: No space left on device \(.* free on that disk\): free space on the disk "
                rf"mounted at {mount_point(path)} and rerun the same command")
    with pytest.raises(WriteError, match=expected), ledger.phase("train"):  # the next step
        pass
    with pytest.raises(WriteError, match=expected):
        ledger.add_tokens(2, 1000)
    ledger.close(clean=False)  # ends without writing, without a second error
    assert ledger._closed


def test_a_read_only_lock_folder_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock folder on a read-only mount (EROFS: root too is refused) was a PermissionError/OSError traceback."""
    from experiment import lock
    from experiment.errors import WriteError

    locks = tmp_path / "run" / lock.LOCKS_DIR
    locks.mkdir(parents=True)
    real_open = os.open

    def read_only(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if Path(path).parent == locks and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    expected = (rf"^cannot take the lock {locks / 'shards.lock'}: Read-only file system: every stage writes its "
                rf"lock in {locks}; make that folder writable")
    with monkeypatch.context() as patch:
        patch.setattr(lock.os, "open", read_only)
        with pytest.raises(WriteError, match=expected), lock.hold(locks / "shards.lock", "shards"):
            pass
    if os.geteuid() != 0:  # a folder without write permission (root writes anyway)
        locks.chmod(0o555)
        try:
            with pytest.raises(WriteError, match=r"Permission denied: every stage writes its lock"), \
                    lock.hold(locks / "shards.lock", "shards"):
                pass
        finally:
            locks.chmod(0o755)


def test_credentials_outside_the_name_list_are_recorded_as_their_reference(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """DATABASE_URL (a password in its URL), PRIVATE_KEY_PEM and GH_PAT were written in clear to
    config.resolved.yaml and the W&B config; by name or by the value's shape they are now ``${VAR}``."""
    import yaml

    from experiment.config import dump_yaml, is_secret_var, to_dict

    secrets = {"DATABASE_URL": "postgresql://trainer:Pw-81xQ@db.internal:5432/runs",
               "PRIVATE_KEY_PEM": "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
               "GH_PAT": "github_pat_11AAQ7Z2Y0xVxk"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RU_PLAIN_URL", "https://mirror.example.org/data")  # no credential: recorded as it is
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"experiment": {"name": "x", "description": "db ${DATABASE_URL} via ${GH_PAT}",
                                                   "run_root": str(tmp_path / "runs")},
                                    "wandb": {"tags": ["${PRIVATE_KEY_PEM}", "${RU_PLAIN_URL}"]}}), encoding="utf-8")
    cfg = load_config(path)
    assert cfg.experiment.description == f"db {secrets['DATABASE_URL']} via {secrets['GH_PAT']}"  # the run sees them
    recorded = dump_yaml(cfg) + repr(to_dict(cfg))
    assert not [name for name, value in secrets.items() if value in recorded]
    assert "db ${DATABASE_URL} via ${GH_PAT}" in recorded and "${PRIVATE_KEY_PEM}" in recorded
    assert "https://mirror.example.org/data" in recorded
    assert not any(map(is_secret_var, ["PATH", "PWD", "HOME", "KEYBOARD", "RU_SHARED_DATA", "AUTHOR"]))


def test_recipe_02_refuses_a_corpus_edited_after_recipe_01_before_the_old_tokenizer_goes(tmp_path: Path) -> None:
    """Only recipe 03 checked the corpus shards' sha256: recipe 02 trained on a corpus edited after recipe 01."""
    from data_prep.corpus.build import build_corpus
    from experiment.errors import DataError
    from experiment.runfolder import RunFolder
    from tests.fixture_run import fixture_config
    from tokenizer.train import train_tokenizer

    cfg = load_config(fixture_config(tmp_path))
    folder = RunFolder.for_config(cfg)
    build_corpus(cfg, folder, None)
    shard = Path(str(folder.corpus)) / "docs-00000.jsonl"
    text = shard.read_bytes()
    index = text.index("о".encode())  # one Cyrillic letter for another of the same size: the sizes still match
    shard.write_bytes(text[:index] + "а".encode() + text[index + 2:])
    previous = Path(str(folder.tokenizer)) / "manifest.json"  # the tokenizer an earlier recipe 02 wrote
    previous.parent.mkdir(parents=True)
    previous.write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^corpus shard {shard} does not match its manifest: sha256 .* "
                                        r"\(the file changed after recipes/01_build_corpus.py wrote it\)"):
        train_tokenizer(cfg, folder, None)
    assert previous.read_text(encoding="utf-8") == "{}"
