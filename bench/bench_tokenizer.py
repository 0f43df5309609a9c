"""Benchmark: SentencePiece vs Hugging Face byte-level BPE on the same Russian text, in one run.

Each trainer runs in its own fresh process (so peak memory is its own), on the same training lines
and at the same vocabulary size; encoding throughput is one core (a plain loop over held-out
documents). The two sides alternate over ``--rounds`` interleaved rounds (``bench/interleave.py``), a
fresh process each time; each side's figures are medians over the rounds, and each SentencePiece / HF
ratio is the median of the per-round ratios. Prints one JSON object.

    python bench/bench_tokenizer.py --vocab-size 32000 --max-mb 20 --rounds 3

``--stage-report DIR`` instead builds a corpus folder from ruslit under DIR and runs the real
recipe-02 stage on it (report.json with the baseline beside SentencePiece, round-trip on every
held-out document), printing the headline figures.

``--unseen DIR`` measures text the tokenizer never saw: the corpus folder (every document through recipe
01's ``normalize_text``) holds ruslit with whole authors held out (``--unseen-authors``, sources
``unseen-<genre>``), a wiki-style sample (Debian's ``debian-faq-ru``, the Debian FAQ in Russian, HTML
prose) and a social-style sample (``fortunes-ru``: Russian jokes, chat and forum quotes), both held out
whole (``tokenizer.heldout_sources``), plus the usual 5% of the seen authors' documents. The recipe-02
stage trains on the rest (``--extra-train``: Debian packages' text in ``tokenizer.extra_train_sources``;
``--exclude-authors`` leaves authors out entirely) and writes its report; the same held-out documents are
then measured with widely used LLM tokenizers from the files a registry package ships (``--llm-dir``:
``mistral_common/data`` of the ``mistral-common`` wheel, fetched with ``pip download --no-deps
mistral-common``: Mistral 7B's SentencePiece ``tokenizer.model.v1`` and Tekken ``tekken_240911.json``,
read with ``tiktoken``). Debian packages are fetched with ``apt-get download`` into ``--debian-cache``.
``--extra-corpus`` puts Debian packages' text into the corpus instead (5% of it held out and measured),
``--character-coverage`` overrides ``tokenizer.character_coverage``; the JSON also counts the single-character
pieces (what a higher coverage spends) and measures the unseen samples' digit-dense lines (``split_digits``).
``line_by_line`` in the JSON measures ours and the HF peer with every held-out line encoded alone (single
sentences or posts: no newline tokens). Levers: ``--split-digits``, ``--no-space-digit-pieces``,
``--max-piece-length``, ``--user-symbols``, ``--trainer-option KEY=VALUE`` (SentencePiece options that are no
config key, e.g. ``split_by_unicode_script=false``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from interleave import interleaved_rounds, median_ratio, medians  # noqa: E402

from experiment.split import is_validation  # noqa: E402

VALIDATION_PERCENT = 5.0
DOC_CHARS = 20_000  # works are cut into documents of about this many characters, at paragraph breaks


def ruslit_dir() -> Path:
    shared = Path(os.environ.get("RU_SHARED_DATA", REPO.parent / "shared" / "data"))
    path = shared / "text" / "ruslit"
    if not path.is_dir():
        sys.exit(f"error: ruslit not found at {path} (set RU_SHARED_DATA to the shared/data folder)")
    return path


def ruslit_documents(max_mb: float | None = None) -> list[dict[str, Any]]:
    """Every work cut into ~20k-character documents; source = prose / poems / publicism."""
    docs: list[dict[str, Any]] = []
    budget = None if max_mb is None else int(max_mb * 1e6)
    total = 0
    files = sorted(ruslit_dir().glob("*/*/*.txt"))
    # Interleave works so that a size cap still samples every genre and author.
    files.sort(key=lambda p: hashlib.sha256(str(p.relative_to(ruslit_dir())).encode()).hexdigest())
    for path in files:
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # one ruslit file is not UTF-8; recipe 01 would reject it too
            print(f"skipping {path}: not UTF-8", file=sys.stderr)
            continue
        text = unicodedata.normalize("NFC", raw.replace("\r\n", "\n"))
        paragraphs = [p.strip() for p in text.split("\n") if p.strip()]
        chunk: list[str] = []
        size = 0
        part = 0
        for para in [*paragraphs, None]:
            if para is None or (chunk and size + len(para) > DOC_CHARS):
                if chunk:
                    category, author = path.parts[-3], path.parts[-2]
                    doc_text = "\n\n".join(chunk)
                    docs.append({"id": f"ruslit/{category}/{author}/{path.stem}#{part}", "source": category,
                                 "text": doc_text})
                    total += len(doc_text.encode("utf-8"))
                    part += 1
                    chunk, size = [], 0
                if para is None:
                    break
            chunk.append(para)
            size += len(para) + 2
        if budget is not None and total >= budget:
            break
    return docs


def split_docs(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train = [d for d in docs if not is_validation(d["id"], VALIDATION_PERCENT)]
    heldout = [d for d in docs if is_validation(d["id"], VALIDATION_PERCENT)]
    return train, heldout


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _train_and_measure(kind: str, train: list[dict[str, Any]], heldout: list[str], vocab_size: int, model_type: str,
                       queue: Any) -> None:
    """Child process: train one tokenizer as the stage does, then time single-core encoding of held-out texts."""
    from experiment.sections.tokenizer import TokenizerConfig
    from tokenizer.baselines import train_bytelevel_bpe
    from tokenizer.texts import training_lines, training_texts
    from tokenizer.train import train_sentencepiece, trainer_options

    rss_before = peak_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    if kind == "sentencepiece":
        import sentencepiece as spm

        tok = TokenizerConfig(vocab_size=vocab_size, model_type=model_type, num_threads=os.cpu_count() or 1)
        lines = training_lines(train, 0.0, tok.max_sentence_length)
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, trainer_options(tok, seed=0)))
        encode = sp.encode
        decode = sp.decode
    else:
        hf = train_bytelevel_bpe(training_texts(train, 0.0), vocab_size)
        encode = lambda text: hf.encode(text, add_special_tokens=False).ids  # noqa: E731
        decode = lambda ids: hf.decode(ids, skip_special_tokens=False)  # noqa: E731
    train_seconds, train_cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    train_peak = peak_rss_mb()
    n_bytes = sum(len(t.encode("utf-8")) for t in heldout)
    # CPU time of this single-threaded loop: per-core speed, unaffected by other jobs on the machine.
    cpu_started = time.process_time()
    encoded = [encode(t) for t in heldout]
    encode_cpu_seconds = time.process_time() - cpu_started
    tokens = sum(len(ids) for ids in encoded)
    queue.put({
        "train_seconds": round(train_seconds, 2),
        "train_cpu_seconds": round(train_cpu_seconds, 2),
        "train_peak_rss_mb": round(train_peak, 1),
        "train_rss_growth_mb": round(train_peak - rss_before, 1),
        "encode_mb_per_s_per_core": round(n_bytes / 1e6 / encode_cpu_seconds, 2),
        "chars_per_token": round(sum(len(t) for t in heldout) / tokens, 3),
        "roundtrip_exact": sum(decode(ids) == t for ids, t in zip(encoded, heldout, strict=True)) / len(heldout),
    })


def run_isolated(kind: str, train: list[dict[str, Any]], heldout: list[str], vocab_size: int,
                 model_type: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # a fresh interpreter: peak RSS is this trainer's alone
    queue = ctx.Queue()
    proc = ctx.Process(target=_train_and_measure, args=(kind, train, heldout, vocab_size, model_type, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def compare(args: argparse.Namespace) -> dict[str, Any]:
    from data_prep.corpus.normalize import normalize_text

    # as recipe 01 writes the corpus: the tokenizer's own rules (no-break spaces, quotes, dashes) are applied
    # already, so a round trip measures the tokenizer, not those rules
    docs = [{**d, "text": normalize_text(d["text"])} for d in ruslit_documents(args.max_mb)]
    train, heldout = split_docs(docs)
    texts = [d["text"] for d in heldout]
    rounds = interleaved_rounds({kind: lambda kind=kind: run_isolated(kind, train, texts, args.vocab_size,
                                                                       args.model_type)
                                 for kind in ("sentencepiece", "hf_bytelevel_bpe")}, args.rounds)
    sides = {kind: medians({key: [r[key] for r in results] for key in results[0]}, digits=3)
             for kind, results in rounds.items()}
    for kind, results in rounds.items():
        sides[kind]["rounds"] = results
    ratios = {key: median_ratio([r[key] for r in rounds["sentencepiece"]], [r[key] for r in rounds["hf_bytelevel_bpe"]],
                                digits=2)
              for key in ("train_seconds", "train_cpu_seconds", "train_peak_rss_mb", "encode_mb_per_s_per_core",
                          "chars_per_token")}
    return {
        "bench": "tokenizer",
        "corpus": {"train_documents": len(train), "heldout_documents": len(heldout),
                   "train_mb": round(sum(len(d["text"].encode()) for d in train) / 1e6, 1),
                   "heldout_mb": round(sum(len(t.encode()) for t in texts) / 1e6, 2)},
        "vocab_size": args.vocab_size,
        "model_type": args.model_type,
        "rounds": args.rounds,
        "sentencepiece": sides["sentencepiece"],
        "hf_bytelevel_bpe": sides["hf_bytelevel_bpe"],
        "ratio_sentencepiece_over_hf": ratios,
    }


class NoRun:
    """Stands in for W&B: the benchmark keeps its numbers in report.json."""

    summary: dict[str, Any] = {}

    def log(self, _data: dict[str, Any]) -> None: ...

    def log_artifact(self, _artifact: Any) -> None: ...


def run_stage_on(cfg: Any, folder: Any, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Write ``docs`` as a finished corpus folder, run the recipe-02 stage, return its report.json."""
    from experiment.files import atomic_write_bytes
    from experiment.manifest import write_manifest
    from tokenizer.train import train_tokenizer

    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    atomic_write_bytes(folder.corpus / "docs-00000.jsonl", data)
    write_manifest(folder.corpus, "corpus", {
        "shards": [{"file": "docs-00000.jsonl", "documents": len(docs), "bytes": len(data), "sha256": ""}],
        "documents": len(docs), "bytes": len(data), "sources": sorted({d["source"] for d in docs}), "counts": {},
        "config": {},
    })
    extra = None
    if cfg.tokenizer.extra_train_sources:  # read as recipe 02 reads them
        from data_prep.corpus.sources import normalized_texts

        extra = normalized_texts(cfg.tokenizer.extra_train_sources, folder.root, "tokenizer.extra_train_sources")
    train_tokenizer(cfg, folder, NoRun(), extra)
    return json.loads((folder.tokenizer / "report.json").read_text(encoding="utf-8"))


