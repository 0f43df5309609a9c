"""The Beam runner of recipe 3 writes the same shards as the local runner, byte for byte
(optional `beam` extra; run with its interpreter, e.g. .venvs/beam/bin/python -m pytest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import import_extra

import_extra("apache_beam", "beam")  # its own venv: Beam pins protobuf below 7

from data_prep.shards.beam import file_offsets, shard_pieces  # noqa: E402
from data_prep.shards.build import shard_corpus  # noqa: E402
from tests.test_corpus_beam import TWO_WORKERS, assert_same_entries_as_wandb_reads, opened_files  # noqa: E402
from tests.test_shards_common import DisabledRun, make_documents, make_run  # noqa: E402


@pytest.mark.parametrize("packing", ["concat", "document"])
def test_beam_and_local_shards_are_byte_identical(tmp_path: Path, packing: str) -> None:
    run = make_run(tmp_path, docs=make_documents(70), packing=packing, records_per_shard=9)
    local = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    local_bytes = {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))}
    run.cfg.shards.runner, run.cfg.shards.beam_options = "beam", ["--runner=DirectRunner"]
    beam = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    beam_bytes = {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))}
    assert len(local_bytes) > 6 and beam_bytes == local_bytes
    assert beam["splits"] == local["splits"]


def test_two_worker_processes_write_the_local_shards_and_the_driver_opens_no_data(tmp_path: Path) -> None:
    """Workers read the corpus, tokenize and write whole shards; this process reads summaries only."""
    run = make_run(tmp_path, docs=make_documents(70), packing="document", records_per_shard=9)
    local = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    local_bytes = {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))}
    run.cfg.shards.runner, run.cfg.shards.beam_options = "beam", TWO_WORKERS
    wandb_run = DisabledRun()
    with opened_files() as opened:  # W&B too: its reference takes the checksums the workers computed
        beam = shard_corpus(run.cfg, run.run_folder, wandb_run)
    assert {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))} == local_bytes
    assert beam["splits"] == local["splits"] and len(local_bytes) > 6
    data_opens = [p for p in opened if ".tfrecord" in p or Path(p).name.startswith("docs-")]
    assert data_opens == [], f"the driver opened data files: {data_opens}"
    assert any("manifest" in p for p in opened)  # the guard sees what this process opens
    assert_same_entries_as_wandb_reads(wandb_run.artifacts[-1], run.run_folder.shards)


def test_pieces_tile_each_shard() -> None:
    layout = file_offsets([(("train", 1), (3, 1)), (("train", 0), (17, 2)), (("validation", 0), (4, 1))])
    assert layout["train"] == {"files": {0: (0, 0), 1: (17, 2)}, "total": 20, "documents": 3}
    # the second document of file 0 starts 5 tokens into the file: position 5, ordinal 1
    pieces = list(shard_pieces(("train", 0, 5, 1, np.arange(12)), layout, shard_tokens=8))
    assert [(key, start, ordinal, ids.tolist()) for key, (start, ordinal, ids) in pieces] == [
        (("train", 0), 5, 1, [0, 1, 2]), (("train", 1), 0, 1, [3, 4, 5, 6, 7, 8, 9, 10]), (("train", 2), 0, 1, [11])]
    pieces = list(shard_pieces(("train", 1, 0, 0, np.arange(3)), layout, shard_tokens=8))
    assert [(key, start, ordinal) for key, (start, ordinal, _ids) in pieces] == [(("train", 2), 1, 2)]


def test_beam_shards_with_an_adopted_byte_level_tokenizer_match_local(tmp_path: Path) -> None:
    """Workers rebuild an adopted tokenizer.json from its bytes and write the local runner's shards."""
    from experiment.files import sha256_file
    from experiment.stages import TOKENIZER
    from tokenizer.baselines import train_bytelevel_bpe

    run = make_run(tmp_path, docs=make_documents(40), packing="document", records_per_shard=9)
    tokenizer = train_bytelevel_bpe([doc["text"] for doc in run.docs], 300)
    folder = run.run_folder.tokenizer
    tokenizer.save(str(folder / "tokenizer.json"))
    TOKENIZER.write_manifest(folder, {"kind": "hf_tokenizer_json", "model_file": "tokenizer.json",
                                      "sha256": sha256_file(folder / "tokenizer.json"),
                                      "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
                                      "tokenizer_vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
                                      "special_ids": {"eos": tokenizer.token_to_id("</s>"), "pad": None}})
    local = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    local_bytes = {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))}
    run.cfg.shards.runner, run.cfg.shards.beam_options = "beam", ["--runner=DirectRunner"]
    beam = shard_corpus(run.cfg, run.run_folder, DisabledRun())
    assert local["tokenizer_kind"] == "hf_tokenizer_json"
    assert {p.name: p.read_bytes() for p in sorted(run.run_folder.shards.glob("*.tfrecord*"))} == local_bytes
    assert beam["splits"] == local["splits"] and len(local_bytes) > 2
