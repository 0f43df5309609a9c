"""Recipe 09: prompts continued by a trained checkpoint (or a Hugging Face folder), as text.

    prompt text --normalize, encode (as eval does: EOS first)--> ids --model/generate.py--> new ids
               --decode, cut before the first stop string--> completion

A run's checkpoint reads its prompts the way eval scores a context (eval/harness.py's ``PairEncoder``):
the run tokenizer's normalization, EOS first as the start of a document, no other special tokens. A
Hugging Face folder (``generate.hf_model``) encodes with its own tokenizer (tokenizer.json with the special
tokens its post-processor adds, else tokenizer.model with BOS first), and stops at config.json's EOS ids.

Every run of the recipe writes ``generate/<UTC time>.jsonl``: one line per prompt with its completion,
the new token ids, and the decode throughput of its batch (docs/CONTRACTS.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment.errors import ConfigError, DataError
from experiment.files import atomic_write_text, read_json_object
from experiment.schema import ExperimentConfig
from experiment.sections.generate import GenerateConfig
from experiment.stages import GENERATE
from experiment.storage import is_bucket, local_folder, location

log = logging.getLogger("eval.completions")

BATCH_SIZE = 8  # prompts generated together (left-padded into one batch)


@dataclass
class PromptCodec:
    """How prompts become ids and ids text again, and which ids end a completion."""

    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    eos_ids: tuple[int, ...]
    pad_id: int = 0


def run_codec(tokenizer: Any) -> PromptCodec:
    """The run tokenizer's (tokenizer/loaded.py ``RunTokenizer``): normalized text, EOS first, as eval encodes."""
    def encode(text: str) -> list[int]:
        return [tokenizer.eos_id, *tokenizer.encode(tokenizer.normalize(text))]

    return PromptCodec(encode, tokenizer.decode, (int(tokenizer.eos_id),), int(tokenizer.pad_id))


def hf_codec(folder: Path | str, hf_config: dict[str, Any]) -> PromptCodec:
    """A Hugging Face folder's own tokenizer: its tokenizer.json with the special tokens its post-processor
    adds, else its SentencePiece tokenizer.model with BOS first where the folder names one. EOS: config.json's
    ids (one or several), else the folder's EOS token."""
    from tokenizer.adopt import HF_TOKENIZER_FILE, SPM_TOKENIZER_FILE, special_ids_from_folder
    from tokenizer.loaded import read_hf_tokenizer, read_sentencepiece

    folder = Path(folder)
    if (folder / HF_TOKENIZER_FILE).is_file():
        hf = read_hf_tokenizer(folder / HF_TOKENIZER_FILE)
        special = special_ids_from_folder(folder, hf.token_to_id, {})

        def encode(text: str) -> list[int]:
            return hf.encode(text, add_special_tokens=True).ids

        def decode(ids: Sequence[int]) -> str:
            return hf.decode([int(i) for i in ids], skip_special_tokens=True)
    elif (folder / SPM_TOKENIZER_FILE).is_file():
        sp = read_sentencepiece(folder / SPM_TOKENIZER_FILE)
        special = special_ids_from_folder(folder, sp.piece_to_id, {"bos": sp.bos_id(), "eos": sp.eos_id(),
                                                                   "pad": sp.pad_id()})
        bos = [] if special.get("bos") is None else [int(special["bos"])]

        def encode(text: str) -> list[int]:
            return [*bos, *sp.encode(text, out_type=int)]

        def decode(ids: Sequence[int]) -> str:
            return sp.decode([int(i) for i in ids])
    else:
        raise DataError(f"{folder}: neither {HF_TOKENIZER_FILE} nor {SPM_TOKENIZER_FILE} (generate.hf_model needs "
                        "the folder's tokenizer)")
    eos = hf_config.get("eos_token_id", special.get("eos"))
    eos_ids = () if eos is None else (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)
    pad = special.get("pad")
    return PromptCodec(encode, decode, eos_ids, int(pad) if pad is not None else (eos_ids[0] if eos_ids else 0))


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first occurrence of any stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