def stage_report(args: argparse.Namespace) -> dict[str, Any]:
    """Run the real recipe-02 stage on ruslit and return its headline figures."""
    from experiment.config import build_dataclass
    from experiment.runfolder import RunFolder
    from experiment.schema import ExperimentConfig

    cfg = build_dataclass(ExperimentConfig, {
        "experiment": {"name": "ruslit-tokenizer", "run_root": str(args.stage_report), "seed": 0},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": args.model_type, "report_max_docs": 100_000,
                      **({} if args.max_piece_length is None else {"max_piece_length": args.max_piece_length})},
        "shards": {"validation_percent": VALIDATION_PERCENT},
    })
    folder = RunFolder.for_config(cfg)
    started = time.perf_counter()
    report = run_stage_on(cfg, folder, ruslit_documents(args.max_mb))
    headline = {}
    for name, result in report["tokenizers"].items():
        headline[name] = {
            "overall": {k: result["overall"][k] for k in ("documents", "chars_per_token", "tokens_per_word",
                                                          "byte_fallback_share", "roundtrip_exact")},
            "chars_per_token_by_source": {s: m["chars_per_token"] for s, m in result["by_source"].items()},
            "train_seconds": result["train_seconds"],
        }
    return {"bench": "tokenizer-stage", "vocab_size": args.vocab_size, "model_type": args.model_type,
            "max_piece_length": cfg.tokenizer.max_piece_length,
            "stage_seconds": round(time.perf_counter() - started, 1), "report": str(folder.tokenizer / "report.md"),
            **headline}


