"""Export a trained model as a Hugging Face Transformers model: safetensors, config.json, tokenizer.

The weights and config.json come from the model family's HF adapter (``ModelFamily.hf_adapter``:
for Llama, ``LlamaForCausalLM`` in model/llama/hf.py); a family without one is not exported (recipe 05
logs that it skipped the export). The Llama folder loads with ``LlamaForCausalLM.from_pretrained``
and its fp32 logits match ours within 1e-4 (tests/test_eval_hf_export.py). Only numpy and
safetensors are needed here, not torch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_dir, atomic_write_json, atomic_write_text, read_json_object, write_errno
from experiment.jsontext import parse_json
from experiment.schema import ExperimentConfig
from experiment.sections.model import FamilyConfig
from experiment.stages import TOKENIZER
from experiment.storage import location
from experiment.storage.local import umask
from model.registry import family_of

if TYPE_CHECKING:
    from tokenizer.loaded import RunTokenizer

log = logging.getLogger("eval.hf_export")

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
MODEL_CARD = "README.md"


def prompt_template(eos_piece: str, eos_id: int) -> dict[str, Any]:
    """The ``tokenizers`` TemplateProcessing (as tokenizer.json stores it) that starts every text with EOS: the
    shards stage ends each document with EOS, so the model learned that a document starts after one, and recipe 09
    and eval encode a prompt the same way (``eval.completions.run_codec``)."""
    def special(type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": eos_piece, "type_id": type_id}}

    def text(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {"type": "TemplateProcessing", "single": [special(0), text("A", 0)],
            "pair": [special(0), text("A", 0), special(1), text("B", 1)],
            "special_tokens": {eos_piece: {"id": eos_piece, "ids": [eos_id], "tokens": [eos_piece]}}}


def carry_prompt_convention(folder: Path, eos_id: int) -> str:
    """Make the tokenizer files in ``folder`` start every encoded text with EOS, as the model was trained, for
    ``tokenizers``, transformers 4 and 5 alike; returns the EOS piece.

    tokenizer.json: its post-processor becomes the EOS template (a byte-level one keeps its offset trimming beside
    it). tokenizer_config.json / special_tokens_map.json: ``bos_token`` is the EOS piece and ``add_bos_token`` true,
    because transformers rebuilds the post-processor from those two keys when the config names them (a base's
    ``add_bos_token: true`` with its own BOS would otherwise put that BOS first again)."""
    from tokenizer.loaded import read_hf_tokenizer

    tokenizer_path = folder / TOKENIZER_JSON
    spec = parse_json(tokenizer_path.read_text(encoding="utf-8"))
    eos_piece = read_hf_tokenizer(tokenizer_path).id_to_token(eos_id)
    if eos_piece is None:
        raise DataError(f"{tokenizer_path} has no token of the EOS id {eos_id}: it is not the run's tokenizer")
    template = prompt_template(eos_piece, eos_id)
    old = spec.get("post_processor") or {}
    # ByteLevel as a post-processor only trims offsets: kept; any template a base shipped (its BOS first) is replaced
    kept = [p for p in (old.get("processors", []) if old.get("type") == "Sequence" else [old])
            if p.get("type") == "ByteLevel"]
    spec["post_processor"] = {"type": "Sequence", "processors": [*kept, template]} if kept else template
    atomic_write_text(tokenizer_path, json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
    read_hf_tokenizer(tokenizer_path)  # the file we wrote loads: a malformed template is our error, caught here
    for name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
        path = folder / name
        settings = read_json_object(path) if path.is_file() else {}
        settings["bos_token"] = eos_piece
        if name == TOKENIZER_CONFIG:
            # model_input_names: no token_type_ids, which a causal LM's generate(**tokenizer(text)) refuses
            settings.update(add_bos_token=True, add_eos_token=False, model_input_names=["input_ids", "attention_mask"])
        atomic_write_json(path, settings)
    return eos_piece


def model_card(architecture: str, eos_piece: str, eos_id: int) -> str:
    """README.md of the export: what the folder is and the three lines that continue a prompt as recipe 09 does."""
    return f"""# {architecture} exported by ru-pretrain (recipes 05 / 05b)

The model was trained on documents that each follow an end-of-text token (`{eos_piece}`, id {eos_id}): recipe 09
and the evaluation start every prompt with it. The tokenizer here does the same: its post-processor (tokenizer.json)
puts `{eos_piece}` first, and tokenizer_config.json names it as the sequence-start token (`bos_token`,
`add_bos_token: true`), so a plain `AutoTokenizer` encodes a prompt as the model expects. Recipe 09's greedy
completion of a prompt, in transformers:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok, model = AutoTokenizer.from_pretrained("<this folder>"), AutoModelForCausalLM.from_pretrained("<this folder>")
print(tok.decode(model.generate(**tok("Жили-были", return_tensors="pt"), do_sample=False, max_new_tokens=32)[0],
                 skip_special_tokens=True))
