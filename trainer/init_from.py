"""Continued pretraining: the first session of recipe 04 starts from a Hugging Face model folder.

``model.init_from: <folder>`` (a ``model:`` key, since it decides the model): the folder's config.json
gives the family and the shape; the keys of the run's own (``RUN_KEYS``: sequence length, kernels,
loss terms) stay the YAML's. A shape key the YAML sets explicitly and config.json contradicts is one
error line naming both values. The weights come in through ``model.hf_checkpoint.load_hf_checkpoint``;
when the run's tokenizer is not the base model's, ``model.vocab_adaptation`` rewrites the embedding
rows (``model.vocab_adaptation``). The optimizer starts fresh, with its own warmup, at step 0.

Once the run has a checkpoint, init_from is not read again: the model is the checkpoint's (its meta
says which) and the base model's lineage (file hashes, adaptation counts) is carried over from it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_write_json, read_json_object
from experiment.presets import preset_fields
from experiment.runfolder import RunFolder
from experiment.schema import ExperimentConfig
from experiment.sections.model import FamilyConfig
from experiment.storage import BucketPath, RunPath, local_folder, location
from model.family import family_of
from model.hf_checkpoint import (
    ImportedCheckpoint,
    available_memory,
    check_fits,
    hf_model_config,
    load_hf_checkpoint,
    read_config,
)
from model.hf_tensors import get_path, set_path
from model.vocab_adaptation import adapt_embeddings
from trainer.branch import Branch
from trainer.resume import finished_steps, is_stage_key, latest_meta
from trainer.trained_model import model_config_from_meta

if TYPE_CHECKING:
    from jax.sharding import Mesh

log = logging.getLogger("trainer")
# model keys that belong to the run, not to the base model: kept from our YAML
RUN_KEYS = ("max_seq_len", "z_loss", "init_std", "attention", "remat", "init_from", "vocab_adaptation", "preset",
            "scan_layers", "scan_unroll", "extend_context")
LINEAGE_FILE = "init_from.json"  # in checkpoints/: the base model a run started from (written by its first session)
# our tokenizer manifest's special ids -> the config.json key of the base model's counterpart
SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "pad_token_id"}


@dataclasses.dataclass
class StartPoint:
    """What a run's model is: its resolved config, the step-0 parameters when they come from a base
    model (None: initialised afresh, or restored from a checkpoint), and the base's lineage."""

    model_cfg: FamilyConfig
    params: dict[str, Any] | None = None
    lineage: dict[str, Any] | None = None


def start_point(cfg: ExperimentConfig, run_folder: RunFolder, vocab_size: int, mesh: Mesh | None = None,
                branch: Branch | None = None) -> StartPoint:
    """The run's model: ``cfg.model``, or with ``model.init_from`` the base model's (its weights read onto
    ``mesh`` with the run's ``train.mesh.rules`` when given, else the default device). Once there is a
    checkpoint to start from (the run's own, else a branch's parent's at the branch step), the model is
    that checkpoint's and the base model is not read."""
    folder = cfg.model.init_from
    if not folder:
        return StartPoint(cfg.model)
    checkpoint_dir = run_folder.checkpoints
    steps = finished_steps(checkpoint_dir)
    if not steps and branch is not None:  # the branch's first session restores its parent's checkpoint
        checkpoint_dir, steps = branch.parent.checkpoints, [branch.step]
    if steps:
        meta = latest_meta(checkpoint_dir, steps)
        base_cfg = model_config_from_meta(meta) if meta else None
        if base_cfg is not None:
            log.info("model.init_from is not read again: the run starts from the checkpoints in %s", checkpoint_dir)
            return StartPoint(merge_model_config(cfg, base_cfg, f"the checkpoints in {checkpoint_dir}",
                                                 stage=cfg.train.branch_data == "own"),
                              lineage=meta.get("init_from"))
    # everything config.json and the tokenizers decide is checked before the weights are read
    named, local = base_folder(folder, "model.init_from")
    base_config = read_config(local)
    _, base_cfg, base_vocab = hf_model_config(base_config, str(named / "config.json"))
    model_cfg = merge_model_config(cfg, base_cfg, str(named / "config.json"))
    check_context(cfg, base_cfg.max_seq_len, f"max_position_embeddings of {named / 'config.json'}")
    embeddings = EmbeddingPlan.for_run(cfg, run_folder, base_config, base_vocab, vocab_size)
    imported = load_hf_checkpoint(local, cfg.train.param_dtype, mesh=mesh, rules=cfg.train.mesh.rules,
                                  scan_layers=model_cfg.scan_layers)
    # the model is what the weights hold (config.json may declare more: a Transformers save of DeepSeek-V3 keeps
    # num_nextn_predict_layers but drops that layer), checked against the YAML as config.json was
    model_cfg = merge_model_config(cfg, imported.model_cfg, f"the weights in {named}")
    params, adaptation = embeddings.apply(imported, cfg.experiment.seed)
    lineage = {"folder": str(named), "family": imported.family, "files": imported.source_files,
               "tokenizer_files": [Path(p).name for p in imported.tokenizer_files],
               "base_vocab_size": imported.vocab_size,
               "vocab_adaptation": adaptation,
               # the context the base was built for: an export keeps it when the run trains at a shorter one
               "max_position_embeddings": int(base_cfg.max_seq_len)}
    log.info("model.init_from: %s (%s family, vocabulary %d); embeddings: %s", folder, imported.family,
             imported.vocab_size, describe_adaptation(adaptation))
    return StartPoint(model_cfg, params, lineage)