UNSEEN_SAMPLES = {"wiki-debian-faq": ["debian-faq-ru"], "social-fortunes": ["fortunes-ru"]}


def debian_documents(packages: list[str], source: str, cache: Path) -> list[dict[str, Any]]:
    """Documents of Debian packages as recipe 01 reads them (its reader and its normalization)."""
    from data_prep.corpus.debian import iter_debian_source
    from data_prep.corpus.documents import DocumentNumberer
    from data_prep.corpus.normalize import normalize_text
    from experiment.sections.corpus import SourceConfig

    cfg = SourceConfig(kind="debian", name=source, packages=packages, cache_dir=str(cache))
    docs = []
    for raw in iter_debian_source(cfg, DocumentNumberer(cfg, 0), source, cache):
        text = normalize_text(raw.text) if raw.text else ""
        if len(text) >= 200:
            docs.append({"id": raw.id, "source": source, "text": text})
    return docs


def llm_tokenizers(llm_dir: Path | None) -> list[Any]:
    """Mistral 7B's SentencePiece (32k) and Tekken (Mistral NeMo, 131k) from the mistral-common wheel."""
    if llm_dir is None:
        return []
    import base64

    import sentencepiece as spm
    import tiktoken

    from tokenizer.measured import MeasuredTokenizer, sentencepiece_under_test

    sp = spm.SentencePieceProcessor(model_file=str(llm_dir / "tokenizer.model.v1"))
    # Llama-style SentencePiece adds a dummy prefix: a word in running text is measured as "▁word" either way
    found = [sentencepiece_under_test(sp, name="mistral_7b_sentencepiece")]
    tekken = json.loads((llm_dir / "tekken_240911.json").read_text(encoding="utf-8"))
    config = tekken["config"]
    # as mistral-common loads it: the first vocabulary ranks, after the special tokens' ids
    inner = config["default_vocab_size"] - config["default_num_special_tokens"]
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in tekken["vocab"][:inner]}
    enc = tiktoken.Encoding(name="tekken", pat_str=config["pattern"], mergeable_ranks=ranks, special_tokens={})
    found.append(MeasuredTokenizer(
        name="mistral_tekken", vocab_size=len(ranks),
        encode=lambda text: enc.encode(text, disallowed_special=()), decode=enc.decode,
        is_byte_fallback=None, is_unknown=lambda _i: False,
        surface=lambda i: enc.decode_single_token_bytes(i).decode("utf-8", "replace")))
    return found


