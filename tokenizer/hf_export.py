"""Export the SentencePiece model (unigram or BPE) as a Hugging Face ``tokenizers`` / ``transformers`` folder.

The folder (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and the
original ``tokenizer.model``) loads with ``transformers.AutoTokenizer.from_pretrained(path)``
offline and gives the same ids as SentencePiece: spaces become U+2581 with no prefix added, the
user-defined symbols (the newline first) are split out before the model, as SentencePiece does,
unknown characters fall back to ``<0xNN>`` byte pieces, and no BOS/EOS is added on encode (the
shards stage appends EOS itself).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from experiment.errors import ConfigError
from experiment.files import atomic_dir, atomic_write_bytes, atomic_write_text
from experiment.storage import RunPath, location
from tokenizer.model_proto import BPE, UNIGRAM, USER_DEFINED, read_model
from tokenizer.spm import WHITESPACE_MARK

# Control and byte pieces are never matched against text by SentencePiece; in the HF Unigram lattice
# they are ordinary vocabulary entries, so they get a score no real segmentation would pick.
UNREACHABLE_SCORE = -1e9
_TOKEN_NAMES = {"pad": "pad_token", "unk": "unk_token", "bos": "bos_token", "eos": "eos_token"}
# tokenizer_config.json's keys that make AutoTokenizer run tokenizer.json's pipeline as it is. AutoTokenizer picks a
# model type's own class over tokenizer_class for some types (transformers 5: qwen2's Qwen2Tokenizer rebuilds a
# byte-level pipeline from our vocabulary and encodes Russian into byte pieces; LlamaTokenizer adds a prefix space
# a model without add_dummy_prefix never saw); naming the class in auto_map keeps the pipeline for every model type.
FAST_TOKENIZER_CLASS: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                        "auto_map": {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}}


def _is_text_piece(sp: spm.SentencePieceProcessor, piece_id: int) -> bool:
    """A piece SentencePiece matches against text (not control, unknown, byte or unused)."""
    return not (sp.is_control(piece_id) or sp.is_byte(piece_id) or sp.is_unknown(piece_id) or sp.is_unused(piece_id))


def _unigram_model(sp: spm.SentencePieceProcessor, byte_fallback: bool) -> models.Model:
    vocab = [(sp.id_to_piece(i), sp.get_score(i) if _is_text_piece(sp, i) else UNREACHABLE_SCORE)
             for i in range(sp.get_piece_size())]
    return models.Unigram(vocab, unk_id=sp.unk_id(), byte_fallback=byte_fallback)


def _bpe_model(sp: spm.SentencePieceProcessor, byte_fallback: bool) -> models.Model:
    """SentencePiece BPE merges any adjacent pair that forms a piece, best-scored piece first: as HF
    merges, every split of every piece into two pieces, ranked by the merged piece's score."""
    text_pieces = {sp.id_to_piece(i): i for i in range(sp.get_piece_size()) if _is_text_piece(sp, i)}
    ranked = []
    for piece, piece_id in text_pieces.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in text_pieces and right in text_pieces:
                ranked.append((-sp.get_score(piece_id), piece_id, cut, left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    return models.BPE(vocab, merges, unk_token=sp.id_to_piece(sp.unk_id()), byte_fallback=byte_fallback)


def build_hf_tokenizer(sp: spm.SentencePieceProcessor) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` that gives the same ids as ``sp`` (unigram or BPE)."""
    proto = read_model(sp.serialized_model_proto())
    model_type = proto.trainer_spec.model_type
    byte_fallback = proto.trainer_spec.byte_fallback
    if model_type == UNIGRAM:
        tokenizer = Tokenizer(_unigram_model(sp, byte_fallback))
    elif model_type == BPE:
        tokenizer = Tokenizer(_bpe_model(sp, byte_fallback))
    else:
        raise ConfigError("config key 'tokenizer.hf_export': the Hugging Face export supports model_type unigram "
                          "or bpe; set tokenizer.hf_export=false for other models")
    spaces = normalizers.Replace(" ", WHITESPACE_MARK)
    charsmap = proto.normalizer_spec.precompiled_charsmap
    # the character rules the model carries (tokenizer.normalization), compiled as SentencePiece has them
    tokenizer.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap), spaces]) if charsmap else spaces
    tokenizer.decoder = decoders.Sequence([decoders.Replace(WHITESPACE_MARK, " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    user_defined = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                    if proto.pieces[i].type == USER_DEFINED]
    # matched after the normalizer, as SentencePiece matches them in normalized text ("\r\n" is one "\n")
    tokenizer.add_tokens([AddedToken(p, normalized=True, special=False) for p in user_defined])
    controls = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    tokenizer.add_special_tokens([AddedToken(p, normalized=False, special=True) for p in controls])
    return tokenizer


def tokenizer_config(sp: spm.SentencePieceProcessor, special_ids: dict[str, int],
                     model_max_length: int) -> dict[str, Any]:
    tokens = {_TOKEN_NAMES[name]: sp.id_to_piece(i) for name, i in special_ids.items()}
    return {
        "tokenizer_class": FAST_TOKENIZER_CLASS["tokenizer_class"],
        **tokens,
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        # "<s>" typed in text stays text, as in SentencePiece, instead of becoming the BOS id.
        "split_special_tokens": True,
        "auto_map": FAST_TOKENIZER_CLASS["auto_map"],
    }


def write_hf_files(sp: spm.SentencePieceProcessor, folder: Path, special_ids: dict[str, int],
                   model_max_length: int) -> None:
    """The export's files into ``folder``, a staging folder its caller publishes (``export_hf``, the model export)."""
    build_hf_tokenizer(sp).save(str(folder / "tokenizer.json"))
    config = tokenizer_config(sp, special_ids, model_max_length)
    atomic_write_text(folder / "tokenizer_config.json", json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    special_map = {k: v for k, v in config.items() if k in _TOKEN_NAMES.values()}
    atomic_write_text(folder / "special_tokens_map.json", json.dumps(special_map, indent=2) + "\n")
    atomic_write_bytes(folder / "tokenizer.model", sp.serialized_model_proto())


def export_hf(sp: spm.SentencePieceProcessor, out_dir: RunPath, special_ids: dict[str, int],
              model_max_length: int) -> RunPath:
    """Write the export into a temporary folder and move it over ``out_dir`` only when complete."""
    out_dir = location(out_dir)
    with atomic_dir(out_dir) as staging:
        write_hf_files(sp, staging, special_ids, model_max_length)
    return out_dir