def check_context(cfg: ExperimentConfig, base_context: int, source: str) -> None:
    """A continued run trains at most at the base model's context (``source`` names where it comes from), unless
    ``model.extend_context`` says to train past it: positions the base never saw, with its RoPE frequencies as
    they are, would otherwise be trained silently and the export would declare the longer context."""
    if cfg.model.max_seq_len > base_context and not cfg.model.extend_context:
        raise ConfigError(f"config key 'model.max_seq_len': {cfg.model.max_seq_len} is past the base model's context "
                          f"({base_context}, {source}): continued pretraining would train positions the base never "
                          f"saw, with RoPE not rescaled for them; set model.max_seq_len to at most {base_context}, or "
                          "model.extend_context=true to train the longer context as it is")


def check_base_model(cfg: ExperimentConfig, run_folder: RunFolder) -> str | None:
    """The stage check of recipe 04 (experiment/check.py) for a first session from ``model.init_from``, before
    anything is written: the folder is a Hugging Face model whose config.json agrees with the YAML's shape keys
    (``merge_model_config``), whose context the run does not exceed (``check_context``), and, once recipe 02 has
    made the run's tokenizer, whose vocabulary fits it by ``model.vocab_adaptation`` (``EmbeddingPlan``: the same
    token texts for ``none``). A run with checkpoints (or a branch's) trains theirs: checked under the stage's
    lock (``check_init_from``). A base in a bucket is not read by ``python -m experiment.check``: its preset's
    context stands for its own, and the note says so."""
    from experiment.check import reads_buckets
    from experiment.stages import TOKENIZER

    folder = cfg.model.init_from
    if not folder or cfg.train.branch_from or finished_steps(run_folder.checkpoints):
        return None
    named = location(folder, "model.init_from")
    config_path = named / "config.json"
    if isinstance(named, BucketPath) and not reads_buckets():
        preset = preset_fields(cfg.model.preset, cfg.model.family) if cfg.model.preset else {}
        if "max_seq_len" in preset:
            check_context(cfg, int(preset["max_seq_len"]), f"model.preset {cfg.model.preset!r}'s max_seq_len")
        return f"model.init_from {folder} is in a bucket (recipe 04 reads its config.json before it writes anything)"
    if not config_path.is_file():
        raise ConfigError(f"config key 'model.init_from': {config_path} does not exist (a Hugging Face model folder "
                          "holds config.json and *.safetensors)")
    base_config = read_json_object(config_path)
    _, base_cfg, base_vocab = hf_model_config(base_config, str(config_path))
    merge_model_config(cfg, base_cfg, str(config_path))
    check_context(cfg, base_cfg.max_seq_len, f"max_position_embeddings of {config_path}")
    check_base_fits(cfg, named, base_cfg, base_vocab)
    tokenizer = TOKENIZER.read_manifest_if_present(run_folder.tokenizer)
    if tokenizer is None:
        return (f"model.vocab_adaptation: the run's tokenizer is not made yet, so it is not compared with "
                f"{folder}'s (recipe 04 compares them before it reads the weights)")
    if isinstance(named, BucketPath):  # its tokenizer files come with the copy recipe 04 makes of the base
        return None
    EmbeddingPlan.for_run(cfg, run_folder, base_config, base_vocab, int(tokenizer["vocab_size"]))
    return None