def single_char_pieces(tokenizer_dir: Path) -> dict[str, Any]:
    """Vocabulary slots that single characters take (learned, not byte pieces): what coverage 1.0 costs."""
    import sentencepiece as spm

    from tokenizer.spm import MODEL_FILE

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / MODEL_FILE))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i))]
    single = [p for p in pieces if len(p.replace("\u2581", " ")) == 1]
    other = "".join(p for p in single if not ("а" <= p.lower() <= "я" or p.lower() == "ё" or "a" <= p.lower() <= "z"))
    return {"single_char": len(single), "other_than_cyrillic_latin": len(other), "other_chars": other}


def digit_dense_lines(tokenizer_dir: Path, docs: list[dict[str, Any]], sources: list[str],
                      min_digits: int = 4) -> dict[str, Any]:
    """Chars/token of the SentencePiece model on the unseen samples' lines with at least ``min_digits`` digits
    (what ``split_digits`` costs where numbers are dense)."""
    import sentencepiece as spm

    from tokenizer.spm import MODEL_FILE

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / MODEL_FILE))
    lines = [line for d in docs if d["source"] in sources for line in d["text"].split("\n")
             if sum(c.isdigit() for c in line) >= min_digits]
    chars = sum(len(line) for line in lines)
    tokens = sum(len(ids) for ids in sp.encode(lines))
    return {"min_digits": min_digits, "lines": len(lines), "chars": chars,
            "chars_per_token": round(chars / max(tokens, 1), 4)}