def complete(model: Any, codec: PromptCodec, prompts: Sequence[str], *, max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             stop: Sequence[str] = (), max_len: int | None = None,
             batch_size: int = BATCH_SIZE, layout: Any = None) -> list[dict[str, Any]]:
    """Each prompt's completion as a record (prompt, completion, token ids, new tokens, why it stopped,
    tokens/s of its batch's decode), in the order of ``prompts``; ``layout``: (mesh, rules) to generate on."""
    from model.generate import generate

    records = []
    for first in range(0, len(prompts), batch_size):
        texts = list(prompts[first:first + batch_size])
        ids = [codec.encode(text) for text in texts]
        out = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       seed=seed + first, eos_id=codec.eos_ids or None, pad_id=codec.pad_id, max_len=max_len,
                       layout=layout)
        for text, prompt_ids, new, finished in zip(texts, ids, out.tokens, out.finished, strict=True):
            completion, stopped = cut_at_stop(codec.decode(new), stop)
            records.append({"prompt": text, "completion": completion, "prompt_token_ids": prompt_ids,
                            "token_ids": new, "new_tokens": len(new), "finished": "stop" if stopped else finished,
                            "tokens_per_s": round(out.decode_tokens_per_second, 2),
                            "prefill_s": round(out.prefill_seconds, 4)})
    return records


def read_prompts(gen_cfg: GenerateConfig) -> list[str]:
    """``generate.prompts`` and then ``generate.prompt_file``'s non-blank lines."""
    prompts = list(gen_cfg.prompts)
    if gen_cfg.prompt_file:
        path = location(gen_cfg.prompt_file, "generate.prompt_file")
        if not path.is_file():
            raise ConfigError(f"config key 'generate.prompt_file': {path} is not a file")
        prompts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ConfigError("config key 'generate.prompt_file': it has no prompts (and generate.prompts is empty)")
    return prompts


def check_generate(cfg: ExperimentConfig, run_folder: Any) -> str | None:
    """The stage check of recipe 09 (experiment/check.py), before anything is written or loaded: the prompts
    (``read_prompts``: generate.prompt_file is a file), ``generate.hf_model`` a Hugging Face folder whose
    config.json is a model we import, and ``generate.max_new_tokens`` below the model's context (config.json's,
    else model.max_seq_len, which a run's checkpoints keep: a run key even under model.init_from), so a prompt
    has room."""
    from experiment.check import reads_buckets
    from model.hf_checkpoint import hf_model_config

    gen = cfg.generate
    read_prompts(gen)
    context, source = cfg.model.max_seq_len, "model.max_seq_len"
    if gen.hf_model:
        folder = location(gen.hf_model, "generate.hf_model")
        if is_bucket(folder) and not reads_buckets():
            return f"generate.hf_model {gen.hf_model} is in a bucket (recipe 09 reads it before it writes anything)"
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ConfigError(f"config key 'generate.hf_model': {config_path} does not exist (a Hugging Face model "
                              "folder holds config.json and *.safetensors)")
        _, model_cfg, _ = hf_model_config(read_json_object(config_path), str(config_path))
        context, source = model_cfg.max_seq_len, f"max_position_embeddings of {config_path}"
    if gen.max_new_tokens >= context:
        raise ConfigError(f"config key 'generate.max_new_tokens': {gen.max_new_tokens} leaves no room for a prompt in "
                          f"the model's {context} tokens ({source})")
    return None


def generation_mesh(cfg: ExperimentConfig) -> Any:
    """The mesh recipe 09 generates on where there are several devices: the training mesh (``train.mesh``), or,
    where it does not fit the devices here (a checkpoint of a slice read on a smaller machine), every device
    on the data axis, with a warning; None on one device."""
    import jax

    from model.sharding import build_mesh

    if jax.device_count() == 1:
        return None
    try:
        return build_mesh(cfg.train.mesh)
    except ConfigError as exc:
        log.warning("%s: generating with the %d devices here on the data axis", exc, jax.device_count())
        return build_mesh(dataclasses.replace(cfg.train.mesh, data=-1, fsdp=1, tensor=1, dcn_data=1,
                                              axes={axis: 1 for axis in cfg.train.mesh.axes}))


