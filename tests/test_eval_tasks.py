"""The task harness: metrics on constructed cases, few-shot determinism, task files good and bad."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from eval.harness import PairEncoder, fewshot_prefix, load_task, task_metrics
from eval.stats import matthews_corrcoef, tie_aware_correct, wilson_interval
from eval.tasks import TASKS, Item, TaskSpec, template_fields
from experiment.errors import DataError

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data"))
BENCH = SHARED / "bench"
needs_shared = pytest.mark.shared_data(BENCH)


def mc_spec(**kw) -> TaskSpec:
    return TaskSpec(name="t", description="", sources=(), **kw)


def test_acc_and_acc_norm_disagree_on_a_constructed_case() -> None:
    # the gold answer is longer: a lower total log-likelihood but a higher one per character; per UTF-8
    # byte the Cyrillic distractor (2 bytes a letter) is longer, which flips acc_norm_bytes back.
    item = Item(task="t", id="x", contexts=("Q:", "Q:"), continuations=(" да", " yes-yes"), gold=1)
    loglik = [[-3.0, -6.0]]  # " да": 3 chars / 5 bytes; " yes-yes": 8 chars / 8 bytes
    metrics = task_metrics(mc_spec(), [item], loglik)["metrics"]
    assert metrics["acc"]["value"] == 0.0  # -3 > -6
    assert metrics["acc_norm_chars"]["value"] == 1.0  # -3/3 = -1.0 < -6/8 = -0.75
    assert metrics["acc_norm_bytes"]["value"] == 0.0  # -3/5 = -0.6 > -6/8 = -0.75


def test_acc_norm_chars_prefers_the_better_per_character_answer() -> None:
    item = Item(task="t", id="x", contexts=("Q:", "Q:"), continuations=(" a", " bbbbbbb"), gold=1)
    metrics = task_metrics(mc_spec(), [item], [[-2.0, -4.0]])["metrics"]
    assert metrics["acc"]["value"] == 0.0
    assert metrics["acc_norm_chars"]["value"] == 1.0  # -2/2 = -1 < -4/8 = -0.5


def test_ties_share_credit_so_a_constant_model_sits_at_chance() -> None:
    items = [Item(task="t", id=str(i), contexts=("", ""), continuations=("a b", "a c"), gold=0) for i in range(10)]
    metrics = task_metrics(mc_spec(metrics=("acc",)), items, [[-1.0, -1.0]] * 10)["metrics"]
    assert metrics["acc"]["value"] == 0.5
    assert metrics["acc"]["chance"] == 0.5
    assert tie_aware_correct([0.0, 0.0, 0.0], 1) == pytest.approx(1 / 3)


def test_mcc_and_wilson_interval() -> None:
    assert matthews_corrcoef([1, 1, 0, 0], [1, 1, 0, 0]) == 1.0
    assert matthews_corrcoef([1, 1, 0, 0], [0, 0, 1, 1]) == -1.0
    assert matthews_corrcoef([1, 0, 1, 0], [1, 1, 1, 1]) == 0.0  # constant prediction
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)


def test_mcc_metric_in_task_results() -> None:
    items = [Item(task="t", id=str(i), contexts=("", ""), continuations=(" Нет", " Да"), gold=g)
             for i, g in enumerate([0, 1, 0, 1])]
    result = task_metrics(mc_spec(metrics=("acc", "mcc")), items, [[-1, -2], [-2, -1], [-1, -2], [-1, -2]])
    assert result["metrics"]["mcc"]["value"] == pytest.approx(matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 0]))
    assert result["metrics"]["mcc"]["chance"] == 0.0
    assert result["metrics"]["acc"]["majority"] == 0.5  # the same two answers on every item
    varied = [Item(task="t", id="v", contexts=("",) * 2, continuations=(" a", " b"), gold=0),
              Item(task="t", id="w", contexts=("",) * 2, continuations=(" c", " d"), gold=0)]
    assert "majority" not in task_metrics(mc_spec(metrics=("acc",)), varied, [[0, 1], [1, 0]])["metrics"]["acc"]
    lo, hi = result["metrics"]["mcc"]["ci95"]
    assert -1.0 <= lo <= hi <= 1.0


def pool(n: int) -> list[Item]:
    return [Item(task="t", id=f"f:{i}", contexts=(f"q{i}:",) * 2, continuations=(" a", " b"), gold=i % 2)
            for i in range(n)]


def test_fewshot_is_seeded_per_item_and_never_shows_the_item() -> None:
    items = pool(30)
    first = [fewshot_prefix(it, items, 3, seed=7) for it in items]
    subset = [fewshot_prefix(it, items, 3, seed=7) for it in reversed(items[::3])]
    assert subset == list(reversed(first[::3]))  # an item's prompt does not depend on which others are evaluated
    assert all(f"q{i}:" not in first[i] for i in range(30))
    assert first[0].count("\n\n") == 3
    assert "q1: b\n\n" in "".join(first) and "q2: a\n\n" in "".join(first)  # examples show the gold answer
    assert [fewshot_prefix(it, items, 3, seed=8) for it in items] != first
    assert fewshot_prefix(items[0], items, 0, seed=7) == ""


def test_fewshot_needs_enough_other_items() -> None:
    with pytest.raises(DataError, match="3-shot needs 3 other items"):
        fewshot_prefix(pool(3)[0], pool(3), 3, seed=0)


def test_balanced_cap_draws_each_gold_answer_equally() -> None:
    from eval.harness import cap_items

    items = [Item(task="t", id=str(i), contexts=("",) * 3, continuations=("a", "b", "c"),
                  gold=0 if i < 20 else 1 + i % 2)
             for i in range(40)]
    kept = cap_items(items, 9, seed=0, balance=True)
    assert sorted(Counter(it.gold for it in kept).values()) == [3, 3, 3]
    assert kept == cap_items(items, 9, seed=0, balance=True)
    assert [int(it.id) for it in kept] == sorted(int(it.id) for it in kept)  # file order kept
    assert len(cap_items(items, 9, seed=0)) == 9


def test_pair_encoder_moves_trailing_space_and_starts_a_document() -> None:
    encoder = PairEncoder(lambda text: [ord(c) for c in text], start_id=0)
    request = encoder("Ответ: ", "Да")
    assert request.context == [0, *map(ord, "Ответ:")]
    assert request.continuation == [ord(" "), ord("Д"), ord("а")]
    assert encoder("", "Да").context == [0]


# ---- task files: schema errors name the file, row and field -----------------------------------

def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def load(name: str, path: Path):
    return load_task(TASKS[name], bench_dir="", task_files={name: str(path)})


def test_missing_field_is_named_with_file_and_row(tmp_path: Path) -> None:
    rows = [{"premise": "a", "hypothesis": "b", "label": 0}, {"premise": "a", "label": 1}]
    path = write_jsonl(tmp_path / "terra.jsonl", rows)
    with pytest.raises(DataError, match=r"terra\.jsonl: row 2: missing field 'hypothesis'"):
        load("terra", path)


def test_gold_outside_the_choices_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rucola.csv"
    path.write_text("id,sentence,label\n0,Иван пришёл.,1\n1,Иван пришёл.,7\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"rucola\.csv: row 2: field 'label' has '7', not one of \['0', '1'\]"):
        load("rucola", path)


def test_empty_split_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "parus.jsonl"
    path.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"parus\.jsonl: no rows \(empty split\)"):
        load("parus", path)
    csv_path = tmp_path / "rucola.csv"
    csv_path.write_text("id,sentence,label\n", encoding="utf-8")
    with pytest.raises(DataError, match="no rows"):
        load("rucola", csv_path)


def test_broken_json_and_ragged_csv_rows_are_named(tmp_path: Path) -> None:
    path = tmp_path / "xnli.jsonl"
    path.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n{"premise": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"xnli\.jsonl line 2: not valid JSON"):
        load("xnli_ru", path)
    csv_path = tmp_path / "rucola.csv"
    csv_path.write_text("id,sentence,label\n0,a,1,extra\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"rucola\.csv: row 1: has 4 cells, the header has 3"):
        load("rucola", csv_path)


def test_hub_offline_gives_one_line_naming_the_dataset() -> None:
    with pytest.raises(DataError, match=r"hub:facebook/belebele/rus_Cyrl\[test\] could not be loaded") as info:
        load_task(TASKS["belebele_rus_Cyrl"], bench_dir="/nonexistent")
    assert "\n" not in str(info.value)


HUB_RECORDS = {
    "xwinograd_ru": {"sentence": "Кубок не влез в чемодан, потому что _ был слишком большой.", "option1": "кубок",
                     "option2": "чемодан", "answer": "1"},
    "xstorycloze_ru": {**{f"input_sentence_{i}": f"Фраза {i}." for i in range(1, 5)}, "sentence_quiz1": "Конец.",
                       "sentence_quiz2": "Начало.", "answer_right_ending": 1},
    "hellaswag_ru": {"activity_label": "Готовка", "ctx": "Он режет лук", "endings": ["а", "б", "в", "г"],
                     "label": "2"},
    "belebele_rus_Cyrl": {"flores_passage": "Текст.", "question": "Что?", "mc_answer1": "а", "mc_answer2": "б",
                          "mc_answer3": "в", "mc_answer4": "г", "correct_answer_num": "4"},
    "xnli_ru": {"premise": "Идёт дождь", "hypothesis": "мокро", "label": 0},
    "ruopenbookqa": {"instruction": "...", "inputs": {"question": "Что?", "option_a": "а", "option_b": "б",
                                                      "option_c": "в", "option_d": "г"}, "outputs": "C"},
    "rummlu": {"inputs": {"text": "Сколько?", "option_a": "1", "option_b": "2", "option_c": "3", "option_d": "4",
                          "subject": "math"}, "outputs": "B"},
}


@pytest.mark.parametrize("name", sorted(HUB_RECORDS))
def test_hub_tasks_read_local_files_in_the_hub_schema(tmp_path: Path, name: str) -> None:
    data = load(name, write_jsonl(tmp_path / f"{name}.jsonl", [HUB_RECORDS[name]] * 2))
    item = data.items[0]
    assert len(data.items) == 2 and data.source.labels == "gold"
    assert len(item.contexts) == len(item.continuations) >= 2
    assert all(c.strip() for c in item.continuations)
    expected_gold = {"xwinograd_ru": 0, "xstorycloze_ru": 0, "hellaswag_ru": 2, "belebele_rus_Cyrl": 3,
                     "xnli_ru": 0, "ruopenbookqa": 2, "rummlu": 1}[name]
    assert item.gold == expected_gold
    if name == "xwinograd_ru":
        assert item.contexts == ("Кубок не влез в чемодан, потому что кубок",
                                 "Кубок не влез в чемодан, потому что чемодан")
        assert item.continuations[0] == item.continuations[1] == " был слишком большой."


def test_every_task_names_its_template_fields() -> None:
    for spec in TASKS.values():
        assert spec.sources, spec.name
        if not spec.choices_field:
            assert template_fields(spec), spec.name


@needs_shared
@pytest.mark.parametrize("name,labels", [("rublimp", "gold"), ("parus", "silver"), ("terra", "gold"),
                                         ("rcb", "silver"), ("rucola", "gold"), ("ruworldtree", "silver")])
def test_local_tasks_load_from_shared_bench(name: str, labels: str) -> None:
    data = load_task(TASKS[name], bench_dir=str(BENCH), rublimp_dir=str(BENCH / "rublimp"), max_items=5, seed=1)
    assert data.source.labels == labels
    assert data.items and len(data.pool) >= len(data.items)
    if name == "rublimp":
        groups = {it.group for it in data.items}
        assert len(groups) == len(list((BENCH / "rublimp").glob("*.csv")))
        assert all(len([it for it in data.items if it.group == g]) == 5 for g in groups)
    else:
        assert len(data.items) == 5
    again = load_task(TASKS[name], bench_dir=str(BENCH), rublimp_dir=str(BENCH / "rublimp"), max_items=5, seed=1)
    assert [it.id for it in again.items] == [it.id for it in data.items]


def test_every_task_is_documented_with_its_schema() -> None:
    readme = (REPO / "eval" / "README.md").read_text(encoding="utf-8")
    for name, spec in TASKS.items():
        assert f"| `{name}` |" in readme, f"eval/README.md has no row for task {name}"
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
        for source in spec.sources:
            if source.gold_field:
                assert f"`{source.gold_field}`" in row, f"{name}: gold field {source.gold_field} undocumented"
        for field_name in template_fields(spec):
            if field_name not in ("stem", "choice1_text", "choice2_text", "head", "tail", "story", "query"):
                assert field_name in row, f"{name}: field {field_name} undocumented"


@pytest.mark.parametrize("override,key", [
    ("eval.batch_size=0", "eval.batch_size"),
    ("eval.tasks=[rublimp,parrus]", "eval.tasks"),
    ("eval.train_tasks=[parrus]", "eval.train_tasks"),
    ("eval.max_items_per_task=0", "eval.max_items_per_task"),
    ("eval.num_fewshot=-1", "eval.num_fewshot"),
    ("eval.task_files.nosuch=/x.jsonl", "eval.task_files.nosuch"),
])
def test_bad_eval_config_names_the_key(override: str, key: str) -> None:
    """Task names are the eval package's to check (where the eval starts); the rest is checked at load."""
    from eval.tasks import check_task_names
    from experiment.config import load_config
    from experiment.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^config key '{key}'.*"):
        check_task_names(load_config(REPO / "recipes" / "configs" / "demo.yaml", [override]).eval)


