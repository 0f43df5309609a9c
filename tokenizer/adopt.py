"""Recipe 02 with ``tokenizer.adopt_from``: take a base model's tokenizer instead of training one.

A team continuing a Hugging Face model keeps its vocabulary (or measures it before replacing it).
The source is a model folder or one file: ``tokenizer.json`` (byte-level BPE as in Llama 3 and Qwen,
or SentencePiece-style with ``<0xNN>`` byte fallback as in Mistral) is preferred, else a
SentencePiece ``tokenizer.model``. The files are copied into ``tokenizer/`` (the model file at the
top, the folder's tokenizer files as they are in ``hf/``, which the HF export ships unchanged), the
report measures it on the same held-out documents and baselines as a trained one, and the manifest
(written last) records its kind, hash, vocabulary and the special ids the folder's own files name.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from experiment.config import redact
from experiment.errors import ConfigError, DataError
from experiment.files import atomic_dir, atomic_write_bytes, read_json_object, remove_file, sha256_file
from experiment.manifest import invalidate
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.stages import TOKENIZER
from experiment.storage import RunPath, location
from experiment.storage.urls import is_bucket_url
from tokenizer.loaded import KIND_HF, KIND_SENTENCEPIECE, read_hf_tokenizer, read_sentencepiece
from tokenizer.measured import MeasuredTokenizer, hf_tokenizer_under_test, sentencepiece_under_test
from tokenizer.report import build_report, log_report, write_report
from tokenizer.spm import MODEL_FILE, VOCAB_FILE
from tokenizer.texts import split_corpus

log = logging.getLogger("tokenizer")

HF_TOKENIZER_FILE = "tokenizer.json"
SPM_TOKENIZER_FILE = "tokenizer.model"
# Files of a Hugging Face folder that describe its tokenizer; the ones present are copied to hf/.
HF_TOKENIZER_FILES = (HF_TOKENIZER_FILE, SPM_TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json",
                      "added_tokens.json", "vocab.json", "merges.txt")
# Files whose fields name the special tokens (later files fill what earlier ones leave out).
_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")
_ID_FILES = ("config.json", "generation_config.json")
SPECIAL_NAMES = ("pad", "unk", "bos", "eos")
ADOPTED_NAME = "adopted"  # the run's tokenizer in the report when it was adopted


def locate_source(adopt_from: str) -> tuple[str, RunPath]:
    """``(kind, model file)`` of ``tokenizer.adopt_from``: a folder (its tokenizer.json, else its
    tokenizer.model) or one of those files."""
    path = location(adopt_from, "tokenizer.adopt_from").expanduser()
    key = "config key 'tokenizer.adopt_from'"
    if path.is_dir():
        for name, kind in ((HF_TOKENIZER_FILE, KIND_HF), (SPM_TOKENIZER_FILE, KIND_SENTENCEPIECE)):
            if (path / name).is_file():
                return kind, path / name
        raise ConfigError(f"{key}: {path} has neither {HF_TOKENIZER_FILE} nor {SPM_TOKENIZER_FILE}")
    if not path.is_file():
        raise ConfigError(f"{key}: {path} does not exist")
    return (KIND_SENTENCEPIECE if path.suffix == ".model" else KIND_HF), path


def check_adopt_source(cfg: ExperimentConfig, run_folder: RunFolder) -> str | None:
    """The stage check of recipe 02 (experiment/check.py): ``tokenizer.adopt_from`` names a tokenizer
    (``locate_source``); a bucket is left to the recipe where the check reads none (``python -m experiment.check``),
    which the returned note says."""
    from experiment.check import reads_buckets

    source = cfg.tokenizer.adopt_from
    if not source:
        return None
    if is_bucket_url(source) and not reads_buckets():
        return f"tokenizer.adopt_from {source} is in a bucket (recipe 02 reads it before it writes anything)"
    locate_source(source)
    return None


def _present(folder: RunPath, names: tuple[str, ...]) -> Iterator[tuple[RunPath, dict[str, Any]]]:
    """``(path, JSON object)`` of each of ``names`` that ``folder`` holds, in order."""
    for name in names:
        if (folder / name).is_file():
            yield folder / name, read_json_object(folder / name)


def _token_content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def special_ids_from_folder(folder: RunPath, token_to_id: Any, own: dict[str, int | None]) -> dict[str, int | None]:
    """pad/unk/bos/eos ids: tokens named in tokenizer_config.json / special_tokens_map.json, then ids in
    config.json / generation_config.json, then the tokenizer's own (``own``, SentencePiece's ids)."""
    ids: dict[str, int | None] = {}
    for path, body in _present(folder, _TOKEN_FILES):
        for special in SPECIAL_NAMES:
            token = _token_content(body.get(f"{special}_token"))
            if special in ids or token is None:
                continue
            token_id = token_to_id(token)
            if token_id is None:
                raise DataError(f"{path}: {special}_token {token!r} is not in the tokenizer's vocabulary")
            ids[special] = int(token_id)
    for _, body in _present(folder, _ID_FILES):
        for special in SPECIAL_NAMES:
            value = body.get(f"{special}_token_id")
            # several EOS ids: the first ends documents
            value = value[0] if isinstance(value, list) and value else value
            if special not in ids and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                ids[special] = value
    for special in SPECIAL_NAMES:
        value = own.get(special)
        if special not in ids:
            ids[special] = value if value is not None and value >= 0 else None
    return ids


def model_vocab_size(folder: RunPath) -> int | None:
    """``vocab_size`` of the base model's config.json beside the tokenizer (its embedding rows), if any."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    body = read_json_object(path)
    value = body.get("vocab_size")
    if value is None and isinstance(body.get("text_config"), dict):  # multimodal configs nest the text model's
        value = body["text_config"].get("vocab_size")
    return int(value) if isinstance(value, int) else None


