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
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_dir, atomic_write_text
from experiment.schema import ExperimentConfig
from experiment.sections.model import FamilyConfig
from experiment.stages import TOKENIZER
from experiment.storage import location
from model.registry import family_of

if TYPE_CHECKING:
    from tokenizer.loaded import RunTokenizer

log = logging.getLogger("eval.hf_export")

WEIGHTS_FILE = "model.safetensors"


def write_export(model: Any, model_cfg: FamilyConfig, vocab_size: int, out_dir: Path, *, sp: Any = None,
                 special_ids: dict[str, int] | None = None, metadata: dict[str, str] | None = None,
                 tokenizer_files: Path | None = None, base_context: int | None = None) -> Path:
    """Write the export into a staging folder and move it over ``out_dir`` only when complete.

    The tokenizer: ``sp`` (a trained SentencePiece model, converted by the tokenizer stage's exporter)
    or ``tokenizer_files`` (an adopted tokenizer's folder, copied as it is). ``base_context``: the
    ``max_position_embeddings`` of the base model a continued run started from; the export declares it when the
    run trained at a shorter ``model.max_seq_len`` (a 512-context base trained at 128 stays a 512-context model:
    RoPE has no learned positions to lose), and the trained length past it only where the run said so
    (``model.extend_context``): a checkpoint trained past its base's context without it keeps the base's."""
    from safetensors.numpy import save_file

    family = family_of(model_cfg)
    if family.hf_adapter is None:
        raise ConfigError(f"the '{family.name}' model family has no Hugging Face adapter: it cannot be exported")
    out_dir = location(out_dir)
    with atomic_dir(out_dir) as staging:
        if sp is not None:  # the tokenizer stage's exporter writes its files into the staging folder
            from tokenizer.hf_export import export_hf

            export_hf(sp, staging, special_ids or {}, model_max_length=model_cfg.max_seq_len)
        elif tokenizer_files is not None:
            for path in sorted(location(tokenizer_files).iterdir()):
                if path.is_file():
                    shutil.copyfile(path, staging / path.name)
        tensors, config = family.hf_adapter.export(model, model_cfg, vocab_size, special_ids)
        if base_context and base_context != config.get("max_position_embeddings"):
            config["max_position_embeddings"] = export_context(model_cfg, base_context)
        save_file(tensors, str(staging / WEIGHTS_FILE),
                  metadata={"format": "pt", "family": family.name, **(metadata or {})})
        atomic_write_text(staging / "config.json", json.dumps(config, indent=2) + "\n")
        atomic_write_text(staging / "generation_config.json", json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
             "pad_token_id": config["pad_token_id"]}, indent=2) + "\n")
    n_params = sum(t.size for t in tensors.values())
    log.info("Hugging Face %s export (%d tensors, %.2fM parameters) in %s", family.hf_adapter.architecture,
             len(tensors), n_params / 1e6, out_dir)
    return out_dir


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
                        sp=None if adopted else tokenizer.sp, tokenizer_files=adopted, special_ids=special_ids,
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
