"""Loading the trained SentencePiece tokenizer and the per-id byte lengths bits-per-byte needs.

Other stages never open ``spm.model`` directly: ``load_tokenizer`` refuses a folder whose manifest
is missing (an unfinished run) or whose model bytes do not match the manifest's hash.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sentencepiece as spm

from experiment.errors import DataError
from experiment.files import sha256_file
from experiment.manifest import manifest_path
from experiment.stages import TOKENIZER
from experiment.storage import RunPath, location

MODEL_FILE = "spm.model"
VOCAB_FILE = "spm.vocab"
# SentencePiece writes spaces as U+2581 inside pieces (escape_whitespaces), so a piece's surface
# text is the piece with this character turned back into a space.
WHITESPACE_MARK = "\u2581"


def verified_model_file(tokenizer_dir: RunPath, manifest: dict[str, Any],
                        default_name: str = MODEL_FILE) -> tuple[RunPath, str]:
    """``(path, sha256)`` of the model file a tokenizer manifest lists, refused when it is missing or its
    bytes do not match the manifest's hash (hashed once, here, for every tokenizer kind)."""
    model_path = tokenizer_dir / str(manifest.get("model_file", default_name))
    if not model_path.is_file():
        raise DataError(f"{model_path} is listed in the tokenizer manifest but missing: {TOKENIZER.run_again}")
    digest = sha256_file(model_path)
    if digest != manifest.get("sha256"):
        raise DataError(
            f"{model_path} has sha256 {digest[:12]}..., the manifest says {str(manifest.get('sha256'))[:12]}...: "
            f"the model changed after recipe 02; {TOKENIZER.run_again}"
        )
    return model_path, digest


def load_tokenizer(tokenizer_dir: str | RunPath, manifest: dict[str, Any] | None = None
                   ) -> tuple[spm.SentencePieceProcessor, dict[str, Any]]:
    """Load a finished tokenizer folder: ``(SentencePieceProcessor, manifest)``; ``manifest``: the folder's,
    when the caller has already read it."""
    tokenizer_dir = location(tokenizer_dir)
    manifest = TOKENIZER.read_manifest(tokenizer_dir) if manifest is None else manifest
    model_path, _ = verified_model_file(tokenizer_dir, manifest)
    try:
        processor = spm.SentencePieceProcessor(model_proto=model_path.read_bytes())
    except (OSError, RuntimeError) as exc:
        raise DataError(f"{model_path} is not a readable SentencePiece model ({exc})") from exc
    # an adopted model's manifest keeps its pieces apart from the base model's (larger) embedding rows
    pieces = manifest.get("tokenizer_vocab_size", manifest.get("vocab_size"))
    if processor.get_piece_size() != pieces:
        raise DataError(f"{model_path} has {processor.get_piece_size()} pieces, the manifest says {pieces}")
    return processor, manifest


def eos_and_pad_ids(sp: spm.SentencePieceProcessor, manifest: dict[str, Any],
                    tokenizer_dir: str | RunPath) -> tuple[int, int]:
    """``(eos, pad)`` of a loaded tokenizer: the manifest's ``special_ids``, else SentencePiece's own.

    A tokenizer without padding pads with EOS: padding is masked out wherever it is read (segment 0 in
    the shards, the target mask in scoring), so any valid id does, and one rule keeps the shards and
    eval from disagreeing. No EOS is an error naming the manifest.
    """
    special = manifest.get("special_ids") or {}
    eos = special.get("eos", sp.eos_id())
    if eos is None or eos < 0:
        raise DataError(f"{manifest_path(location(tokenizer_dir))}: the tokenizer has no EOS id (special_ids.eos); "
                        f"{TOKENIZER.run_again} with one")
    pad = special.get("pad", sp.pad_id())
    return int(eos), int(pad) if pad is not None and pad >= 0 else int(eos)


def piece_surface(sp: spm.SentencePieceProcessor, piece_id: int) -> str:
    """The text a normal or user-defined piece stands for ('' for control, unknown and byte pieces)."""
    if sp.is_control(piece_id) or sp.is_unknown(piece_id) or sp.is_byte(piece_id) or sp.is_unused(piece_id):
        return ""
    return sp.id_to_piece(piece_id).replace(WHITESPACE_MARK, " ")


def piece_byte_lengths(sp: spm.SentencePieceProcessor) -> np.ndarray:
    """UTF-8 bytes each id stands for: ``<0xNN>`` byte pieces 1, control/unknown/unused pieces 0.

    With identity normalization and no dummy prefix, the sum over a document's ids equals the
    document's UTF-8 length whenever ``decode(encode(text)) == text``.
    """
    lengths = np.zeros(sp.get_piece_size(), dtype=np.int32)
    for piece_id in range(sp.get_piece_size()):
        lengths[piece_id] = 1 if sp.is_byte(piece_id) else len(piece_surface(sp, piece_id).encode("utf-8"))
    return lengths
