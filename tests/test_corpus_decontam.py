"""Benchmark decontamination in recipe 01 (corpus.decontamination): real benchmark items from ../shared/data/bench,
read by eval's loaders, planted in real Russian text (../shared/data/text/ruslit), whole and inside longer documents."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from data_prep.corpus.decontam import IndexBuilder, decontaminate, normalized_words
from eval.decontam import benchmark_index, check_decontamination, segment_spec
from eval.decontam_status import KEY, decontamination_status
from eval.tasks import TASKS
from experiment.config import build_config, build_dataclass
from experiment.corpus_format import iter_documents, read_corpus_manifest
from experiment.errors import ConfigError, DataError
from experiment.runfolder import RunFolder, make_link
from experiment.schema import ExperimentConfig
from experiment.stages import CORPUS, SHARDS
from tests.conftest import needs_shared

SHARED = Path(os.environ.get("RU_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
BENCH, RUSLIT = SHARED / "bench", SHARED / "text" / "ruslit"
# a few benchmarks keep the index small; xnli_ru has no local file here: recorded as not decontaminated against
BENCHMARKS = ["rublimp", "terra", "ruworldtree", "rcb", "xnli_ru"]
CLEAN_TEXT = [RUSLIT / "prose" / "Gogol" / "Нос.txt", RUSLIT / "prose" / "Gogol" / "Коляска.txt"]


def make_cfg(tmp_path: Path, sources: list[dict[str, Any]], runner: str = "local",
             **decontamination: Any) -> ExperimentConfig:
    return build_dataclass(ExperimentConfig, {
        "experiment": {"name": "t", "run_root": str(tmp_path / "runs")},
        # the planted documents are single sentences too: the length, language and quality filters stay out of it
        "corpus": {"sources": sources, "workers": 1, "runner": runner, "min_chars": 20, "langid": {"enabled": False},
                   "quality": {"enabled": False}, "decontamination": {"benchmarks": BENCHMARKS, **decontamination}},
        "eval": {"bench_dir": str(BENCH)},
    })


def first_row(path: Path, text: Any, min_words: int) -> str:
    """The first record of a benchmark file whose text (``text(record)``) has at least ``min_words`` words."""
    if path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as handle:
            rows: list[dict[str, Any]] = list(csv.DictReader(handle))
    else:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return next(text(row) for row in rows if len(normalized_words(text(row))) >= min_words)


def planted_items() -> dict[str, str]:
    return {
        "rublimp": first_row(BENCH / "rublimp" / "negative_concord.csv", lambda r: r["source_sentence"], 9),
        "terra": first_row(BENCH / "terra" / "train.jsonl", lambda r: r["premise"], 25),
        "ruworldtree": first_row(BENCH / "mera_humanbench" / "ruworldtree_items_human_mv.jsonl",
                                 lambda r: r["question"], 14),
        "rcb": first_row(BENCH / "mera_humanbench" / "rcb_items_human_mv.jsonl", lambda r: r["premise"], 14),
    }


def disguised(sentence: str) -> str:
    """The same words as a writer might have them: upper case, ё for е, other punctuation."""
    return sentence.upper().replace("Е", "Ё", 1).replace(",", " —").rstrip(".") + "!"


@pytest.fixture(scope="module")
def clean_paragraphs() -> list[str]:
    needs_shared(RUSLIT)
    needs_shared(BENCH / "rublimp")
    lines = [line.strip() for path in CLEAN_TEXT for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if len(line) > 300][:60]


def write_sources(tmp_path: Path, clean: list[str], planted: dict[str, str]) -> list[dict[str, Any]]:
    """A clean source (ruslit paragraphs) and a planted one: each item whole as a document, and disguised in the
    middle of a longer real paragraph."""
    (tmp_path / "in").mkdir(exist_ok=True)
    rows = []
    for i, (name, item) in enumerate(sorted(planted.items())):
        rows.append({"text": item, "name": f"{name} whole"})
        host = clean[-1 - i]
        middle = len(host) // 2
        rows.append({"text": f"{host[:middle]} {disguised(item)} {host[middle:]}", "name": f"{name} inside"})
    hosts = clean[:len(clean) - len(planted)]  # the last paragraphs host the planted items
    (tmp_path / "in" / "clean.jsonl").write_text(
        "".join(json.dumps({"text": p}, ensure_ascii=False) + "\n" for p in hosts), encoding="utf-8")
    (tmp_path / "in" / "planted.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return [{"kind": "files", "name": "clean", "paths": [str(tmp_path / "in" / "clean.jsonl")]},
            {"kind": "files", "name": "planted", "paths": [str(tmp_path / "in" / "planted.jsonl")]}]


def build(cfg: ExperimentConfig, with_index: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    from data_prep.corpus.build import build_corpus

    folder = RunFolder.for_config(cfg)
    build_corpus(cfg, folder, None, benchmarks=benchmark_index(cfg) if with_index else None)
    return (read_corpus_manifest(folder.corpus), list(iter_documents(folder.corpus)),
            (folder.corpus / "report.md").read_text(encoding="utf-8"))


def test_words_are_lower_case_with_e_for_yo_and_no_punctuation() -> None:
    assert normalized_words("Ёлка, — сказал  он: «Всё_равно!»") == ["елка", "сказал", "он", "все", "равно"]
    assert normalized_words("ЁЛКА сказал Он все равно") == normalized_words("Ёлка, — сказал  он: «Всё_равно!»")


def test_an_item_shorter_than_n_words_matches_whole_and_below_min_words_not_at_all() -> None:
    builder = IndexBuilder(ngram=13, min_words=8)
    builder.add_benchmark("b", "file", [["Восемь слов в этом предложении стоят одно за другим."], ["Семь слов тут."]])
    index = builder.build()
    assert index.summaries["b"].items_indexed == 1 and index.summaries["b"].ngrams == 1
    inside = "Сначала было начало. Восемь слов в этом предложении стоят одно за другим! А потом конец."
    assert decontaminate(inside, index, "remove").benchmarks == ("b",)
    assert decontaminate("Восемь слов в этом предложении стоят одно за другим", index, "remove").benchmarks == ("b",)
    assert decontaminate("Восемь слов в этом предложении стоят одно", index, "remove").benchmarks == ()  # 7 of 8
    cut = decontaminate(inside, index, "cut")
    assert cut.text == "Сначала было начало. ! А потом конец." and cut.words_cut == 9


def test_segments_leave_the_prompt_template_words_out() -> None:
    spec = segment_spec(TASKS["terra"])
    assert "Вопрос" not in spec.context and "{premise}" in spec.context and "{hypothesis}" in spec.context
    assert all("Верно" not in choice for choice in spec.choices)
    winograd = segment_spec(TASKS["xwinograd_ru"])  # no word between the fields: the sentence stays whole
    assert winograd.contexts == TASKS["xwinograd_ru"].contexts and winograd.choices == TASKS["xwinograd_ru"].choices


@pytest.mark.shared_data(BENCH)
def test_planted_benchmark_items_are_removed_and_the_report_names_their_benchmark(
        tmp_path: Path, clean_paragraphs: list[str]) -> None:
    planted = planted_items()
    manifest, docs, report = build(make_cfg(tmp_path, write_sources(tmp_path, clean_paragraphs, planted)))
    texts = "\n".join(d["text"] for d in docs)
    rejected = manifest["counts"]["rejected"]
    for name, item in planted.items():
        assert rejected.get(f"benchmark:{name}") == 2, (name, rejected)  # whole, and inside a longer document
        assert item not in texts and disguised(item) not in texts
        entry = manifest["decontamination"]["benchmarks"][name]
        assert entry["documents"] == entry["documents_removed"] == 2 and entry["source"].startswith(str(BENCH))
        assert f"| rejected: benchmark:{name} | 2 |" in report and f"| {name} | `{entry['source']}`" in report
    assert set(rejected) == {f"benchmark:{name}" for name in planted}  # nothing clean was lost
    assert manifest["counts"]["kept"] == len(clean_paragraphs) - len(planted)
    assert "on the Hugging Face hub" in manifest["decontamination"]["not_decontaminated"]["xnli_ru"]
    assert "- xnli_ru: no local file (otherwise its items are on the Hugging Face hub" in report
    assert manifest["decontamination"]["ngram"] == 13 and manifest["decontamination"]["action"] == "remove"


@pytest.mark.shared_data(BENCH)
def test_cut_keeps_the_rest_of_a_longer_document(tmp_path: Path, clean_paragraphs: list[str]) -> None:
    planted = {"terra": planted_items()["terra"]}
    manifest, docs, _ = build(make_cfg(tmp_path, write_sources(tmp_path, clean_paragraphs, planted), action="cut"))
    host = clean_paragraphs[-1]
    cut = [d["text"] for d in docs if d["source"] == "planted"]
    assert len(cut) == 1 and host[:40] in cut[0] and host[-40:] in cut[0]  # the whole item document is gone
    assert "Женщин" not in cut[0] or planted["terra"][:30] not in cut[0]
    assert manifest["counts"]["rejected"] == {"benchmark:terra": 1}
    assert manifest["decontamination"]["benchmarks"]["terra"]["documents"] == 2
    assert manifest["decontamination"]["words_cut"] == 2 * len(normalized_words(planted["terra"]))


@pytest.mark.shared_data(BENCH)
def test_a_clean_corpus_loses_nothing(tmp_path: Path, clean_paragraphs: list[str]) -> None:
    sources = write_sources(tmp_path, clean_paragraphs, {})[:1]
    on = build(make_cfg(tmp_path / "on", sources))
    off = build(make_cfg(tmp_path / "off", sources, enabled=False), with_index=False)
    assert on[1] == off[1] and on[0]["shards"] == off[0]["shards"] and on[0]["counts"] == off[0]["counts"]
    assert all(entry["documents"] == 0 for entry in on[0]["decontamination"]["benchmarks"].values())
    assert off[0]["decontamination"] == {"enabled": False, "reason": "corpus.decontamination.enabled is off"}


def test_config_keys_are_checked_with_one_line_naming_the_key(tmp_path: Path) -> None:
    for override, key in (({"ngram": 0}, "ngram"), ({"min_words": 20}, "min_words"),
                          ({"benchmarks": ["terra", "terra"]}, "benchmarks"), ({"action": "blank"}, "action")):
        with pytest.raises(ConfigError, match=rf"corpus\.decontamination\.{key}") as caught:
            make_cfg(tmp_path, [{"kind": "debian"}], **override)
        assert "\n" not in str(caught.value)
    cfg = make_cfg(tmp_path, [{"kind": "debian"}], benchmarks=["terra", "tera"])
    with pytest.raises(ConfigError, match=r"^config key 'corpus.decontamination.benchmarks': unknown benchmark 'tera'"):
        check_decontamination(cfg, RunFolder.for_config(cfg))


@pytest.mark.shared_data(BENCH)
def test_a_missing_benchmark_file_is_an_error_or_recorded_as_the_config_says(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, [{"kind": "debian"}], benchmarks=["terra", "rucola"], missing="error")
    cfg.eval.bench_dir = str(tmp_path / "no-bench")
    with pytest.raises(DataError, match=r"^benchmark 'terra' cannot be read for decontamination: no local file "
                                        r"\(\S+/no-bench/terra/train\.jsonl missing; .*missing=error"):
        benchmark_index(cfg)
    cfg.corpus.decontamination.missing = "record"
    index = benchmark_index(cfg)
    assert index is not None and index.empty and set(index.not_indexed) == {"terra", "rucola"}


def test_recipe_05_says_per_task_whether_the_corpus_was_decontaminated_against_it(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, [{"kind": "debian"}])
    folder = RunFolder.for_config(cfg)
    tasks = {"terra": {"source": "/b/terra/train.jsonl"}, "rcb": {"source": "/other/rcb.jsonl"},
             "xnli_ru": {"source": "hub:facebook/xnli"}, "rucola": {"source": "/b/rucola/in_domain_dev.csv"}}
    assert set(decontamination_status(cfg, folder, tasks).values()) == {
        f"unknown: no finished corpus in {folder.corpus}"}
    folder.corpus.mkdir(parents=True)
    entry = {"items": 5, "items_indexed": 5, "ngrams": 50, "documents": 3, "documents_removed": 3}
    CORPUS.write_manifest(folder.corpus, {"documents": 1, "shards": [], "decontamination": {
        "enabled": True, "ngram": 13, "action": "remove", "not_decontaminated": {"xnli_ru": "no local file"},
        "benchmarks": {"terra": {**entry, "source": "/b/terra/train.jsonl"}, "rcb": {**entry, "source": "/b/rcb"}}}})
    assert decontamination_status(cfg, folder, tasks) == {
        "terra": "decontaminated (13-grams, remove: 3 documents overlapped)",
        "rcb": "NOT decontaminated: indexed from /b/rcb, not from the file evaluated (/other/rcb.jsonl)",
        "xnli_ru": "NOT decontaminated: no local file",
        "rucola": "NOT decontaminated: not among corpus.decontamination.benchmarks"}


TERRA = {"terra": {"source": "/b/terra/train.jsonl"}}
OVERLAPPED = "13-grams, remove: 3 documents overlapped"


def write_corpus(folder: Path, decontaminated: bool, sha256: str = "a" * 64) -> None:
    """A finished corpus of one file, decontaminated against terra's file (or built without)."""
    entry = {"items": 5, "items_indexed": 5, "ngrams": 50, "documents": 3, "documents_removed": 3,
             "source": "/b/terra/train.jsonl"}
    record = ({"enabled": True, "ngram": 13, "action": "remove", "not_decontaminated": {},
               "benchmarks": {"terra": entry}} if decontaminated else {"enabled": False})
    folder.mkdir(parents=True, exist_ok=True)
    CORPUS.write_manifest(folder, {"documents": 1, "shards": [{"file": "docs-00000.jsonl", "sha256": sha256}],
                                   "decontamination": record})