def load_source(kind: str, model_file: RunPath, data: bytes) -> tuple[MeasuredTokenizer, int, dict[str, int | None]]:
    """Load the adopted file from its bytes (one error line naming it if it does not load): what the
    report measures, its vocabulary size and its special ids."""
    folder = model_file.parent
    if kind == KIND_HF:
        hf = read_hf_tokenizer(model_file, data)
        special = special_ids_from_folder(folder, hf.token_to_id, {})
        return hf_tokenizer_under_test(hf, ADOPTED_NAME), hf.get_vocab_size(with_added_tokens=True), special
    sp = read_sentencepiece(model_file, data)
    own = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}

    def piece_id(piece: str) -> int | None:  # SentencePiece answers the unknown id for a piece it lacks
        found = sp.piece_to_id(piece)
        return None if found == sp.unk_id() and piece != sp.id_to_piece(found) else found

    special = special_ids_from_folder(folder, piece_id, own)
    return sentencepiece_under_test(sp, name=ADOPTED_NAME), sp.get_piece_size(), special


def copy_hf_files(model_file: RunPath, data: bytes, target: str, out_dir: RunPath) -> dict[str, str]:
    """Write the adopted file (``data``, as ``target``) and copy its folder's other tokenizer files into
    ``out_dir/hf``, atomically as one folder; returns their sha256 by name."""
    names = [name for name in HF_TOKENIZER_FILES
             if name not in (HF_TOKENIZER_FILE, SPM_TOKENIZER_FILE) and (model_file.parent / name).is_file()]
    files = {target: data, **{name: (model_file.parent / name).read_bytes() for name in names}}
    with atomic_dir(out_dir / "hf") as staging:
        for name, body in files.items():
            atomic_write_bytes(staging / name, body)  # fsynced before the folder is renamed into place
    # hashed from the bytes written (the adopted file's own copy at the top is the one read back)
    return {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}


def adopt_tokenizer(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> dict[str, Any]:
    """Recipe 02 with ``tokenizer.adopt_from``: copy, measure, write the manifest last."""
    tok = cfg.tokenizer
    out_dir = run_folder.tokenizer
    corpus_dir = run_folder.corpus
    kind, model_file = locate_source(tok.adopt_from)
    data = model_file.read_bytes()  # read once: what is measured is what is copied
    measured, vocab_size, special = load_source(kind, model_file, data)
    if special.get("eos") is None:
        raise DataError(f"{model_file.parent}: the adopted tokenizer names no EOS token (eos_token in "
                        "tokenizer_config.json, or eos_token_id in config.json): documents need one to end with")
    invalidate(out_dir)
    target = HF_TOKENIZER_FILE if kind == KIND_HF else SPM_TOKENIZER_FILE
    for stale in (MODEL_FILE, VOCAB_FILE, HF_TOKENIZER_FILE, SPM_TOKENIZER_FILE):  # an earlier run's model
        remove_file(out_dir / stale)
    atomic_write_bytes(out_dir / target, data)
    # the copy is what later stages load: read it back and check it is the file that was measured
    digest = hashlib.sha256(data).hexdigest()
    if sha256_file(out_dir / target) != digest:
        raise DataError(f"{out_dir / target}: the copy of {model_file} reads back differently; run again")
    source_files = copy_hf_files(model_file, data, target, out_dir)
    log.info("adopted the %s tokenizer %s (%d tokens, special ids %s)", kind, model_file, vocab_size, special)

    split = split_corpus(corpus_dir, cfg.shards.validation_percent, tok.report_max_docs, tok.heldout_sources)
    report = build_report(cfg, measured, split, corpus_dir)
    report["adopted_from"] = str(model_file)
    write_report(out_dir, report)

    base_rows = model_vocab_size(model_file.parent)
    manifest = {
        "kind": kind,
        "model_file": target,
        "sha256": digest,
        # the model's embedding rows: the base model's config.json may pad past the tokenizer's ids (Qwen:
        # 151936 rows, 151669 tokens), and continuing that model keeps its rows
        "vocab_size": max(vocab_size, base_rows or 0),
        "tokenizer_vocab_size": vocab_size,
        "model_vocab_size": base_rows,
        "special_ids": special,
        "adopted_from": str(model_file.resolve()),
        "source_files": source_files,
        "hf_export": "hf",
        "heldout_documents_measured": len(split.heldout_docs()),
        "config": {**redact(asdict(tok)), "seed": cfg.experiment.seed,
                   "validation_percent": cfg.shards.validation_percent},
    }
    TOKENIZER.write_manifest(out_dir, manifest)
    log.info("tokenizer written to %s", out_dir)
    log_report(wandb_run, report, out_dir, artifact_name=f"{cfg.experiment.name}-tokenizer")
    return manifest
