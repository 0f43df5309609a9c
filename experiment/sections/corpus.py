"""Config of recipe 01 (corpus building): sources, cleaning, language ID, quality filters, dedup."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError, echo
from experiment.storage.urls import check_any_url

SourceKind = Literal["debian", "files", "hub"]
SplitRule = Literal["file", "paragraph", "chunk"]


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': {message}")


def _check_share(value: float, key: str) -> None:
    _require(0.0 <= value <= 1.0, key, f"{value} must be a share between 0 and 1")


@dataclass
class SourceConfig:
    kind: SourceKind
    name: str = ""  # label in document ids and the manifest; defaults to the kind
    # kind=debian: Debian packages fetched with apt-get download and unpacked with dpkg -x (never installed)
    packages: list[str] = field(default_factory=lambda: ["fortunes-ru", "manpages-ru", "debian-faq-ru"])
    cache_dir: str = ""  # where .deb files are kept between runs; default <run_root>/.cache/debian
    fortune_group_chars: int = 3000  # short fortunes are grouped into documents of about this size
    # kind=files: globs of .txt / .jsonl(.gz|.zst) / .parquet files, or folders of .txt files
    paths: list[str] = field(default_factory=list)
    text_field: str = "text"
    # how a .txt file becomes documents: the whole file, each blank-line paragraph, or paragraphs
    # packed into chunks of about chunk_chars (long works split into pretraining-sized documents)
    split_rule: SplitRule = "file"
    chunk_chars: int = 4000
    # kind=hub: a Hugging Face dataset id (or a builder such as "json" with paths as data_files)
    dataset: str = ""
    config_name: str = ""
    split: str = "train"
    streaming: bool = True
    # mixture: a stable hash-chosen share of the source's documents, and caps
    weight: float = 1.0
    max_documents: int | None = None
    max_bytes: int | None = None

    @property
    def label(self) -> str:
        return self.name or self.kind

    def validate(self, key: str) -> None:
        for index, path in enumerate(self.paths):
            check_any_url(path, f"{key}.paths[{index}]")
        if self.kind == "files" and not self.paths:
            raise ConfigError(f"config key '{key}.paths': a files source needs at least one path or glob")
        if self.kind == "hub" and not self.dataset:
            raise ConfigError(f"config key '{key}.dataset': a hub source needs a dataset id")
        if self.kind == "debian" and not self.packages:
            raise ConfigError(f"config key '{key}.packages': a debian source needs at least one package")
        _require(0.0 < self.weight <= 1.0, f"{key}.weight",
                 f"{self.weight} must be in (0, 1]: the share of this source's documents kept")
        _require(self.chunk_chars >= 100, f"{key}.chunk_chars", f"{self.chunk_chars} is below 100 characters")
        _require(self.fortune_group_chars >= 100, f"{key}.fortune_group_chars",
                 f"{self.fortune_group_chars} is below 100 characters")
        for cap in ("max_documents", "max_bytes"):
            value = getattr(self, cap)
            _require(value is None or value > 0, f"{key}.{cap}", f"{value} must be positive (or null for no cap)")
        _require(bool(self.label.strip()) and "/" not in self.label and ":" not in self.label, f"{key}.name",
                 f"{echo(self.label)} cannot label document ids (empty, or contains '/' or ':')")


@dataclass
class LangIdConfig:
    enabled: bool = True
    target: str = "ru"  # ISO 639-1 code of the language kept
    # candidates lingua chooses among: the Cyrillic neighbours Russian is confused with, plus English
    languages: list[str] = field(default_factory=lambda: ["ru", "uk", "be", "bg", "kk", "sr", "mk", "en"])
    min_confidence: float = 0.65  # document-level confidence of the target language
    sample_chars: int = 1500  # lingua reads up to this many characters from the start, middle and end

    def validate(self, key: str) -> None:
        _check_share(self.min_confidence, f"{key}.min_confidence")
        _require(self.target in self.languages, f"{key}.target", f"'{self.target}' is not in {key}.languages")
        _require(self.sample_chars >= 100, f"{key}.sample_chars", f"{self.sample_chars} is below 100")


@dataclass
class QualityConfig:
    """Gopher- and FineWeb-style document filters with thresholds set for Russian text."""

    enabled: bool = True
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0  # Russian words are longer than English ones (Gopher: 3..10)
    max_mean_word_length: float = 12.0
    max_symbol_word_ratio: float = 0.1  # '#' and ellipses per word
    max_bullet_lines_share: float = 0.9
    max_ellipsis_lines_share: float = 0.3
    min_alpha_words_share: float = 0.7  # words with at least one letter
    min_stop_words: int = 2  # distinct Russian function words (и, в, не, на, что, ...)
    min_terminal_punct_lines_share: float = 0.12  # FineWeb: lines ending in . ! ? … " »
    max_duplicate_lines_chars_share: float = 0.2  # Gopher's value
    max_short_lines_share: float = 0.67  # FineWeb's value...
    short_line_chars: int = 20  # ...but Russian verse lines run 20-35 characters (FineWeb counts <= 30)
    max_duplicate_paragraphs_share: float = 0.3
    # Gopher: the most frequent word 2-, 3-, 4-gram may not cover more than this share of characters
    max_top_ngram_chars_share: list[float] = field(default_factory=lambda: [0.2, 0.18, 0.16])

    def validate(self, key: str) -> None:
        _require(0 <= self.min_words <= self.max_words, f"{key}.min_words",
                 f"{self.min_words} must be between 0 and max_words ({self.max_words})")
        _require(0 < self.min_mean_word_length <= self.max_mean_word_length, f"{key}.min_mean_word_length",
                 "must be positive and at most max_mean_word_length")
        for name in ("max_bullet_lines_share", "max_ellipsis_lines_share", "min_alpha_words_share",
                     "min_terminal_punct_lines_share", "max_duplicate_lines_chars_share", "max_short_lines_share",
                     "max_duplicate_paragraphs_share"):
            _check_share(getattr(self, name), f"{key}.{name}")
        _require(self.max_symbol_word_ratio >= 0, f"{key}.max_symbol_word_ratio", "must not be negative")
        _require(self.min_stop_words >= 0, f"{key}.min_stop_words", "must not be negative")
        _require(len(self.max_top_ngram_chars_share) == 3, f"{key}.max_top_ngram_chars_share",
                 "needs three shares: for word 2-, 3- and 4-grams")
        for i, share in enumerate(self.max_top_ngram_chars_share):
            _check_share(share, f"{key}.max_top_ngram_chars_share[{i}]")


@dataclass
class DedupConfig:
    exact: bool = True
    near: bool = True
    ngram: int = 5  # word n-gram shingles
    bands: int = 14  # FineWeb: 14 bands x 8 rows = 112 permutations
    rows: int = 8
    # a candidate pair sharing an LSH bucket is a duplicate only if its estimated Jaccard reaches this
    # (0 trusts the buckets alone, as FineWeb does)
    min_jaccard: float = 0.0
    seed: int = 1
    # FineWeb-2's rehydration: each kept document written again by the size of the near-duplicate cluster
    # it stands for (data_prep.corpus.dedup.rehydration_copies: 1, 2, 3, 3, 5 for 5-99, 8 for 100-999, 1 from 1000)
    rehydrate: bool = False

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def validate(self, key: str) -> None:
        _require(self.ngram >= 1, f"{key}.ngram", f"{self.ngram} must be at least 1")
        _require(self.bands >= 1 and self.rows >= 1, f"{key}.bands", "bands and rows must be at least 1")
        _check_share(self.min_jaccard, f"{key}.min_jaccard")


@dataclass
class DecontaminationConfig:
    """Recipe 01 drops (or cuts) what the corpus shares with the benchmarks recipes 05 and 05c read (docs/corpus.md).

    The index holds, per benchmark item, every ``ngram``-gram of its text (normalized words: lower case, ё as е,
    punctuation dropped); a piece of an item shorter than ``ngram`` words but of at least ``min_words`` is one gram
    of its own length (GPT-3's rule: Brown et al. 2020, appendix C)."""

    enabled: bool = True
    ngram: int = 13  # GPT-3's 13; datatrove's NGramsDecontFilter uses 12, Marin's overlap reports 15
    min_words: int = 8  # shorter item text is not checked (GPT-3: spurious matches below 8 words)
    action: Literal["remove", "cut"] = "remove"  # drop the document, or cut the overlapping spans out of it
    # names from eval/decontam.py's known_benchmarks() (recipe 05's tasks, 05c's as mera:<config>); []: all of them
    benchmarks: list[str] = field(default_factory=list)
    # a benchmark whose items cannot be read here: stop before anything is written, or build the corpus and record
    # 'not decontaminated against X' (the manifest, the report, and recipe 05's line for that task)
    missing: Literal["error", "record"] = "record"
    # benchmarks whose only source is the Hugging Face hub (no local file: eval.task_files, eval.bench_dir,
    # eval.mera_dir) are read from it only when this is on; off, they are recorded as not decontaminated against
    read_hub: bool = False

    def validate(self, key: str) -> None:
        _require(1 <= self.ngram <= 64, f"{key}.ngram", f"{self.ngram} must be between 1 and 64 words")
        _require(1 <= self.min_words <= self.ngram, f"{key}.min_words",
                 f"{self.min_words} must be between 1 and ngram ({self.ngram})")
        duplicated = sorted({name for name in self.benchmarks if self.benchmarks.count(name) > 1})
        _require(not duplicated, f"{key}.benchmarks", f"{duplicated} repeats")


@dataclass
class CorpusConfig:
    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig(kind="debian")])
    min_chars: int = 200
    max_chars: int = 200_000
    min_cyrillic_share: float = 0.5  # of letters; a cheap prefilter in front of lingua
    docs_per_shard: int = 50_000
    repair_mojibake: bool = True  # ftfy plus cp1251/koi8-r text read as latin-1
    replace_pii: bool = True  # e-mails and IP addresses become placeholders
    email_placeholder: str = "<EMAIL>"
    ip_placeholder: str = "<IP>"
    langid: LangIdConfig = field(default_factory=LangIdConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontamination: DecontaminationConfig = field(default_factory=DecontaminationConfig)
    # the document filters: ours (the quality: section), or FineWeb-2's Russian set with its published
    # thresholds (data_prep.corpus.quality.FINEWEB2_RUS; its lingua threshold replaces langid.min_confidence)
    filters: Literal["default", "fineweb2-rus"] = "default"
    runner: Literal["local", "beam"] = "local"
    workers: int = 0  # local pool size; 0 = one per CPU core, 1 = a plain loop in this process
    beam_options: list[str] = field(default_factory=list)  # e.g. ["--runner=DataflowRunner", "--project=..."]
    # where Beam workers write the docs-NNNNN.jsonl shards (gs://bucket/run/corpus, s3://...); "" = the run's
    # corpus/ folder. report.md and manifest.json (naming it as data_uri) stay in the run folder.
    output_uri: str = ""
    report_examples: int = 3  # rejected examples per reason in report.md and W&B

    def validate(self, key: str) -> None:
        if not self.sources:
            raise ConfigError(f"config key '{key}.sources': at least one source is needed")
        check_any_url(self.output_uri, f"{key}.output_uri")
        labels = [s.label for s in self.sources]
        duplicated = sorted({x for x in labels if labels.count(x) > 1})
        _require(not duplicated, f"{key}.sources", f"source names must differ, {duplicated} repeats (set name:)")
        _require(0 <= self.min_chars <= self.max_chars, f"{key}.min_chars",
                 f"{self.min_chars} must be between 0 and max_chars ({self.max_chars})")
        _check_share(self.min_cyrillic_share, f"{key}.min_cyrillic_share")
        _require(self.docs_per_shard >= 1, f"{key}.docs_per_shard", f"{self.docs_per_shard} must be at least 1")
        _require(self.workers >= 0, f"{key}.workers", f"{self.workers} must be 0 (all cores) or more")
        _require(self.report_examples >= 0, f"{key}.report_examples", "must not be negative")
        _require(not self.output_uri or self.runner == "beam", f"{key}.output_uri",
                 "is written by Beam workers: set corpus.runner=beam, or leave it empty")