def line_by_line(encoders: dict[str, Any], heldout: dict[str, list[dict[str, Any]]], unseen: list[str],
                 min_digits: int = 4) -> dict[str, Any]:
    """Chars/token with every non-empty line encoded alone, per tokenizer and sample: what a sample of
    single sentences or posts sees (no newline tokens; ``"\\n\\n"`` as one piece is no help there), and
    the same over the unseen samples' lines with at least ``min_digits`` digits (``split_digits``)."""
    lines = {source: [line for d in docs for line in d["text"].split("\n") if line] for source, docs in heldout.items()}
    dense = [line for source in unseen for line in lines.get(source, [])
             if sum(c.isdigit() for c in line) >= min_digits]

    def measure(encode: Any, texts: list[str]) -> dict[str, Any]:
        chars = sum(len(t) for t in texts)
        tokens = sum(len(encode(t)) for t in texts)
        return {"lines": len(texts), "chars": chars, "tokens": tokens,
                "chars_per_token": round(chars / max(tokens, 1), 4)}

    return {name: {"by_source": {source: measure(encode, texts) for source, texts in lines.items()},
                   "digit_dense_lines": {"min_digits": min_digits, **measure(encode, dense)}}
            for name, encode in encoders.items()}


# GPT-2's pre-tokenization (the peer's, without its English contractions) over characters, not bytes
GPT2_WORDS = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def train_charlevel_bpe(texts: Any, vocab_size: int) -> Any:
    """The peer's recipe on characters: Hugging Face's BPE trainer with the peer's word boundaries, spaces
    as SentencePiece's "▁", no bytes. Where it gives our figure and not the peer's, the difference is
    characters against bytes, not SentencePiece's trainer or its boundaries (``--char-level-peer``)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_WORDS), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=False)])
    tokenizer.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    return tokenizer


def trainer_option_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` SentencePiece trainer options that are no config key (split_by_unicode_script, ...),
    laid over what ``trainer_options`` gives: for measuring a lever before it becomes one."""
    import tokenizer.train as train

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        overrides[key] = {"true": True, "false": False}.get(value.lower(),
                                                            int(value) if value.lstrip("-").isdigit() else value)
    if overrides:
        plain = train.trainer_options
        train.trainer_options = lambda tok, seed: {**plain(tok, seed), **overrides}
    return overrides


def keep_baseline() -> dict[str, Any]:
    """The HF byte-level BPE the stage trains for its report, kept here (filled in once the stage has run)
    so the bench can measure it beyond the report."""
    import tokenizer.report as report_module

    kept: dict[str, Any] = {}
    train = report_module.train_bytelevel_bpe

    def train_and_keep(lines: Any, vocab_size: int) -> Any:
        kept["tokenizer"] = train(lines, vocab_size)
        return kept["tokenizer"]

    report_module.train_bytelevel_bpe = train_and_keep
    return kept


