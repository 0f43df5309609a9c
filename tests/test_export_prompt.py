"""The Hugging Face export starts a prompt as the model was trained (the `hf` extra: torch and transformers).

Documents reach the model after an EOS (the shards stage ends each with one), and recipe 09 and eval put EOS first.
A plain ``AutoTokenizer.from_pretrained(export)`` + ``generate`` (greedy) must give recipe 09's tokens, for both
tokenizer kinds the project trains with: its own SentencePiece model (the fixture run, through recipes 09 and 05b)
and an adopted ``tokenizer.json`` whose base puts its own BOS first (a byte-level BPE with a Llama-style config).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import import_extra, optional_import
from tests.fixture_run import pretrained_copy
from tests.recipe_runner import run_recipe

PROMPTS = ["Жили-были", "Капитанская дочка", "Берегите честь смолоду"]
NEW = 12


def their_greedy(folder: Path, prompt: str, new: int = NEW) -> tuple[list[int], list[int]]:
    """(prompt ids, new ids up to and with the first EOS) from transformers' own classes on ``folder``."""
    torch = import_extra("torch", "hf")
    transformers = import_extra("transformers", "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                              dtype=torch.float32).eval()
    inputs = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=new)
    prompt_ids = inputs["input_ids"][0].tolist()
    return prompt_ids, out[0, len(prompt_ids):].tolist()


def recipe09_tokens(record: dict[str, Any], eos: int) -> list[int]:
    """Recipe 09's new ids, with the EOS that ended them (transformers returns it; recipe 09 leaves it out)."""
    return record["token_ids"] + ([eos] if record["finished"] == "eos" else [])


def test_sentencepiece_export_generates_recipe_09s_tokens(fixture_pretrained: Path, tmp_path: Path) -> None:
    from tokenizer.loaded import load_run_tokenizer

    config = pretrained_copy(fixture_pretrained, tmp_path)
    run = tmp_path / "runs" / "tiny"
    run_recipe("09_generate.py", config, f"generate.prompts={json.dumps(PROMPTS, ensure_ascii=False)}",
               f"generate.max_new_tokens={NEW}")
    records = [json.loads(line) for path in sorted((run / "generate").glob("*.jsonl"))
               for line in path.read_text(encoding="utf-8").splitlines()]
    run_recipe("05b_export_hf.py", config)
    export = run / "export" / "hf" / "step_0000006"
    eos = load_run_tokenizer(run / "tokenizer").eos_id
    for record in records:
        prompt_ids, new = their_greedy(export, record["prompt"])
        assert prompt_ids == record["prompt_token_ids"] and prompt_ids[0] == eos
        assert new == recipe09_tokens(record, eos), record["prompt"]
    # the model card's three lines, run as written, print recipe 09's prompt and completion
    card = (export / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("<this folder>", str(export))
    assert len(code.strip().splitlines()) == 4  # three statements, the print's arguments wrapped
    printed: list[str] = []
    exec(code, {"print": printed.append})  # noqa: S102 - the card's own code
    first = next(r for r in records if r["prompt"] == "Жили-были")
    long_run = run_recipe("09_generate.py", config, 'generate.prompts=["Жили-были"]', "generate.max_new_tokens=32")
    assert long_run.returncode == 0
    latest = sorted((run / "generate").glob("*.jsonl"))[-1]
    record = json.loads(latest.read_text(encoding="utf-8").splitlines()[0])
    assert record["token_ids"][:len(first["token_ids"])] == first["token_ids"]
    assert printed == [record["prompt"] + record["completion"]]


def byte_level_base(folder: Path, texts: list[str]) -> Path:
    """A base model's tokenizer folder as Llama ships one: a byte-level BPE whose post-processor and config put
    its BOS first (``add_bos_token: true``)."""
    from tokenizers import processors

    from tokenizer.baselines import train_bytelevel_bpe

    folder.mkdir(parents=True)
    tokenizer = train_bytelevel_bpe(texts, 400)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": {"content": "<s>", "__type": "AddedToken"},
         "eos_token": "</s>", "add_bos_token": True, "add_eos_token": False}), encoding="utf-8")
    return folder