```

Pass `add_special_tokens=False` to encode text without the leading `{eos_piece}` (text in the middle of a document).
"""


def write_export(model: Any, model_cfg: FamilyConfig, vocab_size: int, out_dir: Path, *, sp: Any = None,
                 special_ids: dict[str, int] | None = None, metadata: dict[str, str] | None = None,
                 tokenizer_files: Path | None = None, base_context: int | None = None) -> Path:
    """Write the export into a staging folder and move it over ``out_dir`` only when complete.

    The tokenizer: ``sp`` (a trained SentencePiece model, converted by the tokenizer stage's exporter)
    or ``tokenizer_files`` (an adopted tokenizer's folder, copied; ``sp`` converted beside it where the folder
    has no tokenizer.json). With ``special_ids['eos']`` the tokenizer files then start every text with EOS, as
    the model was trained (``carry_prompt_convention``), and README.md says how to generate as recipe 09 does.
    ``base_context``: the ``max_position_embeddings`` of the base model a continued run started from; the export
    declares it when the run trained at a shorter ``model.max_seq_len`` (a 512-context base trained at 128 stays a
    512-context model: RoPE has no learned positions to lose), and the trained length past it only where the run
    said so (``model.extend_context``): a checkpoint trained past its base's context without it keeps the base's."""
    family = family_of(model_cfg)
    if family.hf_adapter is None:
        raise ConfigError(f"the '{family.name}' model family has no Hugging Face adapter: it cannot be exported")
    out_dir = location(out_dir)
    try:
        tensors = _write_folder(model, model_cfg, vocab_size, out_dir, sp=sp, special_ids=special_ids,
                                metadata=metadata, tokenizer_files=tokenizer_files, base_context=base_context)
    except Exception as exc:
        # safetensors and tokenizers (Rust) report a full disk as their own errors, the errno in the text: the
        # recipes turn an OSError of a write errno into one line
        code = write_errno(exc)
        if code is None or isinstance(exc, OSError):
            raise
        raise OSError(code, os.strerror(code), str(out_dir)) from exc
    n_params = sum(t.size for t in tensors.values())
    log.info("Hugging Face %s export (%d tensors, %.2fM parameters) in %s", family.hf_adapter.architecture,
             len(tensors), n_params / 1e6, out_dir)
    return out_dir


def _write_folder(model: Any, model_cfg: FamilyConfig, vocab_size: int, out_dir: Path, *, sp: Any,
                  special_ids: dict[str, int] | None, metadata: dict[str, str] | None,
                  tokenizer_files: Path | None, base_context: int | None) -> dict[str, Any]:
    """``write_export``'s folder, staged and moved into place; returns the tensors written."""
    from safetensors.numpy import save_file

    family = family_of(model_cfg)
    assert family.hf_adapter is not None  # write_export checked
    with atomic_dir(out_dir) as staging:
        if tokenizer_files is not None:
            for path in sorted(location(tokenizer_files).iterdir()):
                if path.is_file():
                    shutil.copyfile(path, staging / path.name)
            if sp is not None and not (staging / TOKENIZER_JSON).is_file():
                # an adopted tokenizer.model alone: the converted tokenizer.json (SentencePiece's ids exactly) carries
                # the prompt convention, and AutoTokenizer is told to run it as it is
                from tokenizer.hf_export import FAST_TOKENIZER_CLASS, build_hf_tokenizer

                build_hf_tokenizer(sp).save(str(staging / TOKENIZER_JSON))
                config_path = staging / TOKENIZER_CONFIG
                settings = read_json_object(config_path) if config_path.is_file() else {}
                atomic_write_json(config_path, {**settings, **FAST_TOKENIZER_CLASS})
        elif sp is not None:  # the tokenizer stage's exporter writes its files into the staging folder
            from tokenizer.hf_export import write_hf_files

            write_hf_files(sp, staging, special_ids or {}, model_max_length=model_cfg.max_seq_len)
        tensors, config = family.hf_adapter.export(model, model_cfg, vocab_size, special_ids)
        eos_id = (special_ids or {}).get("eos")
        start_id = config["bos_token_id"]
        if (staging / TOKENIZER_JSON).is_file() and eos_id is not None:
            eos_piece = carry_prompt_convention(staging, eos_id)
            atomic_write_text(staging / MODEL_CARD, model_card(family.hf_adapter.architecture, eos_piece, eos_id))
            start_id = eos_id  # generate() without a prompt starts a document as the model was trained
        if base_context and base_context != config.get("max_position_embeddings"):
            config["max_position_embeddings"] = export_context(model_cfg, base_context)
        save_file(tensors, str(staging / WEIGHTS_FILE),
                  metadata={"format": "pt", "family": family.name, **(metadata or {})})
        atomic_write_text(staging / "config.json", json.dumps(config, indent=2) + "\n")
        atomic_write_text(staging / "generation_config.json", json.dumps(
            {"bos_token_id": start_id, "eos_token_id": config["eos_token_id"],
             "pad_token_id": config["pad_token_id"]}, indent=2) + "\n")
        # safetensors writes through a private temporary file (mode 0600): the export is for others to read
        for path in staging.iterdir():
            os.chmod(path, 0o666 & ~umask())
    return tensors


def export_context(model_cfg: FamilyConfig, base_context: int) -> int:
    """The ``max_position_embeddings`` a continued run's export declares (``write_export``), and a log line on why."""
    trained = model_cfg.max_seq_len
    if trained <= base_context:
        log.info("max_position_embeddings %d: the base model's, which the run trained at model.max_seq_len %d",
                 base_context, trained)
        return base_context
    if getattr(model_cfg, "extend_context", False):
        log.info("max_position_embeddings %d: the trained model.max_seq_len, past the base model's %d "
                 "(model.extend_context)", trained, base_context)
        return trained
    log.warning("max_position_embeddings %d: the base model's; the checkpoint trained at model.max_seq_len %d past it "
                "without model.extend_context, so the export does not declare the longer context", base_context,
                trained)
    return base_context


def export_checkpoint(model: Any, step: int, meta: dict[str, Any], run_folder: Any, cfg: ExperimentConfig,
                      tokenizer: RunTokenizer, out_root: Path | None = None) -> Path | None:
    """Export a loaded checkpoint with the run's tokenizer (loaded by the caller, from ``run_folder.tokenizer``)
    into ``<out_root>/step_NNNNNNN`` (default ``eval/hf``, recipe 05's); None (and a log line) when the
    checkpoint's model family has no Hugging Face adapter."""
    from trainer.trained_model import model_config_from_meta

    model_cfg = model_config_from_meta(meta)
    family = family_of(model_cfg)
    if family.hf_adapter is None:
        log.info("Hugging Face export skipped: the '%s' model family has no Hugging Face adapter", family.name)
        return None
    manifest = tokenizer.manifest
    if meta.get("tokenizer_sha256") and meta["tokenizer_sha256"] != manifest.get("sha256"):
        raise DataError(f"the checkpoint was trained with tokenizer {meta['tokenizer_sha256'][:12]}..., not the one "
                        f"in {run_folder.tokenizer}: cannot export a matching tokenizer")
    out_dir = location(out_root if out_root is not None else run_folder.eval / "hf") / f"step_{step:07d}"
    # an adopted tokenizer is exported as the base model shipped it; a trained one is converted
    adopted = run_folder.tokenizer / "hf" if manifest.get("adopted_from") else None
    if adopted is not None and not (adopted / manifest["model_file"]).is_file():
        raise DataError(f"{adopted} lacks the adopted {manifest['model_file']}: {TOKENIZER.run_again}")
    special_ids = {name: i for name, i in (manifest.get("special_ids") or {}).items() if i is not None}
    return write_export(model, model_cfg, meta["vocab_size"], out_dir,
                        sp=tokenizer.sp, tokenizer_files=adopted, special_ids=special_ids,
                        metadata={"experiment": cfg.experiment.name, "tokenizer_sha256": manifest.get("sha256", "")},
                        base_context=(meta.get("init_from") or {}).get("max_position_embeddings"))


def export_only(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> Path:
    """Recipe 05b: the Hugging Face folder of one step (``eval.checkpoint_step``, else the latest) in
    ``export/hf/step_NNNNNNN``, and nothing else: no evaluation, nothing under ``eval/``."""
    from tokenizer.loaded import load_run_tokenizer
    from trainer.trained_model import load_trained_model, model_config_from_meta

    tokenizer = load_run_tokenizer(run_folder.tokenizer)
    model, step, meta = load_trained_model(run_folder, step=cfg.eval.checkpoint_step)
    family = family_of(model_config_from_meta(meta))
    if family.hf_adapter is None:
        raise ConfigError(f"checkpoint step {step} is a '{family.name}' model: that family has no Hugging Face "
                          "adapter, so it cannot be exported")
    out_dir = export_checkpoint(model, int(step), meta, run_folder, cfg, tokenizer, out_root=run_folder.export / "hf")
    assert out_dir is not None  # the family has an adapter
    if wandb_run is not None:
        wandb_run.summary.update({"export/step": int(step), "export/hf_folder": str(out_dir)})
    return out_dir