def run_at(root: Path, name: str, decontaminated: bool | None = True, **train: Any) -> tuple[ExperimentConfig,
                                                                                                RunFolder]:
    """A run folder under ``root`` with its resolved config (``train`` keys) and, unless ``decontaminated`` is
    None, a finished corpus."""
    cfg = build_config({"experiment": {"name": name, "run_root": str(root)}, "train": train})
    folder = RunFolder.for_config(cfg)
    folder.save_resolved_config(cfg, "pretrain")
    if decontaminated is not None:
        write_corpus(folder.root / "corpus", decontaminated)
    return cfg, folder


def read_only_status(cfg: ExperimentConfig, folder: RunFolder, root: Path) -> str:
    """terra's line, checked to have written nothing under ``root`` (no file added, none touched)."""
    def every_file() -> dict[str, int]:
        return {str(path): path.stat().st_mtime_ns for path in root.rglob("*")}

    before = every_file()
    line = decontamination_status(cfg, folder, TERRA)["terra"]
    assert every_file() == before
    return line


def test_recipe_05_reads_the_corpus_of_every_run_a_stage_trained_on(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A stage trained on its parent's data up to its step and on a mixture set of another run: a task is
    decontaminated only where all three corpora were, and a line names the corpus that was not."""
    runs = tmp_path / "runs"
    _, demo = run_at(runs, "demo")
    _, web = run_at(runs, "web", decontaminated=False)
    cfg, stage = run_at(runs, "stage", branch_from="demo", branch_step=200, branch_data="own",
                        mixture=[{"name": "own"}, {"name": "web", "shards": str(web.root / "shards")}])
    with caplog.at_level(logging.WARNING, logger="eval.decontam"):
        assert read_only_status(cfg, stage, runs) == (
            f"NOT decontaminated: mixture set 'web' ({web.corpus}): the corpus was built without decontamination")
    assert not caplog.records  # every corpus was found and read
    write_corpus(web.corpus, decontaminated=True)
    assert read_only_status(cfg, stage, runs) == (
        f"decontaminated in every corpus it trained on: mixture set 'own' ({stage.corpus}): {OVERLAPPED}; "
        f"mixture set 'web' ({web.corpus}): {OVERLAPPED}; parent demo to step 200 ({demo.corpus}): {OVERLAPPED}")
    write_corpus(demo.corpus, decontaminated=False)
    assert read_only_status(cfg, stage, runs) == (
        f"NOT decontaminated: parent demo to step 200 ({demo.corpus}): the corpus was built without "
        "decontamination")
    # a stage of that stage: its grandparent's corpus is followed through the stage's resolved config
    powerup_cfg, powerup = run_at(runs, "powerup", branch_from="stage", branch_step=300, branch_data="own")
    assert read_only_status(powerup_cfg, powerup, runs) == (
        f"NOT decontaminated: parent stage to step 300: parent demo to step 200 ({demo.corpus}): the corpus was "
        "built without decontamination")


def test_a_corpus_that_cannot_be_found_is_unknown_in_one_warning_line(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A mixture set kept outside any run folder and a parent without a corpus: unknown, naming both, one warning
    line each however many tasks there are; a corpus known NOT to be decontaminated outweighs them."""
    runs = tmp_path / "runs"
    run_at(runs, "demo", decontaminated=None)
    elsewhere = tmp_path / "bought" / "shards"
    cfg, stage = run_at(runs, "stage", branch_from="demo", branch_step=200, branch_data="own",
                        mixture=[{"name": "own"}, {"name": "bought", "shards": str(elsewhere)}])
    tasks = {**TERRA, "rcb": {"source": "/b/rcb.jsonl"}, "parus": {}}
    with caplog.at_level(logging.WARNING, logger="eval.decontam"):
        status = decontamination_status(cfg, stage, {"terra": TERRA["terra"]})
        assert status["terra"] == (
            f"unknown: mixture set 'bought': {elsewhere} is no run folder's shards/ (no config.resolved.yaml beside "
            f"it): its corpus cannot be found; parent demo to step 200 ({runs / 'demo' / 'corpus'}): no finished "
            f"corpus in {runs / 'demo' / 'corpus'}")
    assert len(caplog.records) == 2 and all(r.levelname == "WARNING" for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eval.decontam"):
        status = decontamination_status(cfg, stage, tasks)
    assert len(caplog.records) == 2  # per corpus, not per task
    assert status["rcb"] == f"NOT decontaminated: mixture set 'own' ({stage.corpus}): not among {KEY}.benchmarks"
    # a damaged manifest is a line too: recipe 05 has scored every task by now, and writes its results
    (stage.corpus / "manifest.json").write_text("{", encoding="utf-8")
    assert decontamination_status(cfg, stage, TERRA)["terra"].startswith(
        f"unknown: mixture set 'own' ({stage.corpus}): {stage.corpus / 'manifest.json'} is not a readable manifest")


def test_a_decay_branch_reads_the_corpus_its_linked_shards_were_packed_from(tmp_path: Path) -> None:
    """A decay branch has no corpus of its own: its shards are its parent's (a link), packed from the parent's
    corpus; once that corpus is rebuilt, the shards trained on are no longer known to be decontaminated."""
    runs = tmp_path / "runs"
    _, demo = run_at(runs, "demo")
    SHARDS.write_manifest(demo.root / "shards", {"tokenizer_sha256": "t", "seq_len": 8, "splits": {},
                                                 "corpus": {"documents": 1, "shards_sha256": ["a" * 64]}})
    cfg, branch = run_at(runs, "decay", decontaminated=None, branch_from="demo", branch_step=200)
    make_link(branch.root / "shards", demo.root / "shards")
    assert decontamination_status(cfg, branch, TERRA)["terra"] == (
        f"decontaminated in every corpus it trained on: its shards ({demo.corpus}): {OVERLAPPED}")
    write_corpus(demo.corpus, decontaminated=True, sha256="b" * 64)  # recipe 01 again, recipe 03 not
    assert decontamination_status(cfg, branch, TERRA)["terra"] == (
        f"unknown: its shards ({demo.corpus}): the corpus in {demo.corpus} is not the one the shards in "
        f"{branch.root / 'shards'} were packed from (recipe 01 ran again since)")


def test_a_cycle_of_branches_ends(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_at(runs, "a", branch_from="b", branch_step=10, branch_data="own")
    cfg, b = run_at(runs, "b", branch_from="a", branch_step=10, branch_data="own")
    assert decontamination_status(cfg, b, TERRA)["terra"] == (
        f"unknown: parent a to step 10: parent b to step 10: train.branch_from leads back to {b.root} (a cycle of "
        "branches)")


@pytest.mark.shared_data(BENCH)
def test_overlap_report_of_a_corpus_built_without_decontamination(tmp_path: Path, clean_paragraphs: list[str]) -> None:
    import yaml

    from tools.benchmark_overlap import main as overlap_main

    planted = planted_items()
    sources = write_sources(tmp_path, clean_paragraphs, planted)
    manifest, _, _ = build(make_cfg(tmp_path, sources, enabled=False), with_index=False)
    assert manifest["counts"]["kept"] == len(clean_paragraphs) + len(planted)  # every planted item is in it
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"experiment": {"name": "t", "run_root": str(tmp_path / "runs")},
                                      "corpus": {"sources": sources, "decontamination": {
                                          "enabled": False, "benchmarks": BENCHMARKS}},
                                      "eval": {"bench_dir": str(BENCH)}}, allow_unicode=True), encoding="utf-8")
    assert overlap_main(["--config", str(config), "--out", str(tmp_path / "overlap")]) == 0
    with (tmp_path / "overlap" / "overlap.csv").open(encoding="utf-8") as handle:
        rows = {row["benchmark"]: row for row in csv.DictReader(handle)}
    assert set(rows) == set(planted)  # xnli_ru has no local file: listed as not measured
    for name in planted:  # one item of each planted twice, and no clean paragraph overlaps these benchmarks
        assert rows[name]["items_overlapping"] == "1", rows[name]
        assert float(rows[name]["share_overlapping"]) == round(1 / int(rows[name]["items"]), 4)
    assert int(rows["rublimp"]["items"]) == 35_000 > int(rows["rublimp"]["items_checked"])
    markdown = (tmp_path / "overlap" / "overlap.md").read_text(encoding="utf-8")
    assert "| terra | 2,616 |" in markdown and "- xnli_ru: no local file" in markdown
    assert (tmp_path / "overlap" / "overlap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.shared_data(BENCH)
def test_recipe_01_reads_the_benchmarks_before_it_writes_and_removes_what_the_corpus_shares_with_them(
        tmp_path: Path, clean_paragraphs: list[str]) -> None:
    import yaml

    from tests.recipe_runner import error_line, run_recipe

    sources = write_sources(tmp_path, clean_paragraphs[:10], {"terra": planted_items()["terra"]})
    config = tmp_path / "exp.yaml"
    corpus = {"sources": sources, "workers": 1, "min_chars": 20, "langid": {"enabled": False},
              "quality": {"enabled": False}, "decontamination": {"benchmarks": ["terra", "xnli_ru"]}}
    config.write_text(yaml.safe_dump({"experiment": {"name": "t", "run_root": str(tmp_path / "runs")},
                                      "corpus": corpus, "eval": {"bench_dir": str(BENCH)}}, allow_unicode=True),
                      encoding="utf-8")
    # xnli_ru has no local file: with missing=error the recipe stops with one line, the run folder untouched
    failed = run_recipe("01_build_corpus.py", config, "corpus.decontamination.missing=error", check=False)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert error_line(failed).endswith("benchmark 'xnli_ru' cannot be read for decontamination: no local file "
                                       "(otherwise its items are on the Hugging Face hub and "
                                       "corpus.decontamination.read_hub is off; eval.task_files or eval.mera_dir may "
                                       "name a copy) (corpus.decontamination.missing=error; 'record' builds the "
                                       "corpus and records it)")
    run_dir = tmp_path / "runs" / "t"
    assert not (run_dir / "corpus").exists() and not list(run_dir.rglob("*.yaml"))
    run_recipe("01_build_corpus.py", config)
    manifest = read_corpus_manifest(run_dir / "corpus")
    assert manifest["counts"]["rejected"] == {"benchmark:terra": 2} and manifest["counts"]["kept"] == 9
    assert set(manifest["decontamination"]["not_decontaminated"]) == {"xnli_ru"}


@pytest.mark.shared_data(BENCH)
def test_recipe_05c_mera_test_inputs_are_indexed_from_eval_mera_dir(tmp_path: Path) -> None:
    # MERA's record schema (instruction, inputs, outputs, meta), the texts real RCB items from the shared folder
    items = [json.loads(line) for line in
             (BENCH / "mera_humanbench" / "rcb_items_human_mv.jsonl").read_text(encoding="utf-8").splitlines()[:20]]
    (tmp_path / "mera").mkdir()
    (tmp_path / "mera" / "rcb.jsonl").write_text("".join(json.dumps(
        {"instruction": "Ситуация: {premise}\nГипотеза: {hypothesis}\nОтвет:", "outputs": "",
         "inputs": {"premise": item["premise"], "hypothesis": item["hypothesis"]}, "meta": {"id": i}},
        ensure_ascii=False) + "\n" for i, item in enumerate(items)), encoding="utf-8")
    cfg = make_cfg(tmp_path, [{"kind": "debian"}], benchmarks=["mera:rcb", "mera:parus"])
    cfg.eval.mera_dir = str(tmp_path / "mera")
    index = benchmark_index(cfg)
    assert index is not None and index.summaries["mera:rcb"].items == 20
    assert index.summaries["mera:rcb"].source == str(tmp_path / "mera" / "rcb.jsonl")
    assert "mera:parus" in index.not_indexed  # no parus.jsonl there, and the hub is not read
    premise = next(item["premise"] for item in items if len(normalized_words(item["premise"])) >= 13)
    assert decontaminate(f"Вот что писали тогда. {disguised(premise)} Конец.", index, "remove").benchmarks == (
        "mera:rcb",)


def test_a_benchmark_item_with_stress_marks_or_decomposed_letters_matches_the_cleaned_document() -> None:
    """Recipe 01 checks a document after normalize_text (NFC, stress marks dropped); the benchmark's text is put in
    the same form, so an item written with a stress mark or a decomposed 'й' still meets its copy in the corpus."""
    from data_prep.corpus.normalize import normalize_text

    item = "Он открыл за\u0301мок старым ключом и вошёл в дом, где давно никто не жил и\u0306 не бывал."
    builder = IndexBuilder(ngram=13, min_words=8)
    builder.add_benchmark("b", "file", [[item]])
    index = builder.build()
    document = normalize_text("Так было. Он открыл замок старым ключом и вошёл в дом, где давно никто не жил й не "
                              "бывал. Конец.")
    assert decontaminate(document, index, "remove").benchmarks == ("b",)


@pytest.mark.shared_data(BENCH)
def test_the_mera_sets_recipe_05_scores_are_indexed_from_the_files_it_reads(tmp_path: Path) -> None:
    """Recipe 05's mera_<config> tasks read MERA's open human-benchmark sets: a ruEthics situation and a ruDetox
    reference are removed under those tasks' names; a task with no labelled file here is recorded, not read."""
    ethics = json.loads((BENCH / "mera_humanbench" / "ruethics_data.json").read_text(encoding="utf-8"))
    situation = next(row["text"] for row in ethics if 20 <= len(normalized_words(row["text"])) <= 80)
    detox = first_row(BENCH / "mera_humanbench" / "rudetox_dataset.csv", lambda r: r["outputs"], 14)
    cfg = make_cfg(tmp_path, [{"kind": "debian"}], benchmarks=["mera_ruethics", "mera_rudetox", "mera_parus"])
    index = benchmark_index(cfg)
    assert index is not None and index.summaries["mera_ruethics"].items == 3 * len(ethics)  # three questions each
    assert index.summaries["mera_ruethics"].source == str(BENCH / "mera_humanbench" / "ruethics_data.json")
    assert "mera_parus" in index.not_indexed  # no labelled PARus file here, and the hub is not read
    assert decontaminate(f"Вот что писали тогда. {disguised(situation)} Конец.", index, "remove").benchmarks == (
        "mera_ruethics",)
    assert decontaminate(disguised(detox), index, "remove").benchmarks == ("mera_rudetox",)