def test_adopted_tokenizer_export_generates_recipe_09s_tokens(tmp_path: Path) -> None:
    """An adopted tokenizer.json (the run tokenizer's HF kind): the export replaces the base's BOS-first template with
    EOS first, and transformers generates what recipe 09's code (eval/completions.py) generates on the same model."""
    import_extra("transformers", "hf")
    from eval.completions import complete, run_codec
    from eval.hf_export import write_export
    from model.llama.config import LlamaConfig
    from model.registry import get_family
    from tests.fixture_run import FIXTURE_TEXTS
    from tokenizer.loaded import KIND_HF, RunTokenizer, read_hf_tokenizer

    texts = [path.read_text(encoding="utf-8") for path in sorted(FIXTURE_TEXTS.glob("ru_*.txt"))]
    base = byte_level_base(tmp_path / "base", texts)
    hf = read_hf_tokenizer(base / "tokenizer.json")
    vocab, eos, bos = hf.get_vocab_size(), hf.token_to_id("</s>"), hf.token_to_id("<s>")
    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64, init_std=0.3)
    model = get_family("llama").init(cfg, vocab, seed=0)
    out = write_export(model, cfg, vocab, tmp_path / "hf", tokenizer_files=base, special_ids={"eos": eos, "bos": bos})
    run_tokenizer = RunTokenizer(KIND_HF, vocab, eos, eos, "", {}, None, hf=hf)
    records = complete(model, run_codec(run_tokenizer), PROMPTS, max_new_tokens=NEW, max_len=cfg.max_seq_len)
    for record in records:
        prompt_ids, new = their_greedy(out, record["prompt"])
        assert prompt_ids == record["prompt_token_ids"] and prompt_ids[0] == eos != bos
        assert new == recipe09_tokens(record, eos), record["prompt"]
    # the base's vocabulary and pipeline are kept: only what starts a text changed
    ours, theirs = (json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")) for folder in (out, base))
    assert {k: v for k, v in ours.items() if k != "post_processor"} == {
        k: v for k, v in theirs.items() if k != "post_processor"}


@pytest.mark.parametrize("kind", ["sentencepiece", "adopted", "adopted-sentencepiece"])
def test_tokenizers_library_alone_puts_eos_first(tmp_path: Path, kind: str) -> None:
    """Without transformers: tokenizer.json's own post-processor starts the text with EOS (an adopted base that
    ships tokenizer.model alone gets the converted tokenizer.json beside it)."""
    import sentencepiece as spm

    from eval.hf_export import write_export
    from model.llama.config import LlamaConfig
    from model.registry import get_family
    from tests.fixture_run import FIXTURE_TEXTS
    from tokenizer.loaded import read_hf_tokenizer

    texts = [path.read_text(encoding="utf-8") for path in sorted(FIXTURE_TEXTS.glob("ru_*.txt"))]
    cfg = LlamaConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=32)
    if kind == "adopted":
        base = byte_level_base(tmp_path / "base", texts)
        eos = read_hf_tokenizer(base / "tokenizer.json").token_to_id("</s>")
        vocab, kwargs = 400, {"tokenizer_files": base}
    else:
        from experiment.sections.tokenizer import TokenizerConfig
        from tokenizer.train import special_ids, train_sentencepiece, trainer_options

        tok_cfg = TokenizerConfig(vocab_size=600, model_type="bpe")
        lines = [line for text in texts for line in text.splitlines() if line.strip()]
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(iter(lines), trainer_options(tok_cfg, 0)))
        eos, vocab, kwargs = sp.eos_id(), sp.get_piece_size(), {"sp": sp}
        kwargs["special_ids"] = special_ids(tok_cfg)
        if kind == "adopted-sentencepiece":  # a base folder with its SentencePiece model and config only
            base = tmp_path / "base"
            base.mkdir()
            (base / "tokenizer.model").write_bytes(sp.serialized_model_proto())
            (base / "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}),
                encoding="utf-8")
            kwargs["tokenizer_files"] = base
    kwargs.setdefault("special_ids", {"eos": eos})
    model = get_family("llama").init(cfg, vocab, seed=0)
    out = write_export(model, cfg, vocab, tmp_path / "hf", **kwargs)
    exported = read_hf_tokenizer(out / "tokenizer.json")
    ids = exported.encode("Жили-были").ids
    assert ids[0] == eos and ids[1:] == exported.encode("Жили-были", add_special_tokens=False).ids
    settings = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["add_bos_token"] is True and settings["bos_token"] == exported.id_to_token(eos)
    assert json.loads((out / "generation_config.json").read_text(encoding="utf-8"))["bos_token_id"] == eos
    transformers = optional_import("transformers", "hf")
    if transformers is not None:  # and transformers' AutoTokenizer, whatever class the base's config named
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        assert hf_tok("Жили-были дед и баба")["input_ids"] == exported.encode("Жили-были дед и баба").ids
