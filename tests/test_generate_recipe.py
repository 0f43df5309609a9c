"""Recipe 09: a trained run's checkpoint continues prompts; the completions are printed and written as jsonl."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiment.errors import DataError
from tests.fixture_run import pretrained_copy
from tests.recipe_runner import error_line, run_recipe, start_recipe
from tokenizer.loaded import load_run_tokenizer


def test_generate_writes_one_record_per_prompt(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Капитанская дочка\n\nБерегите честь смолоду\n", encoding="utf-8")
    proc = run_recipe("09_generate.py", config, 'generate.prompts=["Жили-были"]', f"generate.prompt_file={prompt_file}",
                      "generate.max_new_tokens=6", "generate.checkpoint_step=3")
    files = sorted((tmp_path / "runs" / "tiny" / "generate").glob("*.jsonl"))
    assert len(files) == 1
    records = [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines()]
    eos = load_run_tokenizer(tmp_path / "runs" / "tiny" / "tokenizer").eos_id
    assert [r["prompt"] for r in records] == ["Жили-были", "Капитанская дочка", "Берегите честь смолоду"]
    for record in records:
        assert record["step"] == 3 and record["family"] == "llama" and record["temperature"] == 0.0
        assert 0 < record["new_tokens"] == len(record["token_ids"]) <= 6 or record["finished"] == "eos"
        assert record["prompt_token_ids"][0] == eos  # a document's start, as eval encodes a context
        assert record["tokens_per_s"] >= 0 and isinstance(record["completion"], str)
        assert f"> {record['prompt']}" in proc.stdout

    # greedy is deterministic: the same step gives the same ids; a stop string cuts the text
    first = records[0]["completion"]
    stop = first[1:3] if len(first) >= 3 else None
    overrides = ["generate.max_new_tokens=6", "generate.checkpoint_step=3", 'generate.prompts=["Жили-были"]']
    if stop:
        overrides.append(f"generate.stop=[{json.dumps(stop, ensure_ascii=False)}]")
    run_recipe("09_generate.py", config, *overrides)
    files = sorted((tmp_path / "runs" / "tiny" / "generate").glob("*.jsonl"))
    assert len(files) == 2
    again = json.loads(files[1].read_text(encoding="utf-8").splitlines()[0])
    assert again["token_ids"] == records[0]["token_ids"]
    if stop:
        assert again["completion"] == first[:first.find(stop)] and again["finished"] == "stop"


def test_generate_on_several_devices_reads_the_checkpoint_onto_the_training_mesh(fixture_pretrained: Path,
                                                                                  tmp_path: Path) -> None:
    """Four devices, the training mesh fsdp=2: the parameters are restored onto it and the prompts and cache split
    over it; the tokens are the one-device run's. A mesh that does not fit the devices here falls back to the data
    axis with a warning."""
    config = pretrained_copy(fixture_pretrained, tmp_path)
    prompts = 'generate.prompts=["Жили-были", "Берегите честь смолоду", "Мороз и солнце"]'
    run_recipe("09_generate.py", config, prompts, "generate.max_new_tokens=8")
    one_device = sorted((tmp_path / "runs" / "tiny" / "generate").glob("*.jsonl"))
    expected = [json.loads(line)["token_ids"] for line in one_device[0].read_text(encoding="utf-8").splitlines()]
    for mesh, says in (("train.mesh.fsdp=2", "generating on mesh {'data': 2, 'fsdp': 2, 'tensor': 1}"),
                       ("train.mesh.fsdp=8", "generating with the 4 devices here on the data axis")):
        output = tmp_path / "generate.out"
        proc = start_recipe("09_generate.py", config, output, prompts, "generate.max_new_tokens=8", mesh, devices=4)
        assert proc.wait(timeout=300) == 0, output.read_text(encoding="utf-8")[-3000:]
        assert says in output.read_text(encoding="utf-8")
        newest = sorted((tmp_path / "runs" / "tiny" / "generate").glob("*.jsonl"))[-1]
        assert [json.loads(line)["token_ids"] for line in newest.read_text(encoding="utf-8").splitlines()] == expected


def test_generate_without_a_checkpoint_names_recipe_04(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    shutil.rmtree(tmp_path / "runs" / "tiny" / "checkpoints")
    proc = run_recipe("09_generate.py", config, check=False)
    assert proc.returncode == 2 and "recipes/04_pretrain.py" in error_line(proc), error_line(proc)
    assert not list((tmp_path / "runs" / "tiny").glob("generate/*.jsonl"))


def test_bad_generate_settings_are_one_line_naming_the_key(fixture_pretrained: Path, tmp_path: Path) -> None:
    config = pretrained_copy(fixture_pretrained, tmp_path)
    for override, key in (("generate.top_p=0", "generate.top_p"), ("generate.temperature=-1", "generate.temperature"),
                          ("generate.prompts=[]", "generate.prompts"), ("generate.max_new_tokens=100",
                                                                       "max_seq_len")):
        proc = run_recipe("09_generate.py", config, override, check=False)
        assert proc.returncode == 2 and key in error_line(proc), (override, error_line(proc))


@pytest.mark.integration
def test_generate_with_a_hugging_face_folder_uses_its_tokenizer_and_eos(tmp_path: Path) -> None:
    """generate.hf_model: a Qwen3 folder (our export of a tiny random model, no torch needed) with a word-level
    tokenizer.json; the recipe's ids are what ``generate`` gives the imported model on the prompt as the folder's
    tokenizer encodes it (EOS first: the export carries the training convention), and its EOS ends a row."""
    import dataclasses

    from tokenizers import Tokenizer, models, pre_tokenizers

    from eval.hf_export import write_export
    from model.generate import generate
    from model.hf_checkpoint import load_hf_checkpoint
    from model.registry import get_family
    from tests.recipe_runner import tiny_config

    words = ["<pad>", "<s>", "</s>", *(f"w{i}" for i in range(61))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    files = tmp_path / "tokenizer_files"
    files.mkdir()
    tokenizer.save(str(files / "tokenizer.json"))
    fam = get_family("qwen3")
    cfg = dataclasses.replace(fam.config_cls(), d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                              max_seq_len=64, init_std=0.5)
    ours = fam.init(cfg, len(words), seed=2)
    prompts = ["w1 w2 w3", "w40 w41 w42 w43 w44 w45"]
    ids = [tokenizer.encode(p).ids for p in prompts]
    # the folder's EOS: a token that, put first as the export's tokenizer puts it, comes back among row 0's new tokens
    eos = next(e for e in range(3, len(words)) if e in generate(ours, [[e, *ids[0]]], 12).tokens[0][:11])
    folder = write_export(ours, cfg, len(words), tmp_path / "hf", special_ids={"bos": 1, "eos": eos, "pad": 0},
                          tokenizer_files=files)

    model = load_hf_checkpoint(folder).model()
    ids = [[eos, *row] for row in ids]
    want = generate(model, ids, 12, eos_id=eos).tokens
    assert len(want[0]) < 12
    config = tiny_config(tmp_path)
    run_recipe("09_generate.py", config, f"generate.hf_model={folder}", f"generate.prompts={json.dumps(prompts)}",
               "generate.max_new_tokens=12")
    files_out = sorted((tmp_path / "runs" / "tiny" / "generate").glob("*.jsonl"))
    records = [json.loads(line) for line in files_out[0].read_text(encoding="utf-8").splitlines()]
    assert [r["token_ids"] for r in records] == want
    assert [r["prompt_token_ids"] for r in records] == ids
    assert all(r["hf_model"] == str(folder) and r["family"] == "qwen3" for r in records)
    assert [r["completion"] for r in records] == [tokenizer.decode(t) for t in want]
    assert records[0]["finished"] == "eos"


def test_a_folder_with_only_a_sentencepiece_model_encodes_with_bos_first(tmp_path: Path) -> None:
    import io

    import sentencepiece as spm

    from eval.completions import hf_codec

    model = io.BytesIO()
    text = ["Жили-были старик со старухой у самого синего моря", "Однажды в студёную зимнюю пору"] * 20
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=model, vocab_size=60,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    codec = hf_codec(tmp_path, {"eos_token_id": [2, 5]})
    ids = codec.encode("Жили-были")
    assert ids[0] == 1 and codec.decode(ids[1:]) == "Жили-были"
    assert codec.eos_ids == (2, 5)
    with pytest.raises(DataError, match="tokenizer.model"):
        hf_codec(tmp_path / "nowhere", {})
