from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from experiment.errors import ConfigError
from experiment.sections.corpus import SourceConfig
from experiment.storage.urls import check_location

# Letters and punctuation a Russian tokenizer must represent without byte fallback even when they
# are rare in the training text (ё is often printed as е, so character_coverage alone drops it).
RUSSIAN_REQUIRED_CHARS = (
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ"
    "0123456789.,:;!?()[]-–—«»„“”'\"…№%"
)
# Printable ASCII as well: Latin words and code stay readable pieces, and text that spells a control
# piece ("<s>", "<0x41>") is then always cheaper as ordinary pieces, which keeps the Hugging Face
# export's ids identical to SentencePiece's on such text.
PRINTABLE_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))
DEFAULT_REQUIRED_CHARS = RUSSIAN_REQUIRED_CHARS + "".join(c for c in PRINTABLE_ASCII if c not in RUSSIAN_REQUIRED_CHARS)
# With split_digits, a digit after a space as one piece ("▁" is SentencePiece's space): see space_digit_pieces.
SPACE_DIGIT_PIECES = tuple("\u2581" + digit for digit in "0123456789")
SPECIAL_PIECES = 4  # pad, unk, bos, eos
BYTE_PIECES = 256


@dataclass
class TokenizerConfig:
    vocab_size: int = 32_000
    # BPE: at 32k on ruslit it compresses text the tokenizer never saw better than unigram (unseen authors'
    # prose 3.92 vs 3.83 chars/token, Debian FAQ 2.55 vs 2.44, where unigram falls below the HF byte-level
    # BPE baseline) and SentencePiece trains it about 15x faster; unigram encodes about 3x faster, which
    # sharding (recipe 03) feels most (bench/README.md, "Tokenizer on text it never saw").
    model_type: Literal["unigram", "bpe"] = "bpe"
    # 0.99999, not SentencePiece's 0.9995: symbols at 1 in 10^4-10^5 characters (¶ § © ⟨ ⟩ in technical
    # text beside 31 M characters of literature) stay pieces instead of 2-3 byte tokens each; on ruslit
    # alone it costs 19 more single-character pieces (accented Latin, Greek), 1.0 another 78 (polytonic
    # Greek) for no gain (bench/README.md, "Tokenizer on text it never saw").
    character_coverage: float = 0.99999
    byte_fallback: bool = True
    # Numbers as BPE learns them (" 1812" one piece, "2023" "20"+"23"), as the byte-level BPE peer and
    # GPT-2-style tokenizers do. Measured on text the tokenizer never saw, every digit its own token (true)
    # costs, line by line: 2% on poems (line and poem numbers, years), 1.8% on wiki-style technical text,
    # 0.4% on prose, 4% on digit-dense lines, and put ours below the peer on those. Set true where
    # digit-by-digit arithmetic matters more than length (bench/README.md, "Tokenizer on text it never saw").
    split_digits: bool = False
    # With split_digits, " 7" is one piece "▁" + "7" (ten user-defined pieces) instead of a lone "▁" and
    # "7": every digit stays its own token and each number after a space takes one token less (wiki-style
    # +0.4%, digit-dense lines +2.1%, words in at most two tokens +1.2 points on the Debian FAQ, nothing lost
    # elsewhere). No effect when split_digits is false.
    space_digit_pieces: bool = True
    # The character rules compiled into the model (tokenizer/normalization.py: special spaces, quotes,
    # dashes, stress marks); "identity" trains a model that leaves text as it is (for comparisons).
    normalization: Literal["ru_text_v1", "identity"] = "ru_text_v1"
    # Corpus sources never trained on: the report measures them as unseen text (another author, another
    # kind of text) beside the usual held-out split.
    heldout_sources: list[str] = field(default_factory=list)
    # Text that trains the tokenizer only, never the model (recipe 03 shards the corpus alone): sources in
    # corpus.sources' schema (kind files / debian / hub), read and normalized as recipe 01 does. A corpus of
    # literature leaves technical words in many pieces; 3.3 M characters of Debian documentation lift
    # wiki-style text by half (bench/README.md, "Tokenizer on text it never saw").
    extra_train_sources: list[SourceConfig] = field(default_factory=list)
    input_sentence_size: int = 2_000_000  # lines sampled (shuffled, seeded) from multi-GB corpora
    max_sentence_length: int = 65_536  # bytes; SentencePiece's default 4192 drops long paragraphs
    max_piece_length: int = 16  # characters, counting the leading space; long Russian words hit 16
    # Always-whole pieces after "\n" (always added first, id 4 with the default special ids). "\n\n" is
    # the corpus's paragraph break: one token instead of two (what it saves: bench/README.md, "Tokenizer").
    user_defined_symbols: list[str] = field(default_factory=lambda: ["\n\n"])
    required_chars: str = DEFAULT_REQUIRED_CHARS
    num_threads: int = 2
    # Stable special ids: every later stage and the Hugging Face export rely on these.
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    report_max_docs: int = 2_000  # held-out documents measured in the report (per source)
    baseline_hf_bpe: bool = True  # train a Hugging Face byte-level BPE at the same size for the report
    hf_export: bool = True  # write tokenizer/hf/, loadable by transformers
    # Adopt a base model's tokenizer instead of training one: a Hugging Face model folder (its
    # tokenizer.json, else its SentencePiece tokenizer.model) or one of those files. The training keys
    # above then only size the report's baseline; the special ids come from the folder's own files.
    adopt_from: str = ""

    def space_digit_symbols(self) -> tuple[str, ...]:
        """The user-defined "▁<digit>" pieces this config adds (none unless split_digits and space_digit_pieces)."""
        return SPACE_DIGIT_PIECES if self.split_digits and self.space_digit_pieces else ()

    def validate(self, key: str) -> None:
        prefix = f"{key}." if key else ""
        check_location(self.adopt_from, f"{prefix}adopt_from")
        fixed = (SPECIAL_PIECES + 1 + len(set(self.user_defined_symbols) - {"\n"} | set(self.space_digit_symbols()))
                 + (BYTE_PIECES if self.byte_fallback else 0) + len(set(self.required_chars)))
        if self.vocab_size <= fixed:
            raise ConfigError(f"config key '{prefix}vocab_size': {self.vocab_size} leaves no room for learned pieces: "
                              f"special, newline, byte and required-character pieces already take {fixed}")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ConfigError(f"config key '{prefix}character_coverage': {self.character_coverage} must be in [0.9, 1]")
        for name in ("input_sentence_size", "max_sentence_length", "max_piece_length", "num_threads",
                     "report_max_docs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key '{prefix}{name}': must be at least 1, got {getattr(self, name)}")
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in special.items():
            if not 0 <= value < self.vocab_size:
                raise ConfigError(f"config key '{prefix}{name}': {value} must be in [0, vocab_size)")
        if len(set(special.values())) != len(special):
            raise ConfigError(f"config key '{prefix}pad_id/unk_id/bos_id/eos_id': special ids must differ, "
                              f"got {special}")
        for i, source in enumerate(self.heldout_sources):
            if not source:
                raise ConfigError(f"config key '{prefix}heldout_sources[{i}]': empty source name")
        for i, source in enumerate(self.extra_train_sources):
            source.validate(f"{prefix}extra_train_sources[{i}]")
        for i, symbol in enumerate(self.user_defined_symbols):
            if not symbol:
                raise ConfigError(f"config key '{prefix}user_defined_symbols[{i}]': empty symbol")