PARAM_BYTES = {"float32": 4, "bfloat16": 2}  # train.param_dtype's choices


def check_base_fits(cfg: ExperimentConfig, folder: RunPath, base_cfg: FamilyConfig, base_vocab: int) -> None:
    """The base model's parameters at ``train.param_dtype`` fit the slice the run is priced on (``cost.chips`` x
    the accelerator's memory in cost/hardware.csv; a CPU's: this host's available memory), before anything is
    written or JAX is started (a multi-host run initializes it later): a consistent 2 TiB folder was read until a
    MemoryError. Loading checks again against the devices it finds (``model.hf_checkpoint.check_fits_memory``)."""
    from cost.catalog import Catalog

    parameters = family_of(base_cfg).param_count(base_cfg, base_vocab)
    hardware = Catalog.from_config(cfg.cost).hardware.get(cfg.cost.accelerator)
    if hardware is not None and hardware.hbm_gib:
        available, where = int(hardware.hbm_gib * 2**30) * cfg.cost.chips, f"{cfg.cost.chips} x {cfg.cost.accelerator}"
    else:
        available, where = available_memory([]), "this host (its available memory)"
    check_fits(folder, parameters, PARAM_BYTES[cfg.train.param_dtype], cfg.train.param_dtype, available, where)


def base_folder(folder: str, key: str) -> tuple[RunPath, Path]:
    """A base model's folder as named (resolved when local: what the lineage records) and as local files to read
    (a bucket prefix is copied to this host first, ``experiment.storage.local_folder``)."""
    named = location(folder, key)
    named = named if isinstance(named, BucketPath) else named.resolve()
    return named, local_folder(named, key)


