"""The run's tokenizer, whichever kind it is: one interface for the shards, eval and export.

Recipe 02 either trains a SentencePiece model or adopts a base model's tokenizer (a Hugging Face
``tokenizer.json``, byte-level BPE or SentencePiece-style, or a SentencePiece ``tokenizer.model``);
its manifest's ``kind`` says which. Later stages load it with ``load_run_tokenizer(tokenizer_dir)``
and never call SentencePiece or ``tokenizers`` themselves, so sharding, bits per byte and task
scoring treat both kinds alike. The SentencePiece path encodes exactly as before (the same call,
the same ids), so shards built before this interface are rebuilt byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from experiment.errors import DataError
from experiment.stages import TOKENIZER
from experiment.storage import RunPath, location
from tokenizer.measured import BYTE_PIECE
from tokenizer.normalization import normalize_characters
from tokenizer.spm import MODEL_FILE, eos_and_pad_ids, load_tokenizer, piece_byte_lengths, verified_model_file

KIND_SENTENCEPIECE = "sentencepiece"
KIND_HF = "hf_tokenizer_json"
KINDS = (KIND_SENTENCEPIECE, KIND_HF)


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: the character a byte-level BPE writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {char: byte for byte, char in enumerate(chars)}


@dataclass
class RunTokenizer:
    """A loaded tokenizer folder. ``source`` is what a Beam worker rebuilds it from (kind, model bytes)."""

    kind: str
    vocab_size: int  # the manifest's: the model's embedding rows (an adopted base model's may pass its tokenizer's ids)
    eos_id: int
    pad_id: int
    sha256: str
    manifest: dict[str, Any]
    model_file: Path | None  # None: a SentencePiece model handed in memory (sentencepiece_run_tokenizer)
    sp: spm.SentencePieceProcessor | None = None  # the SentencePiece kind
    hf: Any = None  # the tokenizers.Tokenizer of the HF kind
    _piece_bytes: np.ndarray | None = field(default=None, init=False, repr=False)

    def normalize(self, text: str) -> str:
        """``text`` as the corpus and this tokenizer's training saw it (``tokenizer.normalization``): what an
        evaluation input is scored and counted in bytes as. The trained model applies the same rules
        itself, so its ids do not change; an adopted tokenizer then also meets text in the corpus's form."""
        return normalize_characters(text)

    def encode(self, text: str) -> list[int]:
        if self.sp is not None:
            return self.sp.encode(text, out_type=int)
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], threads: int = 1) -> list[np.ndarray]:
        """int32 id arrays, one per text, in order (no BOS/EOS added: the shards stage appends EOS)."""
        if self.sp is not None:
            # numpy output: SentencePiece hands back its C++ id buffers as int32 arrays, which skips
            # building (and then converting) a Python int per token
            return self.sp.encode(list(texts), out_type="numpy", num_threads=threads)
        return [np.asarray(enc.ids, dtype=np.int32)
                for enc in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.sp is not None:
            return self.sp.decode(ids)
        return self.hf.decode(ids, skip_special_tokens=False)

    def piece_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each id stands for, shape ``[vocab_size]`` (special pieces and the rows past the
        tokenizer's ids 0)."""
        if self._piece_bytes is None:
            lengths = piece_byte_lengths(self.sp) if self.sp is not None else hf_piece_byte_lengths(self.hf)
            self._piece_bytes = np.pad(lengths, (0, max(self.vocab_size - lengths.size, 0)))
        return self._piece_bytes

    @property
    def source(self) -> tuple[str, bytes]:
        if self.model_file is None:
            assert self.sp is not None
            return self.kind, self.sp.serialized_model_proto()
        return self.kind, self.model_file.read_bytes()


def sentencepiece_run_tokenizer(sp: spm.SentencePieceProcessor) -> RunTokenizer:
    """A SentencePiece model in memory (tests, benchmarks) as a run tokenizer: its own EOS, and EOS as
    padding when it has no pad piece (the rule of ``tokenizer.spm.eos_and_pad_ids``)."""
    eos, pad = eos_and_pad_ids(sp, {}, "(in memory)")
    return RunTokenizer(KIND_SENTENCEPIECE, sp.get_piece_size(), eos, pad, "", {}, None, sp=sp)


def hf_piece_byte_lengths(tokenizer: Any) -> np.ndarray:
    """Bytes per id of a ``tokenizers.Tokenizer``: byte-level pieces count their bytes, ``<0xNN>`` byte
    fallback pieces 1, SentencePiece-style pieces their text with U+2581 as a space, special tokens 0."""
    spec = json.loads(tokenizer.to_str())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    alphabet = byte_level_alphabet()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lengths = np.zeros(max(vocab.values(), default=-1) + 1, dtype=np.int32)
    for piece, piece_id in vocab.items():
        token = added.get(piece_id)
        if token is not None:
            lengths[piece_id] = 0 if token.get("special") else len(token["content"].encode("utf-8"))
        elif byte_level and all(char in alphabet for char in piece):
            lengths[piece_id] = len(piece)
        elif byte_fallback and BYTE_PIECE.fullmatch(piece):
            lengths[piece_id] = 1
        else:
            lengths[piece_id] = len(piece.replace("\u2581", " ").encode("utf-8"))
    return lengths


def read_hf_tokenizer(path: Path, data: bytes | None = None) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` (or its bytes, ``data``, read from ``path``); a
    file that does not load is one line naming it."""
    from tokenizers import Tokenizer

    try:
        text = (path.read_bytes() if data is None else data).decode("utf-8")
        return Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON or an unknown model
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path} is not a readable Hugging Face tokenizer.json ({reason})") from exc


def read_sentencepiece(path: Path, data: bytes | None = None) -> spm.SentencePieceProcessor:
    """A SentencePiece model from ``path`` (or its bytes, ``data``); one line naming it if it does not load."""
    try:
        return spm.SentencePieceProcessor(model_proto=path.read_bytes() if data is None else data)
    except (OSError, RuntimeError) as exc:
        raise DataError(f"{path} is not a readable SentencePiece model ({exc})") from exc


def tokenizer_from_source(kind: str, model_bytes: bytes) -> Any:
    """What a Beam worker encodes with: a SentencePieceProcessor or a tokenizers.Tokenizer from its bytes."""
    if kind == KIND_SENTENCEPIECE:
        return spm.SentencePieceProcessor(model_proto=model_bytes)
    from tokenizers import Tokenizer

    return Tokenizer.from_str(model_bytes.decode("utf-8"))


def encode_one(tokenizer: Any, text: str) -> np.ndarray:
    """int32 ids of ``text`` with a tokenizer made by ``tokenizer_from_source`` (as ``RunTokenizer.encode_batch``)."""
    if isinstance(tokenizer, spm.SentencePieceProcessor):
        return tokenizer.encode(text, out_type="numpy")
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)


def load_run_tokenizer(tokenizer_dir: str | RunPath) -> RunTokenizer:
    """The finished tokenizer folder of recipe 02 (trained or adopted), checked against its manifest."""
    tokenizer_dir = location(tokenizer_dir)
    manifest = TOKENIZER.read_manifest(tokenizer_dir)
    kind = manifest.get("kind", KIND_SENTENCEPIECE)  # manifests written before adoption existed: SentencePiece
    if kind == KIND_SENTENCEPIECE:
        sp, manifest = load_tokenizer(tokenizer_dir, manifest)
        eos, pad = eos_and_pad_ids(sp, manifest, tokenizer_dir)
        return RunTokenizer(kind, int(manifest["vocab_size"]), eos, pad, str(manifest["sha256"]), manifest,
                            tokenizer_dir / manifest.get("model_file", MODEL_FILE), sp=sp)
    if kind != KIND_HF:
        raise DataError(f"{tokenizer_dir / 'manifest.json'}: unknown tokenizer kind '{kind}' "
                        f"(known: {', '.join(KINDS)}); "
                        f"{TOKENIZER.run_again}")
    model_path, digest = verified_model_file(tokenizer_dir, manifest, "tokenizer.json")
    hf = read_hf_tokenizer(model_path)
    own_size, recorded = hf.get_vocab_size(with_added_tokens=True), manifest.get("tokenizer_vocab_size")
    if own_size != recorded:
        raise DataError(f"{model_path} has {own_size} tokens, the manifest's tokenizer_vocab_size says {recorded}: "
                        f"{TOKENIZER.run_again}")
    special = manifest.get("special_ids") or {}
    if special.get("eos") is None:
        raise DataError(f"{tokenizer_dir / 'manifest.json'}: the tokenizer has no EOS id (special_ids.eos); "
                        f"{TOKENIZER.run_again} with a tokenizer that has one")
    eos = int(special["eos"])
    pad = int(special["pad"]) if special.get("pad") is not None else eos  # as eos_and_pad_ids: pad with EOS
    return RunTokenizer(kind, int(manifest["vocab_size"]), eos, pad, digest, manifest, model_path, hf=hf)