def unseen_report(args: argparse.Namespace) -> dict[str, Any]:
    """Recipe 02 with whole authors and two outside samples held out, then LLM tokenizers on the same text."""
    from data_prep.corpus.normalize import normalize_text
    from experiment.config import build_dataclass
    from experiment.runfolder import RunFolder
    from experiment.schema import ExperimentConfig
    from tokenizer.report import measure_tokenizer
    from tokenizer.texts import split_corpus

    docs = []
    for doc in ruslit_documents(args.max_mb):
        author = doc["id"].split("/")[2]
        if author in args.exclude_authors:
            continue
        source = f"unseen-{doc['source']}" if author in args.unseen_authors else doc["source"]
        docs.append({**doc, "source": source, "text": normalize_text(doc["text"])})
    unseen = sorted({d["source"] for d in docs if d["source"].startswith("unseen-")})
    for source, packages in UNSEEN_SAMPLES.items():
        docs += debian_documents(packages, source, args.debian_cache)
        unseen.append(source)
    if args.extra_corpus:  # into the corpus: 5% of these documents are held out like the authors' own
        docs += debian_documents(args.extra_corpus, "debian-train", args.debian_cache)
    extra_sources = [{"kind": "debian", "name": "debian-train", "packages": args.extra_train,
                      "cache_dir": str(args.debian_cache)}] if args.extra_train else []
    cfg = build_dataclass(ExperimentConfig, {
        "experiment": {"name": "ruslit-unseen", "run_root": str(args.unseen), "seed": 0},
        "tokenizer": {"vocab_size": args.vocab_size, "model_type": args.model_type, "report_max_docs": 100_000,
                      "split_digits": args.split_digits, "space_digit_pieces": not args.no_space_digit_pieces,
                      "normalization": args.normalization, "heldout_sources": unseen,
                      "extra_train_sources": extra_sources, "hf_export": False, "num_threads": os.cpu_count() or 1,
                      "baseline_hf_bpe": not args.no_hf_baseline,
                      **({} if args.character_coverage is None else {"character_coverage": args.character_coverage}),
                      **({} if args.max_piece_length is None else {"max_piece_length": args.max_piece_length}),
                      **({} if args.user_symbols is None else {"user_defined_symbols": args.user_symbols})},
        "shards": {"validation_percent": VALIDATION_PERCENT},
    })
    folder = RunFolder.for_config(cfg)
    extra_options = trainer_option_overrides(args.trainer_option)
    peer = keep_baseline()
    started = time.perf_counter()
    report = run_stage_on(cfg, folder, docs)
    results = report["tokenizers"]
    import sentencepiece as spm

    from tokenizer.spm import MODEL_FILE

    sp = spm.SentencePieceProcessor(model_file=str(folder.tokenizer / MODEL_FILE))
    encoders = {"sentencepiece": sp.encode}
    if "tokenizer" in peer:
        encoders["hf_bytelevel_bpe"] = lambda text: peer["tokenizer"].encode(text, add_special_tokens=False).ids
    if args.char_level_peer:
        from experiment.corpus_format import iter_documents
        from tokenizer.texts import training_texts

        char_level = train_charlevel_bpe(training_texts(iter_documents(folder.corpus), VALIDATION_PERCENT, unseen),
                                         args.vocab_size)
        encoders["hf_charlevel_bpe"] = lambda text: char_level.encode(text, add_special_tokens=False).ids
    split = split_corpus(folder.corpus, VALIDATION_PERCENT, 100_000, unseen)
    lines = line_by_line(encoders, split.heldout, unseen)
    for tok in llm_tokenizers(args.llm_dir):
        results[tok.name] = measure_tokenizer(tok, split.heldout)
    metrics = ("chars_per_token", "bytes_per_token", "byte_fallback_share", "words_within_two_tokens")
    table = {name: {source: {"documents": m["documents"], "chars": m["chars"], **{k: m[k] for k in metrics}}
                    for source, m in result["by_source"].items()}
             for name, result in results.items()}
    return {"bench": "tokenizer-unseen", "vocab_size": args.vocab_size, "model_type": args.model_type,
            "split_digits": args.split_digits, "space_digit_symbols": list(cfg.tokenizer.space_digit_symbols()),
            "normalization": args.normalization, "character_coverage": cfg.tokenizer.character_coverage,
            "max_piece_length": cfg.tokenizer.max_piece_length,
            "user_defined_symbols": cfg.tokenizer.user_defined_symbols, "trainer_options_overridden": extra_options,
            "extra_corpus": args.extra_corpus,
            "single_char_pieces": single_char_pieces(folder.tokenizer),
            "digit_dense_lines": digit_dense_lines(folder.tokenizer, docs, unseen), "line_by_line": lines,
            "unseen_authors": args.unseen_authors, "excluded_authors": args.exclude_authors, "unseen_sources": unseen,
            "extra_train": args.extra_train,
            "train": report["train"], "stage_seconds": round(time.perf_counter() - started, 1),
            "report": str(folder.tokenizer / "report.md"), "by_source": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--model-type", choices=["unigram", "bpe"], default="bpe")
    parser.add_argument("--max-piece-length", type=int, default=None,
                        help="tokenizer.max_piece_length (default: the config's)")
    parser.add_argument("--user-symbols", nargs="*", default=None,
                        help="tokenizer.user_defined_symbols (--unseen; default: the config's)")
    parser.add_argument("--trainer-option", nargs="*", default=[], metavar="KEY=VALUE",
                        help="SentencePiece trainer options that are no config key, "
                             "e.g. split_by_unicode_script=false (--unseen)")
    parser.add_argument("--max-mb", type=float, default=None, help="cap the ruslit text used (MB of UTF-8)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (a fresh process per side each)")
    parser.add_argument("--stage-report", type=Path, default=None,
                        help="run the recipe-02 stage on ruslit with its run root here instead")
    parser.add_argument("--unseen", type=Path, default=None,
                        help="run the recipe-02 stage with whole authors and outside samples held out (run root here)")
    parser.add_argument("--unseen-authors", nargs="+", default=["Herzen", "Lermontov"])
    parser.add_argument("--exclude-authors", nargs="*", default=[],
                        help="ruslit authors left out entirely (what less training prose costs on the unseen authors)")
    parser.add_argument("--extra-train", nargs="*", default=[], help="Debian packages whose text joins training")
    parser.add_argument("--extra-corpus", nargs="*", default=[],
                        help="Debian packages whose text joins the corpus "
                             "(5%% held out, source debian-train as in the earlier runs)")
    parser.add_argument("--character-coverage", type=float, default=None,
                        help="tokenizer.character_coverage (default: the config's)")
    parser.add_argument("--split-digits", action="store_true", help="tokenizer.split_digits=true (every digit a token)")
    parser.add_argument("--no-space-digit-pieces", action="store_true", help="tokenizer.space_digit_pieces=false")
    parser.add_argument("--char-level-peer", action="store_true",
                        help="also the peer's recipe on characters (Hugging Face BPE, its word boundaries), "
                             "line by line")
    parser.add_argument("--no-hf-baseline", action="store_true", help="skip the HF byte-level BPE baseline (--unseen)")
    parser.add_argument("--normalization", default="ru_text_v1", choices=["ru_text_v1", "identity"])
    parser.add_argument("--debian-cache", type=Path, default=Path("/tmp/bench-debian"))
    parser.add_argument("--llm-dir", type=Path, default=None,
                        help="mistral_common/data of the mistral-common wheel (LLM tokenizers measured beside)")
    args = parser.parse_args()
    if args.extra_corpus and args.extra_train:
        parser.error("--extra-corpus and --extra-train both name their documents debian-train: give one")
    result = unseen_report(args) if args.unseen else stage_report(args) if args.stage_report else compare(args)
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