def reimport_base(run_folder: RunFolder, meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The model a continued run started from, imported again as its first session imported it: the base folder
    its checkpoint's lineage names (``meta['init_from']``), each file's sha256 checked against the lineage, its
    embeddings adapted to the run's tokenizer by the recorded mode and the run's seed, in the checkpoint's model
    config and layer layout, on the default device. The adaptation's counts must equal the recorded ones (else the
    run's tokenizer is not the one the run started with). Returns the model and what it is, for eval's report.

    So recipe 05 scores the base beside the trained step ("did continued pretraining help?") without the run
    keeping a step-0 checkpoint of a model that may be many times the size of its trained deltas."""
    from flax import nnx

    from experiment.files import sha256_file
    from model.registry import get_family

    lineage = meta["init_from"]
    _, folder = base_folder(lineage["folder"], f"{run_folder.checkpoints / LINEAGE_FILE}: folder")
    changed = [name for name, digest in sorted((lineage.get("files") or {}).items())
               if not (folder / name).is_file() or sha256_file(folder / name) != digest]
    if changed:
        raise DataError(f"{folder}: {', '.join(changed)} missing or changed since the run started from it (sha256 "
                        f"against {run_folder.checkpoints / LINEAGE_FILE}): the base model cannot be scored")
    model_cfg = model_config_from_meta(meta)
    vocab_size = int(meta["vocab_size"])
    base_config = read_config(folder)
    _, _, base_vocab = hf_model_config(base_config, str(folder / "config.json"))
    recorded = lineage.get("vocab_adaptation") or {"mode": "none"}
    embeddings = EmbeddingPlan.for_mode(recorded.get("mode", "none"), folder, run_folder, base_config, base_vocab,
                                        vocab_size)
    imported = load_hf_checkpoint(folder, meta.get("param_dtype", "float32"), scan_layers=model_cfg.scan_layers)
    pure, adaptation = embeddings.apply(imported, int(meta.get("seed", 0)))
    if adaptation != recorded:
        raise DataError(f"{run_folder.tokenizer}: adapting {folder} to this tokenizer gives {adaptation}, the run "
                        f"recorded {recorded} at its start: the base model cannot be rebuilt as the run began")
    graphdef, state = nnx.split(get_family(model_cfg.family).abstract(model_cfg, vocab_size))
    nnx.replace_by_pure_dict(state, pure)
    info = {"folder": str(folder), "family": lineage.get("family"), "vocab_adaptation": describe_adaptation(adaptation)}
    log.info("re-imported the base model %s (%s) to score it beside the trained step", folder,
             info["vocab_adaptation"])
    return nnx.merge(graphdef, state), info


def check_init_from(cfg: ExperimentConfig, saved_meta: dict[str, Any], where: Path) -> None:
    """A run with checkpoints trains the checkpoints' model: a ``model.init_from`` that names another base
    model than the one the run started from (or a run that started from scratch) is a ConfigError. The same
    base model in another folder (its config.json describes the same family and shape) may be named."""
    folder = cfg.model.init_from
    if not folder:
        return
    lineage = saved_meta.get("init_from")
    advice = "remove model.init_from, or use another experiment.name to start a run from it"
    if lineage is None:
        raise ConfigError(f"config key 'model.init_from': the checkpoints in {where} were trained from scratch, "
                          f"not from {folder}: {advice}")
    named, local = base_folder(folder, "model.init_from")
    if str(named) == str(lineage["folder"]):
        return
    family, base_cfg, _ = hf_model_config(read_config(local), str(named / "config.json"))
    saved_model = saved_meta.get("model") or {}
    differ = [f"family {lineage.get('family')} -> {family}"] if family != lineage.get("family") else [
        f"{f.name} {saved_model[f.name]!r} -> {getattr(base_cfg, f.name)!r}" for f in dataclasses.fields(base_cfg)
        if f.name not in run_keys(base_cfg) and f.name in saved_model
        and saved_model[f.name] != getattr(base_cfg, f.name)]
    if differ:
        raise ConfigError(f"config key 'model.init_from': {folder} is another model ({', '.join(differ)}) than "
                          f"{lineage['folder']}, which the checkpoints in {where} started from: {advice}")
    log.info("model.init_from: %s is the same model as %s, which the run started from", folder, lineage["folder"])


def run_keys(model_cfg: FamilyConfig) -> tuple[str, ...]:
    """The keys of ``model_cfg`` that are the run's own, not the base model's shape: ``RUN_KEYS`` and the
    family's (``ModelFamily.run_keys``)."""
    return (*RUN_KEYS, *family_of(model_cfg).run_keys)


def merge_model_config(cfg: ExperimentConfig, base_cfg: FamilyConfig, source: str,
                       stage: bool = False) -> FamilyConfig:
    """The base model's config with the run's own keys (``RUN_KEYS``) from the YAML; a shape key the
    YAML sets, or its ``model.preset`` sets (a shipped config names the base model's preset so that the fit check
    and the planner know its shape without the weights), that the base contradicts is a ConfigError naming both
    values and ``source``. A ``stage`` (``train.branch_data: own``, started from checkpoints) also takes the keys
    ``is_stage_key`` names from the YAML where it sets them (a longer context's RoPE scaling)."""
    explicit = getattr(cfg, "explicit_keys", frozenset())
    ours = cfg.model
    preset = set(preset_fields(ours.preset, ours.family)) if "model.preset" in explicit and ours.preset else set()
    base_fields = {f.name for f in dataclasses.fields(base_cfg)}
    staged = {name for name in base_fields if stage and is_stage_key(name) and f"model.{name}" in explicit}
    for name in sorted(base_fields - set(run_keys(base_cfg)) - staged):
        if (f"model.{name}" not in explicit and name not in preset) or not hasattr(ours, name):
            continue
        mine, theirs = getattr(ours, name), getattr(base_cfg, name)
        if name == "head_dim":  # 0 stands for d_model // n_heads
            mine, theirs = ours.resolved_head_dim, base_cfg.resolved_head_dim
        if mine != theirs:
            key, what = ((f"model.{name}", f"{mine!r}") if f"model.{name}" in explicit
                         else ("model.preset", f"{ours.preset!r} sets {name} {mine!r}, which"))
            raise ConfigError(f"config key '{key}': {what} disagrees with {theirs!r} of {source} "
                              "(model.init_from takes the model's shape from there): "
                              f"remove the key or make it {name} {theirs!r}")
    kept = {name: getattr(ours, name) for name in (*run_keys(base_cfg), *staged) if name in base_fields}
    return dataclasses.replace(base_cfg, **kept)


@dataclasses.dataclass
class EmbeddingPlan:
    """How the base model's embeddings become the run's: ``model.vocab_adaptation`` with what it needs
    (the run's token texts, the base tokenizer, the special-token map), checked before weights are read."""

    mode: str
    texts: list[str | None] = dataclasses.field(default_factory=list)
    encode: Any = None
    special_map: dict[int, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_run(cls, cfg: ExperimentConfig, run_folder: RunFolder, base_config: dict[str, Any], base_vocab: int,
                vocab_size: int) -> EmbeddingPlan:
        return cls.for_mode(cfg.model.vocab_adaptation,
                            base_folder(cfg.model.init_from, "model.init_from")[1], run_folder, base_config, base_vocab,
                            vocab_size)

    @classmethod
    def for_mode(cls, mode: str, folder: Path, run_folder: RunFolder, base_config: dict[str, Any], base_vocab: int,
                 vocab_size: int) -> EmbeddingPlan:
        """The plan of ``model.vocab_adaptation`` = ``mode`` from the base model in ``folder`` to the run's
        tokenizer."""
        if mode == "none":
            if vocab_size != base_vocab:
                raise ConfigError("config key 'model.vocab_adaptation': none keeps the base model's token ids, "
                                  f"but the run's tokenizer ({run_folder.tokenizer}) has {vocab_size} tokens and "
                                  f"{folder / 'config.json'} has vocab_size {base_vocab}: "
                                  "set model.vocab_adaptation to mean (or random), or use the base model's tokenizer")
            check_same_token_texts(folder, run_folder)
            return cls(mode)
        texts, special = run_token_texts(run_folder)
        if mode == "random":
            return cls(mode, texts, lambda text: [])
        special_map = {ours: int(base_config[key]) for name, key in SPECIAL_KEYS.items()
                       if (ours := special.get(name)) is not None and ours >= 0
                       and isinstance(base_config.get(key), int) and 0 <= base_config[key] < base_vocab}
        return cls(mode, texts, base_encoder(folder), special_map)

    def apply(self, imported: ImportedCheckpoint, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The imported parameters (a pure dict) with the run's embedding rows, and what was done."""
        from flax import nnx

        from model.registry import get_family

        pure = nnx.to_pure_dict(imported.state)
        if self.mode == "none":
            return pure, {"mode": "none"}
        # the family's embedding table [V, D] and untied head [D, V] (ModelFamily.roles), token-major
        roles = get_family(imported.family).roles
        tables = {roles.embedding: host_array(pure_at(pure, roles.embedding))}
        if roles.output_head is not None and (head := pure_at(pure, roles.output_head)) is not None:
            tables[roles.output_head] = host_array(head).T  # [D, V] -> token-major
        adapted, report = adapt_embeddings(tables, self.texts, self.encode, self.mode, seed=seed,
                                           special_map=self.special_map)
        for path, table in adapted.items():
            set_path(pure, tuple(path.split("/")), table if path == roles.embedding else np.ascontiguousarray(table.T))
        return pure, report.as_dict()


def pure_at(pure: Mapping[str, Any], path: str) -> Any:
    """The entry of a pure parameter dict at a ``/``-separated path (a ``ParamRoles`` path); None when absent."""
    try:
        return get_path(pure, tuple(path.split("/")))
    except (KeyError, TypeError):  # no such entry, or a None (a tied head) on the way
        return None


def host_array(value: Any) -> np.ndarray:
    """The whole of a parameter on this host (gathered from the other processes when sharded across them);
    every process adapts the same table from it."""
    import jax

    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(value)


def run_token_texts(run_folder: RunFolder) -> tuple[list[str | None], dict[str, int]]:
    """Each id's text under the run's SentencePiece tokenizer (None for control pieces and for byte
    pieces that are no character alone), and its special ids."""
    from experiment.stages import TOKENIZER
    from tokenizer.loaded import KIND_SENTENCEPIECE
    from tokenizer.spm import load_tokenizer, piece_surface

    manifest = TOKENIZER.read_manifest(run_folder.tokenizer)
    if manifest.get("kind", KIND_SENTENCEPIECE) != KIND_SENTENCEPIECE:
        # an adopted tokenizer.json is the base model's own vocabulary: there is nothing to adapt
        raise ConfigError(f"config key 'model.vocab_adaptation': mean and random adapt the base model to a Russian "
                          f"SentencePiece tokenizer trained by recipe 02, but {run_folder.tokenizer} holds an adopted "
                          f"{manifest.get('kind')} tokenizer: use model.vocab_adaptation=none with it")
    sp, manifest = load_tokenizer(run_folder.tokenizer, manifest)
    texts: list[str | None] = []
    for piece_id in range(sp.get_piece_size()):
        if sp.is_byte(piece_id):
            byte = int(sp.id_to_piece(piece_id)[3:5], 16)  # <0xNN>
            texts.append(chr(byte) if byte < 0x80 else None)
        else:
            texts.append(piece_surface(sp, piece_id) or None)
    return texts, {k: int(v) for k, v in (manifest.get("special_ids") or {}).items() if v is not None}


MAX_FOREIGN_IDS = 0.01  # vocab_adaptation none: the share of ids whose text may differ from the base's (none: 0)


def check_same_token_texts(folder: Path, run_folder: RunFolder) -> None:
    """``vocab_adaptation: none`` keeps the base model's ids, so the run's tokenizer must be the base's: each id
    decoded alone must give the same text under both (a project tokenizer of the base's size, say 32,000 pieces
    over a Llama-2 or Mistral base, would train the base's embeddings on other tokens). A ConfigError naming the
    first differing id when more than ``MAX_FOREIGN_IDS`` of the ids differ; without the base's tokenizer.json
    there is nothing to compare, which a warning says."""
    from tokenizer.loaded import load_run_tokenizer, read_hf_tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        log.warning("model.vocab_adaptation none: %s has no tokenizer.json, so the run's tokenizer is not checked to "
                    "be the base model's (only their sizes agree)", folder)
        return
    ours, theirs = load_run_tokenizer(run_folder.tokenizer), read_hf_tokenizer(path)
    pieces = ours.sp.get_piece_size() if ours.sp is not None else ours.hf.get_vocab_size(with_added_tokens=True)
    size = min(pieces, theirs.get_vocab_size(with_added_tokens=True))  # embedding rows past the pieces: no text
    differ = [i for i in range(size) if ours.decode([i]) != theirs.decode([i], skip_special_tokens=False)]
    if len(differ) > MAX_FOREIGN_IDS * size:
        first = differ[0]
        raise ConfigError(f"config key 'model.vocab_adaptation': none keeps the base model's token ids, but the run's "
                          f"tokenizer ({run_folder.tokenizer}) is not {path}'s: {len(differ):,} of {size:,} ids "
                          f"decode to other text (id {first}: {ours.decode([first])!r} here, "
                          f"{theirs.decode([first], skip_special_tokens=False)!r} in the base): adopt the base's "
                          "tokenizer (tokenizer.adopt_from) or set model.vocab_adaptation to mean")


def base_encoder(folder: Path) -> Any:
    """text -> the base tokenizer's ids (its tokenizer.json, without added special tokens)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: model.vocab_adaptation=mean splits each new token with the base model's "
                        "tokenizer")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises its own Exception types
        raise DataError(f"{path} does not load as a Hugging Face tokenizer ({str(exc).splitlines()[0]})") from exc
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def describe_adaptation(adaptation: dict[str, Any]) -> str:
    if adaptation.get("mode") == "none":
        return "base token ids kept (vocab_adaptation none)"
    return (f"vocab_adaptation {adaptation['mode']}: {adaptation['new_vocab']} tokens, {adaptation['copied']} copied, "
            f"{adaptation['averaged']} averaged, {adaptation['unknown']} started afresh")


def record_lineage(wandb_run: Any, checkpoint_dir: Path, lineage: dict[str, Any], first_session: bool) -> None:
    """The base model in W&B (an artifact reference the run uses, and summary counts) and, from the first
    session, ``checkpoints/init_from.json``."""
    from tracking.artifacts import use_reference

    adaptation = lineage.get("vocab_adaptation") or {}
    for key in ("mode", "copied", "averaged", "unknown"):
        if key in adaptation:
            wandb_run.summary[f"init/vocab_{key}"] = adaptation[key]
    wandb_run.summary["init/family"] = lineage.get("family")
    if first_session:
        atomic_write_json(checkpoint_dir / LINEAGE_FILE, lineage)
        use_reference(wandb_run, f"base-{location(lineage['folder']).name}", "base-model", lineage["folder"],
                      metadata={"files_sha256": lineage["files"], "family": lineage.get("family"),
                                "vocab_size": lineage.get("base_vocab_size")})
