"""Recipe 09: a trained run's checkpoint continues prompts; the completions are printed and written as jsonl."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.fixture_run import pretrained_copy
from tests.recipe_runner import error_line, run_recipe
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