@pytest.mark.parametrize(("override", "message"), [
    ("eval.tasks=[rublimp,parrus]", r"'eval\.tasks': unknown task 'parrus'; did you mean 'parus'\? \(known: "),
    ("eval.task_files.rucolla=/x.jsonl", r"'eval\.task_files\.rucolla': unknown task; did you mean 'rucola'\?"),
])
def test_a_misspelled_task_gets_the_nearest_name(override: str, message: str) -> None:
    from eval.tasks import check_task_names
    from experiment.config import load_config
    from experiment.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        check_task_names(load_config(REPO / "recipes" / "configs" / "demo.yaml", [override]).eval)


@needs_shared
def test_scoring_a_task_is_deterministic_and_fewshot_changes_the_prompt() -> None:
    import jax.numpy as jnp
    import numpy as np

    from eval.harness import evaluate_task, score_items

    rng = np.random.default_rng(0)
    emb = jnp.asarray(rng.normal(size=(260, 8)).astype(np.float32))
    out = jnp.asarray(rng.normal(size=(8, 260)).astype(np.float32))

    def logits_fn(tokens, **_):  # sees the whole prefix (a running mean), so examples change the scores
        return (jnp.cumsum(emb[tokens], axis=1) / jnp.arange(1, tokens.shape[1] + 1)[None, :, None]) @ out

    encoder = PairEncoder(lambda text: [b + 4 for b in text.encode("utf-8")], start_id=3)
    data = load_task(TASKS["parus"], bench_dir=str(BENCH), max_items=12, seed=0)

    def run(k: int) -> dict:
        return evaluate_task(data, logits_fn, encoder, batch_size=4, max_len=256,
                             num_fewshot=k, seed=5)

    first, again = run(2), run(2)
    assert first == again and first["num_fewshot"] == 2

    def loglik(k: int) -> list[list[float]]:
        return score_items(logits_fn, data.items, data.pool, encoder, batch_size=4,
                           max_len=256, num_fewshot=k, seed=5)

    assert loglik(2) == loglik(2)
    assert loglik(2) != loglik(0)  # the examples are really in the prompt