def load_generator(cfg: ExperimentConfig, run_folder: Any) -> tuple[Any, PromptCodec, int, dict[str, Any], Any]:
    """(model, codec, max_seq_len, what it is, layout) of ``generate.hf_model``, else of the run's checkpoint
    (``generate.checkpoint_step``, else the latest) with the run's tokenizer. On several devices the
    parameters are read straight onto the mesh (``generation_mesh``) and ``layout`` is (mesh, the family's
    rules under ``train.mesh.rules``); on one device it is None."""
    gen, mesh, rules = cfg.generate, generation_mesh(cfg), cfg.train.mesh.rules
    if gen.hf_model:
        from model.hf_checkpoint import load_hf_checkpoint

        folder = local_folder(location(gen.hf_model, "generate.hf_model"), "generate.hf_model")
        imported = load_hf_checkpoint(folder, mesh=mesh, rules=rules)
        codec = hf_codec(folder, imported.hf_config)
        return imported.model(), codec, int(imported.model_cfg.max_seq_len), {"hf_model": gen.hf_model,
                                                                              "family": imported.family}, \
            layout_of(mesh, imported.family, rules)
    from tokenizer.loaded import load_run_tokenizer
    from trainer.trained_model import load_trained_model, model_config_from_meta

    model, step, meta = load_trained_model(run_folder, step=gen.checkpoint_step, mesh=mesh, rules=rules)
    tokenizer = load_run_tokenizer(run_folder.tokenizer)
    model_cfg = model_config_from_meta(meta)
    return model, run_codec(tokenizer), int(model_cfg.max_seq_len), {"step": int(step),
                                                                     "family": model_cfg.family}, \
        layout_of(mesh, model_cfg.family, rules)


def layout_of(mesh: Any, family: str, rules: Any) -> Any:
    """(mesh, the family's axis rules under the config's) to generate on; None without a mesh."""
    from model.registry import get_family

    return None if mesh is None else (mesh, get_family(family).mesh_rules(rules))


def generate_stage(cfg: ExperimentConfig, run_folder: Any, wandb_run: Any) -> Path:
    """Recipe 09: complete every prompt, print each, write ``generate/<UTC time>.jsonl`` (atomically)."""
    gen = cfg.generate
    prompts = read_prompts(gen)
    model, codec, max_len, source, layout = load_generator(cfg, run_folder)
    if layout is not None:
        log.info("generating on mesh %s", dict(layout[0].shape))
    records = complete(model, codec, prompts, max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
                       top_k=gen.top_k, top_p=gen.top_p, seed=gen.seed, stop=gen.stop, max_len=max_len,
                       layout=layout)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    out = GENERATE.dir(run_folder) / f"{stamp}.jsonl"
    sampling = {"temperature": gen.temperature, "top_k": gen.top_k, "top_p": gen.top_p, "seed": gen.seed,
                "max_new_tokens": gen.max_new_tokens}
    atomic_write_text(out, "".join(json.dumps({**record, **source, **sampling}, ensure_ascii=False) + "\n"
                                   for record in records))
    for record in records:
        print(f"> {record['prompt']}\n{record['completion']}\n")
    rate = sum(r["tokens_per_s"] for r in records) / len(records)
    log.info("%d completions (%s) in %s; decode %.1f tokens/s", len(records),
             ", ".join(f"{k} {v}" for k, v in source.items()), out, rate)
    if wandb_run is not None:
        wandb_run.summary.update({"generate/file": str(out), "generate/prompts": len(records),
                                  "generate/tokens_per_s": rate})
    return out


def keeping_the_end(codec: PromptCodec, max_len: int, max_new_tokens: int) -> PromptCodec:
    """``codec`` whose prompts keep their last ``max_len - max_new_tokens`` tokens, so prompt and answer fit the
    model (lm-eval's Hugging Face model cuts long contexts the same way: the end is what is being continued)."""
    keep = max_len - max_new_tokens
    if keep <= 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt "
                          f"in the model's {max_len} tokens")
    encode = codec.encode
    return dataclasses.replace(codec, encode=lambda text: encode(text)[-keep:])
